"""A batch's gemm shared with standing helpers by claimed bands of 8 weight rows (decision 052:
``Helpers.batch_product`` of a panel gemm's ``band_job``, ``_pool.band_caller_of``) -- the same
bits as the format's serial gemm, whoever ran which band, for one or several weights in one
product; the legacy formats' panel and the driver's."""

import numpy as np
import pytest

from numba_qk import _registry, _threads, ops, quant
from numba_qk.formats import activation_format
from numba_qk.kernels import _pool
from subsets import default_few

# Q4_0 and Q8_0 (the tiny models' formats: their band kernels compile for tests/models anyway)
# and Q6_K (the driver's panel) by default, the other legacy and panel formats under -m slow
FORMATS = default_few((quant.q4_0, quant.q4_1, quant.q5_0, quant.q5_1, quant.q8_0, quant.q6_k,
                       quant.q5_k, quant.q3_k, quant.q2_k, quant.iq4_xs),
                      {"Q4_0", "Q8_0", "Q6_K"}, name=lambda f: f.name)


def _job(fmt):
    return getattr(_registry.BY_FORMAT[fmt].gemm, "band_job", None)


needs_bands = pytest.mark.skipif(_job(quant.q4_0) is None or not _pool.HAVE_ATOMICS,
                                 reason="no panel gemm (AVX-512 VNNI) or compiled atomics here")


def _records(fmt, rows, k, rng, scale=1.0):
    bs = fmt.block_size
    values = (rng.standard_normal((rows * k // bs, bs)) * scale).astype(np.float32)
    return ops.quantize(values, format=fmt).reshape(rows, k // bs, -1)


def test_claims_from_both_ends_take_every_band_once():
    words = np.zeros(8, np.int64)
    words[0] = (3 << 32) | 11          # bands 3 .. 10 left
    got = []
    for i in range(10):
        got.append(int((_pool.claim_front if i % 3 else _pool.claim_back)(words, 0)))
    assert sorted(b for b in got if b >= 0) == list(range(3, 11))
    assert got.count(-1) == 2 and got[-2:] == [-1, -1]
    assert got[0] == 10 and got[1] == 3      # the back from the top, the front from the bottom


@needs_bands
@pytest.mark.parametrize("helpers", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_band_products_give_the_serial_gemm_bits(fmt, helpers):
    """``Helpers.batch_product`` of a panel gemm (its ``band_job``): several weights (rows not
    multiples of 8, one of them shorter than a band) in one product, batches of 1 to 33
    activations, 20 products each: every output equals the format's serial gemm bit for bit."""
    rng = np.random.default_rng(7)
    k = 2 * 256
    ws = [_records(fmt, rows, k, rng) for rows in (45, 5, 64)]
    d_at = fmt.field("d").start                                   # a NaN scale in one record
    ws[2][3, 1, d_at:d_at + 2] = 0xFF
    gemm = _registry.BY_FORMAT[fmt].gemm
    group = _threads.Helpers(helpers)
    split = group.batch_product(gemm, ws)
    assert group.jobs == [_job(fmt)]                           # the bands, not row chunks
    act = activation_format(fmt)
    try:
        for t in (1, 2, 5, 17, 33):
            x = _records(act, t, k, rng, scale=3.0)
            want = []
            for w in ws:
                o = np.empty((t, w.shape[0]), np.float32)
                gemm(w, x, o)
                want.append(o.ravel())
            want = np.concatenate(want)
            for _ in range(20):
                out = np.full(t * sum(w.shape[0] for w in ws), 7.0, np.float32)
                split(x, out)
                np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    finally:
        group.close()


@needs_bands
def test_only_panel_formats_have_band_jobs():
    assert _job(quant.q4_k) is None and _job(quant.mxfp4) is None
    assert _job(quant.q4_1) is _job(quant.q4_1)                  # one kernel a format
