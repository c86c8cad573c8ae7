"""K-quant fast paths (SIMD decoders of _simd_kquants, unpack-once loops) equal the portable record definitions bit for
bit: dot, gemv and gemm against ``dot_<t>_q8_k_portable`` on random bytes (NaN/inf/subnormal
scales), extreme records (all 0x00 / all 0xFF) and quantized data, G = 0, 1, 3."""

import importlib

import numpy as np
import pytest

import numba_qk as qk
from records import panel_reference
from subsets import default_few

from numba_qk.testing.asserts import assert_same_f32

FAST = [n for n in ("q2_k", "q3_k", "q5_k", "q6_k")
        if hasattr(importlib.import_module(f"numba_qk.kernels.kquants.{n}"), f"dot_{n}_q8_k_portable")]


@pytest.mark.parametrize("name", default_few(FAST, {"q6_k"}))  # the others: -m slow
def test_fast_paths_equal_the_portable_definition(name, rng):
    mod = importlib.import_module(f"numba_qk.kernels.kquants.{name}")
    fmt = getattr(qk.quant, name)
    dot, port = getattr(mod, f"dot_{name}_q8_k"), getattr(mod, f"dot_{name}_q8_k_portable")
    gemv, gemm = getattr(mod, f"gemv_{name}_q8_k"), getattr(mod, f"gemm_{name}_q8_k")
    for g in (0, 1, 3):
        w = rng.integers(0, 256, (7, g, fmt.block_bytes), dtype=np.uint8)
        x = rng.integers(0, 256, (5, g, 292), dtype=np.uint8)
        if g:
            w[0, :] = 0xFF
            w[1, :] = 0
            x[0, :, 4:260] = 0x80      # q = -128 everywhere
            x[1, :, 4:260] = 0x7F
            w[2] = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32), format=fmt)
            x[2] = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32),
                               format=qk.quant.q8_k)
        x[:, :, 0:4] = np.frombuffer(np.float32(0.5).tobytes(), np.uint8)  # finite ds
        x[4, :, 0:4] = rng.integers(0, 256, (g, 4), dtype=np.uint8)       # any ds
        want = np.array([[port(w[r], x[a]) for r in range(7)] for a in range(5)], np.float32)
        got_dot = np.array([[dot(w[r], x[a]) for r in range(7)] for a in range(5)], np.float32)
        got_gemv = np.empty((5, 7), np.float32)
        for a in range(5):
            gemv(w, x[a], got_gemv[a])
        got_gemm = np.empty((5, 7), np.float32)
        gemm(w, x, got_gemm)
        # strided bytes (the fast paths fall back to the unpacking loops) and read-only input
        ws = np.zeros((7, g, 2 * fmt.block_bytes), np.uint8)
        ws[:, :, ::2] = w
        ws = ws[:, :, ::2]
        xro = x.copy()
        xro.flags.writeable = False
        got_s = np.empty((5, 7), np.float32)
        for a in range(5):
            gemv(ws, xro[a], got_s[a])
        got_sm = np.empty((5, 7), np.float32)
        gemm(ws, xro, got_sm)
        with np.errstate(all="ignore"):
            for got in (got_dot, got_gemv, got_gemm, got_s, got_sm):
                assert_same_f32(got, want, f"{name} G={g}")


@pytest.mark.parametrize("name", ["q2_k", "q3_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("width", ["avx2", "avx2vnni", "avx512", "avx512vnni"])
def test_simd_decoders_equal_the_loops_on_any_bytes(name, width, rng):
    """S of each vector decoder (both widths, with and without VNNI) == the portable
    record_sums on random bytes, all-0xFF / all-0x00 weights and extreme activations."""
    from numba import njit

    from numba_qk.kernels.simd import base as _simd
    from numba_qk.kernels.simd import kquants as sk

    if (not _simd.HAVE_AVX2 or (width.startswith("avx512") and not _simd.HAVE_AVX512)
            or (width.endswith("vnni") and not _simd.HAVE_VNNI)):
        pytest.skip(f"no {width} on this machine")
    mod = importlib.import_module(f"numba_qk.kernels.kquants.{name}")
    fmt = getattr(qk.quant, name)
    simd = getattr(sk, f"{name}_q8_k_s_{width}")
    sums = getattr(mod, f"record_sums_{name}_q8_k")
    with_t = name in ("q2_k", "q5_k")

    @njit(cache=False)
    def both(w, x, out):
        for b in range(w.shape[0]):
            out[b, 0] = simd(w, b * w.strides[0], x, b * x.strides[0])
            out[b, 1] = sums(w, b, x, b)[0] if with_t else sums(w, b, x, b)

    w = rng.integers(0, 256, (512, fmt.block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (512, 292), dtype=np.uint8)
    w[:32] = 0xFF
    w[32:64] = 0
    x[:16, 4:260] = 0x80
    x[16:48, 4:260] = 0x7F
    out = np.zeros((512, 2), np.int64)
    both(w, x, out)
    assert (out[:, 0] == out[:, 1]).all(), np.flatnonzero(out[:, 0] != out[:, 1])[:5]


@pytest.mark.parametrize("name", default_few(FAST, {"q2_k", "q5_k"}))  # q3_k, q6_k: panel below
def test_tiles_equal_the_portable_definition(name, rng):
    """gemv over 8-row tiles (prefetching the next tile: 2 full tiles + 3 leftover rows) and
    gemm over 8-activation tiles (+ 3 leftover activations, 2 record blocks) equal the
    portable dot of every (row, activation) pair bit for bit, on random bytes with finite and
    arbitrary ds, quantized records and extreme records at tile edges."""
    mod = importlib.import_module(f"numba_qk.kernels.kquants.{name}")
    fmt = getattr(qk.quant, name)
    port = getattr(mod, f"dot_{name}_q8_k_portable")
    gemv, gemm = getattr(mod, f"gemv_{name}_q8_k"), getattr(mod, f"gemm_{name}_q8_k")
    rows, batch, g = 19, 11, 10
    w = rng.integers(0, 256, (rows, g, fmt.block_bytes), dtype=np.uint8)
    x = rng.integers(0, 256, (batch, g, 292), dtype=np.uint8)
    w[7] = 0xFF
    w[8] = 0
    w[16] = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32), format=fmt)
    x[0, :, 4:260] = 0x80
    x[7, :, 4:260] = 0x7F
    x[8] = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32), format=qk.quant.q8_k)
    x[1:6, :, 0:4] = np.frombuffer(np.float32(0.25).tobytes(), np.uint8)
    want = np.array([[port(w[r], x[a]) for r in range(rows)] for a in range(batch)], np.float32)
    got_gemv = np.empty((batch, rows), np.float32)
    for a in range(batch):
        gemv(w, x[a], got_gemv[a])
    got_gemm = np.empty((batch, rows), np.float32)
    gemm(w, x, got_gemm)
    with np.errstate(all="ignore"):
        assert_same_f32(got_gemv, want, f"{name} gemv tiles")
        assert_same_f32(got_gemm, want, f"{name} gemm tiles")


@pytest.mark.parametrize("name", default_few(FAST, {"q3_k", "q6_k"}))  # q2_k, q5_k: tiles above
def test_panel_gemm_equals_the_portable_definition(name, rng):
    """Batches of 3 or more go through the panel gemm (records decoded once per call, 8 rows x
    16 activations per microtile, kernels/drive.py ``panel_gemm``; Q2_K and Q5_K with the min
    term from the stored bsums): over several decoded panels (203 rows of 10 records: 12 bands
    of 8 per panel, a partial last band), 65, 49, 33, 20 and 3 activations (5, 4, 3, 2 and 1
    tiles of 16, lanes unused),
    random bytes (any bsum, -128 / 127 quants, NaN / inf / subnormal scales), every output
    equals the portable dot bit for bit; batches of 1 and 2 and strided records take the
    driver's gemm, with the same bits."""
    mod = importlib.import_module(f"numba_qk.kernels.kquants.{name}")
    fmt = getattr(qk.quant, name)
    port = getattr(mod, f"dot_{name}_q8_k_portable")
    gemm = getattr(mod, f"gemm_{name}_q8_k")
    rows, g = 203, 10
    w = rng.integers(0, 256, (rows, g, fmt.block_bytes), dtype=np.uint8)
    w[:40] = qk.quantize(rng.standard_normal((40 * g, 256)).astype(np.float32),
                         format=fmt).reshape(40, g, -1)
    x = rng.integers(0, 256, (65, g, 292), dtype=np.uint8)
    x[:, :, 3] &= 0x3F                           # mostly finite ds
    x[0, :, 4:260] = 0x80
    x[1, :, 4:260] = 0x7F
    x[48, :, 4:260] = 0x80                       # the first lane of the fourth tile
    # the reference: the driver's gemv row by row (equal to the portable dot: the tests above),
    # and the portable dot itself on every 7th row
    gemv = getattr(mod, f"gemv_{name}_q8_k")
    want = panel_reference(gemv, port, w, x, name)
    for batch in (65, 49, 33, 20, 3, 2, 1):
        got = np.full((batch, rows), np.nan, np.float32)
        gemm(w, x[:batch], got)
        with np.errstate(all="ignore"):
            assert_same_f32(got, want[:batch], f"{name} gemm {rows} rows x {batch}")
    ws = np.zeros((rows, g, 2 * fmt.block_bytes), np.uint8)[:, :, ::2]   # strided records
    ws[...] = w
    got = np.empty((5, rows), np.float32)
    gemm(ws, x[:5], got)
    with np.errstate(all="ignore"):
        assert_same_f32(got, want[:5], f"{name} gemm strided")
