"""ggml's grid IQ record formats (``qk.quant.iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq3_s, iq2_s,
iq1_m``): the grid and sign tables equal the native library's (every entry decoded through
ggml's ``dequantize_row_*``), dequantize/decode identical to ggml's ``dequantize_row_<t>`` and
the oracle on random bytes (NaN/inf scales included) and on ggml-quantized records (committed
golden vectors; live ggml when a library is found), exact dots against Q8_K equal to the oracle
(``numba_qk.testing.reference.iq``) and close to ggml's ``vec_dot``.

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
from numba_qk.formats import iq_grids
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing import reference as R
from subsets import default_few
from numba_qk.testing.asserts import assert_same_f32
from records import random_iq_grid

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "iq_grid_ggml.npz"
GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
NAMES = ["iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq3_s", "iq2_s", "iq1_m"]
# an IQ2, an IQ3 and an IQ1 grid in the default run; all seven under -m slow
DEFAULT_FEW = default_few(NAMES, {"iq2_xxs", "iq3_s", "iq1_m"})
FORMATS = {n: getattr(qk.quant, n) for n in NAMES}
# x = d * C * (2 ls + 1) * q (decode's fields)
C_OF = {"iq2_xxs": 0.125, "iq2_xs": 0.125, "iq2_s": 0.125, "iq3_xxs": 0.25, "iq3_s": 1.0,
        "iq1_s": 0.125, "iq1_m": 0.125}
slow = pytest.mark.slow
needs_ggml = pytest.mark.skipif(GGML is None, reason="no ggml library")


def ggml_quantize_chunk(fmt, x, imatrix):
    """ggml's ``ggml_quantize_chunk`` (with an importance matrix: IQ2_XXS, IQ2_XS and IQ1_S
    require one), a private ctypes call for test data."""
    qc = GGML.base.ggml_quantize_chunk
    qc.restype = C.c_size_t
    qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64,
                   C.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(imatrix, np.float32)
    out = np.zeros((x.size // 256, fmt.block_bytes), np.uint8)
    qc(fmt.ggml_type, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], w.ctypes.data)
    return out


def test_schema_answers_spec_001():
    want = {"iq2_xxs": (66, 16, 2.0625), "iq2_xs": (74, 17, 2.3125), "iq3_xxs": (98, 18, 3.0625),
            "iq1_s": (50, 19, 1.5625), "iq3_s": (110, 21, 3.4375), "iq2_s": (82, 22, 2.5625),
            "iq1_m": (56, 29, 1.75)}
    for name, (nbytes, tid, bpw) in want.items():
        f = FORMATS[name]
        assert (f.name, f.block_size, f.block_bytes, f.ggml_type) == (name.upper(), 256, nbytes,
                                                                       tid)
        assert f.is_quantized and not f.is_float and f.bits_per_element == bpw
        assert qk.from_ggml_type(tid) is f and qk.activation_format(f) is qk.quant.q8_k
        assert f.storage_bytes(512) == 2 * nbytes and f.storage_bytes(128) is None
        assert f.field("ls").count == (16 if name in ("iq2_xs", "iq2_s", "iq1_m") else 8)
        assert repr(f) == f"numba_qk.quant.{name}" and f in qk.quant
        c = qk.capabilities(f)
        assert c.dequantize and c.decode and c.gemv
        assert c.quantize   # every grid format has its encoder (some need an imatrix)
        assert c.dot_partner is qk.quant.q8_k


def test_sign_tables():
    """ksigns_iq2xs: 7 sign bits and an 8th of even parity; kmask_iq2xs: bit j."""
    assert iq_grids.KMASK_IQ2XS == tuple(1 << j for j in range(8))
    assert iq_grids.KSIGNS_IQ2XS == tuple(i | ((bin(i).count("1") & 1) << 7) for i in range(128))
    sizes = {"IQ2XXS_GRID": 256, "IQ2XS_GRID": 512, "IQ2S_GRID": 1024, "IQ3XXS_GRID": 256,
             "IQ3S_GRID": 512, "IQ1S_GRID": 2048}
    for name, n in sizes.items():
        assert len(getattr(iq_grids, name)) == n == len(set(getattr(iq_grids, name))), name
    assert iq_grids.IQ1S_DELTA == iq_grids.IQ1M_DELTA == 0.125


def _grid_bytes(table, n):
    t = np.array(table, np.uint64)
    return np.stack([(t >> np.uint64(8 * j)) & np.uint64(255) for j in range(n)], 1).astype(
        np.uint8)


def _enumerating_records(name):
    """Records with d = 1, every scale code 0, no signs, whose groups walk the whole grid in
    order; (records, the per-element factor y / grid) of the grid's format."""
    one = (0x00, 0x3C)
    if name == "iq2_xxs":       # 32 indices per record
        rec = np.zeros((8, 66), np.uint8)
        rec[:, :2] = one
        idx = np.arange(256).reshape(8, 8, 4)
        for s in range(8):
            rec[:, 2 + 8 * s:6 + 8 * s] = idx[:, s]
        return rec, 0.125
    if name == "iq2_xs":        # u16 = index
        rec = np.zeros((16, 74), np.uint8)
        rec[:, :2] = one
        u16 = np.arange(512, dtype=np.uint16).reshape(16, 32)
        rec[:, 2:66] = u16.view(np.uint8).reshape(16, 64)
        return rec, 0.125
    if name == "iq2_s":         # low 8 bits in qs, bits 8, 9 in qh
        rec = np.zeros((32, 82), np.uint8)
        rec[:, :2] = one
        idx = np.arange(1024).reshape(32, 8, 4)
        rec[:, 2:34] = (idx & 255).reshape(32, 32)
        rec[:, 66:74] = ((idx >> 8) << np.array([0, 2, 4, 6])).sum(axis=2)
        return rec, 0.125
    if name == "iq3_xxs":       # 64 indices of 4 per record
        rec = np.zeros((4, 98), np.uint8)
        rec[:, :2] = one
        rec[:, 2:66] = np.arange(256).reshape(4, 64)
        return rec, 0.25
    if name == "iq3_s":         # low 8 bits in qs, bit 8 in qh
        rec = np.zeros((8, 110), np.uint8)
        rec[:, :2] = one
        idx = np.arange(512).reshape(8, 8, 8)
        rec[:, 2:66] = (idx & 255).reshape(8, 64)
        rec[:, 66:74] = ((idx >> 8) << np.arange(8)).sum(axis=2)
        return rec, 1.0
    assert name == "iq1_s"      # low 8 bits in qs, bits 8..10 in qh (ls 0, delta +1/8)
    rec = np.zeros((64, 50), np.uint8)
    rec[:, :2] = one
    idx = np.arange(2048).reshape(64, 8, 4)
    rec[:, 2:34] = (idx & 255).reshape(64, 32)
    qh = ((idx >> 8) << np.array([0, 3, 6, 9])).sum(axis=2).astype(np.uint16)
    rec[:, 34:50] = qh.view(np.uint8).reshape(64, 16)
    return rec, 1.0


@needs_ggml
@pytest.mark.parametrize("name, table, n", [("iq2_xxs", "IQ2XXS_GRID", 8),
                                            ("iq2_xs", "IQ2XS_GRID", 8),
                                            ("iq2_s", "IQ2S_GRID", 8),
                                            ("iq3_xxs", "IQ3XXS_GRID", 4),
                                            ("iq3_s", "IQ3S_GRID", 4),
                                            ("iq1_s", "IQ1S_GRID", 8)])
def test_every_grid_entry_is_the_native_librarys(name, table, n):
    """Every grid entry of iq_grids decoded through ggml's dequantize_row_* (the library's own
    compiled tables) gives the entry's bytes; numba_qk decodes the same records identically."""
    fmt = FORMATS[name]
    rec, step = _enumerating_records(name)
    want = GGML.dequantize(fmt.ggml_type, rec)
    assert_same_f32(qk.dequantize(rec, fmt).reshape(want.shape), want, name)
    if name == "iq1_s":
        ggml_grid = (want - np.float32(0.125)).astype(np.int8).view(np.uint8)
    else:
        ggml_grid = (want / np.float32(step)).astype(np.uint8)
    np.testing.assert_array_equal(ggml_grid.reshape(-1, n),
                                  _grid_bytes(getattr(iq_grids, table), n))


@needs_ggml
def test_every_sign_pattern_is_the_native_librarys():
    """ksigns_iq2xs through ggml's dequantize_row_iq2_xxs: group k of the records takes sign
    index k (grid entry 0: all 8s)."""
    rec = np.zeros((4, 66), np.uint8)
    rec[:, :2] = (0x00, 0x3C)
    k = np.arange(128).reshape(4, 8, 4)
    for s in range(8):
        aux = (k[:, s] << np.array([0, 7, 14, 21])).sum(axis=1).astype(np.uint32)
        rec[:, 6 + 8 * s:10 + 8 * s] = aux.view(np.uint8).reshape(4, 4)
    neg = (GGML.dequantize(16, rec) < 0).reshape(128, 8)
    got = (neg << np.arange(8)).sum(axis=1)
    assert tuple(int(v) for v in got) == iq_grids.KSIGNS_IQ2XS


@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_dequantize_is_ggml_golden_and_oracle(name):
    """Golden: ggml's dequantize_row on 16 random records (NaN/inf f16 scales among them) and
    on 8 records ggml quantized; the oracle agrees on some of each."""
    fmt, g = FORMATS[name], np.load(GOLDEN)
    for kind in ("random", "records"):
        rec, want = g[f"{name}_{kind}"], g[f"{name}_{kind}_values"]
        assert_same_f32(qk.dequantize(rec, fmt).reshape(want.shape), want, f"{name} {kind}")
        for i in range(2):
            assert_same_f32(np.array(R.dequantize(fmt, rec[i]), np.float32), want[i],
                            f"{name} {kind} oracle")


@needs_ggml
@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_dequantize_is_live_ggml(name):
    fmt = FORMATS[name]
    rec = np.random.default_rng(5).integers(0, 256, (300, fmt.block_bytes), dtype=np.uint8)
    assert_same_f32(qk.dequantize(rec, fmt).reshape(300, -1), GGML.dequantize(fmt.ggml_type, rec),
                    name)


@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_decode_fields(name):
    """x = d * c * (2 ls + 1) * q exactly (finite scales: every product is exact in f32)."""
    fmt = FORMATS[name]
    rec = random_iq_grid(np.random.default_rng(6), fmt, 5)
    f = qk.decode(rec, fmt)
    assert f.d.dtype == np.float16 and f.d.shape == (5,)
    assert f.ls.dtype == np.uint8 and f.ls.shape == (5, fmt.field("ls").count)
    assert f.q.dtype == np.int8 and f.q.shape == (5, 256)
    per = 256 // f.ls.shape[1]
    scale = f.d.astype(np.float64)[:, None] * C_OF[name] * (2.0 * f.ls + 1)
    want = (np.repeat(scale, per, axis=1) * f.q).astype(np.float32)
    assert_same_f32(qk.dequantize(rec, fmt).reshape(5, 256), want, name)


@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_dot_is_oracle_on_random_bytes(name):
    fmt = FORMATS[name]
    rng = np.random.default_rng(7)
    for g in (1, 3, 0):
        w = random_iq_grid(rng, fmt, g)
        x = rng.integers(0, 256, (g, 292), dtype=np.uint8)
        x[:, 3] &= 0x3F                 # finite Q8_K scales
        got = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=qk.quant.q8_k)
        assert_same_f32(np.float32(got), np.float32(R.dot(fmt, w, x)), f"{name} G={g}")
    w = rng.integers(0, 256, (2, fmt.block_bytes), dtype=np.uint8)   # any bytes: NaN/inf too
    x = rng.integers(0, 256, (2, 292), dtype=np.uint8)
    with np.errstate(all="ignore"):
        assert_same_f32(np.float32(qk.quantized_dot(w, x, lhs_format=fmt,
                                                    rhs_format=qk.quant.q8_k)),
                        np.float32(R.dot(fmt, w, x)), f"{name} random bytes")


def _close_to_vec_dot(name, n, seed):
    fmt = FORMATS[name]
    r = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(n):
        w = ggml_quantize_chunk(fmt, r.standard_normal((1, 4096)), r.uniform(0.1, 2, 4096))
        x = qk.quantize(r.standard_normal((16, 256)).astype(np.float32), qk.quant.q8_k)
        assert_same_f32(qk.dequantize(w, fmt).ravel(), GGML.dequantize(fmt.ggml_type, w).ravel(),
                        name)
        ours = float(qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=qk.quant.q8_k))
        scale = float(np.abs(qk.dequantize(w, fmt)).sum()
                      * np.abs(qk.dequantize(x, qk.quant.q8_k)).max())
        worst = max(worst, abs(ours - GGML.vec_dot(fmt.ggml_type, w, x)) / scale)
    return worst


@needs_ggml
# IQ1_M under -m slow here: ggml's quantize_chunk for it spends ~10 s building its IQ1 search
# tables (the default run's longest IQ test); the other IQ1_M tests of this file run by default
@pytest.mark.parametrize("name", default_few(NAMES, {"iq2_xxs", "iq3_s"}))
def test_dot_close_to_ggml_vec_dot(name):
    """On ggml-quantized weights: our exact dot and ggml's vec_dot (its own f32 order) differ by
    rounding only (measured worst about 3e-9 of sum |w| * max |x|)."""
    assert _close_to_vec_dot(name, 4, 9) < 1e-6


@slow
@needs_ggml
@pytest.mark.parametrize("name", NAMES)
def test_sweeps_against_ggml(name):
    fmt = FORMATS[name]
    rng = np.random.default_rng(11)
    rec = rng.integers(0, 256, (20000, fmt.block_bytes), dtype=np.uint8)
    assert_same_f32(qk.dequantize(rec, fmt).reshape(20000, -1),
                    GGML.dequantize(fmt.ggml_type, rec), name)
    x = (rng.standard_normal((64, 4096)) * 10.0 ** rng.uniform(-5, 5, (64, 1))).astype(np.float32)
    w = ggml_quantize_chunk(fmt, x, rng.uniform(0, 2, 4096))
    assert_same_f32(qk.dequantize(w, fmt).reshape(64, -1),
                    GGML.dequantize(fmt.ggml_type, w).reshape(64, -1), name)
    assert _close_to_vec_dot(name, 200, 12) < 1e-6
