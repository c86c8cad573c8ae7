"""Public operations: validation, carrier handling and dispatch to the ``@njit`` kernels.

Everything a user can get wrong is checked here, before any kernel runs; the kernels themselves
never raise for user error.  Inputs may be any numpy array or buffer-protocol object (read-only
memory maps, unaligned or strided views, ``memoryview``): the kernels read records byte by byte,
so results never depend on alignment or layout.  Nothing is ever converted silently: a wrong
dtype is an error, not a cast.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .errors import QuantizationDomainError
from .formats import Format, ScalarType, f32, quant
from .kernels.dot import dot_q4_k_q8_k
from .kernels.q4_k import q4_k_decode_records, q4_k_dequantize_records
from .kernels.q8_k import (
    q8_k_decode_records,
    q8_k_dequantize_records,
    q8_k_invalid_records,
    quantize_q8_k,
)

__all__ = [
    "quantize", "quantized_dot", "decode", "dequantize", "find_invalid_records",
    "Q4KFields", "Q8KFields",
]


class Q4KFields(NamedTuple):
    """Decoded Q4_K fields of ``G`` records."""

    d: np.ndarray     # float16 [G]
    dmin: np.ndarray  # float16 [G]
    sc: np.ndarray    # uint8 [G, 8]   (6-bit values)
    m: np.ndarray     # uint8 [G, 8]   (6-bit values)
    q: np.ndarray     # uint8 [G, 256] (4-bit values)


class Q8KFields(NamedTuple):
    """Decoded Q8_K fields of ``G`` records."""

    ds: np.ndarray    # float32 [G]
    q: np.ndarray     # int8 [G, 256]
    bsum: np.ndarray  # int16 [G, 16]


# ----------------------------------------------------------------------------- validation

def _as_array(obj, name: str) -> np.ndarray:
    """View ``obj`` as an ndarray without copying (arrays, memoryviews, any buffer)."""
    if isinstance(obj, np.ndarray):
        return obj
    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:
        return np.asarray(view)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        return np.asarray(obj)
    raise TypeError(f"{name}: expected a numpy array or a buffer-protocol object, "
                    f"got {type(obj).__name__}")


def _describe(value) -> str:
    if isinstance(value, (Format, ScalarType)):
        return f"{value!r} ({value.name})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return f"the numpy dtype {np.dtype(value).name}"
    return f"a {type(value).__name__}"


def _check_slot(value, name: str, expected, what: str) -> None:
    """A format slot takes exactly one closed schema object; anything else is a TypeError."""
    if value is expected:
        return
    hint = ""
    if isinstance(value, str) or isinstance(value, np.dtype) or (
            isinstance(value, type) and issubclass(value, np.generic)):
        hint = " (formats are typed schemas, never strings or dtypes)"
    raise TypeError(f"{name}: {what} expects {expected!r} ({expected.name}), "
                    f"got {_describe(value)}{hint}")


def _check_records(arr: np.ndarray, name: str, fmt: Format) -> None:
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 {fmt.name} records, got dtype {arr.dtype} "
                        f"(records are raw bytes; no cast is made)")
    if arr.ndim != 2 or arr.shape[1] != fmt.block_bytes:
        raise ValueError(f"{name}: expected shape [G, {fmt.block_bytes}] ({fmt.name} records of "
                         f"{fmt.block_bytes} bytes), got {tuple(arr.shape)}")


def _check_values(arr: np.ndarray, name: str, block: int) -> None:
    if arr.dtype != np.float32:
        raise TypeError(f"{name}: expected float32 values, got dtype {arr.dtype.str} "
                        f"({arr.dtype.name}); no cast is made")
    if arr.ndim != 2 or arr.shape[1] != block:
        raise ValueError(f"{name}: expected shape [G, {block}] (blocks of {block} values), "
                         f"got {tuple(arr.shape)}")


def _check_out(out, shape: tuple, dtype, inputs: tuple, what: str) -> np.ndarray:
    arr = _as_array(out, "out")
    if arr.dtype != dtype:
        raise TypeError(f"out: expected dtype {np.dtype(dtype).name} for {what}, got {arr.dtype}")
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"out: expected shape {list(shape)} for {what}, got {list(arr.shape)}")
    if not arr.flags.writeable:
        raise ValueError("out: the buffer is read-only")
    for x in inputs:
        if np.may_share_memory(arr, x):
            raise ValueError("out: the buffer overlaps an input")
    return arr


# ----------------------------------------------------------------------------- operations

def quantize(values, format, *, out=None):
    """Quantize float32 ``values`` ``[G, 256]`` into Q8_K records uint8 ``[G, 292]``.

    ``format`` must be ``numba_qk.quant.q8_k``.  Returns a new C-contiguous array, or ``out``
    (any writable uint8 ``[G, 292]`` buffer) filled in place.  Each block is quantized
    independently, bit-exactly as spec 000 section 4 defines (see the README's numerics).

    Raises ``QuantizationDomainError`` (a ``ValueError``) naming the first block that holds a
    non-finite value or whose extreme is too small to invert; ``out`` is then left untouched.
    """
    _check_slot(format, "format", quant.q8_k, "quantize")
    arr = _as_array(values, "values")
    _check_values(arr, "values", quant.q8_k.block_size)
    g = arr.shape[0]
    shape = (g, quant.q8_k.block_bytes)
    if out is None:
        target = np.empty(shape, dtype=np.uint8)
    else:
        target = _check_out(out, shape, np.uint8, (arr,), "Q8_K records")
    if g == 0:
        return target if out is None else out
    bad = quantize_q8_k(arr, target)
    if bad >= 0:
        raise QuantizationDomainError(int(bad), _domain_reason(arr, int(bad)))
    return target if out is None else out


def _domain_reason(values: np.ndarray, b: int) -> str:
    block = np.asarray(values[b])
    nonfinite = np.flatnonzero(~np.isfinite(block))
    if nonfinite.size:
        i = int(nonfinite[0])
        return f"values[{b}, {i}] is {block[i]!r}; quantize needs finite float32 values"
    mx, mn = block.max(), block.min()
    extreme = mx if abs(mx) > abs(mn) else mn
    with np.errstate(all="ignore"):
        inverse = np.float32(-127.0) / extreme
    return (f"extreme {float(extreme)!r} is too small in magnitude: inverse = R32(-127 / extreme) "
            f"= {float(inverse)!r} is not finite")


def quantized_dot(lhs, rhs, *, lhs_format, rhs_format, acc_dtype=f32, out=None):
    """Canonical dot of Q4_K records ``lhs`` ``[G, 144]`` and Q8_K records ``rhs`` ``[G, 292]``.

    Returns a 0-d float32 ndarray (or writes into ``out``, a writable 0-d float32 array, and
    returns it).  ``lhs_format`` must be ``numba_qk.quant.q4_k``, ``rhs_format``
    ``numba_qk.quant.q8_k`` and ``acc_dtype`` ``numba_qk.f32``.  ``G = 0`` gives ``+0.0``.
    The numerics are spec 000 section 3, bit for bit; Q8_K ``bsum`` is used as stored.
    """
    _check_slot(lhs_format, "lhs_format", quant.q4_k, "quantized_dot")
    _check_slot(rhs_format, "rhs_format", quant.q8_k, "quantized_dot")
    _check_slot(acc_dtype, "acc_dtype", f32, "quantized_dot")
    w = _as_array(lhs, "lhs")
    x = _as_array(rhs, "rhs")
    _check_records(w, "lhs", quant.q4_k)
    _check_records(x, "rhs", quant.q8_k)
    if w.shape[0] != x.shape[0]:
        raise ValueError(f"lhs and rhs must hold the same number of records G: "
                         f"lhs has {w.shape[0]}, rhs has {x.shape[0]}")
    target = None if out is None else _check_out(out, (), np.float32, (), "the result")
    value = np.float32(0.0) if w.shape[0] == 0 else dot_q4_k_q8_k(w, x)
    if target is None:
        return np.array(value, dtype=np.float32)
    target[()] = value
    return out


def _records_and_format(records, format, what: str):
    if not (isinstance(format, Format) and format in quant):
        raise TypeError(f"format: {what} expects one of {', '.join(repr(f) for f in quant)}, "
                        f"got {_describe(format)}")
    arr = _as_array(records, "records")
    _check_records(arr, "records", format)
    return arr


def decode(records, format):
    """Decode records into their named fields (explicit decoding; never used by the dot).

    Q4_K -> ``Q4KFields(d, dmin, sc, m, q)``; Q8_K -> ``Q8KFields(ds, q, bsum)``.
    Float fields keep their stored type (f16 / f32) and bits.
    """
    arr = _records_and_format(records, format, "decode")
    g = arr.shape[0]
    if format is quant.q4_k:
        head = np.ascontiguousarray(arr[:, 0:4])
        d = head[:, 0:2].copy().view("<f2").reshape(g).astype(np.float16)
        dmin = head[:, 2:4].copy().view("<f2").reshape(g).astype(np.float16)
        sc = np.empty((g, 8), np.uint8)
        m = np.empty((g, 8), np.uint8)
        q = np.empty((g, 256), np.uint8)
        if g:
            q4_k_decode_records(arr, sc, m, q)
        return Q4KFields(d, dmin, sc, m, q)
    ds = np.empty(g, np.float32)
    q = np.empty((g, 256), np.int8)
    bsum = np.empty((g, 16), np.int16)
    if g:
        q8_k_decode_records(arr, ds, q, bsum)
    return Q8KFields(ds, q, bsum)


def dequantize(records, format, *, out=None):
    """Dequantize records to float32 ``[G, 256]`` (explicit; never used by ``quantized_dot``).

    Q4_K: ``y = R32(R32(R32(d * sc[s]) * q) - R32(dmin * m[s]))``; Q8_K: ``y = R32(ds * q)``.
    """
    arr = _records_and_format(records, format, "dequantize")
    shape = (arr.shape[0], format.block_size)
    if out is None:
        target = np.empty(shape, dtype=np.float32)
    else:
        target = _check_out(out, shape, np.float32, (arr,), "dequantized values")
    if arr.shape[0]:
        if format is quant.q4_k:
            q4_k_dequantize_records(arr, target)
        else:
            q8_k_dequantize_records(arr, target)
    return target if out is None else out


def find_invalid_records(records, format) -> np.ndarray:
    """Indices (int64, ascending) of records that break their format's data contract.

    Q8_K: records whose stored ``bsum[j]`` differs from ``sum(q[16j:16j+16])``.  Q4_K: every
    bit pattern is legal, so the result is always empty.  This is an explicit check; no other
    operation calls it or repairs records.
    """
    arr = _records_and_format(records, format, "find_invalid_records")
    if format is quant.q4_k or arr.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    bad = np.empty(arr.shape[0], dtype=np.int64)
    n = q8_k_invalid_records(arr, bad)
    return bad[:n].copy()
