"""ggml's ternary record formats (``qk.quant.tq1_0``, ``qk.quant.tq2_0``): schema and GGML ids,
quantize byte-identical to ggml's ``quantize_row_tq*_0_ref`` (committed golden vectors from
ggml, live ggml when libggml-python is found) and to the oracle, dequantize bit-identical to
ggml's ``dequantize_row_tq*_0`` on random bytes (NaN/inf/subnormal scales), decode, and exact
dots against Q8_K equal to the oracle (``numba_qk.testing.reference.ternary``) and close to
ggml's ``vec_dot``.  The registry-wide conformance (gemv/gemm/matmul == dot, carriers, errors)
runs in ``tests/conformance``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _registry as registry
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing import reference as oracle
from numba_qk.testing.asserts import assert_same_f32

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GGML = ggml_bridge.load()
FORMATS = {"tq1_0": (qk.quant.tq1_0, 34, 54), "tq2_0": (qk.quant.tq2_0, 35, 66)}
NAMES = list(FORMATS)


def golden(name):
    return np.load(GOLDEN / f"{name}_ggml.npz")


def random_records(rng, fmt, g):
    rec = rng.integers(0, 256, (g, fmt.block_bytes), dtype=np.uint8)
    rec[:, -2:] = (rng.standard_normal(g) * 0.05).astype("<f2").view(np.uint8).reshape(g, 2)
    return rec


def q8_k(rng, g):
    x = rng.standard_normal((g, 256)).astype(np.float32)
    return qk.quantize(x, qk.quant.q8_k)


@pytest.mark.parametrize("name", NAMES)
def test_schema(name):
    fmt, tid, nbytes = FORMATS[name]
    assert (fmt.block_size, fmt.block_bytes, fmt.ggml_type) == (256, nbytes, tid)
    assert qk.from_ggml_type(tid) is fmt
    assert qk.activation_format(fmt) is qk.quant.q8_k
    assert fmt.storage_bytes(512) == 2 * nbytes and fmt.storage_bytes(100) is None
    assert fmt in qk.quant and getattr(qk.quant, name) is fmt


@pytest.mark.parametrize("name", NAMES)
def test_quantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    assert np.array_equal(qk.quantize(g["inputs"], fmt), g["quantized"])


@pytest.mark.parametrize("name", NAMES)
def test_quantize_oracle_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    x, want = g["inputs"], g["quantized"]
    for b in range(0, x.shape[0], 3):
        assert oracle.quantize(fmt, x[b]) == want[b].tobytes(), b


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_ggml_golden(name):
    fmt = FORMATS[name][0]
    g = golden(name)
    assert_same_f32(qk.dequantize(g["records"], fmt), g["dequantized"])
    for b in (0, 1, 2, 3, 17, 99):
        assert_same_f32(np.array(oracle.dequantize(fmt, g["records"][b]), np.float32),
                        g["dequantized"][b])


@pytest.mark.parametrize("name", NAMES)
def test_every_byte_decodes_as_ggml(name):
    """All 256 byte values in every position (TQ1_0's 5- and 4-digit bytes, TQ2_0's codes)."""
    fmt, tid, nbytes = FORMATS[name]
    rec = np.zeros((256, nbytes), np.uint8)
    rec[:, :nbytes - 2] = np.arange(256, dtype=np.uint8)[:, None]
    rec[:, -2:] = np.array([0x3C00], "<u2").view(np.uint8)
    vals = qk.dequantize(rec, fmt)
    fields = qk.decode(rec, fmt)
    assert fields.q.dtype == np.int8
    assert np.array_equal(fields.q.astype(np.float32), vals)
    lo = -1
    hi = 1 if name == "tq1_0" else 2
    assert fields.q.min() == lo and fields.q.max() == hi
    assert np.array_equal(fields.d.view("<u2"), np.full(256, 0x3C00, "<u2"))
    if GGML is not None:
        assert_same_f32(vals, GGML.dequantize(tid, rec))


@pytest.mark.parametrize("name", NAMES)
def test_quantize_round_trip_of_ternary_values(name):
    """Values already d * {-1, 0, 1} (d an f16) come back exactly."""
    fmt = FORMATS[name][0]
    rng = np.random.default_rng(5)
    t = rng.integers(-1, 2, (8, 256)).astype(np.float32)
    t[:, 0] = 1.0
    d = np.float32(np.float16(0.375))
    x = (t * d).astype(np.float32)
    assert np.array_equal(qk.dequantize(qk.quantize(x, fmt), fmt), x)


@pytest.mark.parametrize("name", NAMES)
def test_quantize_refuses_non_finite(name):
    fmt = FORMATS[name][0]
    x = np.zeros((3, 256), np.float32)
    x[1, 7] = np.nan
    with pytest.raises(qk.QuantizationDomainError):
        qk.quantize(x, fmt)


@pytest.mark.parametrize("name", NAMES)
def test_live_ggml_quantize_and_dequantize(name):
    if GGML is None:
        pytest.skip("libggml-python not found")
    fmt, tid, _ = FORMATS[name]
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((64, 256)) * 10.0 ** rng.uniform(-40, 38, (64, 1))).astype(np.float32)
    assert np.array_equal(qk.quantize(x, fmt), GGML.quantize_ref(tid, x))
    rec = random_records(rng, fmt, 64)
    rec[:3, -2:] = np.array([0x7C00, 0xFE00, 0x8001], "<u2").view(np.uint8).reshape(3, 2)
    assert_same_f32(qk.dequantize(rec, fmt), GGML.dequantize(tid, rec))


@pytest.mark.parametrize("name", NAMES)
def test_dot_equals_oracle(name):
    fmt = FORMATS[name][0]
    b = registry.BY_FORMAT[fmt]
    rng = np.random.default_rng(3)
    for g in (0, 1, 2, 5):
        w = random_records(rng, fmt, g)
        x = q8_k(rng, g)
        assert_same_f32(np.float32(b.dot(w, x)), np.float32(oracle.dot(fmt, w, x)))
        got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=qk.quant.q8_k)
        assert_same_f32(np.float32(got), np.float32(oracle.dot(fmt, w, x)))
    # non-finite scales propagate as the definition says
    w = random_records(rng, fmt, 3)
    w[1, -2:] = np.array([0x7C00], "<u2").view(np.uint8)
    x = q8_k(rng, 3)
    assert_same_f32(np.float32(b.dot(w, x)), np.float32(oracle.dot(fmt, w, x)))


@pytest.mark.parametrize("name", NAMES)
def test_dot_close_to_ggml_golden(name):
    """ggml's vec_dot rounds in another order (and FMAs on AVX2): close, not equal."""
    fmt = FORMATS[name][0]
    g = golden(name)
    b = registry.BY_FORMAT[fmt]
    rec, xq, want = g["records"], g["q8_k"], g["vec_dot"]
    for k in range(want.shape[0]):
        got = b.dot(rec[4 + 4 * k: 8 + 4 * k], xq[4 + 4 * k: 8 + 4 * k])
        scale = float(np.abs(qk.dequantize(rec[4 + 4 * k: 8 + 4 * k], fmt)).max()) * 4 * 256 * 4
        assert abs(float(got) - float(want[k])) <= 1e-6 * scale, k


@pytest.mark.parametrize("name", NAMES)
def test_matmul_matches_dot(name):
    fmt = FORMATS[name][0]
    b = registry.BY_FORMAT[fmt]
    rng = np.random.default_rng(9)
    w = np.stack([random_records(rng, fmt, 2) for _ in range(11)])
    x = np.stack([q8_k(rng, 2) for _ in range(3)])
    out = np.empty((3, 11), np.float32)
    b.gemm(w, x, out)
    for a in range(3):
        for r in range(11):
            assert_same_f32(out[a, r], np.float32(b.dot(w[r], x[a])))
