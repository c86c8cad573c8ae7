"""The legacy formats' gemm with AVX-512 VNNI (``legacy/kernels._vnni_gemm``: activations laid
out once per call in tiles of 16 lanes, one weight record against 16 or 32 activations per
``legacy_acts_vnni``): every output equals the portable loop bit for bit (NaN == NaN) on any
bytes and at the quants' extremes, for batches of one tile, two tiles and a tile left over."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.simd import base as _simd
from numba_qk.testing.asserts import assert_same_f32
from records import legacy_extremes
from subsets import default_few

needs_vnni = pytest.mark.skipif(not legacy.HAVE_LEGACY_VNNI, reason="no AVX-512 VNNI here")
NAMES = [f.name.lower() for f in legacy.WEIGHT_FORMATS]


def _portable(f, w, x):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    code = legacy.CODES[f]
    for a in range(x.shape[0]):
        legacy.gemv_loop(code, w, x[a], out[a])
    return out


@needs_vnni
@pytest.mark.parametrize("name", default_few(NAMES, {"q4_1", "q5_0"}))
def test_vnni_gemm_equals_portable_loop(name, rng):
    f = getattr(qk.quant, name)
    act = qk.activation_format(f)
    rows, g = 11, 3
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    we, xe = legacy_extremes(f, act, rows, g, rng)
    w[: rows // 2] = we[: rows // 2]
    for batch in (2, 16, 35):   # one tile (padded lanes), exactly one, two tiles and one more
        x = rng.integers(0, 256, (batch, g, act.block_bytes), dtype=np.uint8)
        x[::3] = xe
        got = qk.gemm(w, x, lhs_format=f, rhs_format=act)
        assert_same_f32(got, _portable(f, w, x))
