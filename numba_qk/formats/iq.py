"""ggml's IQ record formats (``block_iq*`` in ``ggml-common.h``): declarations only (no numba).
The IQ4 formats IQ4_NL and IQ4_XS first, then the grid formats IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S,
IQ3_S, IQ2_S, IQ1_M (end of this docstring).

Both store 4-bit codes ``c`` (0..15) read through ggml's non-linear table ``kvalues_iq4nl``
(``KVALUES_IQ4NL`` below, copied from ggml-common.h of llama.cpp / ggml):
``k(c) = -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113``.

IQ4_NL (18 B, 32 elements, ggml type 20; ``x[i] = d * k(c_i)``; pairs with Q8_0)::

    [0, 2)    d       IEEE f16 scale
    [2, 18)   qs[16]  codes: element j (0..15) in the low nibble of byte 2 + j, element j + 16
                      in the high nibble

IQ4_XS (136 B, 256 elements in 8 sub-blocks of 32, ggml type 23; pairs with Q8_K;
``x[32s + i] = d * (ls_s - 32) * k(c)``)::

    [0, 2)     d            IEEE f16 super-block scale
    [2, 8)     ls[8]        6-bit sub-block scales (field ``ls``), in ggml's two arrays:
      [2, 4)   scales_h     little-endian u16: bits 2s, 2s+1 are bits 4, 5 of ``ls_s``
      [4, 8)   scales_l[4]  low 4 bits of ``ls_s``: byte 4 + s // 2, low nibble for even s
    [8, 136)   qs[128]      codes: sub-block s takes bytes 8 + 16s .. 8 + 16s + 16, element j
                            of it in the low nibble of byte j, element j + 16 in the high one

The grid formats (256 elements, 8 sub-blocks of 32, groups of 8 elements (IQ3: two halves of
4) read as one entry of a grid table of ``numba_qk.formats.iq_grids``, ggml's data; all pair
with Q8_K).  ``ls`` are the sub-block scale codes (one per 32, or per 16 where two), used as
``(2 ls + 1)``; ``signs`` hold 7 sign bits per group of 8 read through ``ksigns_iq2xs`` (8 with
even parity) or 8 plain sign bits (IQ2_S, IQ3_S); element ``j`` of group ``l`` of sub-block
``s`` is element ``32 s + 8 l + j``::

    IQ2_XXS (66 B, type 16)  [0, 2) d f16; [2, 66) 8 x 8 bytes: per sub-block 4 grid indices
        (u8, iq2xxs_grid) then a little-endian u32 of 4 x 7 sign bits (bits 7l..7l+7) and ls
        (bits 28..31);  x = d * (0.5 + ls) / 4 * grid * sign
    IQ2_XS  (74 B, type 17)  [0, 2) d; [2, 66) 32 little-endian u16: 9-bit index into
        iq2xs_grid (bits 0..8), 7 sign bits (9..15); [66, 74) ls: two 4-bit scales per
        sub-block (low nibble: groups 0, 1; high: 2, 3);  x = d * (0.5 + ls) / 4 * grid * sign
    IQ2_S   (82 B, type 22)  [0, 2) d; [2, 34) low 8 bits of the 10-bit iq2s_grid indices;
        [34, 66) 8 sign bits per group; [66, 74) qh: bits 2l, 2l+1 of byte s are index bits
        8, 9 of group l; [74, 82) ls as IQ2_XS;  x = d * (0.5 + ls) / 4 * grid * sign
    IQ3_XXS (98 B, type 18)  [0, 2) d; [2, 66) 64 indices into iq3xxs_grid (u8, 4 elements
        each); [66, 98) per sub-block a little-endian u32 of 4 x 7 sign bits and ls (bits
        28..31);  x = d * (0.5 + ls) / 2 * grid * sign
    IQ3_S   (110 B, type 21) [0, 2) d; [2, 66) low 8 bits of 64 9-bit iq3s_grid indices;
        [66, 74) qh: bit k of byte s is index bit 8 of half-group k of sub-block s; [74, 106)
        8 sign bits per group; [106, 110) ls: 4-bit, sub-block 2t in the low nibble of byte t,
        2t + 1 in the high one;  x = d * (1 + 2 ls) * grid * sign
    IQ1_S   (50 B, type 19)  [0, 2) d; [2, 34) low 8 bits of 32 11-bit iq1s_grid indices;
        [34, 50) 8 little-endian u16 qh: bits 3l..3l+2 index bits 8..10 of group l, bits
        12..14 ls, bit 15 the delta sign;  x = d * (2 ls + 1) * (grid +- 1/8)
    IQ1_M   (56 B, type 29)  [0, 32) low 8 bits of the iq1s_grid indices; [32, 48) qh, one
        byte per pair of groups: bits 0..2 / 4..6 index bits 8..10 of the even / odd group,
        bit 3 / 7 their delta signs; [48, 56) 4 little-endian u16: bits 0..11 of u16 t two
        sub-blocks' pairs of 3-bit ls (one per 16 elements), bits 12..15 one nibble of the
        f16 super-block scale d (u16 t gives d's bits 4t..4t+3);
        x = d * (2 ls + 1) * (grid +- 1/8)
"""

from ._schema import F, f16, ggml_format
from .kquants import q8_k
from .legacy import q8_0


#: ggml's ``kvalues_iq4nl`` (ggml/src/ggml-common.h), the IQ4 code -> integer value table.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

iq4_nl = ggml_format("IQ4_NL", 32, 18, [f16("d", 0), F("qs", 2, 18, "iq4", 32, 4, True)],
                     "IQ4_NL: 32 elements, value = d * kvalues_iq4nl[q]")
iq4_xs = ggml_format(
    "IQ4_XS", 256, 136,
    [f16("d", 0), F("ls", 2, 8, "u6", 8, 6, False), F("qs", 8, 136, "iq4", 256, 4, True)],
    "IQ4_XS: 256 elements in 8 sub-blocks of 32, value = d * (ls - 32) * kvalues_iq4nl[q], "
    "6-bit ls split into scales_l (low 4 bits) and scales_h (high 2)")


def _grid(name, nbytes, fields, doc):
    return ggml_format(name, 256, nbytes, [f16("d", 0), *fields], doc)


iq2_xxs = _grid("IQ2_XXS", 66, [
    F("grid", 2, 66, "u8", 32, 8, False), F("signs", 2, 66, "u7", 32, 7, False),
    F("ls", 2, 66, "u4", 8, 4, False)],
    "IQ2_XXS: 256 elements, groups of 8 from iq2xxs_grid, 7 sign bits per group (ksigns), "
    "value = d * (0.5 + ls) / 4 * grid * sign")
iq2_xs = _grid("IQ2_XS", 74, [
    F("grid", 2, 66, "u9", 32, 9, False), F("signs", 2, 66, "u7", 32, 7, False),
    F("ls", 66, 74, "u4", 16, 4, False)],
    "IQ2_XS: 256 elements, groups of 8 from iq2xs_grid (9-bit index), 7 sign bits per group, "
    "value = d * (0.5 + ls) / 4 * grid * sign, one ls per 16")
iq3_xxs = _grid("IQ3_XXS", 98, [
    F("grid", 2, 66, "u8", 64, 8, False), F("signs", 66, 98, "u7", 32, 7, False),
    F("ls", 66, 98, "u4", 8, 4, False)],
    "IQ3_XXS: 256 elements, halves of 4 from iq3xxs_grid, 7 sign bits per group of 8, "
    "value = d * (0.5 + ls) / 2 * grid * sign")
iq1_s = _grid("IQ1_S", 50, [
    F("grid", 2, 34, "u8", 32, 8, False), F("qh", 34, 50, "u3", 32, 3, False),
    F("ls", 34, 50, "u3", 8, 3, False), F("delta", 34, 50, "u1", 8, 1, False)],
    "IQ1_S: 256 elements, groups of 8 from iq1s_grid (11-bit index, values -1, 0, 1), "
    "value = d * (2 ls + 1) * (grid + delta), delta = +-1/8 per sub-block")
iq3_s = _grid("IQ3_S", 110, [
    F("grid", 2, 66, "u8", 64, 8, False), F("qh", 66, 74, "u1", 64, 1, False),
    F("signs", 74, 106, "u1", 256, 1, False), F("ls", 106, 110, "u4", 8, 4, False)],
    "IQ3_S: 256 elements, halves of 4 from iq3s_grid (9-bit index), one sign bit per element, "
    "value = d * (1 + 2 ls) * grid * sign")
iq2_s = _grid("IQ2_S", 82, [
    F("grid", 2, 34, "u8", 32, 8, False), F("signs", 34, 66, "u1", 256, 1, False),
    F("qh", 66, 74, "u2", 32, 2, False), F("ls", 74, 82, "u4", 16, 4, False)],
    "IQ2_S: 256 elements, groups of 8 from iq2s_grid (10-bit index), one sign bit per element, "
    "value = d * (0.5 + ls) / 4 * grid * sign, one ls per 16")
iq1_m = ggml_format(
    "IQ1_M", 256, 56,
    [F("grid", 0, 32, "u8", 32, 8, False), F("qh", 32, 48, "u3", 32, 3, False),
     F("delta", 32, 48, "u1", 32, 1, False), F("ls", 48, 56, "u3", 16, 3, False),
     F("d", 48, 56, "f16", 1, 16, True)],
    "IQ1_M: 256 elements, groups of 8 from iq1s_grid (11-bit index), value = d * (2 ls + 1) * "
    "(grid + delta), delta = +-1/8 per group, one ls per 16, the f16 d in the scales' top "
    "nibbles")

FORMATS = (iq4_nl, iq4_xs, iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq3_s, iq2_s, iq1_m)
GRID_FORMATS = FORMATS[2:]
ACTIVATION = {iq4_nl: q8_0, iq4_xs: q8_k, **{f: q8_k for f in GRID_FORMATS}}
