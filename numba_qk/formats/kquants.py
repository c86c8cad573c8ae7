"""ggml's K-quant super-block formats (256 elements): declarations only (no numba).

``FORMATS`` lists them in numba_qk's order; ``ACTIVATION`` pairs each weight format with the
activation format its quantized dot takes (ggml's ``vec_dot_type``).
"""

from ._schema import _F, _TOKEN, Format

q4_k = Format(
    _TOKEN, "Q4_K", "q4_k", 256, 144,
    [
        _F("d", 0, 2, "f16", 1, 16, True),        # super-block scale for the sub-block scales
        _F("dmin", 2, 4, "f16", 1, 16, True),     # super-block scale for the sub-block mins
        _F("sc", 4, 16, "u6", 8, 6, False),       # packed with m: 8 x 6-bit scales
        _F("m", 4, 16, "u6", 8, 6, False),        # packed with sc: 8 x 6-bit mins
        _F("q", 16, 144, "u4", 256, 4, False),    # 256 x 4-bit quants
    ],
    "Q4_K weights: 256 elements in 8 sub-blocks of 32, 4-bit quants, 6-bit scales and mins",
    12,
)

q8_k = Format(
    _TOKEN, "Q8_K", "q8_k", 256, 292,
    [
        _F("ds", 0, 4, "f32", 1, 32, True),       # block scale
        _F("q", 4, 260, "i8", 256, 8, True),      # 256 x 8-bit quants
        _F("bsum", 260, 292, "i16", 16, 16, True),  # sums of q over groups of 16
    ],
    "Q8_K activations: 256 elements, 8-bit quants, f32 scale, 16 group sums",
    15,
)

FORMATS = (q4_k, q8_k)
ACTIVATION = {q4_k: q8_k}
