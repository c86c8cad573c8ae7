"""Rounding helpers of the encoders: ``_round.c_int8`` (C's ``(int8_t)`` of an f32 on x86,
used by the legacy encoders) against the oracle in ``numba_qk.testing.reference.core``, scalar and inside a
loop that LLVM may vectorize (NaN, +-inf, +-0, the int32 range edges, the int8 wrap-arounds,
random bit patterns); ``_encode_lanes.f16_bits`` (F16C) against the software f32 -> f16."""

import numpy as np
from numba import njit

from numba_qk.kernels.kquants.encode_lanes import f16_bits
from numba_qk.kernels._round import c_int8, f32_to_f16_bits
from numba_qk.testing.reference.core import _c_int8


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


@njit
def _f16_loop(v, out, hw):
    for i in range(v.size):
        out[i] = f16_bits(v[i]) if hw else f32_to_f16_bits(v[i])


def test_f16_bits_equal_software_conversion(rng):
    """``_encode_lanes.f16_bits`` (F16C's vcvtps2ph where available) gives the bits of the
    software RNE conversion: the overflow edge 65520, subnormal f16 results and their ties,
    f32 subnormals, +-0, +-inf, quiet and signalling NaNs with payloads, random bit patterns."""
    edges = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001,
                      0x7F800001, 0xFF812345, 0x7FBFFFFF, 0x477FE000, 0x477FEFFF, 0x477FF000,
                      0x477FF001, 0xC77FF000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000,
                      0x387FC000, 0x38800000, 0x387FE000, 0x00000001, 0x807FFFFF, 0x3F800000,
                      0x3F801000, 0x3F803000, 0x3F802000], np.uint32)
    rnd = rng.integers(0, 2 ** 32, 200000, dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0x33000000 - 5, 0x47800000 + 5, 200000, dtype=np.uint64).astype(np.uint32)
    v = np.concatenate([edges, rnd, near]).view(np.float32)
    got = np.empty(v.size, np.uint16)
    want = np.empty(v.size, np.uint16)
    _f16_loop(v, got, True)
    _f16_loop(v, want, False)
    assert (got == want).all(), v[got != want][:5].view(np.uint32)
    fin = np.isfinite(v) | np.isinf(v)
    with np.errstate(over="ignore"):  # numpy's RNE cast agrees on every non-NaN
        assert (want[fin] == v[fin].astype(np.float16).view(np.uint16)).all()
