"""``_round.c_int8`` (C's ``(int8_t)`` of an f32 on x86, used by the legacy encoders) against
the oracle in ``numba_qk.reference``, scalar and inside a loop that LLVM may vectorize: NaN,
+-inf, +-0, the int32 range edges, the int8 wrap-arounds, and random bit patterns."""

import numpy as np
from numba import njit

from numba_qk.kernels._round import c_int8
from numba_qk.reference import _c_int8


@njit
def _loop(v, out):
    for i in range(v.size):
        out[i] = c_int8(v[i])


@njit
def _one(t):
    return c_int8(t)


def test_c_int8_matches_oracle(rng):
    edges = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 0.99999994, -0.99999994,
             127.0, 127.9, 128.0, 255.5, 256.0, -128.0, -128.5, -129.0, -255.9, 1e9, -1e9,
             2.0 ** 31, -(2.0 ** 31), 2147483520.0, -2147483520.0, -2147483904.0, 1e38,
             -3.4e38, 1e-45, -1e-45, 15.5, 16.4999, 8.5, 31.5]
    rnd = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    small = rng.uniform(-70000, 70000, 20000)
    v = np.concatenate([np.array(edges, np.float32), rnd, small.astype(np.float32)])
    want = np.array([_c_int8(t) for t in v], np.int32)
    got = np.empty(v.size, np.int32)
    _loop(v, got)
    assert (got == want).all(), v[got != want][:10]
    assert all(_one(np.float32(t)) == _c_int8(np.float32(t)) for t in edges)
