"""Q1_0 / Q2_0 fast paths (SIMD record values and 8-row gemv tiles of
``numba_qk.kernels.simd.lowbit``) equal the portable definitions bit for bit: the SIMD record
value of every vector variant the machine runs against ``record_value_q*_0_q8_0`` on any bytes
(NaN/inf/subnormal scales, every byte value in every weight position, extreme quants), and dot
/ gemv / gemm / matmul against ``dot_q*_0_q8_0_portable`` on random bytes, over 8-row tiles
with leftover rows, G = 0, 1, strided (weights, and activation records that are not
consecutive: the portable loops), read-only and unaligned inputs, and weights and activations
that end where an unreadable page begins.

Default run: the record values of both formats with the AVX2 and the widest variant, and the
products at the end of a guarded page (the specialisations the conformance run compiles anyway);
the other variants, the products on every carrier and the values and guarded-page products
again compiled for an AVX2 CPU (Haswell, in a subprocess) under ``-m slow`` (each case compiles
its own specialisations)."""

import os

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels.lowbit import q1q2
from numba_qk.kernels.simd import base as _simd
from numba_qk.testing.asserts import assert_same_f32
from records import before_a_guard_page, carrier_views, products_on
from subsets import default_few, simd_variant_runs, variant_cases

NAMES = ["q1_0", "q2_0"]
SPAN = {"q1_0": 4, "q2_0": 2}
X_BYTES = 34
needs_simd = pytest.mark.skipif(not _simd.HAVE_AVX2, reason="no AVX2/F16C on this machine")
_RUNS = simd_variant_runs()


@needs_simd
@pytest.mark.parametrize("case", variant_cases(NAMES))
def test_simd_values_equal_the_portable_value_on_any_bytes(case, rng):
    """v of the vector variant == the portable record value, bits compared (NaN matches NaN,
    as everywhere: LLVM may swap an add's operands, and x86 returns the first NaN): random
    bytes (any f16 scales: inf, NaN, subnormal), every byte value in every weight position,
    all-0xFF / all-0x00 weights, quants -128 / 127 everywhere, and sums of the largest
    magnitude (+-32 * 128 per sub-record, its scales 1.0)."""
    from numba import njit

    from numba_qk.kernels.simd import lowbit as sl

    name, var = case
    if not _RUNS[var]:
        pytest.skip(f"{var} is not available on this machine")
    span = SPAN[name]
    value = getattr(q1q2, f"record_value_{name}_q8_0")
    fast = getattr(sl, f"{name}_q8_0_value_{var}")
    g = 1024
    w = rng.integers(0, 256, (g, 18), dtype=np.uint8)
    x = rng.integers(0, 256, (g, span, X_BYTES), dtype=np.uint8)
    w[:32, 2:] = 0xFF
    w[32:64, 2:] = 0
    x[:16, :, 2:] = 0x80
    x[16:48, :, 2:] = 0x7F
    x[100:140, :, 2:] = 0x80          # meets the 0xFF and 0x00 weights' neighbours too
    w[120:130, 2:] = 0xFF
    k = np.arange(256)
    w[512:768, 2:] = (k[:, None] + 37 * np.arange(16)[None, :]) % 256
    x[512:640, :, 2:] = 0x80
    # the largest |S_k|: Q1_0 all signs one way, Q2_0 codes 0 (t = -1) or 3 (t = 2)
    one = np.array([0x3C00], "<u2").view(np.uint8)
    for b, (wb, xb) in enumerate(((0xFF, 0x80), (0x00, 0x80), (0xFF, 0x7F), (0x00, 0x7F))):
        w[800 + b, 2:], x[800 + b, :, 2:] = wb, xb
        w[800 + b, :2], x[800 + b, :, :2] = one, one

    @njit(cache=False)
    def both(w, x, xr, out):
        for b in range(w.shape[0]):
            out[b, 0] = fast(w, b * w.strides[0], x, b * x.strides[0])
            out[b, 1] = value(w, b, xr, b)

    out = np.zeros((g, 2), np.float32)
    with np.errstate(all="ignore"):
        both(w, x, x.reshape(-1, X_BYTES), out)
    assert_same_f32(out[:, 0], out[:, 1], f"{name} {var}")
    assert np.isnan(out[:, 1]).any() and np.isfinite(out[:, 1]).sum() > g // 2


def _records(rng, n):
    """``n`` random Q1_0 / Q2_0 records with finite f16 scales d in [1e-3, 1e-2]."""
    rec = rng.integers(0, 256, (n, 18), dtype=np.uint8)
    rec[:, :2] = rng.uniform(1e-3, 1e-2, n).astype("<f2").view(np.uint8).reshape(n, 2)
    return rec


def _activations(rng, batch, gx):
    x = rng.integers(0, 256, (batch, gx, X_BYTES), dtype=np.uint8)
    x[:, :, 1] &= 0x3B                                              # finite scales ...
    x[min(4, batch - 1), :, :2] = rng.integers(0, 256, (gx, 2), dtype=np.uint8)   # ... but one
    return x


def _portable(name, w, x):
    port = getattr(q1q2, f"dot_{name}_q8_0_portable")
    return np.array([[port(w[r], x[a]) for r in range(w.shape[0])] for a in range(x.shape[0])],
                    np.float32)


@needs_simd
@pytest.mark.parametrize("name", NAMES)
def test_products_at_the_end_of_a_guarded_page(name, rng):
    """dot, gemv (2 tiles of 8 rows + 3 leftover rows), gemm and matmul equal the portable dot
    bit for bit with the weights and the activations each ending where an unreadable page
    begins (a load past the last record would crash the process)."""
    fmt, span = getattr(qk.quant, name), SPAN[name]
    dot, gemv, gemm = (getattr(q1q2, f"{k}_{name}_q8_0") for k in ("dot", "gemv", "gemm"))
    rows, g, batch = 19, 3, 2
    w = before_a_guard_page(rows * g * 18).reshape(rows, g, 18)
    w[...] = _records(rng, rows * g).reshape(rows, g, 18)
    x = before_a_guard_page(batch * span * g * X_BYTES).reshape(batch, span * g, X_BYTES)
    x[...] = _activations(rng, batch, span * g)
    want = _portable(name, w, x)
    got = np.empty((batch, rows), np.float32)
    gemm(w, x, got)
    assert_same_f32(got, want, f"{name} gemm")
    for a in range(batch):
        gemv(w, x[a], got[a])
        assert_same_f32(got[a], want[a], f"{name} gemv")
        assert_same_f32([dot(w[r], x[a]) for r in range(rows)], want[a], f"{name} dot")
    a = rng.standard_normal((9, fmt.block_size * g)).astype(np.float32)
    xq = qk.quantize(a.reshape(-1, 32), format=qk.quant.q8_0).reshape(9, span * g, X_BYTES)
    want = _portable(name, w, xq)
    assert_same_f32(np.asarray(qk.matmul(w, a, lhs_format=fmt, threads=1), np.float32), want,
                    f"{name} matmul")
    assert_same_f32(np.asarray(qk.matmul(w, a[2], lhs_format=fmt, threads=1), np.float32),
                    want[2], f"{name} matvec")


# carriers: "combined" passes one strided, read-only, unaligned view of the weights (one compiled
# specialisation of gemv / gemm for all three properties); "each" passes the three separately
@pytest.mark.parametrize("case", default_few(
    [(n, c) for n in NAMES for c in ("combined", "each")], set(),
    lambda nc: f"{nc[0]}-{nc[1]}"))
def test_fast_paths_equal_the_portable_definition(case, rng):
    """dot, gemv (2 tiles of 8 rows + 3 leftover rows) and gemm equal the portable dot of every
    (row, activation) pair bit for bit on random bytes (NaN/inf scales, extreme quants); also
    on strided weights, activation records that are not consecutive (both: the portable loops),
    read-only and unaligned inputs and G = 0, 1."""
    name, carriers = case
    span = SPAN[name]
    dot, gemv, gemm = (getattr(q1q2, f"{k}_{name}_q8_0") for k in ("dot", "gemv", "gemm"))
    rows, batch = 19, 11
    for g in (10, 1, 0):
        w = _records(rng, rows * g).reshape(rows, g, 18)
        x = _activations(rng, batch, span * g)
        if g:
            w[5] = rng.integers(0, 256, w[5].shape, dtype=np.uint8)    # NaN/inf scales too
            w[7, :, 2:] = 0xFF
            w[8, :, 2:] = 0
            w[15, :, 2:] = 0xFF                                        # a tile's last row
            w[18, :, 2:] = 0xFF                                        # a leftover row
            w[9, :, :2] = np.array([0x7C00], "<u2").view(np.uint8)     # d = inf
            x[0, :, 2:] = 0x80                                         # xq = -128
            x[7, :, 2:] = 0x7F
        want = _portable(name, w, x)
        got = {"dot": np.array([[dot(w[r], x[a]) for r in range(rows)] for a in range(batch)],
                               np.float32)}
        got["gemv"] = np.empty((batch, rows), np.float32)
        for a in range(batch):
            gemv(w, x[a], got["gemv"][a])
        got["gemm"] = np.empty((batch, rows), np.float32)
        gemm(w, x, got["gemm"])
        views = carrier_views(w, x, carriers)
        if carriers == "each":
            xs = np.zeros((batch, span * g, 2, X_BYTES), np.uint8)    # records 68 bytes apart
            xs[:, :, 0] = x
            views.append(("spread activations", w, xs[:, :, 0]))
        got.update(products_on(views, gemv, gemm, dot))
        with np.errstate(all="ignore"):
            for label, arr in got.items():
                assert_same_f32(arr, want, f"{name} G={g} {label}")


# An AVX2 CPU's code (LLVM lowers the sign-bit masks with vpshufb / vpcmpeqb there, with
# AVX-512BW as masked moves): the record values and the products at a guarded page again in a
# fresh process compiled for Haswell, with its own numba cache (~25 s of CPU: -m slow)
_HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+lzcnt,+movbe,+pclmul,+popcnt,"
            "+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")


@needs_simd
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NUMBA_CPU_NAME") == "haswell", reason="already there")
def test_under_a_haswell_target(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve()
    e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_CPU_NAME="haswell",
             NUMBA_CPU_FEATURES=_HASWELL)
    e["PYTHONPATH"] = str(here.parents[2]) + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", str(here), "-k",
                        "(portable_value and avx2 and not vnni) or guarded",
                        "-m", "slow or not slow"], env=e, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "4 passed" in r.stdout, r.stdout[-500:]   # q1_0, q2_0: values (avx2), guarded page
