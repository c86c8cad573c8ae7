"""Low-precision element types (spec 004): the facts table, the singletons, names and scalars.

Every element type is a closed :class:`~numba_qk.formats.ScalarType` singleton, like
``numba_qk.f32``.  This module declares the low-precision ones and attaches to *every* scalar
type its numeric facts (one table, :data:`FACTS`):

=========  =====  ==========  =====  ======================  ====  ====  ========
type       bits   S+E+M       bias   range                   inf   NaN   per byte
=========  =====  ==========  =====  ======================  ====  ====  ========
f32        32     1+8+23      127    +-3.4e38                yes   yes   --
f16        16     1+5+10      15     +-65504                 yes   yes   --
bf16       16     1+8+7       127    +-3.39e38               yes   yes   --
e4m3       8      1+4+3       7      +-448 (OCP E4M3 "fn")   no    yes   --
e5m2       8      1+5+2       15     +-57344                 yes   yes   --
e2m3       6      1+2+3       1      +-7.5  (1 per byte)     no    no    --
e3m2       6      1+3+2       3      +-28   (1 per byte)     no    no    --
e2m1       4      1+2+1       1      +-6                     no    no    2
e8m0       8      0+8+0       127    2^-127 .. 2^127         no    yes   --
i8/u8/i32  8/8/32 integers                                   --    --    --
i4 / u4    4      -8..7 / 0..15                              --    --    2
u1         1      0..1 (a number)                            --    --    8
=========  =====  ==========  =====  ======================  ====  ====  ========

Packed types put element 0 in the high nibble (i4, u4, e2m1) or the most significant bit (u1,
the ``numpy.packbits`` order).  fp6 codes sit in the low 6 bits of a byte (ml_dtypes' layout).

``ml_dtypes`` is optional: without it everything works except ``ScalarType.dtype`` for the
types numpy lacks (bf16, fp8/6/4, e8m0, i4/u4), which then raises a clear ``TypeError``.
"""

from __future__ import annotations

import math
from fractions import Fraction

from . import formats as _formats
from .formats import ScalarType, _TOKEN, bf16, f16, f32, i8, i32

__all__ = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "u8", "i4", "u4", "u1",
           "ALL_TYPES", "FLOAT_TYPES", "INT_TYPES", "PACKED_TYPES", "FACTS", "from_name",
           "from_dtype", "value_dtype", "Scalar", "scalar"]

# ScalarType(token, name, attr, payload bytes, numpy storage dtype, is_float, ggml type id)
e4m3 = ScalarType(_TOKEN, "E4M3", "e4m3", 1, None, True, None)
e5m2 = ScalarType(_TOKEN, "E5M2", "e5m2", 1, None, True, None)
e2m3 = ScalarType(_TOKEN, "E2M3", "e2m3", 1, None, True, None)
e3m2 = ScalarType(_TOKEN, "E3M2", "e3m2", 1, None, True, None)
e2m1 = ScalarType(_TOKEN, "E2M1", "e2m1", 1, None, True, None)
e8m0 = ScalarType(_TOKEN, "E8M0", "e8m0", 1, None, True, None)
u8 = ScalarType(_TOKEN, "U8", "u8", 1, "u1", False, None)
i4 = ScalarType(_TOKEN, "I4", "i4", 1, None, False, None)
u4 = ScalarType(_TOKEN, "U4", "u4", 1, None, False, None)
u1 = ScalarType(_TOKEN, "U1", "u1", 1, None, False, None)


def _float_facts(sign, ebits, mbits, bias, has_inf, has_nan, max_mag_code, per_byte=1):
    """Facts of a sign/exponent/mantissa format; ``max_mag_code``: the largest finite magnitude."""
    e, m = max_mag_code >> mbits, max_mag_code & ((1 << mbits) - 1)
    fmax = Fraction(2) ** (e - bias) * (1 + Fraction(m, 1 << mbits))
    return dict(kind="float", bits=sign + ebits + mbits, sign_bits=sign, exponent_bits=ebits,
                mantissa_bits=mbits, bias=bias, has_inf=has_inf, has_nan=has_nan,
                per_byte=per_byte, max=float(fmax), min=-float(fmax),
                tiny=math.ldexp(1.0, 1 - bias),                       # smallest normal
                smallest_subnormal=math.ldexp(1.0, 1 - bias - mbits),
                eps=math.ldexp(1.0, -mbits), max_code=max_mag_code)


def _int_facts(bits, signed, per_byte=1):
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return dict(kind="int" if signed else "uint", bits=bits, sign_bits=int(signed),
                exponent_bits=0, mantissa_bits=0, bias=0, has_inf=False, has_nan=False,
                per_byte=per_byte, max=hi, min=lo, tiny=None, smallest_subnormal=None, eps=None,
                max_code=(1 << bits) - 1)


FACTS = {
    f32: _float_facts(1, 8, 23, 127, True, True, 0x7F7FFFFF),
    f16: _float_facts(1, 5, 10, 15, True, True, 0x7BFF),
    bf16: _float_facts(1, 8, 7, 127, True, True, 0x7F7F),
    e4m3: _float_facts(1, 4, 3, 7, False, True, 0x7E),       # S.1111.111 is NaN
    e5m2: _float_facts(1, 5, 2, 15, True, True, 0x7B),
    e2m3: _float_facts(1, 2, 3, 1, False, False, 0x1F),
    e3m2: _float_facts(1, 3, 2, 3, False, False, 0x1F),
    e2m1: _float_facts(1, 2, 1, 1, False, False, 0x7, per_byte=2),
    e8m0: dict(_float_facts(0, 8, 0, 127, False, True, 0xFE), kind="e8m0", min=2.0 ** -127,
               tiny=2.0 ** -127, smallest_subnormal=2.0 ** -127, eps=1.0),
    i8: _int_facts(8, True),
    u8: _int_facts(8, False),
    i32: _int_facts(32, True),
    i4: _int_facts(4, True, per_byte=2),
    u4: _int_facts(4, False, per_byte=2),
    u1: _int_facts(1, False, per_byte=8),
}
FACTS[e8m0]["max"] = 2.0 ** 127

for _t, _f in FACTS.items():
    _f["payload_bytes"] = _t.block_bytes
    _f["is_packed"] = _f["per_byte"] > 1
    _f["code_bits"] = 8 * _t.block_bytes // _f["per_byte"]   # storage bits of one code
    _formats._register_scalar(_t, _f)

ALL_TYPES = tuple(FACTS)
FLOAT_TYPES = tuple(t for t in ALL_TYPES if t.is_float)
INT_TYPES = tuple(t for t in ALL_TYPES if not t.is_float)
PACKED_TYPES = (i4, u4, u1, e2m1)

# --- names -----------------------------------------------------------------------------------

_NAMES = {
    f32: ("f32", "float32", "F32"), f16: ("f16", "float16", "half", "F16"),
    bf16: ("bf16", "bfloat16", "BF16"),
    e4m3: ("e4m3", "float8_e4m3", "float8_e4m3fn", "fp8_e4m3", "E4M3"),
    e5m2: ("e5m2", "float8_e5m2", "fp8_e5m2", "E5M2"),
    e2m3: ("e2m3", "float6_e2m3", "float6_e2m3fn", "fp6_e2m3", "E2M3"),
    e3m2: ("e3m2", "float6_e3m2", "float6_e3m2fn", "fp6_e3m2", "E3M2"),
    e2m1: ("e2m1", "float4_e2m1", "float4_e2m1fn", "fp4_e2m1", "E2M1"),
    e8m0: ("e8m0", "float8_e8m0", "float8_e8m0fnu", "ue8m0", "E8M0"),
    i8: ("i8", "int8", "I8"), u8: ("u8", "uint8", "U8"), i32: ("i32", "int32", "I32"),
    i4: ("i4", "int4", "I4"), u4: ("u4", "uint4", "U4"), u1: ("u1", "uint1", "U1"),
}
_BY_NAME = {n: t for t, names in _NAMES.items() for n in names}
# Names of formats that look alike but are NOT these encodings (spec 004's "Rejected" rows).
_REJECTED = {
    "float8_e4m3fnuz": "different bias, NaN and zero encoding",
    "float8_e5m2fnuz": "different NaN and zero encoding",
    "float8_e4m3b11fnuz": "bias 11, incompatible encoding",
    "float8_e3m4": "no numba_qk kernel",
    "int2": "no numba_qk kernel", "uint2": "no numba_qk kernel",
}


def from_name(name: str):
    """The element type for a NumKong, ml_dtypes or ggml type name (``"bfloat16"``, ``"e4m3"``,
    ``"float8_e4m3fn"``, ``"int4"``, ``"BF16"`` ...), or the block-scaled format for
    ``"mxfp4"``, ``"nvfp4"`` ... (a :class:`~numba_qk.formats.ScaledFormat`, ``numba_qk.mx``).
    A numpy or ml_dtypes dtype (``numpy.float16``, ``numpy.dtype("int8")``,
    ``ml_dtypes.bfloat16``) is looked up by :func:`from_dtype`.

    ``"float8_e4m3"`` is NumKong's spelling of OCP E4M3 (= ml_dtypes' ``float8_e4m3fn``); ml_dtypes'
    *array dtype* ``float8_e4m3`` (IEEE-like, with infinities) is accepted by ``astype`` by value,
    never as e4m3 bits.
    """
    if is_dtype_like(name):
        return from_dtype(name)
    if not isinstance(name, str):
        raise TypeError(f"from_name: expected a str, got {type(name).__name__}")
    t = _BY_NAME.get(name) or _BY_NAME.get(name.lower())
    if t is not None:
        return t
    fmt = _formats.mx.find_scaled(name)   # block-scaled formats (declared in numba_qk.mx)
    if fmt is not None:
        return fmt
    if name.lower() in _REJECTED:
        raise TypeError(f"element type {name!r} is not supported: {_REJECTED[name.lower()]}")
    raise KeyError(f"unknown element type name {name!r}; known: {', '.join(sorted(_BY_NAME))}")


# --- numpy / ml_dtypes value dtypes ----------------------------------------------------------

_ML_NAMES = {bf16: "bfloat16", e4m3: "float8_e4m3fn", e5m2: "float8_e5m2",
             e2m3: "float6_e2m3fn", e3m2: "float6_e3m2fn", e2m1: "float4_e2m1fn",
             e8m0: "float8_e8m0fnu", i4: "int4", u4: "uint4"}


# ml_dtypes dtype name -> the numba_qk type of the identical encoding (the inverse of _ML_NAMES)
_ML_TYPES = {name: t for t, name in _ML_NAMES.items()}
_ML_NOT_E4M3 = ("ml_dtypes float8_e4m3 is the IEEE-like E4M3 (with infinities), not numba_qk.e4m3 "
                "(OCP E4M3, ml_dtypes float8_e4m3fn); astype reads such arrays by value but no "
                "numba_qk type holds that encoding")


def is_dtype_like(obj) -> bool:
    """Whether ``obj`` is a numpy dtype or a numpy/ml_dtypes scalar type (``np.float16``,
    ``np.dtype("int8")``, ``ml_dtypes.bfloat16``)."""
    import numpy as np

    return isinstance(obj, np.dtype) or (isinstance(obj, type) and issubclass(obj, np.generic))


def dtype_lookup(dt):
    """(element type, None) for a numpy dtype of a numba_qk type's values, else (None, why)."""
    import numpy as np

    if dt.byteorder not in "=|" and (dt.byteorder == "<") != np.little_endian:
        return None, f"dtype {dt.str} is not in native byte order"
    if dt.type.__module__.split(".")[0] == "ml_dtypes":
        t = _ML_TYPES.get(dt.name)
        if t is not None:
            return t, None
        if dt.name == "float8_e4m3":
            return None, _ML_NOT_E4M3
        why = _REJECTED.get(dt.name, "no numba_qk element type has that encoding")
        return None, f"ml_dtypes {dt.name} is not supported: {why}"
    for t in FACTS:                       # numpy's own: f32, f16, i8, u8, i32
        if t.numpy_dtype is not None and t.numpy_dtype == dt and dt.type.__module__ == "numpy":
            return t, None
    return None, (f"numpy dtype {dt.name} has no numba_qk element type (numpy's float32, "
                  f"float16, int8, uint8 and int32 are numba_qk's f32, f16, i8, u8 and i32)")


def from_dtype(dtype) -> ScalarType:
    """The numba_qk element type of the identical format for a numpy or ml_dtypes dtype (a
    ``numpy.dtype`` or a scalar type: ``numpy.float16``, ``ml_dtypes.float8_e4m3fn``): the
    inverse of :func:`value_dtype` (``from_dtype(t.dtype) is t``).  A ``TypeError`` naming the
    dtype and why for the rest: numpy dtypes numba_qk has no type for (float64, int64, bool
    ...), ml_dtypes' IEEE-like ``float8_e4m3`` and spec 004's rejected formats (``*fnuz``,
    ``float8_e4m3b11fnuz``, ``float8_e3m4``, ``int2``/``uint2``)."""
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"from_dtype: expected a numpy or ml_dtypes dtype, got "
                        f"{type(dtype).__name__}") from None
    t, why = dtype_lookup(dt)
    if t is None:
        raise TypeError(why)
    return t


def ml_dtypes_module():
    """The ml_dtypes module, or None where it is not installed."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - exercised in an environment without ml_dtypes
        return None
    return ml_dtypes


def value_dtype(t: ScalarType):
    """The numpy dtype holding values of ``t`` one per element (ml_dtypes' for bf16/fp8/...).

    This is what ``t.dtype`` answers, so ``np.array([1.0, 2.0], dtype=numba_qk.bf16)`` works
    when ml_dtypes is installed.  ``u1`` has no numpy dtype (use ``numba_qk.astype``).
    """
    import numpy as np

    if t.numpy_dtype is not None:
        return t.numpy_dtype
    if t is u1:
        raise TypeError("numba_qk.u1 has no numpy dtype; use numba_qk.astype(a, numba_qk.u1)")
    ml = ml_dtypes_module()
    if ml is None:
        raise TypeError(f"numba_qk.{t._attr} needs ml_dtypes for a numpy dtype "
                        f"(pip install ml_dtypes); numba_qk.astype works without it")
    return np.dtype(getattr(ml, _ML_NAMES[t]))


# --- scalars ---------------------------------------------------------------------------------

class Scalar:
    """An immutable scalar of a numba_qk element type: ``numba_qk.bf16(1.5)``.

    ``.bits`` is the code (for packed types the nibble / bit, for i4 two's complement in 0..15),
    ``float()`` the exact value, equality and hashing are by value (NaN != NaN, like float).
    """

    __slots__ = ("_dtype", "_bits")

    def __init__(self, *a, **k):
        raise TypeError("make scalars by calling an element type: numba_qk.bf16(1.5)")

    @classmethod
    def _make(cls, t, bits):
        obj = object.__new__(cls)
        object.__setattr__(obj, "_dtype", t)
        object.__setattr__(obj, "_bits", int(bits))
        return obj

    @classmethod
    def from_bits(cls, t: ScalarType, bits: int) -> "Scalar":
        """The scalar whose code is ``bits`` (checked against the type's code width)."""
        if not isinstance(t, ScalarType):
            raise TypeError(f"from_bits: expected an element type, got {type(t).__name__}")
        bits = int(bits)
        if not 0 <= bits < (1 << t.code_bits) or (t.code_bits == 8 and t.bits == 6 and bits >= 64):
            raise ValueError(f"{bits:#x} is not a {t.name} code")
        return cls._make(t, bits)

    def __setattr__(self, k, v):
        raise AttributeError("numba_qk scalars are immutable")

    @property
    def dtype(self) -> ScalarType:
        return self._dtype

    @property
    def bits(self) -> int:
        return self._bits

    def value(self):
        """The exact value: a Python float for float types (inf/NaN included), int for integers."""
        from .reference_lowp import decode

        return decode(self._dtype, self._bits)

    def __float__(self):
        return float(self.value())

    def __int__(self):
        v = self.value()
        return int(v)

    def __index__(self):
        if self._dtype.is_float:
            raise TypeError(f"{self._dtype.name} scalars are not integers")
        return self.value()

    def __bool__(self):
        return bool(self.value())

    def __eq__(self, other):
        if isinstance(other, Scalar):
            return self.value() == other.value()
        if isinstance(other, (int, float, Fraction)):
            return self.value() == other
        try:
            import numpy as np
            if isinstance(other, np.generic):
                return self.value() == other.item()
        except ImportError:  # pragma: no cover
            pass
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __lt__(self, other):
        return self.value() < float(other)

    def __le__(self, other):
        return self.value() <= float(other)

    def __gt__(self, other):
        return self.value() > float(other)

    def __ge__(self, other):
        return self.value() >= float(other)

    def __hash__(self):
        return hash(self.value())

    def __neg__(self):
        return scalar(self._dtype, -self.value())

    def __repr__(self):
        width = max(1, (self._dtype.code_bits + 3) // 4)
        return f"{self._dtype._attr}({self.value()!r}, bits=0x{self._bits:0{width}x})"

    def __reduce__(self):
        return (_scalar_from_bits, (self._dtype, self._bits))


def _scalar_from_bits(t, bits):
    return Scalar._make(t, bits)


def scalar(t: ScalarType, value) -> Scalar:
    """``t(value)``: one rounding of the exact value under the astype policy (DESIGN.md §8)."""
    from .reference_lowp import encode

    if isinstance(value, Scalar):
        value = value.value()
    elif isinstance(value, bool):
        value = int(value)
    elif not isinstance(value, (int, float, Fraction)):
        try:
            import numpy as np
            if isinstance(value, np.generic):
                value = value.item()
            else:
                value = float(value)
        except ImportError:  # pragma: no cover
            value = float(value)
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            value = float(value)
    return Scalar._make(t, encode(t, value))


# What an element type does beyond its declaration (``formats.scalars.BEHAVIOUR``): numpy's
# view of its values (``np.array(x, dtype=qk.bf16)``) and ``qk.bf16(1.5)``.
_formats.scalars.BEHAVIOUR.update(value_dtype=value_dtype, scalar=scalar)
