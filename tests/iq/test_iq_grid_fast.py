"""The grid IQ formats' fast paths (SIMD record values and 8-lane tiles of
``numba_qk.kernels.simd.iq_grid``) equal the portable definitions bit for bit: the SIMD record
sums against the readable loops on any bytes (both vector variants), and dot / gemv / gemm /
matmul against ``dot_<t>_q8_k_portable`` on random bytes (NaN/inf scales), extreme records and
ggml-like data, over 8-row tiles with leftover rows, 8-activation tiles with leftover
activations and several record blocks, G = 0, 1, strided, read-only and unaligned inputs.

IQ4_XS is not a grid format but runs through the same SIMD record values, tiles and panel gemm
(``simd.iq_grid._units_iq4_xs``), so it is checked here too, against ``kernels.iq.iq4``'s
portable loops.

IQ3_XXS and IQ4_XS (record value, 8-row and 8-activation tiles) for the products and IQ3_S,
IQ4_XS for the record sums in the default run (each case compiles its own specialisations); the
others under ``-m slow``."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels.iq import grid, iq4
from numba_qk.kernels.simd import base as _simd
from numba_qk.testing.asserts import assert_same_f32
from records import panel_reference, random_iq_grid, unaligned
from subsets import default_few

NAMES = ["iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_xs"]


def _module(name):
    """The kernel module of format ``name``: its portable loops and its dot / gemv / gemm."""
    return iq4 if name == "iq4_xs" else grid
needs_simd = pytest.mark.skipif(not _simd.HAVE_AVX2, reason="no AVX2/F16C on this machine")


@needs_simd
@pytest.mark.parametrize("name", default_few(NAMES, {"iq3_s", "iq4_xs"}))
def test_simd_sums_equal_the_loops_on_any_bytes(name, rng):
    """S of the vector decoder (with and without VNNI, where the machine has it) == the
    portable record_sums on random bytes, all-0xFF / all-0x00 weights and extreme activations
    (xq = -128 everywhere, 127 everywhere)."""
    from numba import njit

    from numba_qk.kernels.simd import iq_grid as sg

    sums = getattr(_module(name), f"record_sums_{name}_q8_k")
    variants = ["avx2"] + (["avx2vnni"] if _simd.HAVE_VNNI else [])
    w = rng.integers(0, 256, (512, getattr(qk.quant, name).block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (512, 292), dtype=np.uint8)
    w[:32] = 0xFF
    w[32:64] = 0
    x[:16, 4:260] = 0x80
    x[16:48, 4:260] = 0x7F
    x[100:140, 4:260] = 0x80      # meets the 0xFF and 0x00 weights' neighbours too
    w[120:130] = 0xFF
    for var in variants:
        simd = getattr(sg, f"{name}_q8_k_s_{var}")

        @njit(cache=False)
        def both(w, x, out):
            for b in range(w.shape[0]):
                out[b, 0] = simd(w, b * w.strides[0], x, b * x.strides[0])
                out[b, 1] = sums(w, b, x, b)

        out = np.zeros((512, 2), np.int64)
        both(w, x, out)
        assert (out[:, 0] == out[:, 1]).all(), (var, np.flatnonzero(out[:, 0] != out[:, 1])[:5])


@pytest.mark.skipif(not (_simd.HAVE_VNNI and _simd.HAVE_AVX512),
                    reason="no AVX-512 VNNI panel gemm")
@pytest.mark.parametrize("name", default_few(["iq3_s", "iq4_xs"], {"iq3_s"}))
def test_wide_panel_decode_writes_the_unit_decode_bytes(name, rng):
    """The format's 512-bit panel decode (``iq_grid._DECODE_WIDE``) writes the bytes of the
    unit-by-unit decode (q, scales, dc, C) for random records (NaN/inf scales included), all-0xFF
    and all-0x00 ones, read from an unaligned read-only copy."""
    from numba import njit

    from numba_qk.kernels.simd import iq_grid as sg

    if name not in sg._DECODE_WIDE:
        pytest.skip(f"no 512-bit {name} decode on this machine")
    kf = sg.FORMATS[name]
    unit = sg.decode_intrinsic(lambda b, wb, db: sg._decode_into(b, kf, wb, db, False))
    wide = sg.decode_intrinsic(lambda b, wb, db: sg._decode_into(b, kf, wb, db, True))
    dec_bytes = sg.DEC_BYTES

    @njit(cache=False)
    def both(w, out):
        for r in range(w.shape[0]):
            unit(w, r * w.strides[0], out, 2 * r * dec_bytes)
            wide(w, r * w.strides[0], out, (2 * r + 1) * dec_bytes)

    w = rng.integers(0, 256, (600, getattr(qk.quant, name).block_bytes), dtype=np.uint8)
    w[:8] = 0xFF
    w[8:16] = 0
    w = unaligned(w)
    w.flags.writeable = False
    out = np.zeros((600, 2, dec_bytes), np.uint8)
    both(w, out.reshape(-1))
    bad = np.flatnonzero((out[:, 0] != out[:, 1]).any(axis=1))
    assert bad.size == 0, (bad[:5], np.flatnonzero(out[bad[0], 0] != out[bad[0], 1])[:8])


@pytest.mark.skipif(not _simd.HAVE_AVX512, reason="no AVX-512")
@pytest.mark.parametrize("name", default_few(["iq2_xxs", "iq2_xs", "iq2_s"], {"iq2_s"}))
def test_vbmi_iq2_units_equal_the_load_units(name, rng):
    """IQ2's grid entries looked up as 2-bit codes with AVX-512 VBMI (``iq_grid._iq2_codes``,
    wide units of 64 elements, ``_pair64``) give the S and the panel-decode bytes of the
    per-entry table loads (``_units_<t>_loads``) on random records, all-0xFF and all-0x00 ones
    and extreme activations, read from unaligned read-only copies."""
    from numba import njit

    from numba_qk.kernels.simd import base as sb
    from numba_qk.kernels.simd import iq_grid as sg

    if not sg.HAVE_VBMI:
        pytest.skip("no AVX-512 VBMI on this machine")
    kf = sg.FORMATS[name]
    loads = sg._Fmt(kf.fmt, kf.c, getattr(sg, f"_units_{name}_loads"), kf.d_at, kf.sub)
    vbmi = sg._Fmt(kf.fmt, kf.c, getattr(sg, f"_units_{name}_vbmi"), kf.d_at, kf.sub)

    def sums(f):
        return sb.record_intrinsic(False, lambda b, wb, xb: sg._sums(
            b, sg.Ops(b, False, _simd.HAVE_VNNI), f, [wb], [xb]))

    def decode(f):
        return sg.decode_intrinsic(lambda b, wb, db: sg._decode_into(b, f, wb, db, False))

    s_loads, s_vbmi, d_loads, d_vbmi = sums(loads), sums(vbmi), decode(loads), decode(vbmi)
    dec_bytes = sg.DEC_BYTES

    @njit(cache=False)
    def both(w, x, out, dec):
        for r in range(w.shape[0]):
            out[r, 0] = s_loads(w, r * w.strides[0], x, r * x.strides[0])
            out[r, 1] = s_vbmi(w, r * w.strides[0], x, r * x.strides[0])
            d_loads(w, r * w.strides[0], dec, 2 * r * dec_bytes)
            d_vbmi(w, r * w.strides[0], dec, (2 * r + 1) * dec_bytes)

    w = rng.integers(0, 256, (600, getattr(qk.quant, name).block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (600, 292), dtype=np.uint8)
    w[:8] = 0xFF
    w[8:16] = 0
    x[:12, 4:260] = 0x80
    x[12:24, 4:260] = 0x7F
    w, x = unaligned(w), unaligned(x)
    w.flags.writeable = x.flags.writeable = False
    out = np.zeros((600, 2), np.int64)
    dec = np.zeros((600, 2, dec_bytes), np.uint8)
    both(w, x, out, dec.reshape(-1))
    assert (out[:, 0] == out[:, 1]).all(), np.flatnonzero(out[:, 0] != out[:, 1])[:5]
    assert (out[:, 0] != 0).any()
    bad = np.flatnonzero((dec[:, 0] != dec[:, 1]).any(axis=1))
    assert bad.size == 0, (bad[:5], np.flatnonzero(dec[bad[0], 0] != dec[bad[0], 1])[:8])


@pytest.mark.parametrize("name", default_few(NAMES, {"iq4_xs"}))  # value + tiles
def test_fast_paths_equal_the_portable_definition(name, rng):
    """dot, gemv (2 tiles of 8 rows + 3 leftover rows), gemm (2 tiles of 8 activations + 3
    leftover, 2 record blocks; with AVX-512 VNNI a full and a partial tile of 16 activations
    over 2 bands of 8 decoded rows + 3, and 2 activations through gemv) and matmul equal the
    portable dot of every (row, activation) pair bit for bit; also on strided (the loops),
    read-only and unaligned inputs and G = 0, 1."""
    fmt = getattr(qk.quant, name)
    t = name
    port = getattr(_module(name), f"dot_{t}_q8_k_portable")
    dot, gemv, gemm = (getattr(_module(name), f"{k}_{t}_q8_k") for k in ("dot", "gemv", "gemm"))
    rows, batch = 19, 19
    for g in (10, 1, 0):
        w = random_iq_grid(rng, fmt, rows * g).reshape(rows, g, fmt.block_bytes)
        x = rng.integers(0, 256, (batch, g, 292), dtype=np.uint8)
        x[:, :, 3] &= 0x3F                                   # finite ds ...
        x[4, :, 0:4] = rng.integers(0, 256, (g, 4), dtype=np.uint8)   # ... but one: any
        if g:
            w[5] = rng.integers(0, 256, w[5].shape, dtype=np.uint8)    # NaN/inf scales too
            w[7] = 0xFF
            w[8] = 0
            w[15] = 0xFF                                               # a tile's last row
            w[18] = 0xFF                                               # a leftover row
            x[0, :, 4:260] = 0x80                                      # xq = -128
            x[7, :, 4:260] = 0x7F
            x[9] = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32),
                               format=qk.quant.q8_k)
        want = np.array([[port(w[r], x[a]) for r in range(rows)] for a in range(batch)],
                        np.float32)
        got_dot = np.array([[dot(w[r], x[a]) for r in range(rows)] for a in range(batch)],
                           np.float32)
        got_gemv = np.empty((batch, rows), np.float32)
        for a in range(batch):
            gemv(w, x[a], got_gemv[a])
        got_gemm = np.empty((batch, rows), np.float32)
        gemm(w, x, got_gemm)
        got_gemm2 = np.empty((batch, rows), np.float32)
        gemm(w, x[:2], got_gemm2[:2])
        gemm(w, x[2:], got_gemm2[2:])
        ws = np.zeros((rows, g, 2 * fmt.block_bytes), np.uint8)      # strided bytes
        ws[:, :, ::2] = w
        ws = ws[:, :, ::2]
        wro, xro = w.copy(), x.copy()
        wro.flags.writeable = xro.flags.writeable = False
        wu, xu = unaligned(w), unaligned(x)
        got = {"dot": got_dot, "gemv": got_gemv, "gemm": got_gemm, "gemm 2 + 17": got_gemm2}
        for label, ww, xx in (("strided", ws, xro), ("read-only", wro, xro),
                              ("unaligned", wu, xu)):
            got[f"{label} gemm"] = np.empty((batch, rows), np.float32)
            gemm(ww, xx, got[f"{label} gemm"])
            got[f"{label} gemv"] = np.empty((batch, rows), np.float32)
            for a in range(batch):
                gemv(ww, xx[a], got[f"{label} gemv"][a])
        with np.errstate(all="ignore"):
            for label, arr in got.items():
                assert_same_f32(arr, want, f"{name} G={g} {label}")
    # gemm over several decoded-row panels (203 rows of 10 records: 12 bands of 8 per panel
    # with the microtiles; and a partial last band), 65, 49, 33 and 20 activations (5, 4, 3 and
    # 2 tiles of 16; 1 lane used in the last tile of 65, 49 and 33)
    rows2, g = 203, 10
    w = random_iq_grid(rng, fmt, rows2 * g).reshape(rows2, g, fmt.block_bytes)
    x = rng.integers(0, 256, (65, g, 292), dtype=np.uint8)
    x[:, :, 3] &= 0x3F
    # the reference: the gemv (equal to the portable dot above) per activation, and the
    # portable dot itself on every 7th row of every 4th activation
    want = panel_reference(gemv, port, w, x, f"{name} 203 rows")
    for batch in (65, 49, 33, 20):
        got_gemm = np.empty((batch, rows2), np.float32)
        gemm(w, x[:batch], got_gemm)
        with np.errstate(all="ignore"):
            assert_same_f32(got_gemm, want[:batch], f"{name} gemm 203 rows x {batch}")
    # matmul: activations quantized to Q8_K first, then the same dots (one 8-activation tile
    # + 1 leftover, 2 tiles of 8 rows + 3)
    g = 3
    w = random_iq_grid(rng, fmt, rows * g).reshape(rows, g, fmt.block_bytes)
    a = rng.standard_normal((9, 256 * g)).astype(np.float32)
    xq = qk.quantize(a.reshape(-1, 256), format=qk.quant.q8_k).reshape(9, g, 292)
    want = np.array([[port(w[r], xq[k]) for r in range(rows)] for k in range(9)], np.float32)
    assert_same_f32(np.asarray(qk.matmul(w, a, lhs_format=fmt, threads=1), np.float32), want,
                    f"{name} matmul")
    assert_same_f32(np.asarray(qk.matmul(w, a[2], lhs_format=fmt, threads=1), np.float32),
                    want[2], f"{name} matvec")
