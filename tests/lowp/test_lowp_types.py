"""Spec 004 element types: facts, names, spec 001's questions, scalars, singletons."""

import copy
import math
import pickle
import random
import struct
from fractions import Fraction

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import dtypes as D
from numba_qk.formats import ScalarType
from subsets import default_few

ml = pytest.importorskip("ml_dtypes")

ML = {qk.bf16: ml.bfloat16, qk.e4m3: ml.float8_e4m3fn, qk.e5m2: ml.float8_e5m2,
      qk.e2m3: ml.float6_e2m3fn, qk.e3m2: ml.float6_e3m2fn, qk.e2m1: ml.float4_e2m1fn,
      qk.e8m0: ml.float8_e8m0fnu, qk.f16: np.float16, qk.f32: np.float32}

# spec 004's scalar table: bits S+E+M, payload bytes, range, inf, NaN
SPEC_TABLE = [
    (qk.f16, (1, 5, 10), 2, 65504.0, True, True),
    (qk.bf16, (1, 8, 7), 2, 3.3895313892515355e38, True, True),
    (qk.e4m3, (1, 4, 3), 1, 448.0, False, True),
    (qk.e5m2, (1, 5, 2), 1, 57344.0, True, True),
    (qk.e2m3, (1, 2, 3), 1, 7.5, False, False),
    (qk.e3m2, (1, 3, 2), 1, 28.0, False, False),
]


@pytest.mark.parametrize("t, sem, nbytes, vmax, inf, nan", SPEC_TABLE, ids=lambda v: str(v))
def test_spec_table(t, sem, nbytes, vmax, inf, nan):
    assert (t.sign_bits, t.exponent_bits, t.mantissa_bits) == sem
    assert t.bits == sum(sem)
    assert t.payload_bytes == nbytes == t.block_bytes
    assert t.max == vmax and t.min == -vmax
    assert t.has_inf is inf and t.has_nan is nan


@pytest.mark.parametrize("t", [t for t in ML if t is not qk.f32], ids=str)
def test_finfo_matches_ml_dtypes(t):
    fi = ml.finfo(ML[t])
    assert t.max == float(fi.max)
    assert t.tiny == float(fi.smallest_normal)
    assert t.smallest_subnormal == float(fi.smallest_subnormal)
    assert t.eps == float(fi.eps)


@pytest.mark.parametrize("t, lo, hi", [(qk.i8, -128, 127), (qk.u8, 0, 255), (qk.i32, -2**31, 2**31 - 1),
                                       (qk.i4, -8, 7), (qk.u4, 0, 15), (qk.u1, 0, 1)], ids=str)
def test_int_facts(t, lo, hi):
    assert (t.min, t.max) == (lo, hi) and not t.is_float and not t.has_inf


def test_spec001_questions_for_packed_types():
    for t, per in [(qk.i4, 2), (qk.u4, 2), (qk.e2m1, 2), (qk.u1, 8)]:
        assert t.block_size == per and t.block_bytes == 1 and t.is_packed
        assert t.is_quantized is False
        assert t.storage_bytes(16) == 16 // per
        assert t.storage_bytes(per + 1) is None
        assert t.bits_per_element == 8 / per
    assert qk.e2m3.bits == 6 and qk.e2m3.bits_per_element == 8.0 and qk.e2m3.storage_bytes(3) == 3
    assert qk.bf16.storage_bytes(5) == 10 and qk.bf16.block_size == 1
    with pytest.raises(ValueError):
        qk.i4.storage_bytes(-2)


def test_e8m0_facts():
    assert qk.e8m0.max == 2.0 ** 127 and qk.e8m0.min == 2.0 ** -127
    assert qk.e8m0.has_nan and not qk.e8m0.has_inf and qk.e8m0.sign_bits == 0


@pytest.mark.parametrize("name, t", [
    ("bfloat16", qk.bf16), ("bf16", qk.bf16), ("BF16", qk.bf16), ("float8_e4m3", qk.e4m3),
    ("e4m3", qk.e4m3), ("float8_e4m3fn", qk.e4m3), ("float8_e5m2", qk.e5m2), ("e5m2", qk.e5m2),
    ("float6_e2m3fn", qk.e2m3), ("float6_e2m3", qk.e2m3), ("e3m2", qk.e3m2),
    ("float6_e3m2fn", qk.e3m2), ("float4_e2m1fn", qk.e2m1), ("float4_e2m1", qk.e2m1),
    ("e2m1", qk.e2m1), ("float8_e8m0fnu", qk.e8m0), ("e8m0", qk.e8m0), ("int4", qk.i4),
    ("uint4", qk.u4), ("uint1", qk.u1), ("int8", qk.i8), ("uint8", qk.u8), ("i32", qk.i32),
    ("float32", qk.f32), ("F16", qk.f16), ("float16", qk.f16)])
def test_from_name(name, t):
    assert qk.from_name(name) is t


@pytest.mark.parametrize("name", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                                  "float8_e3m4", "int2"])
def test_from_name_rejected(name):
    with pytest.raises(TypeError, match="not supported"):
        qk.from_name(name)


def test_from_name_unknown_and_type():
    with pytest.raises(KeyError, match="unknown element type"):
        qk.from_name("float7")
    with pytest.raises(TypeError):
        qk.from_name(qk.bf16)


# numpy / ml_dtypes dtypes name the numba_qk type of the identical format (issue 21 C)
DTYPE_TYPES = [(np.float32, qk.f32), (np.float16, qk.f16), (np.int8, qk.i8), (np.uint8, qk.u8),
               (np.int32, qk.i32), (ml.bfloat16, qk.bf16), (ml.float8_e4m3fn, qk.e4m3),
               (ml.float8_e5m2, qk.e5m2), (ml.float6_e2m3fn, qk.e2m3),
               (ml.float6_e3m2fn, qk.e3m2), (ml.float8_e8m0fnu, qk.e8m0),
               (ml.float4_e2m1fn, qk.e2m1), (ml.int4, qk.i4), (ml.uint4, qk.u4)]


@pytest.mark.parametrize("sctype,t", DTYPE_TYPES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_numpy_and_ml_dtypes_name_element_types(sctype, t):
    for spelling in (sctype, np.dtype(sctype), np.dtype(sctype).newbyteorder("=")):
        assert D.from_dtype(spelling) is t
        assert qk.tensor.as_element_type(spelling) is t
        assert qk.from_name(spelling) is t
    assert D.from_dtype(t.dtype) is t                 # the inverse of ScalarType.dtype


@pytest.mark.parametrize("bad,match", [
    (np.float64, "numpy dtype float64 has no numba_qk element type"),
    (np.dtype("int64"), "numpy dtype int64 has no"), (np.bool_, "numpy dtype bool has no"),
    (np.complex64, "complex64"), (np.dtype(">f4"), "byte order"),
    (ml.float8_e4m3, "IEEE-like"), (ml.float8_e4m3fnuz, "float8_e4m3fnuz is not supported: "
                                                        "different bias"),
    (ml.float8_e5m2fnuz, "float8_e5m2fnuz is not supported"),
    (ml.float8_e4m3b11fnuz, "float8_e4m3b11fnuz is not supported: bias 11"),
    (ml.float8_e3m4, "float8_e3m4 is not supported"), (ml.int2, "int2 is not supported"),
    (ml.uint2, "uint2 is not supported")], ids=str)
def test_dtypes_without_a_numba_qk_type_are_type_errors(bad, match):
    x = np.zeros(4, np.float32)
    for call in (lambda: D.from_dtype(bad), lambda: qk.tensor.as_element_type(bad),
                 lambda: qk.astype(x, bad), lambda: qk.astype(x, np.dtype(bad)),
                 lambda: qk.Tensor(np.zeros(4, np.uint8), dtype=bad),
                 lambda: qk.astype(qk.astype(x, qk.bf16), bad)):
        with pytest.raises(TypeError, match=match):
            call()


def test_singletons_closed_pickle_copy():
    for t in D.ALL_TYPES:
        assert pickle.loads(pickle.dumps(t)) is t
        assert copy.copy(t) is t and copy.deepcopy(t) is t
        with pytest.raises(AttributeError):
            t.bits = 3
    assert qk.bf16 is qk.formats.bf16
    with pytest.raises(TypeError):
        ScalarType(object(), "X", "x", 1, None, True, None)
    with pytest.raises(TypeError):
        type("Sub", (ScalarType,), {})
    assert qk.from_ggml_type(30) is qk.bf16 and qk.from_ggml_type(1) is qk.f16


def test_numpy_reads_dtype_attribute():
    a = np.array([1.0, 2.0, 3.0], dtype=qk.bf16)
    assert a.dtype == ml.bfloat16 and float(a[0]) == 1.0
    assert np.array([0.3], dtype=qk.e4m3).dtype == ml.float8_e4m3fn
    assert np.array([1], dtype=qk.i4).dtype == ml.int4
    assert np.array([1.5], dtype=qk.f32).dtype == np.float32
    with pytest.raises(TypeError, match="u1"):
        np.array([1], dtype=qk.u1)


# ---- scalars ---------------------------------------------------------------------------------

def test_scalar_basics():
    s = qk.bf16(1.5)
    assert s.bits == 0x3FC0 and float(s) == 1.5 and s.dtype is qk.bf16
    assert repr(s) == "bf16(1.5, bits=0x3fc0)"
    assert s == 1.5 and s == qk.f32(1.5) and hash(s) == hash(1.5)
    assert {s: 1}[qk.bf16(1.5)] == 1
    with pytest.raises(AttributeError):
        s.bits = 1
    with pytest.raises(TypeError):
        qk.Scalar(1.0)
    assert pickle.loads(pickle.dumps(s)).bits == 0x3FC0
    assert qk.e4m3(0.3).bits == 0x2A and float(qk.e4m3(0.3)) == 0.3125


def test_scalar_policy_and_nan():
    n = qk.bf16(float("nan"))
    assert n != n and math.isnan(float(n)) and n.bits == 0x7FC0
    assert qk.bf16(-float("nan")).bits == 0xFFC0
    assert qk.e4m3(1e9).bits == 0x7E and qk.e4m3(-float("inf")).bits == 0xFE
    assert qk.e4m3(float("nan")).bits == 0x7F
    assert qk.e2m3(float("nan")).bits == 0 and qk.e2m1(-float("nan")).bits == 0
    assert qk.e2m1(100).bits == 0x7 and qk.e2m1(-0.0).bits == 0x8
    assert qk.e5m2(1e9).bits == 0x7C
    assert qk.e8m0(0.0).bits == 0xFF and qk.e8m0(float("inf")).bits == 0xFE
    assert qk.e8m0(3.0).bits == 129 and qk.e8m0(2.99).bits == 128 and qk.e8m0(2.0 ** -140).bits == 0
    assert qk.i4(-7.5).bits == 0x8 and int(qk.i4(-7.5)) == -8 and int(qk.i4(7.5)) == 7
    assert int(qk.u1(3)) == 1 and int(qk.i8(2.5)) == 2 and int(qk.i8(float("nan"))) == 0
    assert int(qk.i32(2 ** 40)) == 2 ** 31 - 1 and int(qk.u8(-3)) == 0
    assert qk.f16(65520.0).bits == 0x7C00 and qk.f16(65519.99).bits == 0x7BFF
    # one rounding of a huge Python int (no float conversion first)
    assert qk.bf16(2 ** 64 + 2 ** 56 + 1).bits == qk.bf16(2.0 ** 64 * (1 + 2 ** -7)).bits


def test_scalar_from_numpy_and_ml():
    assert qk.bf16(np.float32(0.1)).bits == np.float32(0.1).astype(ml.bfloat16).view(np.uint16)
    assert qk.e5m2(ml.bfloat16(3.0)) == 3.0
    assert qk.i4(np.int64(-9)) == -8


def test_scalar_from_bits_and_bad_dtypes():
    assert float(qk.Scalar.from_bits(qk.e4m3, 0x7E)) == 448.0
    assert int(qk.Scalar.from_bits(qk.i4, 0xF)) == -1
    for t, bad in [(qk.e2m3, 0x40), (qk.i4, 0x10), (qk.u1, 2), (qk.bf16, 1 << 16)]:
        with pytest.raises(ValueError, match="not a"):
            qk.Scalar.from_bits(t, bad)
    x = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="element type"):
        qk.astype(x, qk.quant.q4_k)
    with pytest.raises(TypeError, match="element type"):
        qk.astype(x, np.float64)
    with pytest.raises(KeyError, match="unknown element type"):
        qk.astype(x, "float7")
    with pytest.raises(TypeError, match="not supported"):
        qk.astype(x, "float8_e4m3fnuz")


# ---- one declaration per element type (issue 22) ----------------------------------------------

# sha256 over the pickles (protocols 0-5) of every element type, every block-scaled format and
# one scalar of every type, taken before the declarations moved into formats.scalars: pickles
# name the same lookups (numba_qk.formats._lookup_scalar, numba_qk.mx._lookup,
# numba_qk.dtypes._scalar_from_bits) byte for byte.
PICKLES_SHA256 = "ea663d3b7daf6fdadbf6748cfc5b87b282fd6324b277bbe76ac2240575d1a70f"


def test_pickles_are_byte_identical_to_the_golden_ones():
    import hashlib

    objs = [*D.ALL_TYPES, *qk.mx.FORMATS, *(t(1) for t in D.ALL_TYPES)]
    h = hashlib.sha256()
    for o in objs:
        for protocol in range(6):
            h.update(pickle.dumps(o, protocol=protocol))
    assert h.hexdigest() == PICKLES_SHA256


def test_every_element_type_is_one_declaration():
    """Each singleton carries its row (``t.spec``); the facts, names, ml_dtypes and DLPack
    spellings and storage are read from it; nothing mutates a singleton after it is made."""
    from numba_qk import _dlpack
    from numba_qk.formats import scalars
    from numba_qk.tensor import storage_dtype

    assert D.ALL_TYPES == scalars.ELEMENT_TYPES and len(D.ALL_TYPES) == 15
    assert qk.formats.SCALARS == (qk.f32, qk.f16, qk.bf16, qk.i8, qk.i32)
    from numba_qk.formats.ggml_types import GGML_TYPES
    assert [t.ggml_type for t in qk.formats.SCALARS] == [0, 1, 30, 24, 26]   # ggml.h's ids
    assert all(t.ggml_type == GGML_TYPES[t.name] for t in qk.formats.SCALARS)
    assert D.PACKED_TYPES == (qk.i4, qk.u4, qk.u1, qk.e2m1)
    for t in D.ALL_TYPES:
        s = t.spec
        assert (s.attr, s.name, s.payload_bytes, s.ggml_type) == (t._attr, t.name, t.block_bytes,
                                                                   t.ggml_type)
        assert (t.bits, t.bias, t.has_inf, t.has_nan, t.block_size) == (
            s.bits, s.bias, s.has_inf, s.has_nan, s.per_byte)
        assert all(qk.from_name(n) is t for n in s.names)
        assert storage_dtype(t) == np.dtype(s.storage)
        assert (t.numpy_dtype is None) == (s.numpy is None)
        if s.ml_dtypes is not None:
            assert t.dtype == np.dtype(getattr(ml, s.ml_dtypes)) and D.from_dtype(t.dtype) is t
        assert _dlpack._IMPORT[s.dlpack] is t
        assert _dlpack._EXPORT[t] == ((_dlpack.kDLUInt, 8) if t.is_packed else s.dlpack)
        with pytest.raises(TypeError):
            t._facts["max"] = 0                      # the facts are a read-only mapping
        with pytest.raises(AttributeError):
            t.spec = s
    for f in qk.mx.FORMATS:                          # declared beside them
        assert qk.formats.mx.find_scaled(f.name) is f and f.element in D.ALL_TYPES


def test_the_declarations_agree_with_the_kernels():
    """The rows' kernel kinds are the codec kernels' codes, and the rows' overflow and NaN
    codes are what the kernels (astype) and the oracle (scalars) encode inf, huge values and
    NaNs of either sign to; decoding the row's largest finite code gives ``t.max``."""
    from numba_qk.kernels.lowp import codecs as L
    from numba_qk.kernels.mx import codecs as M

    for t in D.ALL_TYPES:
        assert t.spec.kernel_kind == getattr(L, f"K_{t.name}")
    mx_kinds = {qk.e2m1: M.E2M1, qk.e2m3: M.E2M3, qk.e3m2: M.E3M2, qk.e4m3: M.E4M3,
                qk.e5m2: M.E5M2, qk.i8: M.INT8}
    assert {t: t.spec.mx_kernel_kind for t in D.ALL_TYPES
            if t.spec.mx_kernel_kind is not None} == mx_kinds
    x = np.tile(np.array([np.inf, 1e300, np.nan, -np.nan]), 2)
    for t in D.ALL_TYPES:
        s = t.spec
        neg_nan = s.nan_code | (1 << (s.bits - 1)) if s.nan_signed else s.nan_code
        want = [s.overflow_code, s.overflow_code, s.nan_code, neg_nan] * 2
        r = qk.astype(x, t)
        got = r.codes() if isinstance(r, qk.Tensor) else r.view(f"u{r.dtype.itemsize}")
        assert got.tolist() == want, t
        assert [t(float(v)).bits for v in x[:4]] == want[:4], t
        if t.is_float:
            assert float(D.Scalar.from_bits(t, s.max_code)) == t.max


# ---- the scalar API's own exact code (formats/exact.py) is the oracle's twin ------------------

def _same(a, b) -> bool:
    """Identical Python values: same type, equal, same sign of zero and of NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b) and math.copysign(1, a) == math.copysign(1, b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


def _codes(t):
    """Every code; for the 32-bit types every top 9 bits (f32: sign and exponent) with edge and
    random low bits."""
    if t.bits <= 16:
        return range(1 << t.bits)
    rng = random.Random(t.bits)
    lows = [0, 1, 2, 3, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF]
    lows += [rng.getrandbits(23) for _ in range(23)]
    return [(hi << 23) | lo for hi in range(512) for lo in lows]


@pytest.mark.parametrize("t", D.ALL_TYPES, ids=str)
def test_scalar_values_are_the_oracles_on_every_code(t):
    from numba_qk.testing.reference import lowp as ref

    for c in _codes(t):
        assert _same(D.Scalar.from_bits(t, c).value(), ref.decode(t, c)), (t, hex(c))


_TINY = Fraction(1, 2 ** 400)


def _around(x):
    """x and its neighbours just below and above, exactly (Fractions) and as float64s."""
    out = [x, x - _TINY, x + _TINY]
    f = float(x)
    out += [f, math.nextafter(f, -math.inf), math.nextafter(f, math.inf)]
    return out


def _adversarial_values(t):
    """A dense set of values for ``t``: the representable values, every tie between neighbours
    and the values just beside them, the overflow and underflow thresholds, huge and tiny ints
    and Fractions, subnormals, +-inf, NaNs of both signs, +-0; each with both signs."""
    rng = random.Random(sum(map(ord, t.name)))
    vals = [0, 0.0, math.inf, math.nan, Fraction(0)]
    vals += [n for k in range(0, 1100, 7) for n in (2 ** k - 1, 2 ** k, 2 ** k + 1)]
    vals += [10 ** 400, Fraction(1, 10 ** 400), Fraction(10 ** 400 + 1, 3), Fraction(1, 3)]
    vals += [n / 2 for n in range(-40, 41)] + [Fraction(n, 2) for n in range(-600, 601)]
    vals += [Fraction(n, 4) for n in range(-40, 41)] + [Fraction(n, 10) for n in range(-40, 41)]
    vals += [math.ldexp(f, e) for e in range(-160, 140)
             for f in (1.0, 1.25, 1.5, 1.75, 1 + 2 ** -24, 1 - 2 ** -25, 1 + 2 ** -9)]
    vals += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(2000)]
    if t.is_float:
        if t.bits <= 16:          # every representable magnitude and every tie between them
            mags = sorted({Fraction(D.Scalar.from_bits(t, c).value()) for c in range(1 << t.bits)
                           if math.isfinite(D.Scalar.from_bits(t, c).value())})
            mags = [m for m in mags if m >= 0]
        else:                     # f32: every binade, at edge and random significands
            codes = [(e << 23) | m for e in range(255)
                     for m in (0, 1, 2, 0x400000, 0x7FFFFE, 0x7FFFFF, *(rng.getrandbits(23)
                                                                      for _ in range(4)))]
            mags = sorted(Fraction(D.Scalar.from_bits(t, c).value()) for c in codes)
        for lo, hi in zip(mags, mags[1:]):    # f16/bf16: the neighbours of 1 tie in 4
            vals += [lo, (lo + hi) / 2]
            if t.bits < 16 or rng.random() < 0.25:
                vals += _around(lo) + _around((lo + hi) / 2)
        if t is qk.e8m0:
            vals += [Fraction(3, 2) * m for m in mags] + [Fraction(3, 4) * mags[0]]
        top = mags[-1]
        ulp = top - mags[-2]
        vals += _around(top + ulp / 2) + _around(top + ulp) + _around(2 * top)
        vals += _around(mags[1] / 2) + _around(mags[1] / 4 * 3)
    else:
        lo, hi = int(t.min), int(t.max)
        for e in (lo, hi, 0):
            for k in range(-3, 4):
                vals += _around(Fraction(e + k)) + _around(Fraction(2 * (e + k) + 1, 2))
        if t.bits < 32:
            vals += [Fraction(2 * n + 1, 2) for n in range(lo - 2, hi + 2)]
    return vals + [-v for v in vals]


# one type of each encode family by default (float, fp8, sub-byte float, scale, int), -m slow all
# (BF16 too: ~340k values through the Fraction oracle, ~10 s of CPU as F16's)
@pytest.mark.parametrize("t", default_few(D.ALL_TYPES, {"F16", "E4M3", "E2M1", "E8M0", "I8",
                                                        "I4"}))
def test_scalar_encode_is_the_oracles_on_adversarial_values(t):
    """``t(value)`` gives the oracle's code for a dense set of values (one rounding of the exact
    value of a Python int, float or Fraction)."""
    from numba_qk.testing.reference import lowp as ref

    for v in _adversarial_values(t):
        assert t(v).bits == ref.encode(t, v), (t, v)
