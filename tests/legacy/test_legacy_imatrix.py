"""The legacy formats' importance-weighted encoders (``quantize(..., imatrix=w)``) byte-identical
to ggml's ``ggml_quantize_chunk`` with the same weights (``quantize_row_q{4,5}_{0,1}_impl``: whole-
row statistics), Q8_0 ignoring the weights as ggml does, the unweighted path identical to ggml
without weights; the public checks of ``imatrix``.  Bigger sweeps: ``slow``."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.errors import QuantizationDomainError
from imatrix_cases import compare, rows, weights
from subsets import default_few

NAMES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]


@pytest.mark.parametrize("name", default_few(NAMES, {"q4_0", "q5_1"}))  # the rest: -m slow
def test_imatrix_is_ggml(name):
    fmt = getattr(qk.quant, name)
    x = rows(128, 2, 17)
    for w in weights(128, 18):
        compare(fmt, x, w)
    compare(fmt, x, None)


def test_rows_matter():
    """Q4_0 weighs a block by the sum of x^2 over its whole row: the same blocks as rows of 64
    and of 128 give different records (both ggml's)."""
    x = rows(128, 2, 19)
    w = weights(128, 20)[0]
    compare(qk.quant.q4_0, x, w)
    compare(qk.quant.q4_0, x.reshape(-1, 64), w[:64])


def test_imatrix_checks_leave_out_untouched():
    x = rows(64, 1, 21)[:4]
    fmt = qk.quant.q4_0
    out = np.full((8, fmt.block_bytes), 7, np.uint8)
    w = np.ones(64, np.float32)
    cases = [
        (np.ones(64, np.complex64), TypeError, "imatrix: expected float32 weights"),
        (np.full(64, 0.1, np.float64), TypeError, "float32 would round"),
        (np.ones((2, 32), np.float32), ValueError, "1-D"),
        (np.ones(48, np.float32), ValueError, "positive multiple of 32"),
        (np.ones(96, np.float32), ValueError, "whole rows of 96"),
        (np.where(np.arange(64) == 5, -1.0, 1.0).astype(np.float32), ValueError, r"imatrix\[5\]"),
        (np.where(np.arange(64) == 9, np.nan, 1.0).astype(np.float32), ValueError, r"imatrix\[9\]"),
    ]
    for bad, err, msg in cases:
        with pytest.raises(err, match=msg):
            qk.quantize(x.reshape(-1, 32), fmt, imatrix=bad, out=out)
        assert (out == 7).all()
    with pytest.raises(ValueError, match="Q8_K takes no importance matrix"):
        qk.quantize(np.ones((1, 256), np.float32), qk.quant.q8_k, imatrix=np.ones(256, np.float32))
    y = x.reshape(-1, 32).copy()
    y[5, 3] = np.inf
    with pytest.raises(QuantizationDomainError):
        qk.quantize(y, fmt, imatrix=w, out=out)
    assert (out == 7).all()
    # exact conversions are accepted: float64 / float16 / int values that are float32 values
    want = qk.quantize(x.reshape(-1, 32), fmt, imatrix=w)
    for ok in (w.astype(np.float64), w.astype(np.float16), np.ones(64, np.int64), [1.0] * 64):
        assert (qk.quantize(x.reshape(-1, 32), fmt, imatrix=ok) == want).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ggml_sweep(name):
    fmt = getattr(qk.quant, name)
    for seed, n in ((1, 32), (2, 256), (3, 4096)):
        x = rows(n, 16, seed)
        for w in weights(n, seed + 100):
            compare(fmt, x, w)
        compare(fmt, x, None)
