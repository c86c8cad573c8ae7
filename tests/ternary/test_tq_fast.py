"""TQ1_0 / TQ2_0 fast paths (SIMD record values and 8-lane tiles of
``numba_qk.kernels.simd.ternary``) equal the portable definitions bit for bit: the SIMD record
sums of both arrangements (rows: the gemv tile and the record value; acts: the gemm tile)
against the readable loops on any bytes, every vector variant the machine runs, and dot /
gemv / gemm / matmul against ``dot_tq*_q8_k_portable`` on random bytes (NaN/inf scales),
extreme records, over 8-row tiles with leftover rows, 8-activation tiles with leftover
activations and several record blocks, G = 0, 1, strided, read-only and unaligned inputs.

Default run: the record sums of both formats with the AVX2 and the widest variant (the default
run's gemv/gemm == dot of tests/conformance covers the products' tiles); the products against the
portable definition under ``-m slow`` (each case compiles its own specialisations)."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels.simd import base as _simd
from numba_qk.kernels.ternary import tq
from numba_qk.testing.asserts import assert_same_f32
from records import before_a_guard_page, carrier_views, products_on
from subsets import default_few, simd_variant_runs, variant_cases

NAMES = ["tq1_0", "tq2_0"]
needs_simd = pytest.mark.skipif(not _simd.HAVE_AVX2, reason="no AVX2/F16C on this machine")
_RUNS = simd_variant_runs()


@needs_simd
@pytest.mark.parametrize("case", variant_cases(NAMES))
def test_simd_sums_equal_the_loops_on_any_bytes(case, rng):
    """S of both arrangements of the vector decoder == the portable record_sum on random bytes,
    every byte value in every weight position (the digit rule ``(q >= 86) + (q >= 171)`` for
    all 256 bytes and powers of 3), all-0xFF / all-0x00 weights and extreme activations
    (xq = -128 everywhere, 127 everywhere)."""
    from numba import njit

    from numba_qk.kernels.simd import ternary as st

    name, var = case
    if not _RUNS[var]:
        pytest.skip(f"{var} is not available on this machine")
    nbytes = getattr(qk.quant, name).block_bytes
    sums = getattr(tq, f"record_sum_{name}_q8_k")
    rows_s = getattr(st, f"{name}_q8_k_s_{var}")
    acts_s = getattr(st, f"{name}_q8_k_s_acts_{var}")
    w = rng.integers(0, 256, (768, nbytes), dtype=np.uint8)
    x = rng.integers(0, 256, (768, 292), dtype=np.uint8)
    w[:32] = 0xFF
    w[32:64] = 0
    x[:16, 4:260] = 0x80
    x[16:48, 4:260] = 0x7F
    x[100:140, 4:260] = 0x80      # meets the 0xFF and 0x00 weights' neighbours too
    w[120:130] = 0xFF
    k = np.arange(256)
    w[512:, :nbytes - 2] = (k[:, None] + 37 * np.arange(nbytes - 2)[None, :]) % 256
    x[512:640, 4:260] = 0x80

    @njit(cache=False)
    def three(w, x, out):
        for b in range(w.shape[0]):
            out[b, 0] = rows_s(w, b * w.strides[0], x, b * x.strides[0])
            out[b, 1] = acts_s(w, b * w.strides[0], x, b * x.strides[0])
            out[b, 2] = sums(w, b, x, b)

    out = np.zeros((768, 3), np.int64)
    three(w, x, out)
    for col, label in ((0, "rows"), (1, "acts")):
        bad = np.flatnonzero(out[:, col] != out[:, 2])
        assert bad.size == 0, (label, bad[:5])


def test_digit_rule_of_the_vector_decoder():
    """The vector decoder's TQ1_0 digit ``(b >= 86) + (b >= 171)`` is ggml's ``(b * 3) >> 8``
    for every byte ``b`` (and ``b = (u8)(q * 3^n)`` takes every byte value: 3 is odd)."""
    b = np.arange(256)
    assert np.array_equal((b >= 86).astype(int) + (b >= 171), (b * 3) >> 8)
    for n in range(5):
        assert len(set((b * 3 ** n) % 256)) == 256


def _records(rng, fmt, n):
    """``n`` random records with finite f16 scales d in [1e-3, 1e-2]."""
    rec = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    rec[:, -2:] = rng.uniform(1e-3, 1e-2, n).astype("<f2").view(np.uint8).reshape(n, 2)
    return rec


# carriers: "combined" passes one strided, read-only, unaligned view of the weights (one compiled
# specialisation of gemv / gemm for all three properties); "each" passes the three separately
# (three specialisations each: -m slow)
@pytest.mark.parametrize("case", default_few(
    [(n, c) for n in NAMES for c in ("combined", "each")], set(),
    lambda nc: f"{nc[0]}-{nc[1]}"))
def test_fast_paths_equal_the_portable_definition(case, rng):
    """dot, gemv (2 tiles of 8 rows + 3 leftover rows), gemm (1 tile of 8 activations + 3
    leftover, 2 record blocks) and matmul equal the portable dot of every (row, activation)
    pair bit for bit; also on strided (the loops), read-only and unaligned inputs and G = 0, 1."""
    name, carriers = case
    fmt = getattr(qk.quant, name)
    port = getattr(tq, f"dot_{name}_q8_k_portable")
    dot, gemv, gemm = (getattr(tq, f"{k}_{name}_q8_k") for k in ("dot", "gemv", "gemm"))
    rows, batch = 19, 11
    for g in (10, 1, 0):
        w = _records(rng, fmt, rows * g).reshape(rows, g, fmt.block_bytes)
        x = rng.integers(0, 256, (batch, g, 292), dtype=np.uint8)
        x[:, :, 3] &= 0x3F                                   # finite ds ...
        x[4, :, 0:4] = rng.integers(0, 256, (g, 4), dtype=np.uint8)   # ... but one: any
        if g:
            w[5] = rng.integers(0, 256, w[5].shape, dtype=np.uint8)    # NaN/inf scales too
            w[7] = 0xFF
            w[8] = 0
            w[15] = 0xFF                                               # a tile's last row
            w[18] = 0xFF                                               # a leftover row
            w[9, :, -2:] = np.array([0x7C00], "<u2").view(np.uint8)    # d = inf
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
        got = {"dot": got_dot, "gemv": got_gemv, "gemm": got_gemm}
        got.update(products_on(carrier_views(w, x, carriers), gemv, gemm))
        with np.errstate(all="ignore"):
            for label, arr in got.items():
                assert_same_f32(arr, want, f"{name} G={g} {label}")
    # matmul: activations quantized to Q8_K first, then the same dots (one 8-activation tile
    # + 1 leftover, 2 tiles of 8 rows + 3); the weights end where an unreadable page begins
    # (a load past the last record would crash the process)
    g = 3
    w = before_a_guard_page(rows * g * fmt.block_bytes).reshape(rows, g, fmt.block_bytes)
    w[...] = _records(rng, fmt, rows * g).reshape(rows, g, fmt.block_bytes)
    a = rng.standard_normal((9, 256 * g)).astype(np.float32)
    xq = qk.quantize(a.reshape(-1, 256), format=qk.quant.q8_k).reshape(9, g, 292)
    want = np.array([[port(w[r], xq[k]) for r in range(rows)] for k in range(9)], np.float32)
    assert_same_f32(np.asarray(qk.matmul(w, a, lhs_format=fmt, threads=1), np.float32), want,
                    f"{name} matmul")
    assert_same_f32(np.asarray(qk.matmul(w, a[2], lhs_format=fmt, threads=1), np.float32),
                    want[2], f"{name} matvec")
