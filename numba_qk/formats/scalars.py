"""Plain element types (``ScalarType``) and their declarations: one element per "block".

Element types that are not block formats live here together with their class, so that new
low-precision types extend one module.
"""

from __future__ import annotations

from typing import Optional

from ._schema import _TOKEN, _Frozen, _check_count, _no_subclass

__all__ = ["ScalarType", "f32", "f16", "bf16", "i8", "i32", "SCALARS"]


@_no_subclass
class ScalarType(_Frozen):
    """A plain element type (closed singleton): one element per block."""

    __slots__ = ("name", "block_bytes", "ggml_type", "_attr", "_numpy", "_is_float")

    block_size = 1
    is_quantized = False

    def __init__(self, token, name, attr, nbytes, numpy_name, is_float, ggml_type):
        if token is not _TOKEN:
            raise TypeError("ScalarType objects are created by numba_qk only; use numba_qk.f32")
        self._init(name=name, _attr=attr, block_bytes=nbytes, _numpy=numpy_name,
                   _is_float=is_float, ggml_type=ggml_type)

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def bits_per_element(self) -> float:
        return self.block_bytes * 8.0

    @property
    def numpy_dtype(self):
        """The numpy dtype with the same storage (little-endian), or None (bf16: numpy has none)."""
        import numpy as np

        return None if self._numpy is None else np.dtype(self._numpy)

    def storage_bytes(self, n: int) -> Optional[int]:
        return _check_count(n) * self.block_bytes

    def __repr__(self):
        return f"numba_qk.{self._attr}"

    def __str__(self):
        return self.name

    def __reduce__(self):
        from . import _lookup_scalar

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
