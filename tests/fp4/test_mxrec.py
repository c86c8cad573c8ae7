"""ggml's MXFP4 / NVFP4 record formats (``qk.quant.mxfp4``, ``qk.quant.nvfp4``): quantize
bit-identical to ggml's ``quantize_row_*_ref`` (committed golden vectors from ggml; live ggml
when a library is found), dequantize identical to ggml, gguf-py and the oracle on every code and
scale byte, ggml's ``log2f`` rounding, and exact dots against Q8_0 equal to the oracle
(``numba_qk.testing.reference.mxrec``) on random and adversarial records.

The registry-wide conformance (gemv/gemm/matmul == dot, carriers, errors) runs in
``test_registry.py``.  Bigger sweeps are marked ``slow`` and run only with ``-m slow`` or NUMBA_QK_SLOW=1;
``bench/agreement_mxrec.py`` counts agreement with ggml on >= 100k blocks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing.reference import mxrec as ref
from numba_qk.kernels.fp4 import mxrec as K

from numba_qk.testing.asserts import assert_same_f32, assert_same_records

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
Q8 = qk.quant.q8_0
MX, NV = qk.quant.mxfp4, qk.quant.nvfp4
FORMATS = {"mxfp4": (MX, 39, ref.quantize_mxfp4, ref.dequantize_mxfp4, ref.dot_mxfp4_q8_0),
           "nvfp4": (NV, 40, ref.quantize_nvfp4, ref.dequantize_nvfp4, ref.dot_nvfp4_q8_0)}
NAMES = list(FORMATS)


# run on purpose: `pytest -m slow` or NUMBA_QK_SLOW=1 (tests/conftest.py skips them otherwise)
slow = pytest.mark.slow


def golden(name):
    return np.load(GOLDEN / f"{name}_ggml.npz")


# ---- schema ----------------------------------------------------------------------------------

def test_schema_answers_spec_001():
    assert (MX.block_size, MX.block_bytes, MX.ggml_type) == (32, 17, 39)
    assert (NV.block_size, NV.block_bytes, NV.ggml_type) == (64, 36, 40)
    for f in (MX, NV):
        assert f.is_quantized and not f.is_float
        assert qk.from_ggml_type(f.ggml_type) is f
        assert qk.activation_format(f) is Q8
    assert MX.storage_bytes(64) == 34 and MX.storage_bytes(33) is None
    assert NV.storage_bytes(128) == 72 and NV.storage_bytes(32) is None
    assert MX.bits_per_element == 4.25 and NV.bits_per_element == 4.5
    assert [(f.name, f.start, f.stop) for f in MX.fields] == [("e", 0, 1), ("qs", 1, 17)]
    assert [(f.name, f.start, f.stop) for f in NV.fields] == [("d", 0, 4), ("qs", 4, 36)]
    # the ScaledTensor formats keep their names: from_name finds qk.mx's, not the records
    assert qk.from_name("mxfp4") is qk.mx.mxfp4 and qk.quant.mxfp4 is not qk.mx.mxfp4


def test_gguf_py_sizes_agree():
    gguf = pytest.importorskip("gguf")
    for f in (MX, NV):
        t = gguf.GGMLQuantizationType(f.ggml_type)
        assert t.name == f.name
        assert gguf.GGML_QUANT_SIZES[t] == (f.block_size, f.block_bytes)


# ---- quantize == ggml (golden) == oracle -----------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_quantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    assert "ggml" in str(g["ggml"]) or "native" in str(g["ggml"])
    assert_same_records(qk.quantize(g["x"], fmt), g["records"], name)


@pytest.mark.parametrize("name", NAMES)
def test_golden_covers_the_edges(name):
    """The golden records hold the cases the quirks are about (so the test above can fail)."""
    g = golden(name)
    rec = g["records"]
    if name == "mxfp4":
        e = set(rec[:, 0].tolist())
        assert {0, 1, 252, 253, 254, 255} <= e           # subnormal scales, log2f bump, wraps
        amax = np.abs(g["x"]).max(axis=1)
        wrapped = (amax > 0) & (amax < 2.0 ** -125)      # (uint8_t) of a negative exponent
        assert wrapped.sum() >= 20
        assert (rec[wrapped, 0] >= 232).all() and (rec[wrapped, 1:] == 0).all()
        assert ((rec[:, 1:] & 0x0F) == 7).any()           # max code
    else:
        d = rec[:, :4]
        assert 0x7E in d and 0 in d and (d < 8).any()     # saturated, zero and subnormal scales
        assert not ((d >= 0x78) & (d <= 0x7D)).any()      # never emitted by ggml
    qs = rec[:, 1:] if name == "mxfp4" else rec[:, 4:]
    codes = np.concatenate([qs & 15, qs >> 4])
    assert not (codes == 8).any()                        # ggml never emits -0 (code 8)
    assert (codes == 0).any() and ((codes & 7) == 7).any()


@pytest.mark.parametrize("name", NAMES)
def test_quantize_matches_the_oracle_on_golden_inputs(name):
    fmt, _, quantize_oracle, _, _ = FORMATS[name]
    x = golden(name)["x"][::3]  # every third block keeps the default run short
    got = qk.quantize(x, fmt)
    for b in range(x.shape[0]):
        assert got[b].tobytes() == quantize_oracle(x[b]), f"{name} block {b}: {x[b][:4]}"


@pytest.mark.parametrize("name", NAMES)
def test_quantize_rejects_non_finite_and_writes_nothing(name, rng):
    fmt = FORMATS[name][0]
    x = rng.standard_normal((3, fmt.block_size)).astype(np.float32)
    for bad in (np.inf, -np.inf, np.nan):
        x[1, 5] = bad
        out = np.full((3, fmt.block_bytes), 7, np.uint8)
        with pytest.raises(qk.QuantizationDomainError, match=r"^block 1: values\[1, 5\] is"):
            qk.quantize(x, fmt, out=out)
        assert (out == 7).all()


def test_element_choice_equals_the_16_entry_scan():
    """fp4_code (8 magnitudes, sign added) == ggml's 16-entry best_index on ties and extremes."""
    vals = []
    for d in (np.float32(2.0 ** -128), np.float32(2.0 ** -10), np.float32(0.5), np.float32(1.0),
              np.float32(2.0 ** 125), np.float32(2.0 ** 126), np.float32(2.0 ** 127)):
        for m in (0, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 13, 1e6, 1e30):
            for sign in (1.0, -1.0):
                with np.errstate(over="ignore"):
                    v = np.float32(sign * m * float(d))
                if np.isfinite(v):
                    vals.append((v, d))
                    up = np.nextafter(v, np.float32(np.inf))
                    dn = np.nextafter(v, np.float32(-np.inf))
                    vals += [(up, d), (dn, d)]
    vals.append((np.float32(-0.0), np.float32(1.0)))
    vals.append((np.float32(-1e-45), np.float32(0.0)))
    for v, d in vals:
        assert K.fp4_code(v, d) == ref.best_index(v, d), (v, d)


def test_ue4m3_encoder_equals_the_oracle_on_every_boundary():
    xs = [np.float32(0.0), np.float32(-1.0), np.float32(np.nan), np.float32(1e30)]
    for b in range(256):  # every ue4m3 value, its midpoints and 1 ulp around them
        v = ref.ue4m3_half(b) * 2
        for m in (v, v * np.float32(1.0625), v * np.float32(0.9375)):
            m = np.float32(m)
            xs += [m, np.nextafter(m, np.float32(0)), np.nextafter(m, np.float32(1e9))]
    xs += [np.float32(2.0 ** k) for k in range(-20, 12)]
    for x in xs:
        assert K.fp32_to_ue4m3(x) == ref.fp32_to_ue4m3(x), x


def _libm_log2f():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    f = ctypes.CDLL(name).log2f
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return f


def test_floor_log2f_matches_libm_and_the_oracle_near_every_power_of_two():
    """LOG2F_UP (exact arithmetic) == glibc's log2f == the double-precision oracle, at the first
    amax of each binade that rounds up, the one before it, and 1..4 ulps below every 2^k."""
    log2f = _libm_log2f()
    probes = []
    for n in range(-149, 128):
        t = K.LOG2F_UP[n + 149]
        if t != 0xFFFFFFFF:
            probes += [int(t), int(t) - 1]
        top = np.array(np.ldexp(1.0, n + 1) if n < 127 else np.finfo(np.float32).max,
                       np.float32).view(np.uint32)
        probes += [int(top) - k for k in range(0, 5)]
        probes.append(int(np.array(np.ldexp(1.0, n), np.float32).view(np.uint32)))
    bumps = 0
    for p in probes:
        if not 0 < p < 0x7F800000:
            continue
        a = np.array(p, np.uint32).view(np.float32)[()]
        if not (0 < a < np.inf):
            continue
        got = int(K.floor_log2f(a))
        assert got == ref.floor_log2f(a), (a, got)
        if log2f is not None:
            assert got == math.floor(log2f(float(a))), (a, got)
        bumps += got != math.frexp(float(a))[1] - 1
    assert bumps > 200  # the rounding-up cases are really exercised


# ---- dequantize == ggml (golden) == gguf-py == oracle ------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    assert_same_f32(qk.dequantize(g["r_random"], fmt), g["y_random"], name)


def _every_code_and_scale(fmt):
    """Records covering every scale byte and, in each, all 16 codes in both nibbles."""
    qs = np.array([j | ((15 - j) << 4) for j in range(16)], np.uint8)
    if fmt is MX:
        rec = np.zeros((256, 17), np.uint8)
        rec[:, 0] = np.arange(256)
        rec[:, 1:] = qs
        return rec
    rec = np.zeros((64, 36), np.uint8)
    rec[:, :4] = np.arange(256).reshape(64, 4)
    rec[:, 4:] = np.tile(qs, 2)
    return rec


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_every_code_and_scale_matches_oracle_and_gguf_py(name):
    fmt, tid, _, deq_oracle, _ = FORMATS[name]
    rec = _every_code_and_scale(fmt)
    got = qk.dequantize(rec, fmt)
    for b in range(rec.shape[0]):
        assert_same_f32(got[b], np.array(deq_oracle(rec[b].tobytes()), np.float32), f"{b}")
    gguf = pytest.importorskip("gguf")
    from gguf import quants as gq

    with np.errstate(over="ignore"):
        want = gq.dequantize(rec, gguf.GGMLQuantizationType(tid)).reshape(got.shape)
    assert_same_f32(got, want.astype(np.float32), "gguf-py")
    fields = qk.decode(rec, fmt)
    if fmt is MX:
        assert (fields.e == rec[:, 0]).all()
        assert (fields.q[:, :16] == np.arange(16)).all() and (fields.q[:, 16:] == 15 - np.arange(16)).all()
    else:
        assert (fields.d == rec[:, :4]).all()
        assert (fields.q[:, :8] == np.arange(8)).all() and (fields.q[:, 8:16] == 15 - np.arange(8)).all()


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_is_idempotent(name, rng):
    fmt = FORMATS[name][0]
    rec = qk.quantize(rng.standard_normal((64, fmt.block_size)).astype(np.float32), fmt)
    assert_same_records(qk.quantize(qk.dequantize(rec, fmt), fmt), rec, name)


# ---- dots against Q8_0 == oracle -------------------------------------------------------------

def _q8(rng, n, special=False):
    x = rng.integers(0, 256, (n, 34), dtype=np.uint8)
    if special:
        d = np.array([0.0, -0.0, 65504.0, -65504.0, 6e-8, -6e-8, np.inf, np.nan, 1.0, 2.0 ** -14],
                     np.float16)
        x[:, :2] = rng.choice(d, n).reshape(n, 1).view(np.uint8)
        x[rng.random(n) < 0.3, 2:] = rng.choice(np.array([0x7F, 0x80], np.uint8))  # +-127/-128
    return x


def _weights(rng, fmt, g, special=False):
    w = rng.integers(0, 256, (g, fmt.block_bytes), dtype=np.uint8)
    if special:
        if fmt is MX:
            w[:, 0] = rng.choice(np.array([0, 1, 2, 127, 128, 253, 254, 255], np.uint8), g)
        else:
            w[:, :4] = rng.choice(np.array([0, 1, 7, 8, 0x7E, 0x7F, 0x80, 0xFE, 0xFF], np.uint8),
                                  (g, 4))
        maxed = rng.random(g) < 0.4
        w[maxed, -32 if fmt is NV else -16:] = rng.choice(np.array([0x77, 0xFF, 0x7F, 0xF7, 0x88],
                                                                   np.uint8))
    return w


@pytest.mark.parametrize("special", [False, True], ids=["random", "adversarial"])
@pytest.mark.parametrize("name", NAMES)
def test_dot_matches_the_oracle(name, special, rng):
    fmt, _, _, _, dot_oracle = FORMATS[name]
    span = fmt.block_size // 32
    for g in (1, 2, 5, 9):
        for _ in range(4):
            w = _weights(rng, fmt, g, special)
            x = _q8(rng, g * span, special)
            got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=Q8)
            assert_same_f32(got, dot_oracle(w, x), f"{name} G={g}")


@pytest.mark.parametrize("name", NAMES)
def test_dot_edges(name):
    fmt = FORMATS[name][0]
    span = fmt.block_size // 32
    z = np.zeros((0, fmt.block_bytes), np.uint8)
    assert_same_f32(qk.quantized_dot(z, np.zeros((0, 34), np.uint8), lhs_format=fmt,
                                     rhs_format=Q8), np.float32(0.0))
    # every term -0.0 (d_y = -0, S > 0): the fold keeps -0.0 (ggml's 0.0f seed would give +0)
    w = np.zeros((3, fmt.block_bytes), np.uint8)
    w[:, -1] = 0x01  # one code 1 in the last byte of each record
    x = np.zeros((3 * span, 34), np.uint8)
    x[:, :2] = np.array([-0.0], np.float16).view(np.uint8)
    x[:, 2:] = 1
    if fmt is NV:
        w[:, :4] = 0x38  # ue4m3 1.0
    else:
        w[:, 0] = 130
    got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=Q8)
    assert np.signbit(got) and got == 0
    with pytest.raises(ValueError, match="records"):
        qk.quantized_dot(w, x[:-1], lhs_format=fmt, rhs_format=Q8)


def test_nvfp4_span_is_two_q8_0_records(rng):
    """One NVFP4 record pairs with two Q8_0 records: shapes and messages say so."""
    w = qk.quantize(rng.standard_normal((3, 64)).astype(np.float32), NV)
    x = qk.quantize(rng.standard_normal((6, 32)).astype(np.float32), Q8)
    with pytest.raises(ValueError, match=r"^rhs must hold 2 records per lhs record: lhs has 3, "
                                         r"so rhs needs 6, has 3$"):
        qk.quantized_dot(w, x[:3], lhs_format=NV, rhs_format=Q8)
    with pytest.raises(ValueError, match=r"^xq must hold 2 records per weight record"):
        qk.gemv(w[None], x[:3], lhs_format=NV, rhs_format=Q8)
    with pytest.raises(ValueError, match=r"x: expected shape \[192\]"):
        qk.matmul(w[None], np.zeros(96, np.float32), lhs_format=NV)
    xf = rng.standard_normal(192).astype(np.float32)
    xf[100] = np.inf
    with pytest.raises(qk.QuantizationDomainError, match=r"^block 3: x\[100\] is inf"):
        qk.matmul(w[None], xf, lhs_format=NV)


# ---- live ggml (skipped without a library) ------------------------------------------------------

def _live_inputs(n, blocks, seed):
    r = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = np.concatenate([
            r.standard_normal((blocks // 4, n)) * 10.0 ** r.uniform(-40, 38, (blocks // 4, 1)),
            r.standard_cauchy((blocks // 4, n)),
            r.integers(-48, 49, (blocks // 4, n)) / 4 * 2.0 ** r.integers(-130, 120, (blocks // 4, 1)),
            r.standard_normal((blocks - 3 * (blocks // 4), n)) * 2.0 ** -140,
        ]).astype(np.float32)
    return np.where(np.isfinite(x), x, np.float32(0.0)).astype(np.float32)


@pytest.mark.skipif(GGML is None, reason="no ggml library (libggml-python / NUMBA_QK_GGML_LIB)")
@pytest.mark.parametrize("name", NAMES)
def test_matches_ggml_live(name):
    fmt, tid, *_ = FORMATS[name]
    x = _live_inputs(fmt.block_size, 512, 7)
    rec = qk.quantize(x, fmt)
    assert_same_records(rec, GGML.quantize_ref(tid, x), name)
    raw = np.random.default_rng(8).integers(0, 256, (512, fmt.block_bytes), dtype=np.uint8)
    assert_same_f32(qk.dequantize(raw, fmt), GGML.dequantize(tid, raw), name)
    assert GGML.vec_dot_type(tid) == Q8.ggml_type


@pytest.mark.skipif(GGML is None, reason="no ggml library (libggml-python / NUMBA_QK_GGML_LIB)")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", NAMES)
@slow
def test_matches_ggml_live_sweep(name, seed):
    fmt, tid, *_ = FORMATS[name]
    x = _live_inputs(fmt.block_size, 8192, 100 + seed)
    assert_same_records(qk.quantize(x, fmt), GGML.quantize_ref(tid, x), name)


@pytest.mark.parametrize("name", NAMES)
@slow
def test_dot_matches_the_oracle_sweep(name, rng):
    fmt, _, _, _, dot_oracle = FORMATS[name]
    span = fmt.block_size // 32
    for _ in range(200):
        g = int(rng.integers(1, 12))
        w = _weights(rng, fmt, g, True)
        x = _q8(rng, g * span, True)
        assert_same_f32(qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=Q8), dot_oracle(w, x))


# ---- SIMD paths == portable loops ----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_fast_products_equal_the_portable_loops(name, rng):
    """The registry's dot/gemv/gemm (SIMD tiles where AVX2 is there) == the portable loops, on
    random and adversarial record bytes, tiles and remainders, strided records, G = 0."""
    fmt = FORMATS[name][0]
    span = fmt.block_size // 32
    b = qk._registry.BY_FORMAT[fmt]
    gemv_p = getattr(K, f"gemv_{name}_q8_0_portable")
    gemm_p = getattr(K, f"gemm_{name}_q8_0_portable")
    for rows, g, batch, special in ((19, 5, 11, False), (16, 3, 8, True), (9, 1, 17, True),
                                    (8, 0, 9, False)):
        w = np.stack([_weights(rng, fmt, g, special) for _ in range(rows)])
        x = np.stack([_q8(rng, g * span, special) for _ in range(batch)])
        want_v, got_v = np.empty(rows, np.float32), np.full(rows, 7, np.float32)
        gemv_p(w, x[1], want_v)
        b.gemv(w, x[1], got_v)
        assert_same_f32(got_v, want_v, f"gemv {rows}x{g}")
        want_m, got_m = np.empty((batch, rows), np.float32), np.full((batch, rows), 7, np.float32)
        gemm_p(w, x, want_m)
        b.gemm(w, x, got_m)
        assert_same_f32(got_m, want_m, f"gemm {rows}x{g}x{batch}")
        for r in range(min(rows, 3)):
            assert_same_f32(b.dot(w[r], x[2]), want_m[2, r], f"dot row {r}")
        # strided records (every other byte) take the portable path: same bits
        wide = np.zeros(w.shape[:2] + (2 * fmt.block_bytes,), np.uint8)
        wide[..., ::2] = w
        b.gemv(wide[..., ::2], x[1], got_v)
        assert_same_f32(got_v, want_v, "strided gemv")


# a cold compile of every FP4 product in a subprocess (~18 s of CPU): -m slow; the default run's
# other-ISA check is tests/package/test_parity.py's AVX2 subprocess
@pytest.mark.slow
def test_fast_products_without_vnni(tmp_path):
    """NUMBA_QK_NO_VNNI=1 (pmaddubsw + pmaddwd instead of vpdpbusd in the transposed gemv tiles,
    what AVX2 machines run): ``test_fast_products_equal_the_portable_loops`` again, in a fresh
    process with its own numba cache."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from numba_qk.kernels.simd.base import HAVE_VNNI

    if not HAVE_VNNI:
        pytest.skip("no AVX-512 VNNI: the default run already takes the pmaddubsw path")
    env = dict(os.environ, NUMBA_QK_NO_VNNI="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    here = Path(__file__).resolve()
    env["PYTHONPATH"] = str(here.parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", str(here), "-k", "fast_products_equal"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 passed" in r.stdout, r.stdout[-500:]
