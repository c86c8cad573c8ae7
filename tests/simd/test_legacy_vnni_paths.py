"""Legacy-format kernels added for numba_qk.models.  The gemm with AVX-512 VNNI
(``legacy/kernels._vnni_gemm``: up to 16 activations of Q4_0/Q4_1/Q8_0 by 16 weight rows in
the lanes, ``rows16_gemm``; from batch 3 the panel gemm ``_panel_gemm``, records decoded once
per call and 8 rows x 16 activations per microtile; batch 2 of Q5_0/Q5_1 the gemv per
activation): every output equals the portable loop bit for bit (NaN == NaN) on any bytes and
at the quants' extremes, for batches of one tile, two tiles and a tile left over, over several
panels, in every group of the rows16 kernel.
The Q4_1 and Q5_0 x8 tiles (``legacy/x8.py``, kernel level: ``repack`` offers Q4_0 only) give
the plain gemv's bits, and unpack to the records they came from."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels import drive
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.legacy import x8 as legacy_x8
from numba_qk.kernels.iq import iq4
from numba_qk.testing.asserts import assert_same_f32
from records import legacy_extremes
from subsets import default_few

needs_vnni = pytest.mark.skipif(not legacy.HAVE_LEGACY_VNNI, reason="no AVX-512 VNNI here")
NAMES = [f.name.lower() for f in legacy.WEIGHT_FORMATS]


def _portable(f, w, x):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    for a in range(x.shape[0]):
        if f is qk.quant.iq4_nl:
            for r in range(w.shape[0]):
                out[a, r] = iq4.dot_iq4_nl_q8_0_portable(np.ascontiguousarray(w[r]),
                                                         np.ascontiguousarray(x[a]))
        else:
            legacy.gemv_loop(legacy.CODES[f], w, x[a], out[a])
    return out


def _gemm(f):
    """The format's gemm entry point (IQ4_NL's lives in kernels/iq/iq4.py)."""
    return iq4.gemm_iq4_nl_q8_0 if f is qk.quant.iq4_nl else legacy.ENTRIES[f].gemm


def _adversarial(f, act, rows, g, batch, rng):
    """(w, x, the portable loop's out) for random records with the quants' extremes on every
    third row / fourth activation, scales in [0.5, 2) but on weight rows 0..2 and activation 0
    (any f16 there: inf, NaN, subnormal), so that most outputs are finite and the integer sums
    show through the float steps."""
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    we, xe = legacy_extremes(f, act, rows, g, rng)
    w[::3] = we[::3]
    x = rng.integers(0, 256, (batch, g, act.block_bytes), dtype=np.uint8)
    x[::4] = xe
    code = legacy.CODES.get(f, legacy.Q4_0)   # IQ4_NL has Q4_0's layout
    for at in (legacy.D_AT[code], legacy.M_AT[code]):
        if at >= 0:
            w[3:, :, at + 1] = 0x38 | (w[3:, :, at + 1] & 0x07)
    for at in (legacy.X_D_AT[code], legacy.X_S_AT[code]):
        if at >= 0:
            x[1:, :, at + 1] = 0x38 | (x[1:, :, at + 1] & 0x07)
    want = _portable(f, w, x)
    assert np.isfinite(want).mean() > 0.9
    return w, x, want


@needs_vnni
# Q5_0 by default (the register-decoded groups, the z * sum(x) correction); the tiny models
# of tests/models run Q4_0 and Q8_0 through this gemm too; every format under -m slow
@pytest.mark.parametrize("name", default_few(NAMES, {"q5_0"}))
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


@needs_vnni
# Q4_1 by default (nibbles, the min term); every format under -m slow
@pytest.mark.parametrize("name", default_few(NAMES, {"q4_1"}))
def test_panel_gemm_equals_portable_loop(name, rng, monkeypatch):
    """203 rows of 80 records over several decoded panels (12 bands of 8 rows per panel, a
    partial last band), 33 and 3 activations (tiles with lanes unused), random bytes with the
    quants' extremes and non-finite scales: the portable loop's bits."""
    f = getattr(qk.quant, name)
    act = qk.activation_format(f)
    rows, g = 203, 80
    per_panel = drive._PANEL_BYTES // (8 * g * legacy.LDEC_BYTES)
    assert 0 < per_panel < (rows + 7) // 8 // 2            # two full panels and a partial one
    w, x, want = _adversarial(f, act, rows, g, 33, rng)
    for batch in (33, 3):
        got = np.full((batch, rows), np.nan, np.float32)
        legacy.ENTRIES[f].gemm(w, x[:batch], got)
        assert_same_f32(got, want[:batch])




@needs_vnni
# IQ4_NL under -m slow: by default tests/conformance/test_fast_paths.py runs its gemm (batches
# through this kernel included) against the portable loops on any bytes
@pytest.mark.parametrize("name", default_few(["q4_0", "q4_1", "q8_0", "iq4_nl"], {"q8_0"}))
def test_rows16_gemm_equals_portable_loop(name, rng):
    """Batches 2..16 of Q4_0/Q4_1/Q8_0/IQ4_NL go through ``rows16_gemm`` (16 rows in the lanes,
    records read in place, activations in groups of 8, 4, 2, 1; the rows past the last 16 by
    the driver): 53 rows (3 bands and 5 more), contiguous and strided records, the quants'
    extremes, non-finite scales on a few rows: the portable loop's bits."""
    f = getattr(qk.quant, name)
    act = qk.activation_format(f)
    rows, g = 53, 7
    w, x, want = _adversarial(f, act, rows, g, 16, rng)
    ws = np.zeros((rows, g, 2 * f.block_bytes), np.uint8)[:, :, ::2]    # strided records
    ws[...] = w
    for batch in (16, 15, 6, 3, 2):                # every group of 8, 4, 2 and 1
        for weights in (w, ws):
            got = np.full((batch, rows), np.nan, np.float32)
            _gemm(f)(weights, x[:batch], got)
            assert_same_f32(got, want[:batch])


@pytest.mark.parametrize("name", default_few(["q4_1", "q5_0"], {"q5_0"}))
def test_x8_tiles_equal_the_plain_gemv(name, rng):
    f = getattr(qk.quant, name)
    act = qk.activation_format(f)
    code = legacy.CODES[f]
    for rows, g in ((8, 1), (19, 5), (40, 9)):   # tail rows, remainders of the 8-record trip
        w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
        we, xe = legacy_extremes(f, act, rows, g, rng)
        w[::2] = we[::2]
        tiles, tail = legacy_x8.repack_x8(code, w)
        np.testing.assert_array_equal(legacy_x8.unpack_x8(code, tiles, tail, g, f.block_bytes), w)
        for x in (rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8), xe):
            out = np.empty(rows, np.float32)
            legacy_x8.GEMV_X8[code](tiles, tail, x, out)
            assert_same_f32(out, qk.gemv(w, x, lhs_format=f, rhs_format=act))
            rec = np.empty((g, f.block_bytes), np.uint8)
            port = np.empty(8 * tiles.shape[0], np.float32)
            legacy_x8._tile_rows_portable(code, tiles, x, port, rec)
            assert_same_f32(port, out[:8 * tiles.shape[0]])


def test_x8_tile_prefetch_level_follows_the_target_cpu():
    """The x8 gemv prefetches its tiles into L1 only where that was measured faster (AMD Zen 5
    and later, by the LLVM CPU name numba compiles for, which is part of numba's cache key);
    into L2 elsewhere."""
    l1 = legacy_x8._l1_prefetch
    assert l1("znver5") and l1("znver6") and l1("znver10")
    assert not any(l1(c) for c in ("znver4", "znver3", "znver", "znverx", "skylake-avx512",
                                   "sapphirerapids", "haswell", ""))
    assert legacy_x8.PREFETCH_LOCALITY == (3 if l1(legacy_x8._target_cpu()) else 2)
