"""``numba_qk.repack``: 8-row interleaved Q4_0 / IQ4_NL and 16-row Q4_K weights give the same bits as
the plain records through ``gemv`` / ``gemm`` / ``matmul`` -- random bytes (NaN/inf/subnormal
scales), adversarial extremes, every remainder of the tile and of the 4-record trip (G = 1
included), G = 0, strided / unaligned / read-only inputs, threads, batches -- and the portable
tile loop (targets without AVX-512 VNNI) as well.  The kernels' Q8_0 tiles (not offered by
``repack``) are tested at the kernel level."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref, iq as ref_iq
from numba_qk.kernels.kquants import dot
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.legacy import x8 as legacy_x8
from numba_qk.kernels.kquants import q4_k_x16
from numba_qk.kernels.iq import iq4
from numba_qk.kernels.legacy import layout as _LL

from numba_qk.testing.asserts import assert_same_f32
from records import extreme_q4_k_q8_k, legacy_extremes, random_q4_k, random_q8_k
from subsets import default_few

ALL_NAMES = ["q4_0", "iq4_nl", "q4_k"]
# IQ4_NL's tiles are Q4_0's kernel with a lookup: by default its bits (random bytes, extremes,
# the oracle); strides, threads, zero sizes and the Repacked checks under -m slow
NAMES = default_few(ALL_NAMES, {"q4_0", "q4_k"})
KERNEL_NAMES = ["q4_0", "q8_0", "iq4_nl", "q4_k"]
SHAPES = ((8, 1), (1, 1), (7, 3), (9, 1), (16, 4), (17, 5), (24, 6), (31, 7), (40, 2),
          (8, 9), (64, 33), (83, 2))


def _fmt(name):
    f = getattr(qk.quant, name)
    return f, qk.activation_format(f)


def _tile_rows(f):
    return q4_k_x16.X16_ROWS if f is qk.quant.q4_k else 8


def _loop(f, w, x):
    """The portable definition (the record loop of legacy.py / dot.py), one row at a time."""
    out = np.empty(w.shape[0], np.float32)
    if f is qk.quant.q4_k:
        dot._gemv_loop(np.ascontiguousarray(w), np.ascontiguousarray(x), out)
    elif f is qk.quant.iq4_nl:
        for r in range(w.shape[0]):
            out[r] = iq4.dot_iq4_nl_q8_0_portable(np.ascontiguousarray(w[r]),
                                                  np.ascontiguousarray(x))
    else:
        legacy.gemv_loop(_LL.CODES[f], np.ascontiguousarray(w), np.ascontiguousarray(x), out)
    return out


def _gemv(f, act, w, x, **kw):
    return qk.gemv(w, x, lhs_format=f, rhs_format=act, **kw)


def _portable_tiles(f, rp, x):
    """The tile loop used where the VNNI kernel is not available."""
    out = np.empty(_tile_rows(f) * rp.tiles.shape[0], np.float32)
    rec = np.empty((x.shape[0], f.block_bytes), np.uint8)
    if f is qk.quant.q4_k:
        q4_k_x16._tile_rows_portable(rp.tiles, np.ascontiguousarray(x), out, rec)
    elif f is qk.quant.iq4_nl:
        iq4.tiles_portable_iq4_nl_q8_0(rp.tiles, np.ascontiguousarray(x), out, rec)
    else:
        legacy_x8._tile_rows_portable(_LL.CODES[f], rp.tiles, np.ascontiguousarray(x), out, rec)
    return out


class _Tiles:
    """What ``repack`` returns, for any format the kernels take (Q8_0 included)."""

    def __init__(self, f, w):
        self.format, self.shape = f, w.shape
        self.tiles, self.tail = legacy_x8.repack_x8(_LL.CODES[f], w)

    def unpack(self):
        return legacy_x8.unpack_x8(_LL.CODES[self.format], self.tiles, self.tail,
                                   self.shape[1], self.shape[2])


def _repack_any(f, w):
    return qk.repack(w, f) if f in qk.REPACK_FORMATS else _Tiles(f, w)


def _gemv_any(f, act, rp, x):
    if isinstance(rp, qk.Repacked):
        return _gemv(f, act, rp, x)
    out = np.empty(rp.shape[0], np.float32)
    legacy_x8.gemv_x8(_LL.CODES[f], rp.tiles, rp.tail, np.ascontiguousarray(x), out)
    return out


@pytest.mark.parametrize("name", default_few(KERNEL_NAMES, {"q4_0", "iq4_nl", "q4_k"}))  # q8_0: slow
def test_random_bytes_every_tile_and_trip_remainder(name, rng):
    f, act = _fmt(name)
    for rows, g in SHAPES:
        w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
        x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
        rp = _repack_any(f, w)
        assert rp.shape == w.shape and (rp.unpack() == w).all()
        assert rp.tiles.size == 0 or (rp.tiles.ctypes.data % 64 == 0
                                      and rp.tiles.strides[0] % 64 == 0)
        want = _loop(f, w, x)
        assert_same_f32(_gemv_any(f, act, rp, x), want, f"{name} rows={rows} G={g}")
        r = _tile_rows(f) * (rows // _tile_rows(f))
        assert_same_f32(_portable_tiles(f, rp, x), want[:r], "portable tiles")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_matches_the_oracle_and_plain_gemv(name, rng):
    f, act = _fmt(name)
    rows, g = 20, 6
    n = f.block_size
    w = qk.quantize(rng.standard_normal((rows * g, n)).astype(np.float32),
                    format=f).reshape(rows, g, -1)
    x = qk.quantize(rng.standard_normal((g, n)).astype(np.float32), format=act)
    if f is qk.quant.q4_k:
        want = np.array([ref.quantized_dot(w[r], x) for r in range(rows)], np.float32)
    elif f is qk.quant.iq4_nl:
        want = np.array([ref_iq.dot_iq4_nl_q8_0(w[r], x) for r in range(rows)], np.float32)
    else:
        want = np.array([ref.legacy_dot(name.upper(), w[r], act.name, x) for r in range(rows)],
                        np.float32)
    got = _gemv(f, act, qk.repack(w, f), x)
    assert_same_f32(got, want)
    assert_same_f32(got, _gemv(f, act, w, x))


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_adversarial_extremes(name, rng):
    f, act = _fmt(name)
    if f is qk.quant.q4_k:
        _q4_k_extremes(f, act, rng)
        return
    for rows, g in ((16, 8), (24, 5), (8, 1)):
        w, x = legacy_extremes(f, act, rows, g, rng)
        rp = _repack_any(f, w)
        assert_same_f32(_gemv_any(f, act, rp, x), _loop(f, w, x), f"{name} extremes")
        assert_same_f32(_portable_tiles(f, rp, x), _loop(f, w, x), f"{name} portable")
    for wb, xb in ((0xFF, 0x80), (0x00, 0x80), (0x80, 0x80), (0xFF, 0x7F), (0x00, 0x7F)):
        w = np.full((8, 4, f.block_bytes), wb, np.uint8)
        x = np.full((4, act.block_bytes), xb, np.uint8)
        w[..., 0:2] = np.array([0x00, 0x3C], np.uint8)  # d = 1
        x[..., 0:2] = np.array([0x00, 0x3C], np.uint8)
        got = _gemv_any(f, act, _repack_any(f, w), x)
        assert_same_f32(got, _loop(f, w, x), f"{name} all {wb:#x} x {xb:#x}")
        if f is qk.quant.iq4_nl:
            assert_same_f32(got[0], ref_iq.dot_iq4_nl_q8_0(w[0], x))
        else:
            assert_same_f32(got[0], ref.legacy_dot(name.upper(), w[0], act.name, x))


def _q4_k_extremes(f, act, rng):
    """Q4_K: tests/records.py's extremes (all-0xFF records, max codes with zero scales, bsum at
    -32768 / 32767, +-0 / inf / NaN / subnormal d, dmin, ds), as 20 rows (one tile and a tail)
    and, rows stacked, as 2 full tiles; every byte pattern everywhere; T from the int16 pair
    sums (every one fits) and from the int32 ones (one does not)."""
    w, xs = extreme_q4_k_q8_k(rng)
    w2 = np.concatenate([w, w[::-1]])[:32]
    rp, rp2 = _repack_any(f, w), _repack_any(f, w2)
    for a in range(xs.shape[0]):
        assert_same_f32(_gemv_any(f, act, rp, xs[a]), _loop(f, w, xs[a]), f"extremes x[{a}]")
        assert_same_f32(_gemv_any(f, act, rp2, xs[a]), _loop(f, w2, xs[a]), f"2 tiles x[{a}]")
        assert_same_f32(_portable_tiles(f, rp, xs[a]), _loop(f, w, xs[a])[:16], "portable")
    for wb in (0x00, 0x0F, 0xF0, 0xFF, 0x80):
        for xb in (0x80, 0x7F, 0x00, 0xFF):
            w = np.full((16, 3, f.block_bytes), wb, np.uint8)
            w[..., 0:4] = np.array([0x00, 0x3C, 0x00, 0x38], np.uint8)   # d = 1, dmin = 0.5
            x = np.full((3, act.block_bytes), xb, np.uint8)
            x[..., 0:4] = np.array([0x00, 0x00, 0x80, 0x3F], np.uint8)   # ds = 1
            assert_same_f32(_gemv_any(f, act, _repack_any(f, w), x), _loop(f, w, x),
                            f"all {wb:#x} x {xb:#x}")
    w = rng.integers(0, 256, (33, 4, f.block_bytes), dtype=np.uint8)
    rp = _repack_any(f, w)
    x = random_q8_k(rng, 4)                       # pair sums fit an int16: the int16 form
    assert_same_f32(_gemv_any(f, act, rp, x), _loop(f, w, x), "int16 pair sums")
    for pair in ((0x7FFF, 1), (-0x8000, -1), (0x7FFF, 0x7FFF), (-0x8000, -0x8000)):
        xo = x.copy()                              # one pair sum out of int16 range
        bs = xo[3, 260:292].view(np.int16)
        bs[10:12] = pair
        assert_same_f32(_gemv_any(f, act, rp, xo), _loop(f, w, xo), f"int32 pair sums {pair}")
    w = random_q4_k(rng, 48 * 5).reshape(48, 5, f.block_bytes)
    xq = random_q8_k(rng, 5)
    assert_same_f32(_gemv_any(f, act, _repack_any(f, w), xq), _loop(f, w, xq), "records.py")


def test_q4_k_both_read_plans(rng):
    """Q4_K tiles of at most ``_SMALL_BYTES`` are read as one run with software prefetch, larger
    ones as ``_STREAMS`` runs: both give the plain records' bits (random bytes, tiles at the
    boundary and one tile past it, a tail, int16 and int32 pair sums)."""
    f, act = _fmt("q4_k")
    g = 8
    at = q4_k_x16._SMALL_BYTES // (g * q4_k_x16.X16_BYTES)   # whole tiles in the small plan
    for tiles in (at, at + 1, at + 2):
        rows = 16 * tiles + 5
        w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
        rp = _repack_any(f, w)
        for x in (random_q8_k(rng, g), rng.integers(0, 256, (g, act.block_bytes), np.uint8)):
            assert_same_f32(_gemv_any(f, act, rp, x), _loop(f, w, x), f"{tiles} tiles")


@pytest.mark.parametrize("name", NAMES)
def test_strided_unaligned_readonly_inputs(name, rng):
    f, act = _fmt(name)
    rows, g = 27, 6
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
    want = _loop(f, w, x)
    w2 = np.zeros((2 * rows, 2 * g, f.block_bytes), np.uint8)
    w2[::2, ::2] = w
    assert_same_f32(_gemv(f, act, qk.repack(w2[::2, ::2], f), x), want, "strided weights")
    assert_same_f32(_gemv(f, act, qk.repack(w[::-1], f), x), want[::-1], "reversed rows")
    buf = np.zeros(x.nbytes * 2 + 1, np.uint8)
    xs = buf[1:1 + 2 * x.nbytes].reshape(2 * g, act.block_bytes)[::2]
    xs[...] = x
    rp = qk.repack(w, f)
    assert_same_f32(_gemv(f, act, rp, xs), want, "strided, unaligned activations")
    wr, xr = w.copy(), x.copy()
    wr.setflags(write=False)
    xr.setflags(write=False)
    assert_same_f32(_gemv(f, act, qk.repack(wr, f), xr), want, "read-only")
    assert not rp.tiles.flags.writeable and not rp.tail.flags.writeable
    out = np.zeros(2 * rows, np.float32)
    qk.gemv(rp, x, lhs_format=f, rhs_format=act, out=out[::2])
    assert_same_f32(out[::2], want, "strided out")


@pytest.mark.parametrize("name", NAMES)
def test_zero_blocks_and_zero_rows(name):
    f, act = _fmt(name)
    w = np.zeros((16, 0, f.block_bytes), np.uint8)
    x = np.zeros((0, act.block_bytes), np.uint8)
    assert_same_f32(_gemv(f, act, qk.repack(w, f), x), np.zeros(16, np.float32))
    w = np.zeros((0, 3, f.block_bytes), np.uint8)
    x = np.zeros((3, act.block_bytes), np.uint8)
    assert _gemv(f, act, qk.repack(w, f), x).shape == (0,)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("threads, rows", [(2, 75), (3, 75), (2, 64), (3, 5)])
def test_threads_gemm_and_matmul(name, threads, rows, rng):
    """Threaded gemv claims whole tiles in compiled code (tail rows on the caller first):
    with a tail, without one, and with no whole tile."""
    f, act = _fmt(name)
    g, batch = 5, 3
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    w[..., 0:2] = np.array([0x00, 0x2C], np.uint8)   # finite scales: matmul's numbers show
    if f is qk.quant.q4_k:
        w[..., 2:4] = np.array([0x00, 0x28], np.uint8)
    rp = qk.repack(w, f)
    x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
    assert_same_f32(_gemv(f, act, rp, x, threads=threads), _loop(f, w, x), "gemv threads")
    xb = rng.integers(0, 256, (batch, g, act.block_bytes), dtype=np.uint8)
    want = qk.gemm(w, xb, lhs_format=f, rhs_format=act)
    for t in (1, threads):
        assert_same_f32(qk.gemm(rp, xb, lhs_format=f, rhs_format=act, threads=t), want,
                        f"gemm threads={t}")
    v = rng.standard_normal((batch, g * f.block_size)).astype(np.float32)
    for t in (1, threads):
        assert_same_f32(qk.matmul(rp, v, lhs_format=f, threads=t),
                        qk.matmul(w, v, lhs_format=f), f"matmul batch threads={t}")
        assert_same_f32(qk.matmul(rp, v[1], lhs_format=f, threads=t),
                        qk.matmul(w, v[1], lhs_format=f), f"matmul threads={t}")


def test_errors(rng):
    f, act = _fmt("q4_0")
    w = rng.integers(0, 256, (8, 2, f.block_bytes), dtype=np.uint8)
    rp = qk.repack(w, f)
    with pytest.raises(ValueError, match="repacked as Q4_0"):
        qk.gemv(rp, np.zeros((2, 34), np.uint8), lhs_format=qk.quant.q5_0,
                rhs_format=qk.quant.q8_0)
    with pytest.raises(ValueError, match="same number of records"):
        qk.gemv(rp, np.zeros((3, 34), np.uint8), lhs_format=f, rhs_format=act)
    with pytest.raises(ValueError):
        qk.matmul(rp, np.zeros(96, np.float32), lhs_format=f)
    for other in (qk.quant.q4_1, qk.quant.q8_0, qk.quant.q5_k, qk.quant.q6_k, qk.quant.iq4_xs,
                  "q4_0"):
        with pytest.raises(TypeError, match="repack expects"):
            qk.repack(np.zeros((8, 2, 20), np.uint8), other)
    with pytest.raises(ValueError):
        qk.repack(np.zeros((8, 2, 20), np.uint8), f)
    assert "Q4_0" in repr(rp) and rp.nbytes >= w.nbytes
    rk = qk.repack(rng.integers(0, 256, (16, 2, 144), dtype=np.uint8), qk.quant.q4_k)
    with pytest.raises(ValueError, match="repacked as Q4_K"):
        qk.gemv(rk, np.zeros((2, 34), np.uint8), lhs_format=f, rhs_format=act)
    with pytest.raises(ValueError):
        qk.repack(np.zeros((16, 2, 143), np.uint8), qk.quant.q4_k)
    assert "Q4_K" in repr(rk) and rk.nbytes == 16 * 2 * 144


# each case compiles the kernels afresh in a subprocess (~25 s of CPU): all three under -m slow;
# the default run's other-ISA check is tests/package/test_parity.py's AVX2 subprocess
@pytest.mark.parametrize("env", [pytest.param({"NUMBA_QK_NO_VNNI": "1"}, marks=pytest.mark.slow),
                                 pytest.param({"NUMBA_QK_PORTABLE": "1"}, marks=pytest.mark.slow),
                                 pytest.param({"NUMBA_CPU_NAME": "haswell"},
                                              marks=pytest.mark.slow)],
                         ids=["no-vnni", "portable", "haswell"])
def test_without_the_vnni_kernel(env, tmp_path):
    """With the VNNI kernel switched off or compiled for an AVX2 CPU (what other CPUs run: the
    portable tile loop, the tail by the SIMD or portable single-row fold) the random-bytes and
    extremes tests again, in a fresh process with its own numba cache."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), **env)
    here = Path(__file__).resolve()
    e["PYTHONPATH"] = str(here.parents[2]) + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", str(here), "-k", "random_bytes or extremes",
                        "-m", "slow or not slow"],   # q8_0's random bytes case is slow-marked
                       env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "8 passed" in r.stdout, r.stdout[-500:]   # q4_0, q8_0, iq4_nl and q4_k, twice


# ----------------------------------------------------------------------------- a Repacked is trusted
# only after its parts are checked (issue 21, item 2: a reassigned shape made the tile loop read
# past the tiles -- SIGSEGV for Q4_K, NaNs for Q4_0)

def _rp_and_x(name, rng, rows=40, g=2):
    f, act = _fmt(name)
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    x = rng.standard_normal(g * f.block_size).astype(np.float32)
    return f, w, qk.repack(w, f), x


@pytest.mark.parametrize("name", NAMES)
def test_repacked_is_immutable_and_read_only(name, rng):
    f, w, rp, x = _rp_and_x(name, rng)
    with pytest.raises(AttributeError, match="immutable"):
        rp.shape = (16, 4096, f.block_bytes)          # the reproducer
    for attr in ("format", "tiles", "tail"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(rp, attr, getattr(rp, attr))
        with pytest.raises(AttributeError, match="immutable"):
            delattr(rp, attr)
    for arr in (rp.tiles, rp.tail):
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr.flags.writeable = True
    before = w.copy()
    w[...] = 0                                        # the plain records are not shared
    np.testing.assert_array_equal(rp.unpack(), before)
    assert w.flags.writeable                          # and stay the caller's, writable


@pytest.mark.parametrize("name", NAMES)
def test_products_check_a_forced_shape(name, rng):
    """Even a shape forced past __setattr__ never reaches a kernel."""
    f, act = _fmt(name)
    _, w, rp, x = _rp_and_x(name, rng)
    for shape in ((16, 4096, f.block_bytes), (40, 3, f.block_bytes), (41, 2, f.block_bytes),
                  (39, 2, f.block_bytes)):
        object.__setattr__(rp, "shape", shape)
        with pytest.raises(ValueError, match="does not match records of shape"):
            qk.matmul(rp, np.zeros(shape[1] * f.block_size, np.float32), lhs_format=f)
        with pytest.raises(ValueError, match="does not match records of shape"):
            qk.gemv(rp, np.zeros((shape[1], act.block_bytes), np.uint8), lhs_format=f,
                    rhs_format=act)
        with pytest.raises(ValueError, match="does not match records of shape"):
            qk.gemm(rp, np.zeros((2, shape[1], act.block_bytes), np.uint8), lhs_format=f,
                    rhs_format=act)


@pytest.mark.parametrize("name", NAMES)
def test_products_check_arrays_reshaped_in_place(name, rng):
    """numpy lets a read-only array's shape be reassigned in place: the products notice."""
    f, w, rp, x = _rp_and_x(name, rng, rows=32)
    rp.tiles.shape = (rp.tiles.shape[0] * 2, rp.tiles.shape[1] // 2)
    with pytest.raises(ValueError, match="tiles of shape"):
        qk.matmul(rp, x, lhs_format=f)


@pytest.mark.parametrize("name", NAMES)
def test_hand_built_repacked_is_checked(name, rng):
    f, w, rp, x = _rp_and_x(name, rng)
    want = qk.matmul(w, x, lhs_format=f)
    ok = qk.Repacked(f, rp.shape, rp.tiles, rp.tail)  # consistent parts: accepted, copied
    assert ok.tiles is not rp.tiles and not ok.tiles.flags.writeable
    assert_same_f32(qk.matmul(ok, x, lhs_format=f), want)
    tiles = np.array(rp.tiles)                        # a writable array of the caller's
    mine = qk.Repacked(f, rp.shape, tiles, rp.tail)
    tiles[...] = 0
    assert_same_f32(qk.matmul(mine, x, lhs_format=f), want)
    bad = [((f, rp.shape, rp.tiles, np.zeros((3, 2, f.block_bytes), np.uint8)), ValueError,
            "tail of shape"),
           ((f, rp.shape, rp.tiles[:1], rp.tail), ValueError, "tiles of shape"),
           ((f, (40, 2), rp.tiles, rp.tail), ValueError, "shape must be"),
           ((f, (40, 2, f.block_bytes + 1), rp.tiles, rp.tail), ValueError, "shape must be"),
           ((f, (40, "2", f.block_bytes), rp.tiles, rp.tail), TypeError, "shape must be"),
           ((f, rp.shape, rp.tiles.view(np.int8), rp.tail), TypeError, "uint8"),
           ((qk.quant.q8_0, rp.shape, rp.tiles, rp.tail), TypeError, "format must be")]
    for args, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            qk.Repacked(*args)


@pytest.mark.parametrize("name", NAMES)
def test_pickled_repacked_is_checked_and_read_only(name, rng):
    import copy
    import pickle

    f, w, rp, x = _rp_and_x(name, rng)
    want = qk.matmul(w, x, lhs_format=f)
    for back in (pickle.loads(pickle.dumps(rp)), copy.deepcopy(rp), copy.copy(rp)):
        assert type(back) is qk.Repacked and back.shape == rp.shape and back.format is f
        for arr in (back.tiles, back.tail):
            assert not arr.flags.writeable
            with pytest.raises(ValueError):
                arr.flags.writeable = True
        assert back.tiles.ctypes.data % 64 == 0
        assert_same_f32(qk.matmul(back, x, lhs_format=f), want)
    # a tampered pickle (the state of another shape) is refused on loading
    state = (None, {"format": f, "shape": (41, 2, f.block_bytes), "tiles": np.array(rp.tiles),
                    "tail": np.array(rp.tail)})
    with pytest.raises(ValueError, match="does not match records of shape"):
        qk.Repacked.__new__(qk.Repacked).__setstate__(state)


# A Repacked pickled before it became immutable (numba_qk 8fb6842: slots state
# ``(None, {...})``): 9 Q4_0 rows of G = 1, and the plain records they were made of.
_OLD_PICKLE = (
    "gASVAgIAAAAAAACMD251bWJhX3FrLnJlcGFja5SMCFJlcGFja2VklJOUKYGUTn2UKIwGZm9ybWF0lIwQbnVtYmFfcWsu"
    "Zm9ybWF0c5SMDl9sb29rdXBfZm9ybWF0lJOUjARxNF8wlIWUUpSMBXNoYXBllEsJSwFLEoeUjAV0aWxlc5SMFm51bXB5"
    "Ll9jb3JlLm11bHRpYXJyYXmUjAxfcmVjb25zdHJ1Y3SUk5SMBW51bXB5lIwHbmRhcnJheZSTlEsAhZRDAWKUh5RSlChL"
    "AUsBS8CGlGgSjAVkdHlwZZSTlIwCdTGUiYiHlFKUKEsDjAF8lE5OTkr/////Sv////9LAHSUYolDwAk1ALT4M320/DIL"
    "Mzg0gTYAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABIeSdFJ3VInLwLVNuIZJpY"
    "ZnecjXNFi2DNh47PebtXcFAr5HzJgV5/42qegWdlsHu8R4q7KwuWjniphoZ2tog2hnYKaYiFOGqIWC24c6512Na4jbt3"
    "x4eui6qH9sl59VZYh2d0LUb4VHiI1bqmVyPCc4taK39OJKJpOQ11uohYZJR0lGKMBHRhaWyUaBFoFEsAhZRoFoeUUpQo"
    "SwFLAUsBSxKHlGgeiUMSOjXbyHiomAqaiYVadnvEmIjUlHSUYnWGlGIu")
_OLD_RECORDS = (
    "CTVIeSdFJ3VInIZ2CmmIhThqALS8C1TbiGSaWIhYLbhzrnXY+DNmd5yNc0WLYNa4jbt3x4eufbTNh47PebtXcIuqh/bJ"
    "efVW/DJQK+R8yYFef1iHZ3QtRvhUCzPjap6BZ2Wwe3iI1bqmVyPCODS8R4q7KwuWjnOLWit/TiSigTZ4qYaGdraINmk5"
    "DXW6iFhkOjXbyHiomAqaiYVadnvEmIjU")


def test_pickles_from_before_immutability_still_load():
    import base64
    import pickle

    rp = pickle.loads(base64.b64decode(_OLD_PICKLE))
    w = np.frombuffer(base64.b64decode(_OLD_RECORDS), np.uint8).reshape(9, 1, 18)
    assert rp.shape == (9, 1, 18) and rp.format is qk.quant.q4_0
    assert not rp.tiles.flags.writeable
    np.testing.assert_array_equal(rp.unpack(), w)
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    assert_same_f32(qk.matmul(rp, x, lhs_format=qk.quant.q4_0),
                    qk.matmul(w, x, lhs_format=qk.quant.q4_0))
