"""The element-type conversion behind ``numba_qk.astype`` (spec 004): one pass, any strides.

:func:`convert` reads ``a`` -- a numpy array of any rank and strides (f64, f32, f16, ints,
bool), an ml_dtypes array (by value), a :class:`~numba_qk.Tensor` or any buffer -- and writes
every element once, converted by the kernels of :mod:`numba_qk.kernels.lowp.codecs` (DESIGN.md
§8's policy: one RNE from the exact source value).  The result is C-contiguous with the same
logical shape: a numpy array where numpy has the target dtype (f32, f16, i8, u8, i32), else a
Tensor; or ``out`` when given.

The kernels run without the GIL; ``threads=N`` splits the work over up to N threads (fewer when
other processes keep cores busy: ``numba_qk._threads``); ``threads=None`` means every core, as
for the products.  Arguments are checked by :mod:`numba_qk._validate`, as the products' are.

Layering: below ``numba_qk.cast`` (``astype``'s dispatch to the block-scaled formats) and
``numba_qk.scaled`` (whose encode/decode convert through here); above ``numba_qk.tensor``.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import _threads
from . import dtypes as _d
from ._validate import check_astype_out, check_threads, overlaps
from numba_qk.kernels.simd import stream as _stream
from numba_qk.kernels.lowp import codecs as _k
from .tensor import UNSIGNED, Tensor, as_element_type, storage_dtype, storage_shape

__all__ = ["convert", "dot", "source", "Source"]

# numpy's own dtypes as sources (by dtype code): (kernel kind, element type or None) -- the
# element types numpy has (f32, f16, i8, u8, i32: their rows' kernel kind) and the rest, read
# by value (f64, i16, u16, u32, i64, u64, bool: source-only kinds of the kernels)
_NUMPY_SOURCES = {t.numpy_dtype.str[1:]: (t.spec.kernel_kind, t) for t in _d.ALL_TYPES
                  if t.numpy_dtype is not None}
_NUMPY_SOURCES.update({"f8": (_k.K_F64, None), "i2": (_k.K_I16, None), "u2": (_k.K_U16, None),
                       "u4": (_k.K_U32, None), "i8": (_k.K_I64, None), "u8": (_k.K_U64, None),
                       "b1": (_k.K_BOOL, None)})

# ml_dtypes dtype name -> numba_qk type (identical encodings, read as codes): dtypes' table
_ML_TYPES = _d.ML_TYPES
# ml_dtypes formats read by value through a decode table (no numba_qk type of that encoding)
_ML_BY_VALUE = {"float8_e4m3"}
_ML_REJECTED = _d.REJECTED               # spec 004's rejected formats, with the reasons

_NO_TABLE = np.zeros(1, np.float64)


class Source:
    __slots__ = ("kind", "store", "spb", "shape", "table", "etype")


def source(a) -> Source:
    """Classify ``a``: its kind code, storage as unsigned ints (a view), logical shape."""
    s = Source()
    s.table = _NO_TABLE
    if isinstance(a, Tensor):
        t = a.dtype
        s.kind, s.spb, s.etype, s.shape = t.spec.kernel_kind, t.block_size, t, a.shape
        s.store = a.storage.view(UNSIGNED[a.storage.dtype.itemsize])
        return s
    if isinstance(a, _d.Scalar):
        raise TypeError("astype: expected an array or buffer, got a numba_qk scalar "
                        "(use numba_qk.<type>(value))")
    if not isinstance(a, np.ndarray):
        try:
            a = np.asarray(a) if hasattr(a, "__array_interface__") else np.asarray(memoryview(a))
        except TypeError:
            raise TypeError(f"astype: expected an array, Tensor or buffer, got "
                            f"{type(a).__name__}") from None
    dt = a.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian):
        a = a.astype(dt.newbyteorder("<"))
        dt = a.dtype
    s.shape = a.shape
    s.spb = 1
    code = dt.str[1:]
    if code in _NUMPY_SOURCES and dt.type.__module__ == "numpy":  # numpy's own dtypes
        s.kind, s.etype = _NUMPY_SOURCES[code]
    elif (name := dt.name) in _ML_TYPES:
        s.etype = _ML_TYPES[name]
        s.kind = s.etype.spec.kernel_kind  # e2m1/i4/u4: one per byte, code in the low nibble
    elif name in _ML_BY_VALUE:
        s.kind, s.etype = _k.K_TABLE, None
        s.table = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    elif name in _ML_REJECTED:
        raise TypeError(f"astype: ml_dtypes {name} is not accepted: {_ML_REJECTED[name]}")
    else:
        raise TypeError(f"astype: unsupported source dtype {dt}")
    s.store = a.view(UNSIGNED[dt.itemsize])
    return s


def _blocks(store: np.ndarray, spb: int):
    """(3-d view, logical index offset) pieces covering ``store`` in C order, dims merged."""
    if store.size == 0:
        return []
    if store.flags.c_contiguous:
        return [(store.reshape(1, 1, -1), 0)]
    dims = []
    for n, st in zip(reversed(store.shape), reversed(store.strides)):
        if n == 1:
            continue
        if dims and st == dims[0][0] * dims[0][1]:
            dims[0] = (dims[0][0] * n, dims[0][1])
        else:
            dims.insert(0, (n, st))
    if not dims:
        dims = [(1, store.itemsize)]
    full = as_strided(store, [n for n, _ in dims], [st for _, st in dims], writeable=False)
    if len(dims) <= 3:
        return [(full.reshape((1,) * (3 - len(dims)) + full.shape)
                 if len(dims) < 3 else full, 0)]
    inner = dims[-2][0] * dims[-1][0] * spb
    out = []
    for k, idx in enumerate(np.ndindex(*[n for n, _ in dims[:-2]])):
        out.append((full[idx][None], k * inner))
    return out


def _split(view, idx0, spb, threads):
    n0, n1, n2 = view.shape
    if threads <= 1:
        return [(view, idx0)]
    if n0 > 1:
        bounds = np.linspace(0, n0, min(threads, n0) + 1).astype(int)
        return [(view[a:b], idx0 + a * n1 * n2 * spb) for a, b in zip(bounds, bounds[1:]) if b > a]
    if n1 > 1:
        bounds = np.linspace(0, n1, min(threads, n1) + 1).astype(int)
        return [(view[:, a:b], idx0 + a * n2 * spb) for a, b in zip(bounds, bounds[1:]) if b > a]
    step = max(64, -(-n2 // threads) // 64 * 64)
    return [(view[:, :, a:a + step], idx0 + a * spb) for a in range(0, n2, step)]


def convert(a, dtype, *, out=None, threads=1):
    """``a`` converted to element type ``dtype`` in one native pass (GIL released): the element
    type half of :func:`numba_qk.astype` (see there), checks included."""
    t = as_element_type(dtype)
    threads = check_threads(threads)
    src = source(a)
    shape = tuple(src.shape)
    dshape = storage_shape(t, shape)                    # checks packed last axes
    if out is not None:
        store = check_astype_out(out, t, shape)
        if overlaps(store, src.store):
            raise ValueError("out: overlaps the input")
        result = out
    else:
        store = np.empty(dshape, storage_dtype(t))
        result = store if t.numpy_dtype is not None and t.block_size == 1 else \
            Tensor._wrap(store, t)
    dst = store.reshape(-1).view(UNSIGNED[store.dtype.itemsize])
    if src.etype is t and src.spb == t.block_size:      # same type: an exact copy of the codes
        np.copyto(store.view(UNSIGNED[store.dtype.itemsize]).reshape(src.store.shape), src.store)
        return result
    dk = t.spec.kernel_kind
    kernel = _k.converter(src.kind, dk, src.spb, t.block_size)
    # Large casts may bypass the caches with non-temporal stores (the same bits;
    # kernels/simd/stream.py) where that measured faster on the CPU family (thresholds there):
    # widening ones (f32 from bf16/f16/fp8/fp6), and f32 -> bf16/f16 where the vector kernels
    # store straight from registers.  Other narrowing casts measured slower streamed.
    stream = _stream.HAVE_STREAM and src.spb == 1 and t.block_size == 1 and (
        (dst.itemsize > src.store.itemsize and dst.nbytes >= _stream.STREAM_MIN_BYTES)
        or (_k.register_stream(src.kind, dk) and dst.nbytes >= _stream.REG_STREAM_MIN_BYTES))
    n = _threads.effective_threads(threads, dst.size) if threads > 1 else 1
    jobs = []
    for view, idx0 in _blocks(src.store, src.spb):
        jobs.extend(_split(view, idx0, src.spb, n))
    _threads.run([(kernel, (view, dst, src.table, idx0, stream)) for view, idx0 in jobs], n)
    return result


def dot(a, b):
    """Dot product of two arrays/Tensors of one element type and one shape (all elements).

    Integer and packed types (i8, u8, i32, i4, u4, u1) give the exact Python int
    (``dot(packed, packed) == int(codes @ codes)``).  Float types give a Python float: each
    product of two decoded values is exact in float64, the products are summed left to right in
    C order with one float64 rounding per addition (deterministic: no threads, no reassociation).
    numpy float64 inputs are not an element type (use numpy.dot).
    """
    sa, sb = source(a), source(b)
    ta, tb = sa.etype, sb.etype
    if ta is None or tb is None:
        raise TypeError("dot: inputs must hold a numba_qk element type (f32, f16, bf16, fp8/6/4, "
                        "e8m0, i8, u8, i32, i4, u4, u1)")
    if ta is not tb or sa.spb != sb.spb:
        raise TypeError(f"dot: element types differ ({ta.name} and {tb.name}); convert with astype")
    if tuple(sa.shape) != tuple(sb.shape):
        raise ValueError(f"dot: shapes differ: {tuple(sa.shape)} and {tuple(sb.shape)}")
    ca = np.ascontiguousarray(sa.store).reshape(-1)
    cb = np.ascontiguousarray(sb.store).reshape(-1)
    if ta is _d.i32:                   # exact: 16-bit halves keep every partial sum in int64
        x, y = ca.view(np.int32).astype(np.int64), cb.view(np.int32).astype(np.int64)
        xh, xl, yh, yl = x >> 16, x & 0xFFFF, y >> 16, y & 0xFFFF
        return (int(xh @ yh) << 32) + (int(xh @ yl + xl @ yh) << 16) + int(xl @ yl)
    n = ca.size * sa.spb
    if not ta.is_float and n >= 1 << 47:  # pragma: no cover - 128 TiB of codes
        raise ValueError("dot: too many elements for an exact int64 sum")
    iacc, facc = _k.dot_kernel(sa.kind, sa.spb)(ca, cb)
    return int(iacc) if not ta.is_float else float(facc)
