"""pytest-benchmark suite for the core operations (not part of the test run):

    python -m pytest bench/ --benchmark-only --benchmark-group-by=group

Each group puts numba_qk beside the baselines a user would otherwise pick.
"""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels import dot_q4_k_q8_k, gemv_q4_k_q8_k, quantize_q8_k

from _common import activations, q4_k_weights

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


@pytest.mark.parametrize("groups", [16, 4096])
def test_quantize(benchmark, groups):
    benchmark.group = f"quantize G={groups}"
    x = activations(groups)
    out = np.empty((groups, 292), np.uint8)
    quantize_q8_k(x, out)
    benchmark(qk.quantize, x, format=Q8, out=out)


@pytest.mark.parametrize("groups", [16, 4096])
def test_quantize_numpy_f32_to_int8_baseline(benchmark, groups):
    """Plain numpy per-block absmax scaling to int8 (not the Q8_K numerics; a speed yardstick)."""
    benchmark.group = f"quantize G={groups}"
    x = activations(groups)

    def naive():
        s = np.abs(x).max(axis=1, keepdims=True) / 127
        return np.rint(x / s).astype(np.int8)
    benchmark(naive)


@pytest.mark.parametrize("groups", [16, 256])
def test_quantized_dot_api(benchmark, groups):
    benchmark.group = f"dot G={groups}"
    w = q4_k_weights(1, groups)[0]
    xq = qk.quantize(activations(groups), format=Q8)
    benchmark(qk.quantized_dot, w, xq, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)


@pytest.mark.parametrize("groups", [16, 256])
def test_dot_kernel(benchmark, groups):
    benchmark.group = f"dot G={groups}"
    w = q4_k_weights(1, groups)[0]
    xq = qk.quantize(activations(groups), format=Q8)
    dot_q4_k_q8_k(w, xq)
    benchmark(dot_q4_k_q8_k, w, xq)


@pytest.mark.parametrize("groups", [16, 256])
def test_dot_numpy_dequantized_baseline(benchmark, groups):
    benchmark.group = f"dot G={groups}"
    wf = qk.dequantize(q4_k_weights(1, groups)[0], Q4).ravel()
    xf = activations(groups).ravel()
    benchmark(np.dot, wf, xf)


@pytest.mark.parametrize("shape", [(4096, 4096)])
def test_gemv_kernel(benchmark, shape):
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols}"
    w = q4_k_weights(rows, cols // 256)
    xq = qk.quantize(activations(cols // 256), format=Q8)
    out = np.empty(rows, np.float32)
    gemv_q4_k_q8_k(w, xq, out)
    benchmark(gemv_q4_k_q8_k, w, xq, out)


@pytest.mark.parametrize("shape", [(4096, 4096)])
def test_gemv_numpy_f32_baseline(benchmark, shape):
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols}"
    wf = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    x = activations(cols // 256).ravel()
    benchmark(np.dot, wf, x)


@pytest.mark.parametrize("shape", [(4096, 4096)])
def test_gemv_gguf_py_dequantize_baseline(benchmark, shape):
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols}"
    w = q4_k_weights(rows, cols // 256).reshape(rows, -1)
    x = activations(cols // 256).ravel()
    benchmark.pedantic(lambda: gq.dequantize(w, GGMLQuantizationType.Q4_K) @ x,
                       rounds=3, iterations=1)
