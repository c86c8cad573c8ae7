"""ggml's 1- and 2-bit scale-only formats (``qk.quant.q1_0``, ``qk.quant.q2_0``): schema and
GGML ids, quantize byte-identical to ggml's ``ggml_quantize_chunk`` (committed golden vectors
from ggml; live ggml when a library is found, with and without an importance matrix, which
ggml ignores) and to the oracle, dequantize bit-identical to ggml's ``dequantize_row_q*_0`` on
random bytes (inf/NaN/signalling-NaN/subnormal scales: NaN payloads compared too), decode, and
exact dots against Q8_0 equal to ggml's ``ggml_vec_dot_q*_0_q8_0_generic`` (but for the sign
of a zero dot: ggml seeds its sum with +0.0) and to the oracle.  The registry-wide conformance
(gemv/gemm/matmul == dot, carriers, errors) runs in ``tests/conformance``; a sweep of 10k+
blocks against live ggml under ``-m slow``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing import reference as oracle
from numba_qk.testing.asserts import assert_same_f32

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parents[0] / "golden"
GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
FORMATS = {"q1_0": (qk.quant.q1_0, 41, 128), "q2_0": (qk.quant.q2_0, 42, 64)}
NAMES = list(FORMATS)
Q8 = qk.quant.q8_0


def golden(name):
    return np.load(GOLDEN / f"{name}_ggml.npz")


def same_bits(got, want):
    """float32 bits equal, NaN payloads included."""
    assert np.array_equal(np.asarray(got, np.float32).view(np.uint32),
                          np.asarray(want, np.float32).view(np.uint32))


def same_dot(got, want):
    """Bit-equal, or both zeros (ggml seeds the fold with +0.0), or both NaN."""
    got, want = np.float32(got), np.float32(want)
    assert (got.view(np.uint32) == want.view(np.uint32) or (got == 0 and want == 0)
            or (np.isnan(got) and np.isnan(want))), (got, want)


def _has_types():
    try:
        return GGML is not None and GGML._traits(42).type_size == 18
    except Exception:
        return False


live = pytest.mark.skipif(not _has_types(), reason="no ggml library with Q1_0/Q2_0")


def ggml_generic_dot(tid):
    import ctypes as C

    sym = "ggml_vec_dot_q1_0_q8_0_generic" if tid == 41 else "ggml_vec_dot_q2_0_q8_0"
    fn = getattr(GGML.cpu, sym)
    fn.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                   C.c_void_p, C.c_size_t, C.c_int]
    n = FORMATS["q1_0" if tid == 41 else "q2_0"][2]

    def dot(w, x):
        s = C.c_float()
        w, x = np.ascontiguousarray(w), np.ascontiguousarray(x)
        fn(w.shape[0] * n, C.byref(s), 0, w.ctypes.data, 0, x.ctypes.data, 0, 1)
        return np.float32(s.value)
    return dot


@pytest.mark.parametrize("name", NAMES)
def test_schema(name):
    fmt, tid, n = FORMATS[name]
    assert (fmt.block_size, fmt.block_bytes, fmt.ggml_type) == (n, 18, tid)
    assert qk.from_ggml_type(tid) is fmt and getattr(qk.quant, name) is fmt
    assert qk.activation_format(fmt) is Q8
    assert fmt.storage_bytes(2 * n) == 36 and fmt.storage_bytes(n + 1) is None
    assert fmt.bits_per_element == 18 * 8 / n


# ---- golden (ggml's bytes, committed) ---------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_quantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    assert np.array_equal(qk.quantize(g["inputs"], fmt), g["quantized"])
    for b in range(0, g["inputs"].shape[0], 11):
        assert oracle.quantize(fmt, g["inputs"][b]) == g["quantized"][b].tobytes(), b


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    same_bits(qk.dequantize(g["records"], fmt), g["dequantized"])
    for b in (0, 1, 2, 3, 5, 6, 17, 99):
        assert_same_f32(np.array(oracle.dequantize(fmt, g["records"][b]), np.float32),
                        g["dequantized"][b])


@pytest.mark.parametrize("name", NAMES)
def test_dot_matches_ggml_generic_golden(name):
    fmt, _, n = FORMATS[name]
    g = golden(name)
    rec, xq, want = g["records"], g["q8_0"], g["vec_dot"]
    s = n // 32
    for k in range(want.shape[0]):
        w, x = rec[8 + 3 * k: 11 + 3 * k], xq[s * (8 + 3 * k): s * (11 + 3 * k)]
        got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=Q8)
        same_dot(got, want[k])
        if k % 8 == 0:
            assert_same_f32(got, oracle.dot(fmt, w, x))


@pytest.mark.parametrize("name", NAMES)
def test_every_byte_decodes(name):
    fmt, tid, n = FORMATS[name]
    rec = np.zeros((256, 18), np.uint8)
    rec[:, 2:] = np.arange(256, dtype=np.uint8)[:, None]
    rec[:, :2] = np.array([0x3C00], "<u2").view(np.uint8)
    vals = qk.dequantize(rec, fmt)
    fields = qk.decode(rec, fmt)
    assert fields.q.dtype == np.int8 and fields.q.shape == (256, n)
    assert np.array_equal(fields.q.astype(np.float32), vals)
    assert (fields.q.min(), fields.q.max()) == ((-1, 1) if name == "q1_0" else (-1, 2))
    assert np.array_equal(fields.d.view("<u2"), np.full(256, 0x3C00, "<u2"))
    if _has_types():
        same_bits(vals, GGML.dequantize(tid, rec))


@pytest.mark.parametrize("name", NAMES)
def test_quantize_round_trip(name):
    """Values already d * t (d an f16 ggml's scale rule reproduces) come back exactly."""
    fmt, _, n = FORMATS[name]
    rng = np.random.default_rng(5)
    d = np.float32(np.float16(0.375))
    if name == "q1_0":
        t = rng.choice([-1.0, 1.0], (8, n))
    else:
        t = rng.integers(-1, 2, (8, n)).astype(np.float64)
        t[:, 0] = 1.0
    x = (t * d).astype(np.float32)
    assert np.array_equal(qk.dequantize(qk.quantize(x, fmt), fmt), x)


@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ignored_as_ggml_does(name):
    fmt, _, n = FORMATS[name]
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, n)).astype(np.float32)
    w = rng.uniform(0.0, 3.0, n).astype(np.float32)
    assert np.array_equal(qk.quantize(x, fmt, imatrix=w), qk.quantize(x, fmt))


# ---- live ggml (skipped without a library that has the types) ---------------------------------

def _live_inputs(rng, n, blocks):
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((blocks, n)) * 10.0 ** rng.uniform(-40, 38, (blocks, 1)))
    x = x.astype(np.float32)
    x[np.isinf(x)] = 3e38
    x[0], x[1] = 0.0, -0.0
    x[2] = (rng.uniform(-1, 1, n) * 2.0 ** -135).astype(np.float32)
    return x


def _live(name, seed, blocks):
    fmt, tid, n = FORMATS[name]
    rng = np.random.default_rng(seed)
    x = _live_inputs(rng, n, blocks)
    want = GGML.quantize_chunk(tid, x)
    assert np.array_equal(qk.quantize(x, fmt), want)
    imatrix = rng.uniform(0.0, 2.0, 4 * n).astype(np.float32)
    assert np.array_equal(qk.quantize(x, fmt), GGML.quantize_chunk(tid, x.reshape(-1, 4 * n)
                                                                     if blocks % 4 == 0 else x,
                                                                     imatrix if blocks % 4 == 0
                                                                     else None))
    rec = rng.integers(0, 256, (blocks, 18), dtype=np.uint8)
    same_bits(qk.dequantize(rec, fmt), GGML.dequantize(tid, rec))
    dot = ggml_generic_dot(tid)
    s = n // 32
    for w in (want, rec):
        xq = qk.quantize(rng.standard_normal((blocks * s, 32)).astype(np.float32), Q8)
        for k in range(0, blocks - 3, 4):
            same_dot(qk.quantized_dot(w[k:k + 4], xq[s * k:s * (k + 4)], lhs_format=fmt,
                                      rhs_format=Q8), dot(w[k:k + 4], xq[s * k:s * (k + 4)]))


@live
@pytest.mark.parametrize("name", NAMES)
def test_matches_ggml_live(name):
    _live(name, 11, 64)


@live
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", NAMES)
def test_matches_ggml_live_sweep(name, seed):
    _live(name, seed, 4096)
