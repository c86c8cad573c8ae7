"""Public operations: validation, carrier handling and dispatch to the ``@njit`` kernels.

Everything a user can get wrong is checked here, before any kernel runs; the kernels themselves
never raise for user error.  Inputs may be any numpy array or buffer-protocol object (read-only
memory maps, unaligned or strided views, ``memoryview``): the kernels read records byte by byte,
so results never depend on alignment or layout.  Nothing is ever converted silently: a wrong
dtype is an error, not a cast.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import numpy as np

from . import _threads
from .errors import QuantizationDomainError
from .formats import Format, ScalarType, activation_format, f32, quant
from .kernels import legacy
from .kernels.dot import dot_q4_k_q8_k, gemm_q4_k_q8_k, gemv_q4_k_q8_k
from .kernels.parallel import gemm_legacy_parallel, gemm_parallel, gemv_legacy_parallel, gemv_parallel
from .kernels.q4_k import q4_k_decode_records, q4_k_dequantize_records
from .kernels.q4_k_encode import quantize_q4_k
from .kernels.q8_k import (
    q8_k_decode_records,
    q8_k_dequantize_records,
    q8_k_invalid_records,
    quantize_q8_k,
)

__all__ = [
    "quantize", "quantized_dot", "decode", "dequantize", "find_invalid_records",
    "gemv", "gemm", "matmul", "Q4KFields", "Q8KFields", "BlockFields",
]

# Kernel codes of ggml's legacy 32-element formats (numba_qk.kernels.legacy).
_LEGACY = {quant.q4_0: legacy.Q4_0, quant.q4_1: legacy.Q4_1, quant.q5_0: legacy.Q5_0,
           quant.q5_1: legacy.Q5_1, quant.q8_0: legacy.Q8_0, quant.q8_1: legacy.Q8_1}
# Formats quantize() can produce, and the weight formats that have a quantized dot.
_QUANTIZABLE = (quant.q8_k, quant.q4_k) + tuple(_LEGACY)
_WEIGHTS = (quant.q4_k, quant.q4_0, quant.q4_1, quant.q5_0, quant.q5_1, quant.q8_0)


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


class BlockFields(NamedTuple):
    """Decoded fields of ``G`` records of a legacy 32-element format."""

    d: np.ndarray                  # float16 [G]
    q: np.ndarray                  # [G, 32]: uint8 stored quants (Q4: 0..15, Q5: 0..31), int8 (Q8)
    m: Optional[np.ndarray] = None  # float16 [G] (Q4_1, Q5_1)
    s: Optional[np.ndarray] = None  # float16 [G] (Q8_1)


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


def _check_slot(value, name: str, expected, what: str, context: str = "") -> None:
    """A format slot takes exactly one closed schema object; anything else is a TypeError."""
    if value is expected:
        return
    hint = ""
    if isinstance(value, str) or isinstance(value, np.dtype) or (
            isinstance(value, type) and issubclass(value, np.generic)):
        hint = " (formats are typed schemas, never strings or dtypes)"
    raise TypeError(f"{name}: {what} expects {expected!r} ({expected.name}){context}, "
                    f"got {_describe(value)}{hint}")


def _check_slot_in(value, name: str, allowed, what: str, note: str = "") -> None:
    """A format slot that takes one of several closed schema objects."""
    if any(value is a for a in allowed):
        return
    hint = ""
    if isinstance(value, str) or isinstance(value, np.dtype) or (
            isinstance(value, type) and issubclass(value, np.generic)):
        hint = " (formats are typed schemas, never strings or dtypes)"
    listed = ", ".join(f"{a!r} ({a.name})" for a in allowed)
    raise TypeError(f"{name}: {what} expects {listed}; got {_describe(value)}{hint}{note}")


def _check_pair(lhs_format, rhs_format, what: str) -> None:
    """lhs_format must be a weight format and rhs_format the activation format it pairs with."""
    _check_slot_in(lhs_format, "lhs_format", _WEIGHTS, what)
    act = activation_format(lhs_format)
    if rhs_format is not act:
        _check_slot(rhs_format, "rhs_format", act, what,
                    f" to pair with {lhs_format.name} weights")


def _f16_field(arr: np.ndarray, off: int) -> np.ndarray:
    """float16 [G] from bytes [off, off+2) of each record (bits kept)."""
    g = arr.shape[0]
    return np.ascontiguousarray(arr[:, off:off + 2]).view("<f2").reshape(g).astype(np.float16)


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
    """Quantize float32 ``values`` ``[G, block]`` into records uint8 ``[G, block_bytes]``.

    ``format``: ``numba_qk.quant.q8_k`` (blocks of 256, the canonical numerics of spec 000
    section 4), ``numba_qk.quant.q4_k`` (blocks of 256, bit-identical to ggml's
    ``quantize_row_q4_K_ref``, no importance matrix) or one of ggml's legacy formats ``q4_0``,
    ``q4_1``, ``q5_0``, ``q5_1``, ``q8_0``, ``q8_1`` (blocks of 32, bit-identical to ggml's
    reference quantizers).  Returns a new
    C-contiguous array, or ``out`` (any writable uint8 buffer of that shape) filled in place.

    Raises ``QuantizationDomainError`` (a ``ValueError``) naming the first block that holds a
    non-finite value (or, for Q8_K, whose extreme is too small to invert); ``out`` is then left
    untouched.  (ggml's quantizers do not check; they turn NaN and inf into garbage.)
    """
    _check_slot_in(format, "format", _QUANTIZABLE, "quantize")
    arr = _as_array(values, "values")
    _check_values(arr, "values", format.block_size)
    g = arr.shape[0]
    shape = (g, format.block_bytes)
    if out is None:
        target = np.empty(shape, dtype=np.uint8)
    else:
        target = _check_out(out, shape, np.uint8, (arr,), f"{format.name} records")
    if g:
        if format is quant.q8_k:
            bad = quantize_q8_k(arr, target)
        elif format is quant.q4_k:
            bad = quantize_q4_k(arr, target)
        else:
            bad = legacy.quantize_legacy(_LEGACY[format], arr, target)
        if bad >= 0:
            raise QuantizationDomainError(int(bad), _domain_reason(arr, int(bad)))
    return target if out is None else out


def _domain_reason(values: np.ndarray, b: int, element=None) -> str:
    """Why block ``b`` of ``values`` [G, 256] cannot be quantized; ``element(i)`` names the
    block's i-th value for the message (default ``values[b, i]``)."""
    block = np.asarray(values[b])
    nonfinite = np.flatnonzero(~np.isfinite(block))
    if nonfinite.size:
        i = int(nonfinite[0])
        name = element(i) if element else f"values[{b}, {i}]"
        return f"{name} is {float(block[i])!r}; quantize needs finite float32 values"
    mx, mn = block.max(), block.min()
    extreme = mx if abs(mx) > abs(mn) else mn
    with np.errstate(all="ignore"):
        inverse = np.float32(-127.0) / extreme
    return (f"extreme {float(extreme)!r} is too small in magnitude: inverse = R32(-127 / extreme) "
            f"= {float(inverse)!r} is not finite")


def quantized_dot(lhs, rhs, *, lhs_format, rhs_format, acc_dtype=f32, out=None):
    """Canonical quantized dot of weight records ``lhs`` and activation records ``rhs``.

    Pairs: Q4_K x Q8_K (``[G, 144]`` x ``[G, 292]``, spec 000 section 3, bit for bit), and
    ggml's legacy pairs Q4_0/Q5_0/Q8_0 x Q8_0 and Q4_1/Q5_1 x Q8_1 (``[G, bytes]`` records of 32
    elements; numba_qk's canonical numerics, see the README).  Returns a 0-d float32 ndarray (or
    writes into ``out``, a writable 0-d float32 array, and returns it); ``acc_dtype`` must be
    ``numba_qk.f32``.  ``G = 0`` gives ``+0.0``.  Stored sums (Q8_K ``bsum``, Q8_1 ``s``) are
    used as stored.
    """
    _check_pair(lhs_format, rhs_format, "quantized_dot")
    _check_slot(acc_dtype, "acc_dtype", f32, "quantized_dot")
    w = _as_array(lhs, "lhs")
    x = _as_array(rhs, "rhs")
    _check_records(w, "lhs", lhs_format)
    _check_records(x, "rhs", rhs_format)
    if w.shape[0] != x.shape[0]:
        raise ValueError(f"lhs and rhs must hold the same number of records G: "
                         f"lhs has {w.shape[0]}, rhs has {x.shape[0]}")
    target = None if out is None else _check_out(out, (), np.float32, (), "the result")
    if w.shape[0] == 0:
        value = np.float32(0.0)
    elif lhs_format is quant.q4_k:
        value = dot_q4_k_q8_k(w, x)
    else:
        value = legacy.dot_legacy(_LEGACY[lhs_format], w, x)
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

    Q4_K -> ``Q4KFields(d, dmin, sc, m, q)``; Q8_K -> ``Q8KFields(ds, q, bsum)``; the legacy
    formats -> ``BlockFields(d, q, m, s)`` (``m``: Q4_1/Q5_1, ``s``: Q8_1, else None; ``q`` the
    stored quants: uint8 0..15 / 0..31 without the -8/-16 offset, int8 for Q8_0/Q8_1).
    Float fields keep their stored type (f16 / f32) and bits.
    """
    arr = _records_and_format(records, format, "decode")
    g = arr.shape[0]
    if format in _LEGACY:
        q8 = format in (quant.q8_0, quant.q8_1)
        q = np.empty((g, 32), np.int8 if q8 else np.uint8)
        if g:
            legacy.decode_legacy(_LEGACY[format], arr, q)
        has_m = format in (quant.q4_1, quant.q5_1)
        return BlockFields(_f16_field(arr, 0), q, _f16_field(arr, 2) if has_m else None,
                           _f16_field(arr, 2) if format is quant.q8_1 else None)
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

    Q4_K: ``y = R32(R32(R32(d * sc[s]) * q) - R32(dmin * m[s]))``; Q8_K: ``y = R32(ds * q)``;
    legacy formats: ggml's ``dequantize_row_*`` (``R32(q' * d)``, or ``R32(R32(q * d) + m)``).
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
        elif format is quant.q8_k:
            q8_k_dequantize_records(arr, target)
        else:
            legacy.dequantize_legacy(_LEGACY[format], arr, target)
    return target if out is None else out


def find_invalid_records(records, format) -> np.ndarray:
    """Indices (int64, ascending) of records that break their format's data contract.

    Q8_K: records whose stored ``bsum[j]`` differs from ``sum(q[16j:16j+16])``.  Every other
    format accepts every bit pattern (Q8_1's ``s`` is derived by ggml from the unrounded scale,
    so it cannot be re-checked from the record), so the result is empty.  This is an explicit
    check; no other operation calls it or repairs records.
    """
    arr = _records_and_format(records, format, "find_invalid_records")
    if format is not quant.q8_k or arr.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    bad = np.empty(arr.shape[0], dtype=np.int64)
    n = q8_k_invalid_records(arr, bad)
    return bad[:n].copy()


# ----------------------------------------------------------------------------- composed products

def _check_threads(threads) -> int:
    if threads is None:
        return max(1, os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads: expected a positive int or None, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"threads: expected a positive int or None, got {threads}")
    return int(threads)


def _run(serial, parallel, args, rows: int, threads: int):
    """``serial(*args)`` or ``parallel(*args, nchunks)``: the threading policy (layer, locks,
    fork rules) lives in ``numba_qk._threads``."""
    _threads.launch(serial, parallel, args, rows, threads)


def _check_weights(w, fmt: Format, name: str = "w") -> np.ndarray:
    arr = _as_array(w, name)
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 {fmt.name} records, got dtype {arr.dtype} "
                        f"(records are raw bytes; no cast is made)")
    if arr.ndim != 3 or arr.shape[2] != fmt.block_bytes:
        raise ValueError(f"{name}: expected shape [rows, G, {fmt.block_bytes}] ({fmt.name} weight "
                         f"rows of G records), got {tuple(arr.shape)}")
    return arr


def _prepare_out(out, shape, inputs, what):
    if out is None:
        return np.empty(shape, dtype=np.float32), None
    return _check_out(out, shape, np.float32, inputs, what), out


def _gemv_into(fmt, wa, xa, target, nthreads):
    if fmt is quant.q4_k:
        _run(gemv_q4_k_q8_k, gemv_parallel, (wa, xa, target), wa.shape[0], nthreads)
    else:
        _run(legacy.gemv_legacy, gemv_legacy_parallel, (_LEGACY[fmt], wa, xa, target),
             wa.shape[0], nthreads)


def _gemm_into(fmt, wa, xa, target, nthreads):
    if fmt is quant.q4_k:
        _run(gemm_q4_k_q8_k, gemm_parallel, (wa, xa, target), wa.shape[0], nthreads)
    else:
        _run(legacy.gemm_legacy, gemm_legacy_parallel, (_LEGACY[fmt], wa, xa, target),
             wa.shape[0], nthreads)


def gemv(w, xq, *, lhs_format, rhs_format, out=None, threads=1):
    """Matrix-vector product of quantized weight rows and one quantized activation.

    ``w``: uint8 ``[rows, G, bytes]`` weight records; ``xq``: uint8 ``[G, bytes]`` activation
    records of the paired format (Q4_K -> Q8_K, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1) ->
    float32 ``[rows]``, where element ``r`` equals ``quantized_dot(w[r], xq, ...)`` bit for bit.
    ``threads`` splits the rows over numba's thread pool (``None``: all cores); results do not
    depend on it.
    """
    _check_pair(lhs_format, rhs_format, "gemv")
    nthreads = _check_threads(threads)
    wa = _check_weights(w, lhs_format)
    xa = _as_array(xq, "xq")
    _check_records(xa, "xq", rhs_format)
    if xa.shape[0] != wa.shape[1]:
        raise ValueError(f"w and xq must hold the same number of records G per row: "
                         f"w has {wa.shape[1]}, xq has {xa.shape[0]}")
    target, user_out = _prepare_out(out, (wa.shape[0],), (wa, xa), "gemv's result")
    _gemv_into(lhs_format, wa, xa, target, nthreads)
    return target if user_out is None else user_out


def gemm(w, xq, *, lhs_format, rhs_format, out=None, threads=1):
    """Matrix product of quantized weight rows and a batch of quantized activations.

    ``w``: uint8 ``[rows, G, bytes]``; ``xq``: uint8 ``[batch, G, bytes]`` of the paired format
    -> float32 ``[batch, rows]`` with ``out[a, r] == quantized_dot(w[r], xq[a], ...)`` bit for
    bit.  For Q4_K each weight record is decoded once per tile of 8 activations.
    """
    _check_pair(lhs_format, rhs_format, "gemm")
    nthreads = _check_threads(threads)
    wa = _check_weights(w, lhs_format)
    xa = _as_array(xq, "xq")
    if xa.dtype != np.uint8:
        raise TypeError(f"xq: expected uint8 {rhs_format.name} records, got dtype {xa.dtype}")
    if xa.ndim != 3 or xa.shape[2] != rhs_format.block_bytes:
        raise ValueError(f"xq: expected shape [batch, G, {rhs_format.block_bytes}] "
                         f"({rhs_format.name} activations), got {tuple(xa.shape)}")
    if xa.shape[1] != wa.shape[1]:
        raise ValueError(f"w and xq must hold the same number of records G per row: "
                         f"w has {wa.shape[1]}, xq has {xa.shape[1]}")
    target, user_out = _prepare_out(out, (xa.shape[0], wa.shape[0]), (wa, xa), "gemm's result")
    if xa.shape[0]:
        _gemm_into(lhs_format, wa, xa, target, nthreads)
    return target if user_out is None else user_out


def matmul(w, x, *, lhs_format, out=None, threads=1):
    """Quantized weights times float32 activations, the way llama.cpp runs a quantized layer.

    ``w``: uint8 ``[rows, G, bytes]`` records of a weight format; ``x``: float32 ``[K]`` or
    ``[batch, K]`` with ``K = G * block_size``.  Each activation row is quantized once to the
    format paired with ``lhs_format`` (Q4_K -> Q8_K, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1),
    shared by every weight row, then ``gemv``/``gemm`` run.  Returns float32 ``[rows]`` or
    ``[batch, rows]``.  A non-finite activation raises ``QuantizationDomainError`` naming the
    row and block.
    """
    _check_slot_in(lhs_format, "lhs_format", _WEIGHTS, "matmul")
    act = activation_format(lhs_format)
    nthreads = _check_threads(threads)
    wa = _check_weights(w, lhs_format)
    xa = _as_array(x, "x")
    if xa.dtype != np.float32:
        raise TypeError(f"x: expected float32 activations, got dtype {xa.dtype.str} "
                        f"({xa.dtype.name}); no cast is made")
    k = wa.shape[1] * lhs_format.block_size
    if xa.ndim not in (1, 2) or xa.shape[-1] != k:
        raise ValueError(f"x: expected shape [{k}] or [batch, {k}] (G={wa.shape[1]} records of "
                         f"{lhs_format.block_size} per weight row), got {tuple(xa.shape)}")
    batch = 1 if xa.ndim == 1 else xa.shape[0]
    out_shape = (wa.shape[0],) if xa.ndim == 1 else (batch, wa.shape[0])
    target, user_out = _prepare_out(out, out_shape, (wa, xa), "matmul's result")
    blocks = xa.reshape(batch * wa.shape[1], act.block_size)
    xq = np.empty((batch * wa.shape[1], act.block_bytes), np.uint8)
    if blocks.shape[0]:
        if act is quant.q8_k:
            bad = quantize_q8_k(blocks, xq)
        else:
            bad = legacy.quantize_legacy(_LEGACY[act], blocks, xq)
        if bad >= 0:
            row, blk = divmod(int(bad), wa.shape[1])
            n = act.block_size
            name = ((lambda i: f"x[{blk * n + i}]") if xa.ndim == 1
                    else (lambda i: f"x[{row}, {blk * n + i}]"))
            raise QuantizationDomainError(blk, _domain_reason(blocks, int(bad), name),
                                          row=row if xa.ndim == 2 else None)
    if xa.ndim == 1:
        _gemv_into(lhs_format, wa, xq, target, nthreads)
    else:
        _gemm_into(lhs_format, wa, xq.reshape(batch, wa.shape[1], act.block_bytes), target,
                   nthreads)
    return target if user_out is None else user_out
