"""Plain element types (``ScalarType``) and their declarations: one element per "block".

Element types that are not block formats live here together with their class, so that new
low-precision types extend one module.
"""

from __future__ import annotations

from typing import Optional

from ._schema import _TOKEN, _Frozen, _check_count, _no_subclass

__all__ = ["ScalarType", "f32", "f16", "bf16", "i8", "i32", "SCALARS", "BEHAVIOUR"]

#: What an element type does beyond its declaration -- ``value_dtype(t)`` (numpy's view of its
#: values) and ``scalar(t, value)`` (``t(value)``) -- supplied by :mod:`numba_qk.dtypes`, the
#: layer above, when it is imported (``numba_qk`` always imports it).  A table filled from
#: above instead of an import from here keeps the declarations free of upward imports.
BEHAVIOUR: dict = {}

_SCALARS_BY_ATTR: dict = {}   # every ScalarType, by attribute name, as it is declared


def _lookup_scalar(attr):
    """The ScalarType named ``attr`` (what a pickled ScalarType refers to)."""
    return _SCALARS_BY_ATTR[attr]


_lookup_scalar.__module__ = "numba_qk.formats"   # pickles name numba_qk.formats._lookup_scalar


@_no_subclass
class ScalarType(_Frozen):
    """A plain element type (closed singleton).

    Packed sub-byte types (``i4``, ``u4``, ``e2m1``: two per byte; ``u1``: eight) count
    ``block_size`` elements per ``block_bytes = 1`` byte.  The numeric facts (``bits``,
    ``exponent_bits``, ``max`` ...) come from the table in :mod:`numba_qk.dtypes`, which also
    declares the low-precision singletons; calling a type (``qk.bf16(1.5)``) makes a scalar.
    """

    __slots__ = ("name", "block_bytes", "ggml_type", "_attr", "_numpy", "_is_float", "_facts")

    is_quantized = False

    def __init__(self, token, name, attr, nbytes, numpy_name, is_float, ggml_type):
        if token is not _TOKEN:
            raise TypeError("ScalarType objects are created by numba_qk only; use numba_qk.f32")
        self._init(name=name, _attr=attr, block_bytes=nbytes, _numpy=numpy_name,
                   _is_float=is_float, ggml_type=ggml_type, _facts=None)
        _SCALARS_BY_ATTR[attr] = self

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def block_size(self) -> int:
        """Elements per ``block_bytes``: 1, or 2 / 8 for packed sub-byte types."""
        return self._facts["per_byte"] if self._facts else 1

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8.0 / self.block_size

    @property
    def numpy_dtype(self):
        """The numpy dtype with the same storage (little-endian), or None (bf16: numpy has none)."""
        import numpy as np

        return None if self._numpy is None else np.dtype(self._numpy)

    def storage_bytes(self, n: int) -> Optional[int]:
        n = _check_count(n)
        return None if n % self.block_size else n // self.block_size * self.block_bytes

    def __getattr__(self, key):  # the numeric facts (bits, max, has_inf, ...): numba_qk.dtypes
        if key == "dtype":  # lets numpy read ``np.array(x, dtype=qk.bf16)``
            return BEHAVIOUR["value_dtype"](self)
        facts = object.__getattribute__(self, "_facts")
        if facts is not None and key in facts:
            return facts[key]
        raise AttributeError(f"{type(self).__name__} {self.name} has no attribute {key!r}")

    def __call__(self, value):
        """A scalar of this type: ``numba_qk.bf16(1.5)`` (one rounding, the astype policy)."""
        return BEHAVIOUR["scalar"](self, value)

    def __repr__(self):
        return f"numba_qk.{self._attr}"

    def __str__(self):
        return self.name

    def __reduce__(self):
        return (_lookup_scalar, (self._attr,))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


ScalarType.__module__ = "numba_qk.formats"

f32 = ScalarType(_TOKEN, "F32", "f32", 4, "<f4", True, 0)
f16 = ScalarType(_TOKEN, "F16", "f16", 2, "<f2", True, 1)
bf16 = ScalarType(_TOKEN, "BF16", "bf16", 2, None, True, 30)
i8 = ScalarType(_TOKEN, "I8", "i8", 1, "i1", False, 24)
i32 = ScalarType(_TOKEN, "I32", "i32", 4, "<i4", False, 26)

SCALARS = (f32, f16, bf16, i8, i32)  # declaration order = numba_qk's listing order
