"""Record-level ``@njit`` kernels, callable from your own ``@njit`` code.

They take plain numpy arrays (uint8 records, float32 values) and do no validation: shapes,
dtypes and ``G`` agreement are the caller's responsibility (the public functions in
``numba_qk`` check them).  See ``examples/njit_gemv.py`` for a GEMV composed from them.

Every record format has the same building blocks (``blocks.py``; dot / gemv for the weight
formats only): ``dot_<f>_<a>(w_row, xq)``, ``gemv_<f>_<a>(w, xq, out)``,
``dequantize_<f>(w, out)`` and ``quantize_<f>(x, out)``, e.g. ``dot_q6_k_q8_k``,
``gemv_q4_0_q8_0``, ``dequantize_q5_1``, ``quantize_q8_0`` (``quantize_q8_k`` keeps its older
``[G, 256]`` signature); ``examples/njit_mixed_layer.py`` composes a mixed-format layer.
"""

from numba_qk.kernels._bits import f16_to_f32, load_f16, load_f32, load_i16, round_half_even, saturate_i8
from numba_qk.kernels.kquants.dot import dot_q4_k_q8_k, gemv_q4_k_q8_k, record_sums_loop, record_sums_q4_k_q8_k, record_value_q4_k_q8_k
from numba_qk.kernels.kquants.q4_k import q4_k_d, q4_k_decode_into, q4_k_dmin, q4_k_quant, q4_k_scale_min
from numba_qk.kernels.kquants.q8_k import q8_k_block_inverse, q8_k_bsum, q8_k_ds, q8_k_quant, quantize_block_q8_k, quantize_q8_k
from numba_qk.kernels.lowp.codecs import decode_bf16, decode_e2m1, decode_e2m3, decode_e3m2, decode_e4m3, decode_e5m2, decode_e8m0, decode_f16, decode_i4, encode_bf16, encode_e2m1, encode_e2m3, encode_e3m2, encode_e4m3, encode_e5m2, encode_e8m0, encode_f16, encode_i4, encode_u4, packed_bit, packed_nibble
from numba_qk.kernels.simd.ggml_cpu import quantize_q8_0_ggml_cpu, quantize_q8_1_ggml_cpu, quantize_q8_k_ggml_cpu
from . import blocks as _blocks
from numba_qk.kernels.blocks import *  # noqa: F401,F403  (the per-format building blocks, blocks.__all__)

__all__ = [
    "dot_q4_k_q8_k", "gemv_q4_k_q8_k", "record_value_q4_k_q8_k", "record_sums_q4_k_q8_k",
    "quantize_q8_k", "quantize_block_q8_k", "q8_k_block_inverse",
    "q4_k_d", "q4_k_dmin", "q4_k_scale_min", "q4_k_quant", "q4_k_decode_into",
    "q8_k_ds", "q8_k_quant", "q8_k_bsum",
    "f16_to_f32", "load_f16", "load_f32", "load_i16", "round_half_even", "saturate_i8",
    "decode_bf16", "encode_bf16", "decode_f16", "encode_f16", "decode_e4m3", "encode_e4m3",
    "decode_e5m2", "encode_e5m2", "decode_e2m3", "encode_e2m3", "decode_e3m2", "encode_e3m2",
    "decode_e2m1", "encode_e2m1", "decode_e8m0", "encode_e8m0", "decode_i4", "encode_i4",
    "encode_u4", "packed_nibble", "packed_bit",
    "quantize_q8_0_ggml_cpu", "quantize_q8_1_ggml_cpu", "quantize_q8_k_ggml_cpu",
    *_blocks.__all__,
]
