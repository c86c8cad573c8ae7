"""The argument checks every public operation shares (one copy of each; no numba here).

Everything a user can get wrong is checked before any kernel runs.  Each check raises a
one-line ``TypeError`` (wrong kind of object, wrong dtype, wrong format) or ``ValueError``
(wrong shape, overlap, read-only ``out``) naming the argument, what was expected and what was
given.  Nothing is ever converted silently: a wrong dtype is an error, not a cast.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import ml_dtypes_module, value_dtype
from .formats import Format, ScalarType
from .tensor import Tensor

__all__ = ["as_array", "describe", "check_slot", "check_slot_in", "check_records",
           "check_f32", "check_out", "prepare_out", "check_threads", "overlaps",
           "check_astype_out", "check_tensor_scale"]


def as_array(obj, name: str) -> np.ndarray:
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


def describe(value) -> str:
    if isinstance(value, (Format, ScalarType)):
        return f"{value!r} ({value.name})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return f"the numpy dtype {np.dtype(value).name}"
    return f"a {type(value).__name__}"


def _hint(value) -> str:
    if isinstance(value, str) or isinstance(value, np.dtype) or (
            isinstance(value, type) and issubclass(value, np.generic)):
        return " (formats are typed schemas, never strings or dtypes)"
    return ""


def check_slot(value, name: str, expected, what: str, context: str = "") -> None:
    """A format slot takes exactly one closed schema object; anything else is a TypeError."""
    if value is expected:
        return
    raise TypeError(f"{name}: {what} expects {expected!r} ({expected.name}){context}, "
                    f"got {describe(value)}{_hint(value)}")


_ID_SETS = {}


def _ids_of(allowed) -> frozenset:
    """The ids of the objects of the tuple ``allowed`` (the registry's constant tuples: one set
    each, made on first use), so that a slot check is one set lookup by identity."""
    got = _ID_SETS.get(id(allowed))
    if got is None or got[0] is not allowed:
        got = _ID_SETS[id(allowed)] = (allowed, frozenset(map(id, allowed)))
    return got[1]


def check_slot_in(value, name: str, allowed, what: str, note: str = "") -> None:
    """A format slot that takes one of several closed schema objects."""
    got = _ID_SETS.get(id(allowed))
    if id(value) in (got[1] if got is not None and got[0] is allowed else _ids_of(allowed)):
        return
    listed = ", ".join(f"{a!r} ({a.name})" for a in allowed)
    raise TypeError(f"{name}: {what} expects {listed}; got {describe(value)}{_hint(value)}{note}")


# Record arrays by layout: (leading axes, what they hold, note after a wrong dtype).
_NO_CAST = " (records are raw bytes; no cast is made)"
_LAYOUTS = {
    "records": ("G", "{f} records of {b} bytes", _NO_CAST),
    "weights": ("rows, G", "{f} weight rows of G records", _NO_CAST),
    "batch": ("batch, G", "{f} activations", ""),
}


def check_records(arr: np.ndarray, name: str, fmt: Format, layout: str = "records") -> np.ndarray:
    """uint8 records of ``fmt``: ``[G, bytes]`` (``records``), ``[rows, G, bytes]``
    (``weights``) or ``[batch, G, bytes]`` (``batch``).  The passing path is one test (this runs
    twice per ``quantized_dot``); the messages are built only on failure."""
    if (arr.dtype != np.uint8 or arr.ndim != (2 if layout == "records" else 3)
            or arr.shape[-1] != fmt.block_bytes):
        _records_error(arr, name, fmt, layout)
    return arr


def _records_error(arr, name, fmt, layout):
    axes, holds, note = _LAYOUTS[layout]
    if arr.dtype != np.uint8:
        raise TypeError(f"{name}: expected uint8 {fmt.name} records, got dtype {arr.dtype}{note}")
    raise ValueError(f"{name}: expected shape [{axes}, {fmt.block_bytes}] "
                     f"({holds.format(f=fmt.name, b=fmt.block_bytes)}), got {tuple(arr.shape)}")


def check_f32(arr: np.ndarray, name: str, noun: str, block=None) -> np.ndarray:
    """float32 ``arr``; with ``block``, also of shape ``[G, block]`` (blocks of values)."""
    if arr.dtype != np.float32:
        raise TypeError(f"{name}: expected float32 {noun}, got dtype {arr.dtype.str} "
                        f"({arr.dtype.name}); no cast is made")
    if block is not None and (arr.ndim != 2 or arr.shape[1] != block):
        raise ValueError(f"{name}: expected shape [G, {block}] (blocks of {block} {noun}), "
                         f"got {tuple(arr.shape)}")
    return arr


def check_out(out, shape: tuple, dtype, inputs: tuple, what: str) -> np.ndarray:
    arr = as_array(out, "out")
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


def prepare_out(out, shape, dtype, inputs, what):
    """(target array, user's ``out`` or None): a new array, or the checked ``out``."""
    if out is None:
        return np.empty(shape, dtype=dtype), None
    return check_out(out, shape, dtype, inputs, what), out


def check_threads(threads) -> int:
    if threads is None:
        from ._threads import cpu_count
        return cpu_count()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads: expected a positive int or None, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"threads: expected a positive int or None, got {threads}")
    return int(threads)


# ---- astype (numba_qk.cast, numba_qk.scaled): the same threads check, these for out ---------

def overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays share memory (exactly, up to a bounded amount of work)."""
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=1 << 20))
    except np.exceptions.TooHardError:  # pragma: no cover - pathological strides
        return True


def check_astype_out(out, t: ScalarType, shape) -> np.ndarray:
    """Validate an ``astype`` ``out`` for a result of element type ``t`` and logical ``shape``;
    its storage array (C-contiguous, writable)."""
    if isinstance(out, Tensor):
        if out.dtype is not t:
            raise TypeError(f"out: a Tensor of {out.dtype.name}, expected {t.name}")
        if out.shape != tuple(shape):
            raise ValueError(f"out: shape {out.shape}, expected {tuple(shape)}")
        store = out.storage
    else:
        if isinstance(out, np.ndarray):
            arr = out
        else:
            try:
                arr = np.asarray(memoryview(out))
            except TypeError:
                raise TypeError(f"out: expected an ndarray, memoryview, Tensor or writable "
                                f"buffer, got {type(out).__name__}") from None
        if t.block_size > 1:
            raise TypeError(f"out: a packed {t.name} result needs a numba_qk.Tensor out "
                            f"(a plain buffer cannot say it holds {t.name})")
        want = t.numpy_dtype
        if want is None:
            want = value_dtype(t) if ml_dtypes_module() is not None else None
        if want is None or arr.dtype != want:
            raise TypeError(f"out: dtype {arr.dtype}, expected {want if want is not None else t.name}"
                            f" (or a numba_qk.Tensor of {t.name})")
        if arr.shape != tuple(shape):
            raise ValueError(f"out: shape {arr.shape}, expected {tuple(shape)}")
        store = arr
    if not store.flags.c_contiguous:
        raise ValueError("out: must be C-contiguous")
    if not store.flags.writeable:
        raise ValueError("out: is read-only")
    return store


def check_tensor_scale(fmt, tensor_scale):
    """float32 of a block-scaled format's tensor scale (finite, > 0), or None; errors name what
    was wrong.

    TypeError unless it is a real number (a Python int or float, or a numpy integer or
    floating scalar; not a bool); ValueError, one line, for every real number that does not
    round to a finite float32 > 0 -- zero, negatives, nan, +-inf, values below float32's
    smallest subnormal, and values beyond its range (however large: a huge Python int too)."""
    if not fmt.has_tensor_scale:
        if tensor_scale is not None:
            raise TypeError(f"tensor_scale: {fmt.name} has no tensor scale (only nvfp4 has one)")
        return None
    if tensor_scale is None:
        return None
    if isinstance(tensor_scale, (bool, np.bool_)) or not isinstance(
            tensor_scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"tensor_scale: expected a real number, got {type(tensor_scale).__name__}")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        try:
            ts = np.float32(tensor_scale)
        except OverflowError:                   # a Python int beyond float64's range
            ts = None
    if ts is None or not (math.isfinite(float(ts)) and ts > 0):
        if isinstance(tensor_scale, int) and tensor_scale.bit_length() > 64:   # no 400 digits
            sign = "a negative" if tensor_scale < 0 else "an"
            got = f"{sign} int of {tensor_scale.bit_length()} bits"
        else:
            got = repr(tensor_scale)
        raise ValueError(f"tensor_scale: must round to a finite float32 > 0, got {got}")
    return ts
