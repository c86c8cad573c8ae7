"""pytest-benchmark suites (not part of the test run):

    python -m pytest bench/ --benchmark-only --benchmark-group-by=group

Each group puts numba_qk beside the baselines a user would otherwise pick, measured in the same
run; ``bench/compare.py`` prints the ratio table and writes bench/RESULTS.md.
"""

import os

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels import dot_q4_k_q8_k

from numba_qk.testing import ggml as ggml_ctypes
from _common import activations, q4_k_weights

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
GGML = ggml_ctypes.load()
NCORES = os.cpu_count() or 1
SHAPES = [(4096, 4096), (4096, 14336)]
L3_BYTES = 32 * 2**20


def needs_ggml():
    if GGML is None:
        pytest.skip("libggml-python not installed")


def _cycle(fns):
    state = [0]

    def run():
        fns[state[0] % len(fns)]()
        state[0] += 1
    return run


# ---------------------------------------------------------------- quantize
@pytest.mark.parametrize("groups", [16, 4096])
def test_quantize(benchmark, groups):
    benchmark.group = f"quantize G={groups}"
    x = activations(groups)
    out = np.empty((groups, 292), np.uint8)
    benchmark(qk.quantize, x, format=Q8, out=out)


@pytest.mark.parametrize("groups", [16, 4096])
def test_quantize_ggml(benchmark, groups):
    needs_ggml()
    benchmark.group = f"quantize G={groups}"
    x = activations(groups)
    out = np.empty((groups, 292), np.uint8)
    benchmark(GGML.quantize_q8_k, x, out)


# ---------------------------------------------------------------- single dot
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
def test_dot_numpy_dequantized(benchmark, groups):
    benchmark.group = f"dot G={groups}"
    wf = qk.dequantize(q4_k_weights(1, groups)[0], Q4).ravel()
    xf = activations(groups).ravel()
    benchmark(np.dot, wf, xf)


@pytest.mark.parametrize("groups", [16, 256])
def test_dot_ggml(benchmark, groups):
    needs_ggml()
    benchmark.group = f"dot G={groups}"
    w = q4_k_weights(1, groups)[0]
    xq = qk.quantize(activations(groups), format=Q8)
    benchmark(GGML.vec_dot_q4_k_q8_k, w, xq)


# ---------------------------------------------------------------- matvec / gemm
@pytest.mark.parametrize("threads", [1, NCORES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_hot(benchmark, shape, threads):
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} hot"
    w = q4_k_weights(rows, cols // 256)
    x = activations(cols // 256).ravel()
    benchmark(qk.matmul, w, x, lhs_format=Q4, threads=threads)


@pytest.mark.parametrize("threads", [1, NCORES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_ggml_hot(benchmark, shape, threads):
    needs_ggml()
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} hot"
    mv = GGML.matvec(q4_k_weights(rows, cols // 256), threads)
    benchmark(mv, activations(cols // 256).ravel())


@pytest.mark.parametrize("shape", [(4096, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_numpy_dequantized(benchmark, shape):
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} hot"
    wd = qk.dequantize(q4_k_weights(rows, cols // 256).reshape(-1, 144), Q4).reshape(rows, cols)
    benchmark(np.dot, wd, activations(cols // 256).ravel())


@pytest.mark.parametrize("shape", [(4096, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_gguf_py_dequantize(benchmark, shape):
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} hot"
    w = q4_k_weights(rows, cols // 256).reshape(rows, -1)
    x = activations(cols // 256).ravel()
    benchmark.pedantic(lambda: gq.dequantize(w, GGMLQuantizationType.Q4_K) @ x,
                       rounds=3, iterations=1)


@pytest.mark.parametrize("threads", [1, NCORES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_dram(benchmark, shape, threads):
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} DRAM-streamed"
    w = q4_k_weights(rows, cols // 256)
    ws = [w.copy() for _ in range(max(2, int(2.2 * L3_BYTES / w.nbytes) + 1))]
    x = activations(cols // 256).ravel()
    benchmark(_cycle([lambda w_=w_: qk.matmul(w_, x, lhs_format=Q4, threads=threads) for w_ in ws]))


@pytest.mark.parametrize("threads", [1, NCORES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_ggml_dram(benchmark, shape, threads):
    needs_ggml()
    rows, cols = shape
    benchmark.group = f"matvec {rows}x{cols} DRAM-streamed"
    w = q4_k_weights(rows, cols // 256)
    mvs = [GGML.matvec(w.copy(), threads) for _ in range(max(2, int(2.2 * L3_BYTES / w.nbytes) + 1))]
    x = activations(cols // 256).ravel()
    benchmark(_cycle([lambda m=m: m(x) for m in mvs]))


@pytest.mark.parametrize("threads", [1, NCORES])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemm_batch8(benchmark, shape, threads):
    rows, cols = shape
    benchmark.group = f"batch 8 {rows}x{cols}"
    g = cols // 256
    w = q4_k_weights(rows, g)
    xq = np.stack([qk.quantize(activations(g, seed=s), format=Q8) for s in range(8)])
    benchmark(qk.gemm, w, xq, lhs_format=Q4, rhs_format=Q8, threads=threads)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_eight_gemv_calls(benchmark, shape):
    rows, cols = shape
    benchmark.group = f"batch 8 {rows}x{cols}"
    g = cols // 256
    w = q4_k_weights(rows, g)
    xq = [qk.quantize(activations(g, seed=s), format=Q8) for s in range(8)]
    benchmark(lambda: [qk.gemv(w, x, lhs_format=Q4, rhs_format=Q8) for x in xq])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_matmul_batch8_ggml(benchmark, shape):
    needs_ggml()
    rows, cols = shape
    benchmark.group = f"batch 8 {rows}x{cols}"
    g = cols // 256
    mv = GGML.matvec(q4_k_weights(rows, g), 1, batch=8)
    benchmark(mv, np.stack([activations(g, seed=s).ravel() for s in range(8)]))
