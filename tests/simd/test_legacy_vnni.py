"""The AVX-512 VNNI legacy gemv (8 rows x 4 records per intrinsic call, vpdpbusd, gathered
scales) equals the portable loop bit for bit: random bytes (NaN/inf/subnormal scales included),
adversarial extremes of every field, every remainder of the 8-row tile and of the 4-record trip,
strided, unaligned and read-only inputs, G = 0, and the per-trip variants the benchmark races."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref
from numba_qk.formats import legacy as legacy_family
from numba_qk._registry import WEIGHTS
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.legacy import layout as _LL

from numba_qk.testing.asserts import assert_same_f32
from records import legacy_extremes
from subsets import default_few

NAMES = [f.name.lower() for f in legacy_family.FORMATS if f in WEIGHTS]
needs_vnni = pytest.mark.skipif(not legacy.HAVE_LEGACY_VNNI,
                                reason="no AVX-512 VNNI: the kernel is not used here")


def _fmt(name):
    f = getattr(qk.quant, name)
    return f, qk.activation_format(f)


def _loop(f, w, x):
    """The portable definition (the record loop of legacy.py), one row at a time."""
    out = np.empty(w.shape[0], np.float32)
    legacy.gemv_loop(_LL.CODES[f], np.ascontiguousarray(w), np.ascontiguousarray(x), out)
    return out


def _gemv(f, act, w, x):
    return qk.gemv(w, x, lhs_format=f, rhs_format=act, threads=1)


@pytest.mark.parametrize("name", NAMES)
def test_random_bytes_every_tile_and_trip_remainder(name, rng):
    f, act = _fmt(name)
    for rows, g in ((8, 4), (17, 5), (24, 6), (31, 7), (16, 9), (9, 1), (7, 3), (40, 2)):
        w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
        x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
        assert_same_f32(_gemv(f, act, w, x), _loop(f, w, x), f"{name} rows={rows} G={g}")


@pytest.mark.parametrize("name", NAMES)
def test_matches_the_oracle(name, rng):
    f, act = _fmt(name)
    rows, g = 16, 6
    w = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32),
                    format=f).reshape(rows, g, -1)
    x = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
    want = np.array([ref.legacy_dot(name.upper(), w[r], act.name, x) for r in range(rows)],
                    np.float32)
    assert_same_f32(_gemv(f, act, w, x), want)


@pytest.mark.parametrize("name", NAMES)
def test_adversarial_extremes(name, rng):
    f, act = _fmt(name)
    for rows, g in ((16, 8), (24, 5)):
        w, x = legacy_extremes(f, act, rows, g, rng)
        assert_same_f32(_gemv(f, act, w, x), _loop(f, w, x), f"{name} extremes")
    # the largest |S|: every weight and activation quant at the extreme of its range
    for wb, xb in ((0xFF, 0x80), (0x00, 0x80), (0x80, 0x80), (0xFF, 0x7F), (0x00, 0x7F)):
        w = np.full((8, 4, f.block_bytes), wb, np.uint8)
        x = np.full((4, act.block_bytes), xb, np.uint8)
        w[..., 0:4] = np.array([0x00, 0x3C, 0x00, 0x3C], np.uint8)  # d = 1 (m = 1)
        x[..., 0:4] = np.array([0x00, 0x3C, 0x00, 0x3C], np.uint8)
        got = _gemv(f, act, w, x)
        assert_same_f32(got, _loop(f, w, x), f"{name} all {wb:#x} x {xb:#x}")
        assert_same_f32(got[0], ref.legacy_dot(name.upper(), w[0], act.name, x))


@pytest.mark.parametrize("name", default_few(NAMES, {"q4_0", "q4_1"}))  # the others: -m slow
def test_strided_unaligned_readonly(name, rng):
    f, act = _fmt(name)
    rows, g = 24, 6
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
    want = _loop(f, w, x)
    # every other row (row stride doubled: the VNNI path), reversed rows (negative stride)
    w2 = np.zeros((2 * rows, g, f.block_bytes), np.uint8)
    w2[::2] = w
    assert_same_f32(_gemv(f, act, w2[::2], x), want, "row-strided")
    assert_same_f32(_gemv(f, act, w[::-1], x), want[::-1], "reversed rows")
    # records not contiguous (record stride doubled: the pmaddwd tile loop)
    w3 = np.zeros((rows, 2 * g, f.block_bytes), np.uint8)
    w3[:, ::2] = w
    assert_same_f32(_gemv(f, act, w3[:, ::2], x), want, "record-strided")
    # unaligned: both arrays start one byte into a buffer
    buf = np.zeros(w.nbytes + 1, np.uint8)
    wu = buf[1:].reshape(w.shape)
    wu[...] = w
    xbuf = np.zeros(x.nbytes + 1, np.uint8)
    xu = xbuf[1:].reshape(x.shape)
    xu[...] = x
    assert_same_f32(_gemv(f, act, wu, xu), want, "unaligned")
    # read-only
    wr, xr = w.copy(), x.copy()
    wr.setflags(write=False)
    xr.setflags(write=False)
    assert_same_f32(_gemv(f, act, wr, xr), want, "read-only")


@pytest.mark.parametrize("name", NAMES)
def test_zero_blocks(name):
    f, act = _fmt(name)
    w = np.zeros((16, 0, f.block_bytes), np.uint8)
    x = np.zeros((0, act.block_bytes), np.uint8)
    assert_same_f32(_gemv(f, act, w, x), np.zeros(16, np.float32))


@needs_vnni
@pytest.mark.parametrize("name", ["q4_0", "q5_1", "q8_0"])
def test_trip_and_scale_load_variants(name, rng):
    """The variants bench/experiments/legacy_vnni_ab.py races (2 or 6 records per call; the f16 scales by
    per-lane inserts instead of vpgatherdd) give the same bits."""
    f, act = _fmt(name)
    code = _LL.CODES[f]
    rows, g = 24, 13
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
    want = _loop(f, w, x)
    for trip, gather in ((2, False), (6, True)):
        out = np.empty(rows, np.float32)
        legacy._vnni_gemv_trip(code, w, x, out, trip, gather)
        assert_same_f32(out, want, f"{name} trip={trip} gather={gather}")
