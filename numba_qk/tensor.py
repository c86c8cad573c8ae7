"""``numba_qk.Tensor``: bytes + element type + logical shape (spec 004).

For the element types numpy cannot express (bf16, fp8/6/4, e8m0, packed i4/u4/u1) and any other
numba_qk element type.  A Tensor owns (or views) a numpy *storage* array:

* one storage unit per element for byte-sized and wider types (uint16 codes for bf16, uint8
  codes for fp8/fp6/e8m0, the numpy dtype for f32/f16/i8/u8/i32);
* for packed types, uint8 bytes with the last axis divided by the elements per byte (2 for
  i4/u4/e2m1 with element 0 in the high nibble, 8 for u1 with element 0 in the MSB).

``shape`` counts logical elements; ``nbytes``, ``__array_interface__``, ``memoryview(t.data)``
(and ``memoryview(t)`` on Python >= 3.12) expose the whole bytes.

numpy ufuncs, operators and array functions on a Tensor whose storage holds codes (bf16,
fp8/6/4, e8m0, packed types) raise a TypeError (decode with ``t.numpy()`` /
``numba_qk.astype(t, numba_qk.f32)``; codes with ``t.codes()`` / ``t.storage``); f32, f16, i8,
u8 and i32 Tensors hold values, and numpy computes on their storage.
"""

from __future__ import annotations

import operator

import numpy as np

from .dtypes import (PACKED_TYPES, Scalar, dtype_lookup, from_dtype, from_name, i4, is_dtype_like,
                     u1, value_dtype)
from .formats import ScalarType

__all__ = ["Tensor", "as_element_type", "storage_dtype"]

#: What a Tensor (and a ScaledTensor) does through the layers above it -- ``astype``
#: (:func:`numba_qk.astype`, supplied by :mod:`numba_qk.cast`), ``to_dlpack`` and
#: ``dlpack_packed`` (:mod:`numba_qk._dlpack`) -- filled when those modules are imported
#: (``numba_qk`` imports them all).  A table filled from above instead of an import from here
#: keeps the array types below the operations on them (``formats.scalars.BEHAVIOUR`` does the
#: same for the element types).
OPERATIONS: dict = {}

def as_element_type(dtype) -> ScalarType:
    """A numba_qk element type from a ScalarType, a NumKong/ml_dtypes/ggml name, or a numpy /
    ml_dtypes dtype (``numpy.float16``, ``numpy.dtype("int8")``, ``ml_dtypes.bfloat16``,
    ``numpy.dtype(ml_dtypes.float8_e4m3fn)``: the type of the identical format, see
    :func:`numba_qk.dtypes.from_dtype`; others are a TypeError naming the dtype and why)."""
    if isinstance(dtype, ScalarType):
        return dtype
    if is_dtype_like(dtype):
        try:
            return from_dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dtype: {exc}") from None
    if isinstance(dtype, str):
        t = from_name(dtype)
        if not isinstance(t, ScalarType):
            raise TypeError(f"{dtype!r} is a block-scaled format, not an element type (encode "
                            f"with numba_qk.astype(x, numba_qk.mx.{t.name}))")
        return t
    if getattr(type(dtype), "__name__", "") == "ScaledFormat":
        raise TypeError(f"{dtype!r} is a block-scaled format, not an element type (encode "
                        f"with numba_qk.astype(x, {dtype!r}))")
    raise TypeError(f"dtype: expected a numba_qk element type (e.g. numba_qk.bf16) or its name, "
                    f"got {type(dtype).__name__}")


def storage_dtype(t: ScalarType) -> np.dtype:
    """numpy dtype of one storage unit of ``t``: the values' own dtype where numpy has one
    (f32, f16, i8, u8, i32), else unsigned codes (uint16 for bf16; uint8 for fp8/fp6/e8m0, and
    bytes for the packed types): the row's ``storage``."""
    return np.dtype(t.spec.storage)


def storage_shape(t: ScalarType, shape) -> tuple:
    shape = tuple(shape)
    pb = t.block_size
    if pb == 1:
        return shape
    if not shape or shape[-1] % pb:
        raise ValueError(f"{t.name} packs {pb} elements per byte: the last axis must be a "
                         f"multiple of {pb}, got shape {shape}")
    return shape[:-1] + (shape[-1] // pb,)


class Tensor:
    """Bytes + element type + logical shape.

    ``Tensor(buffer, dtype=numba_qk.i4)`` wraps raw bytes without copying (an 8-byte uint8 array
    is 16 int4s); ``Tensor(array)`` infers the type from a numpy/ml_dtypes array of a numba_qk
    type (a view of its storage; ml_dtypes int4/uint4/float4, one per byte, are packed: a copy).
    ``dtype`` may also be a numpy / ml_dtypes dtype of the same format (``ml_dtypes.int4``).

    Indexing: integers (not bools) give scalars, slices views; slices of a packed last axis are
    byte-aligned with step 1, and any empty slice is an empty Tensor.  numpy computes only on
    values (see the module docstring): ufuncs and array functions on code storage raise.
    """

    __slots__ = ("_store", "_dtype", "_shape", "__weakref__")

    def __init__(self, obj, dtype=None):
        if isinstance(obj, Tensor):
            t = obj._dtype if dtype is None else as_element_type(dtype)
            if t is not obj._dtype:
                raise TypeError(f"Tensor of {obj._dtype.name} cannot be reinterpreted as "
                                f"{t.name}; use numba_qk.astype")
            self._set(obj._store, t)
            return
        arr = obj if isinstance(obj, np.ndarray) else np.asarray(memoryview(obj)) \
            if not hasattr(obj, "__array_interface__") else np.asarray(obj)
        if dtype is None:
            t = _numpy_element_type(arr)
            if t is None:
                raise TypeError(f"Tensor: numpy dtype {arr.dtype} is not a numba_qk element type;"
                                f" pass dtype= to reinterpret the bytes or use numba_qk.astype")
            if t in PACKED_TYPES:            # ml_dtypes int4/uint4/float4: one per byte -> pack
                res = OPERATIONS["astype"](arr, t)
                self._set(res._store, t)
                return
            self._set(arr.view(storage_dtype(t)), t)
            return
        t = as_element_type(dtype)
        sd = storage_dtype(t)
        if arr.dtype.itemsize != sd.itemsize or arr.dtype.kind not in "uifbV":
            if arr.ndim == 0:
                arr = arr.reshape(1)
            try:
                arr = arr.view(np.uint8).view(sd)
            except ValueError as exc:
                raise ValueError(f"Tensor: cannot reinterpret a {arr.dtype} buffer of shape "
                                 f"{arr.shape} as {t.name}: {exc}") from None
        else:
            arr = arr.view(sd)
        self._set(arr, t)

    def _set(self, store, t):
        self._store = store
        self._dtype = t
        pb = t.block_size
        shape = tuple(store.shape)
        if pb > 1:
            if not shape:
                raise ValueError(f"a {t.name} Tensor needs at least one axis (packed bytes)")
            shape = shape[:-1] + (shape[-1] * pb,)
        self._shape = shape

    @classmethod
    def _wrap(cls, store, t):
        self = object.__new__(cls)
        self._set(store, t)
        return self

    # ---- descriptive attributes ----
    @property
    def dtype(self) -> ScalarType:
        return self._dtype

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        """Payload bytes of one storage unit (1 for packed types: a byte holds 2 or 8)."""
        return self._store.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Whole bytes of storage."""
        return self._store.nbytes

    @property
    def storage(self) -> np.ndarray:
        """The storage array (a view: codes, or bytes for packed types)."""
        return self._store

    @property
    def data(self) -> memoryview:
        """A memoryview of the whole bytes (the storage)."""
        return memoryview(self._store)

    @property
    def __array_interface__(self):
        return self._store.__array_interface__

    def __buffer__(self, flags):  # Python >= 3.12: memoryview(tensor) gives the whole bytes
        return memoryview(self._store)

    # ---- numpy computes on values, never on codes ----
    # The storage of most types holds codes (bf16 bit patterns, fp8 bytes, packed nibbles), so a
    # ufunc or array function on it would add, sum or exp bit patterns.  Both protocols raise,
    # pointing at the decoded view and at the explicit code views; f32/f16/i8/u8/i32 Tensors,
    # whose storage holds the values in numpy's own dtype, compute on that storage (a plain
    # ndarray result).  Defining __array_ufunc__ also makes ndarray's operators (``arr + t``)
    # defer to it.  __array_interface__, the buffer and DLPack still expose the whole bytes.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        what = f"numpy.{getattr(ufunc, '__name__', ufunc)}"
        if method != "__call__":
            what += f".{method}"
        inputs = _values_of(inputs, what)
        if "out" in kwargs:
            kwargs["out"] = _values_of(kwargs["out"], what)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        what = f"numpy.{getattr(func, '__name__', func)}"
        return func(*_values_of(args, what), **_values_of(kwargs, what))

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d Tensor")
        return self._shape[0]

    def __repr__(self):
        return f"numba_qk.Tensor(shape={self._shape}, dtype={self._dtype!r}, nbytes={self.nbytes})"

    # ---- indexing ----
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        nd = self.ndim
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (nd - len(key) + 1) + key[i + 1:]
        if any(k is None for k in key):
            raise IndexError("Tensor indexing does not support numpy.newaxis")
        if len(key) > nd:
            raise IndexError(f"too many indices for a {nd}-d Tensor")
        ints = []
        for k in key:
            if isinstance(k, slice):
                ints.append(None)
            elif isinstance(k, (bool, np.bool_)):
                raise IndexError(f"Tensor indices must be integers or slices, not "
                                 f"{type(k).__name__} (numpy would read {k!r} as a mask)")
            else:
                try:
                    ints.append(operator.index(k))
                except TypeError:
                    raise IndexError(f"Tensor indices must be integers or slices, got "
                                     f"{type(k).__name__}") from None
        pb = self._dtype.block_size
        if len(key) == nd and all(i is not None for i in ints):
            idx = []
            for i, n in zip(ints, self._shape):
                if not -n <= i < n:
                    raise IndexError(f"index {i} out of range for axis of size {n}")
                idx.append(i % n)
            return self._scalar_at(tuple(idx))
        skey = list(key)
        if pb > 1 and len(key) == nd:
            last = key[-1]
            if ints[-1] is not None:
                raise IndexError(f"an integer index on the packed last axis of a {self._dtype.name}"
                                 f" Tensor yields no view; index every axis to get a scalar")
            start, stop, step = last.indices(self._shape[-1])
            if not len(range(start, stop, step)):          # empty: an empty view, any bounds
                skey[-1] = slice(0, 0)
            elif step != 1 or start % pb or stop % pb:
                raise IndexError(f"slices of the packed last axis of a {self._dtype.name} Tensor "
                                 f"must have step 1 and start/stop multiples of {pb}")
            else:
                skey[-1] = slice(start // pb, stop // pb)
        return Tensor._wrap(self._store[tuple(skey)], self._dtype)

    def _scalar_at(self, idx):
        pb = self._dtype.block_size
        if pb == 1:
            raw = self._store[idx]
            code = int(np.asarray(raw).reshape(1).view(
                np.dtype(f"u{self._store.dtype.itemsize}"))[0])
        else:
            byte = int(self._store[idx[:-1] + (idx[-1] // pb,)])
            bits = 8 // pb
            code = (byte >> (8 - bits - bits * (idx[-1] % pb))) & ((1 << bits) - 1)
        return Scalar._make(self._dtype, code)

    # ---- conversion ----
    def codes(self) -> np.ndarray:
        """One code per logical element (uint8/uint16/uint32, packed types unpacked), a copy."""
        return astype_codes(self)

    def numpy(self) -> np.ndarray:
        """A typed numpy array of the values (a copy): numpy's dtype where numpy has one,
        ml_dtypes' otherwise (TypeError without ml_dtypes: use ``.codes()``); u1 gives uint8 0/1."""
        t = self._dtype
        if t is u1:
            return self.codes().astype(np.uint8)
        vd = value_dtype(t)                                 # raises without ml_dtypes
        if t.block_size == 1:
            return np.array(self._store, copy=True).view(vd)
        codes = self.codes()
        if t is i4:
            return ((codes.astype(np.int8) ^ 8) - 8).astype(vd)
        return codes.view(vd)                            # u4 / e2m1: low-nibble one per byte

    def astype(self, dtype, *, out=None, threads=1):
        """``numba_qk.astype(self, dtype, out=out, threads=threads)``."""
        return OPERATIONS["astype"](self, dtype, out=out, threads=threads)

    def copy(self) -> "Tensor":
        return Tensor._wrap(np.array(self._store, copy=True, order="C"), self._dtype)

    def __dlpack__(self, *args, **kwargs):
        return OPERATIONS["to_dlpack"](self, *args, **kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def dlpack_packed(self):
        """A DLPack producer of this packed Tensor (i4, u4, e2m1, u1) in DLPack's own sub-byte
        layout: kDLFloat4_e2m1fn / kDLInt / kDLUInt with bits 4 (u1: 1), shape in elements,
        element 0 in the LOW bits -- a copy.  ``__dlpack__`` itself exports the storage bytes
        zero-copy (kDLUInt 8, element 0 in the high nibble).  E.g.
        ``consumer.from_dlpack(st.elements.dlpack_packed())`` for an nvfp4/mxfp4 ScaledTensor."""
        return OPERATIONS["dlpack_packed"](self)


def _values_of(obj, what):
    """``obj`` (an argument of a numpy ufunc / array function) with every Tensor replaced by its
    storage where that storage holds the values (f32, f16, i8, u8, i32); any other Tensor is a
    TypeError naming the operation and the ways to get values or codes."""
    if isinstance(obj, Tensor):
        t = obj._dtype
        if t.numpy_dtype is not None and t.block_size == 1:
            return obj._store
        holds = "packed bytes" if t.block_size > 1 else f"{obj._store.dtype} codes"
        raise TypeError(f"{what} on a numba_qk.Tensor of {t._attr}: its storage holds {holds}, "
                        f"not values; decode first (t.numpy(), or numba_qk.astype(t, "
                        f"numba_qk.f32)), or ask for the codes explicitly (t.codes(), t.storage)")
    if type(obj) in (tuple, list):
        return type(obj)(_values_of(o, what) for o in obj)
    if type(obj) is dict:
        return {k: _values_of(v, what) for k, v in obj.items()}
    return obj


def _numpy_element_type(arr):
    """The numba_qk element type whose values a numpy/ml_dtypes dtype holds, else None."""
    return dtype_lookup(arr.dtype)[0]


#: The unsigned numpy integer of each storage unit size (codes are read as these).
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def astype_codes(x: Tensor) -> np.ndarray:
    """One code per logical element of a Tensor (unsigned ints; packed types unpacked)."""
    t = x.dtype
    store = x.storage
    if t.block_size == 1:
        return np.array(store.view(UNSIGNED[store.dtype.itemsize]), copy=True)
    pb = t.block_size
    bits = 8 // pb
    shifts = np.arange(8 - bits, -1, -bits, dtype=np.uint8)           # element 0: high bits
    codes = (store[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(x.shape)
