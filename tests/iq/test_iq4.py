"""ggml's IQ4_NL / IQ4_XS record formats (``qk.quant.iq4_nl``, ``qk.quant.iq4_xs``): dequantize
and decode identical to ggml's ``dequantize_row_iq4_*`` and the oracle on random bytes (NaN/inf
scales included), quantize byte-identical to ggml's ``ggml_quantize_chunk`` (committed golden
vectors from ggml; live ggml when a library is found), exact dots against Q8_0 / Q8_K equal to
the oracle (``numba_qk.testing.reference.iq``) and close to ggml's ``vec_dot``.

The registry-wide conformance (gemv/gemm/matmul == dot, carriers, errors) runs in
``tests/conformance``.  Bigger sweeps are marked ``slow``.
"""

from __future__ import annotations

import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.errors import QuantizationDomainError
from numba_qk.formats.iq import KVALUES_IQ4NL
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing import reference as R
from numba_qk.testing.asserts import assert_same_f32, assert_same_records

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
NL, XS = qk.quant.iq4_nl, qk.quant.iq4_xs
FORMATS = {"iq4_nl": NL, "iq4_xs": XS}
NAMES = list(FORMATS)
slow = pytest.mark.slow


def golden(name):
    return np.load(GOLDEN / f"{name}_ggml.npz")


def ggml_quantize_chunk(fmt, x):
    qc = GGML.base.ggml_quantize_chunk
    qc.restype = C.c_size_t
    qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64,
                   C.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], fmt.block_bytes), np.uint8)
    qc(fmt.ggml_type, x.ctypes.data, out.ctypes.data, 0, x.shape[0], fmt.block_size, None)
    return out


def test_schema_answers_spec_001():
    assert (NL.block_size, NL.block_bytes, NL.ggml_type) == (32, 18, 20)
    assert (XS.block_size, XS.block_bytes, XS.ggml_type) == (256, 136, 23)
    for f in (NL, XS):
        assert f.is_quantized and qk.from_ggml_type(f.ggml_type) is f
    assert qk.activation_format(NL) is qk.quant.q8_0
    assert qk.activation_format(XS) is qk.quant.q8_k
    assert NL.storage_bytes(64) == 36 and NL.storage_bytes(33) is None
    assert XS.storage_bytes(512) == 272 and XS.storage_bytes(32) is None
    assert NL.bits_per_element == 4.5 and XS.bits_per_element == 4.25
    assert [(f.name, f.start, f.stop) for f in XS.fields] == [("d", 0, 2), ("ls", 2, 8),
                                                               ("qs", 8, 136)]
    # ggml-common.h kvalues_iq4nl
    assert KVALUES_IQ4NL == (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
                             89, 113)


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_is_ggml_on_random_bytes(name):
    """Golden: ggml's dequantize_row on 64 random records (NaN/inf f16 scales among them) and on
    its own records; the oracle agrees."""
    fmt, g = FORMATS[name], golden(name)
    for rec, want in ((g["random_records"], g["random_values"]), (g["records"], g["values"])):
        got = qk.dequantize(rec, fmt)
        assert_same_f32(got.reshape(want.shape), want, name)
    for i in range(8):
        assert_same_f32(np.array(R.dequantize(fmt, g["random_records"][i]), np.float32),
                        g["random_values"][i], f"{name} oracle")


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_is_live_ggml(name):
    if GGML is None:
        pytest.skip("no ggml library")
    fmt = FORMATS[name]
    rec = np.random.default_rng(5).integers(0, 256, (300, fmt.block_bytes), dtype=np.uint8)
    assert_same_f32(qk.dequantize(rec, fmt).reshape(300, -1), GGML.dequantize(fmt.ggml_type, rec),
                    name)


def test_decode_fields():
    rec = np.random.default_rng(6).integers(0, 256, (5, 136), dtype=np.uint8)
    f = qk.decode(rec, XS)
    assert f.ls.shape == (5, 8) and f.q.shape == (5, 256) and f.d.dtype == np.float16
    k = np.array(KVALUES_IQ4NL, np.float32)
    vals = (f.d.astype(np.float32)[:, None] * (f.ls.astype(np.float32) - 32))
    want = np.repeat(vals, 32, axis=1) * k[f.q]   # exact where no overflow
    with np.errstate(all="ignore"):
        assert_same_f32(qk.dequantize(rec, XS).reshape(5, 256), want.astype(np.float32), "XS")
    rec = np.random.default_rng(7).integers(0, 256, (5, 18), dtype=np.uint8)
    f = qk.decode(rec, NL)
    assert f.q.shape == (5, 32)
    with np.errstate(all="ignore"):
        assert_same_f32(qk.dequantize(rec, NL).reshape(5, 32),
                        (f.d.astype(np.float32)[:, None] * k[f.q]).astype(np.float32), "NL")


@pytest.mark.parametrize("name", NAMES)
def test_quantize_is_ggml_golden(name):
    fmt, g = FORMATS[name], golden(name)
    assert_same_records(qk.quantize(g["inputs"], fmt), g["records"], name)


@pytest.mark.parametrize("name", NAMES)
def test_quantize_is_oracle(name):
    fmt, g = FORMATS[name], golden(name)
    rows = [0, 30, 40, 44, 48, 52] if name == "iq4_nl" else [0, 44, 52]
    got = qk.quantize(g["inputs"][rows], fmt)
    for i, r in enumerate(rows):
        with np.errstate(all="ignore"):
            assert R.quantize(fmt, g["inputs"][r]) == got[i].tobytes(), (name, r)


@pytest.mark.parametrize("name", NAMES)
def test_quantize_is_live_ggml(name):
    if GGML is None:
        pytest.skip("no ggml library")
    fmt = FORMATS[name]
    r = np.random.default_rng(8)
    x = np.concatenate([r.standard_normal((40, fmt.block_size)),
                        r.standard_t(3, (20, fmt.block_size)),
                        r.standard_normal((20, fmt.block_size)) * 10.0 ** r.integers(-30, 31, (20, 1))])
    x = x.astype(np.float32)
    assert_same_records(qk.quantize(x, fmt), ggml_quantize_chunk(fmt, x), name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_non_finite_is_a_domain_error(name, bad):
    fmt = FORMATS[name]
    x = np.ones((3, fmt.block_size), np.float32)
    x[1, 5] = bad
    with pytest.raises(QuantizationDomainError):
        qk.quantize(x, fmt)


def _records(fmt, g, seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (g, fmt.block_bytes), dtype=np.uint8)
    a = qk.activation_format(fmt)
    x = rng.integers(0, 256, (g * fmt.block_size // a.block_size, a.block_bytes), dtype=np.uint8)
    return w, x


@pytest.mark.parametrize("name", NAMES)
def test_dot_is_oracle_on_random_bytes(name):
    fmt = FORMATS[name]
    a = qk.activation_format(fmt)
    for seed, g in ((1, 1), (2, 3), (3, 8), (4, 0)):
        w, x = _records(fmt, g, seed)
        if name == "iq4_nl":   # finite f16 scales: the fold stays finite and meaningful
            for arr in (w, x):
                arr[:, 1] &= 0x3F
        got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=a)
        want = R.dot(fmt, w, x)
        assert_same_f32(np.float32(got), np.float32(want), f"{name} G={g}")


@pytest.mark.parametrize("name", NAMES)
def test_dot_close_to_ggml_vec_dot(name):
    if GGML is None:
        pytest.skip("no ggml library")
    fmt = FORMATS[name]
    a = qk.activation_format(fmt)
    r = np.random.default_rng(9)
    worst = 0.0
    for _ in range(20):
        w = qk.quantize(r.standard_normal((4096 // fmt.block_size, fmt.block_size))
                        .astype(np.float32), fmt)
        x = qk.quantize(r.standard_normal((4096 // a.block_size, a.block_size))
                        .astype(np.float32), a)
        ours = float(qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=a))
        scale = float(np.abs(qk.dequantize(w, fmt)).sum() * np.abs(qk.dequantize(x, a)).max())
        worst = max(worst, abs(ours - GGML.vec_dot(fmt.ggml_type, w, x)) / scale)
    assert worst < 1e-6, worst


@slow
@pytest.mark.parametrize("name", NAMES)
def test_quantize_is_live_ggml_sweep(name):
    if GGML is None:
        pytest.skip("no ggml library")
    fmt = FORMATS[name]
    r = np.random.default_rng(10)
    n = 20000 if name == "iq4_nl" else 3000
    with np.errstate(over="ignore"):
        x = (r.standard_normal((n, fmt.block_size))
             * 10.0 ** r.uniform(-35, 35, (n, 1))).astype(np.float32)
    assert_same_records(qk.quantize(x, fmt), ggml_quantize_chunk(fmt, x), name)
