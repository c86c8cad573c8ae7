"""ggml's K-quant super-block formats (256 elements): declarations only (no numba).

``FORMATS`` lists them in numba_qk's order; ``ACTIVATION`` pairs each weight format with the
activation format its quantized dot takes (ggml's ``vec_dot_type``).  Q4_K and Q8_K are spec 000's;
the layouts of ggml's other K-quant records (``block_q*_K`` in ``ggml-common.h``) follow.

Every record holds 256 logical elements.  Notation: ``a`` is the record's bytes, element
``i`` (0..255) is written ``i = 128*c + 32*g + l`` (chunk ``c`` in 0..1, group ``g`` in 0..3,
lane ``l`` in 0..31) where a format interleaves bit planes in groups of 32.  f16 fields are IEEE
binary16, little-endian; every bit pattern is a legal record (inf/NaN/subnormal kept).
Field names: ``d``/``dmin``/``sc``/``m`` as in spec 000; quant bit planes keep ggml's roles
(``ql`` = low bits, ``qh`` = high bits, ``hmask`` = Q3_K's high-bit mask; ggml's ``qs`` is
our ``ql`` in Q3_K/Q5_K and ``q`` in Q2_K).

Q6_K (210 B, ggml type 14; ``x = d * sc[j] * (q - 32)``, 16 sub-blocks ``j = i // 16``)::

    [0, 128)    ql[256]  u4  low 4 bits: byte 64c + l + 32*(g & 1), low nibble for g < 2,
                              high nibble for g >= 2
    [128, 192)  qh[256]  u2  high 2 bits: byte 128 + 32c + l, bits [2g, 2g+2)
    [192, 208)  sc[16]   i8  two's-complement sub-block scales
    [208, 210)  d        f16 super-block scale
    q = ql | (qh << 4) in 0..63, used as q - 32 in -32..31.

Q5_K (176 B, ggml type 13; ``x = d*sc[s]*q - dmin*m[s]``, 8 sub-blocks ``s = i // 32``)::

    [0, 2) d f16, [2, 4) dmin f16, [4, 16) sc[8]/m[8] u6 packed exactly as Q4_K (spec 000)
    [16, 48)    qh[256]  u1  bit 5 of q: byte 16 + (i % 32), bit i // 32
    [48, 176)   ql[256]  u4  low 4 bits: byte 48 + 32*(i // 64) + (i % 32), low nibble when
                              i % 64 < 32, high nibble otherwise (Q4_K's nibble order)
    q = ql | (qh << 4) in 0..31.

Q3_K (110 B, ggml type 11; ``x = d * (sc[j] - 32) * q``, 16 sub-blocks ``j = i // 16``)::

    [0, 32)     hmask[256] u1  byte i % 32, bit i // 32; a SET bit means q = low bits,
                                a CLEAR bit means q = low bits - 4
    [32, 96)    ql[256]    u2  low 2 bits: byte 32 + 32c + l, bits [2g, 2g+2)
    [96, 108)   sc[16]     u6  6-bit scales stored +32 (used as sc - 32 in -32..31):
                                low nibble of sc[j] = byte 96 + (j % 8), nibble j // 8;
                                high 2 bits of sc[j] = byte 104 + (j % 4), bits [2*(j//4), +2)
    [108, 110)  d          f16
    q in -4..3.

Q2_K (84 B, ggml type 10; ``x = d*sc[j]*q - dmin*m[j]``, 16 sub-blocks ``j = i // 16``)::

    [0, 16)     sc[16], m[16]  u4  byte j: sc[j] in the low nibble, m[j] in the high nibble
    [16, 80)    q[256]         u2  byte 16 + 32c + l, bits [2g, 2g+2); q in 0..3
    [80, 82)    d     f16     scale of the scales
    [82, 84)    dmin  f16     scale of the mins

ggml's ternary (BitNet b1.58 / TriLM) formats TQ1_0 and TQ2_0 (``block_tq1_0``, ``block_tq2_0``)
share the 256-element super-block and the Q8_K activation; declared here, their kernels live in
``numba_qk/kernels/ternary/``.

Both hold 256 elements of ``x = d * t`` with one f16 scale ``d``; ``ACTIVATION`` pairs both with
Q8_K (ggml's ``vec_dot_type``).  f16 ``d`` is IEEE binary16, little-endian; every bit pattern
is a legal record (inf/NaN/subnormal kept, any byte of ``qs``/``qh`` decodes).

TQ1_0 (54 B, ggml type 34; ``t`` in -1..1, 1.6875 bits per element)::

    [0, 48)    qs[48]  five base-3 digits per byte, stored as a fixed-point fraction: digit
                       n (0..4) of byte k is ``((u8)(qs[k] * 3^n) * 3) >> 8`` (0..2), t = digit - 1.
                       Bytes 0..31: element 32n + k; bytes 32..47: element 160 + 16n + (k - 32)
    [48, 52)   qh[4]   four digits per byte the same way (n = 0..3): element 240 + 4n + k
    [52, 54)   d       f16 scale

TQ2_0 (66 B, ggml type 35; ``t = q - 1`` in -1..2, q = 3 is decoded as ggml does)::

    [0, 64)    qs[256] u2  byte 32c + l, bits [2g, 2g + 2): element 128c + 32g + l
    [64, 66)   d       f16 scale
"""

from ._schema import F, TOKEN, Format
from .ggml_types import GGMLType

q4_k = Format(
    TOKEN, "Q4_K", "q4_k", 256, 144,
    [
        F("d", 0, 2, "f16", 1, 16, True),        # super-block scale for the sub-block scales
        F("dmin", 2, 4, "f16", 1, 16, True),     # super-block scale for the sub-block mins
        F("sc", 4, 16, "u6", 8, 6, False),       # packed with m: 8 x 6-bit scales
        F("m", 4, 16, "u6", 8, 6, False),        # packed with sc: 8 x 6-bit mins
        F("q", 16, 144, "u4", 256, 4, False),    # 256 x 4-bit quants
    ],
    "Q4_K weights: 256 elements in 8 sub-blocks of 32, 4-bit quants, 6-bit scales and mins",
    GGMLType.Q4_K,
)

q8_k = Format(
    TOKEN, "Q8_K", "q8_k", 256, 292,
    [
        F("ds", 0, 4, "f32", 1, 32, True),       # block scale
        F("q", 4, 260, "i8", 256, 8, True),      # 256 x 8-bit quants
        F("bsum", 260, 292, "i16", 16, 16, True),  # sums of q over groups of 16
    ],
    "Q8_K activations: 256 elements, 8-bit quants, f32 scale, 16 group sums",
    GGMLType.Q8_K,
)

q6_k = Format(
    TOKEN, "Q6_K", "q6_k", 256, 210,
    [
        F("ql", 0, 128, "u4", 256, 4, False),    # low 4 bits of the 6-bit quants
        F("qh", 128, 192, "u2", 256, 2, False),  # high 2 bits of the 6-bit quants
        F("sc", 192, 208, "i8", 16, 8, True),    # 16 signed 8-bit sub-block scales
        F("d", 208, 210, "f16", 1, 16, True),    # super-block scale
    ],
    "Q6_K weights: 256 elements in 16 sub-blocks of 16, 6-bit quants (q - 32), int8 scales",
    GGMLType.Q6_K,
)

q5_k = Format(
    TOKEN, "Q5_K", "q5_k", 256, 176,
    [
        F("d", 0, 2, "f16", 1, 16, True),        # scale of the sub-block scales
        F("dmin", 2, 4, "f16", 1, 16, True),     # scale of the sub-block mins
        F("sc", 4, 16, "u6", 8, 6, False),       # packed with m, as Q4_K
        F("m", 4, 16, "u6", 8, 6, False),        # packed with sc, as Q4_K
        F("qh", 16, 48, "u1", 256, 1, False),    # bit 4 of the 5-bit quants
        F("ql", 48, 176, "u4", 256, 4, False),   # low 4 bits of the 5-bit quants
    ],
    "Q5_K weights: 256 elements in 8 sub-blocks of 32, 5-bit quants, 6-bit scales and mins",
    GGMLType.Q5_K,
)

q3_k = Format(
    TOKEN, "Q3_K", "q3_k", 256, 110,
    [
        F("hmask", 0, 32, "u1", 256, 1, False),  # set: q = low bits; clear: low bits - 4
        F("ql", 32, 96, "u2", 256, 2, False),    # low 2 bits of the quants
        F("sc", 96, 108, "u6", 16, 6, False),    # 16 six-bit scales stored +32
        F("d", 108, 110, "f16", 1, 16, True),    # super-block scale
    ],
    "Q3_K weights: 256 elements in 16 sub-blocks of 16, 3-bit quants (-4..3), 6-bit scales",
    GGMLType.Q3_K,
)

q2_k = Format(
    TOKEN, "Q2_K", "q2_k", 256, 84,
    [
        F("sc", 0, 16, "u4", 16, 4, False),      # low nibbles: sub-block scales
        F("m", 0, 16, "u4", 16, 4, False),       # high nibbles: sub-block mins
        F("q", 16, 80, "u2", 256, 2, False),     # 2-bit quants
        F("d", 80, 82, "f16", 1, 16, True),      # scale of the scales
        F("dmin", 82, 84, "f16", 1, 16, True),   # scale of the mins
    ],
    "Q2_K weights: 256 elements in 16 sub-blocks of 16, 2-bit quants, 4-bit scales and mins",
    GGMLType.Q2_K,
)

tq1_0 = Format(
    TOKEN, "TQ1_0", "tq1_0", 256, 54,
    [
        F("qs", 0, 48, "t5", 48, 8, False),      # 48 bytes of 5 base-3 digits (240 elements)
        F("qh", 48, 52, "t4", 4, 8, False),      # 4 bytes of 4 base-3 digits (16 elements)
        F("d", 52, 54, "f16", 1, 16, True),      # scale
    ],
    "TQ1_0 (ggml): 256 ternary elements, base-3 packed, x = d * (digit - 1)",
    GGMLType.TQ1_0,
)

tq2_0 = Format(
    TOKEN, "TQ2_0", "tq2_0", 256, 66,
    [
        F("qs", 0, 64, "u2", 256, 2, False),     # 2-bit codes q, x = d * (q - 1)
        F("d", 64, 66, "f16", 1, 16, True),      # scale
    ],
    "TQ2_0 (ggml): 256 ternary elements, 2 bits each, x = d * (q - 1)",
    GGMLType.TQ2_0,
)

FORMATS = (q4_k, q8_k, q2_k, q3_k, q5_k, q6_k, tq1_0, tq2_0)
ACTIVATION = {q4_k: q8_k, q2_k: q8_k, q3_k: q8_k, q5_k: q8_k, q6_k: q8_k, tq1_0: q8_k,
              tq2_0: q8_k}
