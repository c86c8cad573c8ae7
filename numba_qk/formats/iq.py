"""ggml's IQ4 record formats IQ4_NL and IQ4_XS (``block_iq4_nl``, ``block_iq4_xs`` in
``ggml-common.h``): declarations only (no numba).

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
"""

from ._schema import F, TOKEN, Format
from .ggml_types import GGMLType
from .kquants import q8_k
from .legacy import q8_0


#: ggml's ``kvalues_iq4nl`` (ggml/src/ggml-common.h), the IQ4 code -> integer value table.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

iq4_nl = Format(
    TOKEN, "IQ4_NL", "iq4_nl", 32, 18,
    [F("d", 0, 2, "f16", 1, 16, True), F("qs", 2, 18, "iq4", 32, 4, True)],
    "IQ4_NL: 32 elements, value = d * kvalues_iq4nl[q]", GGMLType.IQ4_NL,
)
iq4_xs = Format(
    TOKEN, "IQ4_XS", "iq4_xs", 256, 136,
    [F("d", 0, 2, "f16", 1, 16, True), F("ls", 2, 8, "u6", 8, 6, False),
     F("qs", 8, 136, "iq4", 256, 4, True)],
    "IQ4_XS: 256 elements in 8 sub-blocks of 32, value = d * (ls - 32) * kvalues_iq4nl[q], "
    "6-bit ls split into scales_l (low 4 bits) and scales_h (high 2)", GGMLType.IQ4_XS,
)

FORMATS = (iq4_nl, iq4_xs)
ACTIVATION = {iq4_nl: q8_0, iq4_xs: q8_k}
