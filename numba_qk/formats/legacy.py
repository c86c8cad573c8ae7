"""ggml's legacy 32-element block formats (``block_q4_0`` ... ``block_q8_1``): declarations only.

``FORMATS`` lists them in numba_qk's order (also their kernel codes); ``ACTIVATION`` pairs each
weight format with its activation format (ggml's ``vec_dot_type``).
"""

from ._schema import F, f16, ggml_format


def _q(attr, block_bytes, fields, doc):
    """A legacy format of 32 elements; its doc reads ``"<NAME>: 32 elements, <doc>"``."""
    name = attr.upper()
    return ggml_format(name, 32, block_bytes, fields, f"{name}: 32 elements, {doc}")


# ggml's legacy 32-element formats (ggml-common.h block_q4_0 ... block_q8_1).  In the 4- and
# 5-bit formats element j (0 <= j < 16) is the low nibble of qs[j] and element j + 16 the high
# nibble; Q5's fifth bit of element j is bit j of the little-endian 32-bit qh.
q4_0 = _q("q4_0", 18, [f16("d", 0), F("qs", 2, 18, "u4", 32, 4, False)],
          "value = (q - 8) * d")
q4_1 = _q("q4_1", 20, [f16("d", 0), f16("m", 2), F("qs", 4, 20, "u4", 32, 4, False)],
          "value = q * d + m")
q5_0 = _q("q5_0", 22, [f16("d", 0), F("qh", 2, 6, "u1", 32, 1, False),
                       F("qs", 6, 22, "u4", 32, 4, False)],
          "value = (q - 16) * d, q = low nibble | fifth bit << 4")
q5_1 = _q("q5_1", 24, [f16("d", 0), f16("m", 2), F("qh", 4, 8, "u1", 32, 1, False),
                       F("qs", 8, 24, "u4", 32, 4, False)],
          "value = q * d + m, q = low nibble | fifth bit << 4")
q8_0 = _q("q8_0", 34, [f16("d", 0), F("qs", 2, 34, "i8", 32, 8, True)], "value = q * d")
q8_1 = _q("q8_1", 36, [f16("d", 0), f16("s", 2), F("qs", 4, 36, "i8", 32, 8, True)],
          "value = q * d; s = d * sum(q) (activations paired with Q4_1/Q5_1)")

FORMATS = (q4_0, q4_1, q5_0, q5_1, q8_0, q8_1)
ACTIVATION = {q4_0: q8_0, q5_0: q8_0, q8_0: q8_0, q4_1: q8_1, q5_1: q8_1}
