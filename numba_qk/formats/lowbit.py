"""ggml's 1- and 2-bit scale-only formats Q1_0 and Q2_0 (``block_q1_0``, ``block_q2_0`` in
``ggml-common.h``; GGML types 41 and 42): declarations only (no numba).

Both pair with Q8_0 activations (ggml's ``vec_dot_type``): one Q1_0 record spans four Q8_0
records, one Q2_0 record two (as one NVFP4 record spans two).

Q1_0 (18 B, 128 elements; ``x[j] = bit_j ? d : -d``)::

    [0, 2)    d        f16 scale (ggml: the mean of |x| over the block)
    [2, 18)   qs[128]  u1 sign bits: element j is bit j % 8 of byte 2 + j // 8 (1: +d, 0: -d)

Q2_0 (18 B, 64 elements; ``x[j] = (q_j - 1) * d``, q 0..3 -> -1, 0, 1, 2)::

    [0, 2)    d        f16 scale (ggml: the largest |x| of the block)
    [2, 18)   qs[64]   u2 codes: element j in bits [2 (j % 4), 2 (j % 4) + 2) of byte 2 + j // 4
"""

from ._schema import F, f16, ggml_format
from .legacy import q8_0

q1_0 = ggml_format("Q1_0", 128, 18, [f16("d", 0), F("qs", 2, 18, "u1", 128, 1, False)],
                   "Q1_0: 128 elements, value = bit ? d : -d")
q2_0 = ggml_format("Q2_0", 64, 18, [f16("d", 0), F("qs", 2, 18, "u2", 64, 2, False)],
                   "Q2_0: 64 elements, value = (q - 1) * d (q 0..3)")

FORMATS = (q1_0, q2_0)
ACTIVATION = {q1_0: q8_0, q2_0: q8_0}
