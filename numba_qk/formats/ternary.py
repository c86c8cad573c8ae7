"""ggml's ternary (BitNet b1.58 / TriLM) record formats TQ1_0 and TQ2_0 (``block_tq1_0``,
``block_tq2_0`` in ``ggml-common.h``): declarations only (no numba).

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

from ._schema import _F, _TOKEN, Format
from .ggml_types import GGMLType
from .kquants import q8_k

tq1_0 = Format(
    _TOKEN, "TQ1_0", "tq1_0", 256, 54,
    [
        _F("qs", 0, 48, "t5", 48, 8, False),      # 48 bytes of 5 base-3 digits (240 elements)
        _F("qh", 48, 52, "t4", 4, 8, False),      # 4 bytes of 4 base-3 digits (16 elements)
        _F("d", 52, 54, "f16", 1, 16, True),      # scale
    ],
    "TQ1_0 (ggml): 256 ternary elements, base-3 packed, x = d * (digit - 1)",
    GGMLType.TQ1_0,
)

tq2_0 = Format(
    _TOKEN, "TQ2_0", "tq2_0", 256, 66,
    [
        _F("qs", 0, 64, "u2", 256, 2, False),     # 2-bit codes q, x = d * (q - 1)
        _F("d", 64, 66, "f16", 1, 16, True),      # scale
    ],
    "TQ2_0 (ggml): 256 ternary elements, 2 bits each, x = d * (q - 1)",
    GGMLType.TQ2_0,
)

FORMATS = (tq1_0, tq2_0)
ACTIVATION = {tq1_0: q8_k, tq2_0: q8_k}
