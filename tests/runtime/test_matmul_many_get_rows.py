"""``matmul_many`` (one activation quantization shared by several weights) and ``get_rows``
(dequantized rows of any record format): bit for bit the per-call ``matmul`` / ``dequantize``."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import quant


def _weights(fmt, rows, k, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows * k // fmt.block_size, fmt.block_size)).astype(np.float32)
    return qk.quantize(w, fmt).reshape(rows, k // fmt.block_size, fmt.block_bytes)


@pytest.mark.parametrize("batch", [0, 3])
def test_matmul_many_equals_per_call_matmul(batch):
    k = 256
    fmts = [quant.q4_0, quant.q4_1, quant.q4_k, quant.q4_0]
    ws = [_weights(f, r, k, i) for i, (f, r) in enumerate(zip(fmts, (8, 5, 16, 3)))]
    rng = np.random.default_rng(9)
    x = rng.standard_normal((batch, k) if batch else (k,)).astype(np.float32)
    got = qk.matmul_many(ws, x, lhs_formats=fmts)
    for w, f, g in zip(ws, fmts, got):
        np.testing.assert_array_equal(g, qk.matmul(w, x, lhs_format=f))
    same = qk.matmul_many(ws[:1] + ws[3:], x, lhs_formats=quant.q4_0)
    np.testing.assert_array_equal(same[1], got[3])
    # numerics="ggml_cpu": the gemv of ggml's CPU activation records
    cpu = qk.matmul_many(ws[:1], x, lhs_formats=[quant.q4_0], numerics="ggml_cpu")[0]
    xq = qk.quantize(x.reshape(-1, 32), quant.q8_0, numerics="ggml_cpu")
    want = (qk.gemv(ws[0], xq, lhs_format=quant.q4_0, rhs_format=quant.q8_0) if not batch else
            qk.gemm(ws[0], xq.reshape(batch, -1, 34), lhs_format=quant.q4_0,
                    rhs_format=quant.q8_0))
    np.testing.assert_array_equal(cpu, want)


def test_matmul_many_errors():
    w = _weights(quant.q4_0, 4, 64, 0)
    with pytest.raises(ValueError, match="lhs_formats"):
        qk.matmul_many([w, w], np.zeros(64, np.float32), lhs_formats=[quant.q4_0])
    with pytest.raises(ValueError, match="x: expected shape"):
        qk.matmul_many([w], np.zeros(96, np.float32), lhs_formats=quant.q4_0)
    x = np.zeros(64, np.float32)
    x[40] = np.inf
    with pytest.raises(qk.QuantizationDomainError):
        qk.matmul_many([w], x, lhs_formats=quant.q4_0)


@pytest.mark.parametrize("fmt", [quant.q8_0, quant.q6_k], ids=lambda f: f.name)
def test_get_rows_equals_dequantize_of_the_rows(fmt):
    w = _weights(fmt, 7, 512, 1)
    ids = [3, 0, 6, 3]
    got = qk.get_rows(w, ids, fmt)
    assert got.shape == (4, 512) and got.dtype == np.float32
    for i, r in enumerate(ids):
        np.testing.assert_array_equal(got[i], qk.dequantize(w[r], fmt).reshape(-1))
    assert qk.get_rows(w, [], fmt).shape == (0, 512)
    with pytest.raises(IndexError):
        qk.get_rows(w, [7], fmt)
    with pytest.raises(ValueError):
        qk.get_rows(w[0], [0], fmt)
