"""IQ4_NL / IQ4_XS importance-weighted encoders (``quantize(..., imatrix=w)``) byte-identical to
ggml's ``ggml_quantize_chunk`` with the same weights (``quantize_row_iq4_nl_impl``, ntry = 7).
Bigger sweeps: ``slow``."""

import pytest

import numba_qk as qk
from imatrix_cases import compare, rows, weights

NAMES = ["iq4_nl", "iq4_xs"]


@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ggml(name):
    fmt = getattr(qk.quant, name)
    x = rows(512, 2, 27)
    for w in weights(512, 28):
        compare(fmt, x, w)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ggml_sweep(name):
    fmt = getattr(qk.quant, name)
    for seed, n in ((1, 256), (2, 1024), (3, 4096)):
        x = rows(n, 16, seed)
        for w in weights(n, seed + 100):
            compare(fmt, x, w)
        compare(fmt, x, None)
