"""The K-quants' importance-weighted encoders (``quantize(..., imatrix=w)``) byte-identical to
ggml's ``ggml_quantize_chunk`` with the same weights (``quantize_row_q*_K_impl``), and the
unweighted path identical to ``ggml_quantize_chunk`` without weights.  Bigger sweeps: ``slow``."""

import numpy as np
import pytest

import numba_qk as qk
from imatrix_cases import compare, rows, weights
from subsets import default_few

NAMES = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]


@pytest.mark.parametrize("name", default_few(NAMES, {"q3_k", "q4_k"}))  # the rest: -m slow
def test_imatrix_is_ggml(name):
    """Q4_K / Q5_K search two blocks at a time: rows of 3 blocks, 33 blocks in all (pairs
    across rows and a last block alone); the others rows of 2."""
    fmt = getattr(qk.quant, name)
    n = 768 if name in ("q4_k", "q5_k") else 512
    x = rows(n, 2, 7)
    for w in weights(n, 8):
        compare(fmt, x, w)
    compare(fmt, x, None)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ggml_sweep(name):
    fmt = getattr(qk.quant, name)
    for seed, n in ((1, 256), (2, 1024), (3, 2304)):
        x = rows(n, 16, seed)
        for w in weights(n, seed + 100):
            compare(fmt, x, w)
        compare(fmt, x, None)
