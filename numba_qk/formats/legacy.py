"""ggml's legacy 32-element block formats (``block_q4_0`` ... ``block_q8_1``): declarations only.

``FORMATS`` lists them in numba_qk's order (also their kernel codes); ``ACTIVATION`` pairs each
weight format with its activation format (ggml's ``vec_dot_type``).
"""

from ._schema import _F, _TOKEN, Format
from .ggml_types import GGMLType

# ggml's legacy 32-element formats (ggml-common.h block_q4_0 ... block_q8_1).  In the 4- and
# 5-bit formats element j (0 <= j < 16) is the low nibble of qs[j] and element j + 16 the high
# nibble; Q5's fifth bit of element j is bit j of the little-endian 32-bit qh.
q4_0 = Format(
    _TOKEN, "Q4_0", "q4_0", 32, 18,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qs", 2, 18, "u4", 32, 4, False)],
    "Q4_0: 32 elements, value = (q - 8) * d", GGMLType.Q4_0,
)
q4_1 = Format(
    _TOKEN, "Q4_1", "q4_1", 32, 20,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("m", 2, 4, "f16", 1, 16, True),
     _F("qs", 4, 20, "u4", 32, 4, False)],
    "Q4_1: 32 elements, value = q * d + m", GGMLType.Q4_1,
)
q5_0 = Format(
    _TOKEN, "Q5_0", "q5_0", 32, 22,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qh", 2, 6, "u1", 32, 1, False),
     _F("qs", 6, 22, "u4", 32, 4, False)],
    "Q5_0: 32 elements, value = (q - 16) * d, q = low nibble | fifth bit << 4", GGMLType.Q5_0,
)
q5_1 = Format(
    _TOKEN, "Q5_1", "q5_1", 32, 24,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("m", 2, 4, "f16", 1, 16, True),
     _F("qh", 4, 8, "u1", 32, 1, False), _F("qs", 8, 24, "u4", 32, 4, False)],
    "Q5_1: 32 elements, value = q * d + m, q = low nibble | fifth bit << 4", GGMLType.Q5_1,
)
q8_0 = Format(
    _TOKEN, "Q8_0", "q8_0", 32, 34,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("qs", 2, 34, "i8", 32, 8, True)],
    "Q8_0: 32 elements, value = q * d", GGMLType.Q8_0,
)
q8_1 = Format(
    _TOKEN, "Q8_1", "q8_1", 32, 36,
    [_F("d", 0, 2, "f16", 1, 16, True), _F("s", 2, 4, "f16", 1, 16, True),
     _F("qs", 4, 36, "i8", 32, 8, True)],
    "Q8_1: 32 elements, value = q * d; s = d * sum(q) (activations paired with Q4_1/Q5_1)",
    GGMLType.Q8_1,
)

FORMATS = (q4_0, q4_1, q5_0, q5_1, q8_0, q8_1)
ACTIVATION = {q4_0: q8_0, q5_0: q8_0, q8_0: q8_0, q4_1: q8_1, q5_1: q8_1}
