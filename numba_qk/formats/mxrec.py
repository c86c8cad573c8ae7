"""ggml's FP4 record formats MXFP4 and NVFP4 (``block_mxfp4``, ``block_nvfp4`` in
``ggml-common.h``): declarations only (no numba).

These are ggml's *GGUF records* (types 39 and 40), not the OCP/NVIDIA block-scaled tensors of
``numba_qk.mx`` (``qk.mx.mxfp4`` / ``qk.mx.nvfp4``, spec 004): the element codes are the same
e2m1 codes, but the record layout, the scale rules and the rounding are ggml's.  ``FORMATS``
lists them; ``ACTIVATION`` pairs both with Q8_0 (ggml's ``vec_dot_type``; one NVFP4 record spans
two Q8_0 records).

Element codes ``c`` (0..15) read through ggml's ``kvalues_fp4`` table of *doubled* e2m1 values
``k(c) = 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12`` (code 8 is +0), so every
scale below is *half* the OCP scale.

MXFP4 (17 B, 32 elements, ggml type 39; ``x[i] = k(c_i) * 2^(e - 128)``)::

    [0, 1)    e       e8m0 scale byte; every byte 0..255 means 2^(e - 128) (ggml's
                      ``GGML_E8M0_TO_FP32_HALF``; 0xFF is 2^127, not NaN)
    [1, 17)   qs[32]  e2m1 codes: element j (0..15) in the low nibble of byte 1 + j,
                      element j + 16 in the high nibble

NVFP4 (36 B, 64 elements in 4 sub-blocks of 16, ggml type 40; no tensor scale;
``x[16s + j] = k(c) * ue4m3_half(d[s])``)::

    [0, 4)    d[4]    ue4m3 sub-block scales (ggml's ``ggml_ue4m3_to_fp32``: bits 6..3 the
                      exponent (bias 7), bits 2..0 the mantissa, bit 7 ignored, result halved;
                      0x00 and 0x7F decode to 0)
    [4, 36)   qs[64]  e2m1 codes: element j (0..7) of sub-block s in the low nibble of byte
                      4 + 8s + j, element j + 8 in the high nibble
"""

from ._schema import F, ggml_format
from .legacy import q8_0

mxfp4 = ggml_format(
    "MXFP4", 32, 17, [F("e", 0, 1, "e8m0", 1, 8, False), F("qs", 1, 17, "e2m1", 32, 4, True)],
    "MXFP4 (ggml): 32 elements, value = kvalues_fp4[q] * 2^(e - 128)")
nvfp4 = ggml_format(
    "NVFP4", 64, 36, [F("d", 0, 4, "ue4m3", 4, 8, False), F("qs", 4, 36, "e2m1", 64, 4, True)],
    "NVFP4 (ggml): 64 elements in 4 sub-blocks of 16, value = kvalues_fp4[q] * ue4m3(d[s]) / 2")

FORMATS = (mxfp4, nvfp4)
ACTIVATION = {mxfp4: q8_0, nvfp4: q8_0}
