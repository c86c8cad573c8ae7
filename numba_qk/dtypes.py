"""Low-precision element types (spec 004): the singletons, names, numpy dtypes and scalars.

Every element type is a closed :class:`~numba_qk.formats.ScalarType` singleton, like
``numba_qk.f32``, declared once in :mod:`numba_qk.formats.scalars` (one row per type: bits,
bias, inf/NaN, codes, storage, names, ml_dtypes and DLPack spellings; the table of facts is
there).  This module presents them and derives from those rows the lookups by name
(:func:`from_name`) and by numpy / ml_dtypes dtype (:func:`from_dtype`, :func:`value_dtype`),
and makes scalars (``numba_qk.bf16(1.5)``, :class:`Scalar`), whose values and one-rounding
encodes are the plain-Python exact code of :mod:`numba_qk.formats.exact`.

``ml_dtypes`` is optional: without it everything works except ``ScalarType.dtype`` for the
types numpy lacks (bf16, fp8/6/4, e8m0, i4/u4), which then raises a clear ``TypeError``.
"""

from __future__ import annotations

from fractions import Fraction

from . import formats as _formats
from .formats import ScalarType
from .formats import exact as _exact
from .formats.scalars import ELEMENT_TYPES, FACTS  # noqa: F401  (FACTS: presented here)
from .formats.scalars import (bf16, e2m1, e2m3, e3m2, e4m3, e5m2, e8m0, f16, f32,  # noqa: F401
                              i4, i8, i32, u1, u4, u8)

__all__ = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "u8", "i4", "u4", "u1",
           "ALL_TYPES", "FLOAT_TYPES", "INT_TYPES", "PACKED_TYPES", "FACTS", "from_name",
           "from_dtype", "value_dtype", "Scalar", "scalar"]

ALL_TYPES = ELEMENT_TYPES
FLOAT_TYPES = tuple(t for t in ALL_TYPES if t.is_float)
INT_TYPES = tuple(t for t in ALL_TYPES if not t.is_float)
PACKED_TYPES = tuple(t for t in INT_TYPES + FLOAT_TYPES if t.is_packed)   # i4, u4, u1, e2m1

# --- names -----------------------------------------------------------------------------------

_BY_NAME = {n: t for t in ALL_TYPES for n in t.spec.names}
# Names of formats that look alike but are NOT these encodings (spec 004's "Rejected" rows).
REJECTED = {
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
    fmt = _formats.mx.find_scaled(name)   # block-scaled formats (numba_qk.mx)
    if fmt is not None:
        return fmt
    if name.lower() in REJECTED:
        raise TypeError(f"element type {name!r} is not supported: {REJECTED[name.lower()]}")
    raise KeyError(f"unknown element type name {name!r}; known: {', '.join(sorted(_BY_NAME))}")


# --- numpy / ml_dtypes value dtypes ----------------------------------------------------------

# ml_dtypes dtype name -> the numba_qk type of the identical encoding (the rows' ml_dtypes column)
ML_TYPES = {t.spec.ml_dtypes: t for t in ALL_TYPES if t.spec.ml_dtypes is not None}
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
        t = ML_TYPES.get(dt.name)
        if t is not None:
            return t, None
        if dt.name == "float8_e4m3":
            return None, _ML_NOT_E4M3
        why = REJECTED.get(dt.name, "no numba_qk element type has that encoding")
        return None, f"ml_dtypes {dt.name} is not supported: {why}"
    for t in ALL_TYPES:                   # numpy's own: f32, f16, i8, u8, i32
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
    return np.dtype(getattr(ml, t.spec.ml_dtypes))


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
        if not 0 <= bits < (1 << t.bits):          # fp6: 6 bits of a byte
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
        return _exact.decode(self._dtype, self._bits)

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
    return Scalar._make(t, _exact.encode(t, value))


# What an element type does beyond its declaration (``formats.scalars.BEHAVIOUR``): numpy's
# view of its values (``np.array(x, dtype=qk.bf16)``) and ``qk.bf16(1.5)``.
_formats.scalars.BEHAVIOUR.update(value_dtype=value_dtype, scalar=scalar)
