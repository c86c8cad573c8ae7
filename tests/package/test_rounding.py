"""The named rounding helpers (kernels/_round.py) against independent definitions."""

import numpy as np
import pytest

from numba_qk.kernels._round import f32_to_f16_bits


@pytest.fixture(scope="module")
def f16_bits_of():
    from numba import njit

    @njit(cache=False)
    def run(x, out):
        for i in range(x.shape[0]):
            out[i] = f32_to_f16_bits(x[i])

    def f(x):
        out = np.empty(x.shape[0], np.uint16)
        run(np.ascontiguousarray(x, np.float32), out)
        return out
    return f


def _numpy_bits(x):
    with np.errstate(all="ignore"):
        return x.astype(np.float16).view(np.uint16)


def test_every_rounding_boundary_matches_numpy(f16_bits_of):
    """For every finite f16 h: the midpoints to its neighbours (ties to even), one f32 ulp on
    either side of each midpoint, and h itself -- both signs; plus overflow and underflow."""
    h = np.arange(0, 0x7C00, dtype=np.uint32)  # every non-negative finite f16
    lo = h.astype(np.uint16).view(np.float16).astype(np.float32)
    hi = (h + 1).astype(np.uint16).view(np.float16).astype(np.float32)  # 0x7C00 -> inf
    mid = ((lo.astype(np.float64) + np.where(np.isinf(hi), 65520.0, hi)) / 2).astype(np.float32)
    assert ((mid.astype(np.float64) * 2) == (lo.astype(np.float64)
                                            + np.where(np.isinf(hi), 65520.0, hi))).all()
    below = np.nextafter(mid, np.float32(0))
    above = np.nextafter(mid, np.float32(np.inf))
    x = np.concatenate([lo, mid, below, above])
    x = np.concatenate([x, -x, np.float32([65504, 65519.996, 65520, 1e5, 3.4e38, np.inf,
                                           2.0 ** -25, 2.0 ** -26, 1e-45, 0.0, -0.0])])
    got, want = f16_bits_of(x), _numpy_bits(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ; first x={x[bad[0]]!r}: {got[bad[0]]:#06x} vs {want[bad[0]]:#06x}"


def test_dense_sample_of_all_f32_patterns_matches_numpy(f16_bits_of):
    """Every 4099th f32 bit pattern (~1M values over all exponents and both signs) and every
    pattern around the f16 range; NaNs must give a quiet NaN with the sign kept."""
    bits = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)
    dense = np.arange(0x33000000 - 2 ** 16, 0x33000000 + 2 ** 16, dtype=np.uint32)  # 2**-25
    bits = np.concatenate([bits, dense, dense | np.uint32(0x80000000)])
    x = bits.view(np.float32)
    got = f16_bits_of(x)
    nan = np.isnan(x)
    want = _numpy_bits(x)
    assert (got[~nan] == want[~nan]).all(), np.flatnonzero(got[~nan] != want[~nan])[:5]
    g = got[nan]
    assert ((g & 0x7E00) == 0x7E00).all()  # quiet NaN
    assert ((g >> 15) == (bits[nan] >> 31)).all()  # sign kept
