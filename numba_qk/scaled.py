"""``numba_qk.ScaledTensor``: block-scaled tensors (spec 004 part 2; DESIGN.md §9).

A ScaledTensor is three parts, read through plain attributes:

* ``.elements`` -- a :class:`~numba_qk.Tensor` of element codes in the logical dense shape
  (e2m1 packed two per byte, element 0 in the high nibble; fp6 one per byte in the low 6 bits;
  fp8 / int8 one per byte);
* ``.block_scales`` -- a Tensor of e8m0 (MX) or e4m3 codes used as ue4m3 (NVFP4), one per
  block, last axis ``n / block_size``;
* ``.tensor_scale`` -- NVFP4's float32 tensor scale as a Python float; None for MX.

Blocks run along the last axis.  ``numba_qk.astype(x, numba_qk.mx.mxfp4)`` encodes,
``numba_qk.astype(st, numba_qk.f32)`` / ``st.astype(...)`` decodes (to any element type: the
float32 decode, then :func:`numba_qk.astype`'s rules).  Integer indexing on leading axes and
block-aligned slices of the last axis give views sharing storage (both parts in lockstep); bools
are not indices.  A ScaledTensor is not a numpy array: ``numpy.asarray``, ufuncs and array
functions on it raise a TypeError pointing at the decode and the parts.

Layering: above the element-type conversion (:mod:`numba_qk._convert`, which encode and decode
use for their float32 input and non-f32 outputs) and below ``astype``'s dispatch
(:mod:`numba_qk.cast`), which ``ScaledTensor.astype`` reaches through ``tensor.OPERATIONS``.
"""

from __future__ import annotations

import operator

import numpy as np

from . import _threads
from ._convert import convert
from ._validate import check_astype_out, check_tensor_scale, check_threads, overlaps
from .errors import QuantizationDomainError
from .formats import f32
from .formats.mx import ScaledFormat, find_scaled
from numba_qk.kernels.simd import stream as _stream
from numba_qk.kernels.mx import codecs as _k
from .tensor import OPERATIONS, Tensor, as_element_type, storage_dtype

__all__ = ["ScaledTensor", "as_scaled_format", "encode", "decode"]


def as_scaled_format(fmt):
    """The ScaledFormat ``fmt`` names (a ScaledFormat or its name), else None."""
    if isinstance(fmt, ScaledFormat):
        return fmt
    return find_scaled(fmt)


def _part(obj, t, what):
    if isinstance(obj, Tensor):
        if obj.dtype is not t:
            raise TypeError(f"{what}: a Tensor of {obj.dtype.name}, expected {t.name}")
        return obj
    try:
        return Tensor(obj, dtype=t)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{what}: {exc}") from None


class ScaledTensor:
    """Element codes + block scales (+ NVFP4 tensor scale) of one block-scaled format.

    ``ScaledTensor(elements, block_scales, format, tensor_scale=None)`` assembles one from
    existing parts without copying: Tensors of the format's element and scale types, or buffers
    reinterpreted as them (e2m1: packed bytes, last axis n/2).  ``tensor_scale`` (NVFP4 only)
    defaults to 1.0.
    """

    __slots__ = ("_elements", "_scales", "_format", "_ts", "__weakref__")

    def __init__(self, elements, block_scales, format, tensor_scale=None):
        fmt = as_scaled_format(format)
        if fmt is None:
            raise TypeError(f"format: expected a numba_qk.mx format (e.g. numba_qk.mx.mxfp4), "
                            f"got {format!r}")
        el = _part(elements, fmt.element, "elements")
        sc = _part(block_scales, fmt.scale, "block_scales")
        if el.ndim == 0 or sc.ndim != el.ndim:
            raise ValueError(f"elements {el.shape} and block_scales {sc.shape}: need the same "
                             f"number (>= 1) of axes")
        if el.shape[:-1] != sc.shape[:-1] or el.shape[-1] != sc.shape[-1] * fmt.block_size:
            raise ValueError(f"elements {el.shape} and block_scales {sc.shape} do not match: "
                             f"{fmt.name} has one scale per {fmt.block_size} elements of the "
                             f"last axis")
        ts = check_tensor_scale(fmt, tensor_scale)
        if fmt.has_tensor_scale and ts is None:
            ts = np.float32(1.0)
        self._set(el, sc, fmt, ts)

    def _set(self, el, sc, fmt, ts):
        self._elements = el
        self._scales = sc
        self._format = fmt
        self._ts = ts

    @classmethod
    def _make(cls, el, sc, fmt, ts):
        self = object.__new__(cls)
        self._set(el, sc, fmt, ts)
        return self

    # ---- read attributes ----
    @property
    def elements(self) -> Tensor:
        return self._elements

    @property
    def block_scales(self) -> Tensor:
        return self._scales

    @property
    def tensor_scale(self):
        return None if self._ts is None else float(self._ts)

    @property
    def block_size(self) -> int:
        return self._format.block_size

    @property
    def dtype(self) -> ScaledFormat:
        """The format (``numba_qk.mx.nvfp4``; ``str()`` gives its name ``"nvfp4"``)."""
        return self._format

    @property
    def format(self) -> ScaledFormat:
        return self._format

    @property
    def shape(self) -> tuple:
        return self._elements.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self._elements.nbytes + self._scales.nbytes

    def __len__(self):
        return self.shape[0]

    # ---- not a numpy array: numpy gets an error, never an empty or code-valued array ----
    def _not_an_array(self, what):
        return TypeError(f"{what}: a numba_qk.ScaledTensor ({self._format.name}) is not a numpy "
                         f"array; decode it with st.astype(numba_qk.f32) (numba_qk.astype(st, "
                         f"numba_qk.f32)), or use its parts st.elements and st.block_scales")

    def __array__(self, dtype=None, copy=None):
        raise self._not_an_array("numpy.asarray")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise self._not_an_array(f"numpy.{getattr(ufunc, '__name__', ufunc)}")

    def __array_function__(self, func, types, args, kwargs):
        raise self._not_an_array(f"numpy.{getattr(func, '__name__', func)}")

    def __repr__(self):
        ts = "" if self._ts is None else f", tensor_scale={float(self._ts)!r}"
        return f"numba_qk.ScaledTensor(shape={self.shape}, dtype={self._format!r}{ts})"

    # ---- indexing: views, both parts in lockstep ----
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        nd = self.ndim
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis")
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (nd - len(key) + 1) + key[i + 1:]
        if len(key) > nd:
            raise IndexError(f"too many indices for a {nd}-d ScaledTensor")
        for k in key:
            if isinstance(k, (bool, np.bool_)):
                raise IndexError(f"ScaledTensor indices must be integers or slices, not "
                                 f"{type(k).__name__} (numpy would read {k!r} as a mask)")
            if not isinstance(k, slice):
                try:
                    operator.index(k)
                except TypeError:
                    raise IndexError(f"ScaledTensor indices must be integers or slices, got "
                                     f"{type(k).__name__}") from None
        B = self._format.block_size
        ekey = skey = key
        if len(key) == nd:
            last = key[-1]
            if not isinstance(last, slice):
                raise IndexError(f"an integer index on the blocked last axis of a "
                                 f"{self._format.name} ScaledTensor yields no block; slice it "
                                 f"in whole blocks of {B} (or decode it first)")
            start, stop, step = last.indices(self.shape[-1])
            if not len(range(start, stop, step)):
                start, stop, step = 0, 0, 1                          # an empty selection
            if step != 1 or start % B or stop % B:
                raise IndexError(f"slices of the last axis of a {self._format.name} ScaledTensor "
                                 f"must be block-aligned: step 1, start and stop multiples of the "
                                 f"block size {B} (got {start}:{stop}:{step})")
            ekey = key[:-1] + (slice(start, stop),)
            skey = key[:-1] + (slice(start // B, stop // B),)
        return ScaledTensor._make(self._elements[ekey], self._scales[skey], self._format,
                                  self._ts)

    # ---- conversion ----
    def astype(self, dtype, *, out=None, threads=1, tensor_scale=None):
        """``numba_qk.astype(self, dtype, ...)``: the decode (or a re-encode to a block-scaled
        format)."""
        return OPERATIONS["astype"](self, dtype, out=out, threads=threads,
                                    tensor_scale=tensor_scale)

    def copy(self) -> "ScaledTensor":
        return ScaledTensor._make(self._elements.copy(), self._scales.copy(), self._format,
                                  self._ts)


# --------------------------------------------------------------------------- encode / decode

def _jobs(nblocks, threads):
    if threads > 1:
        threads = _threads.effective_threads(threads, nblocks)
    if threads <= 1 or nblocks < 2:
        return [(0, nblocks)]
    bounds = np.linspace(0, nblocks, min(threads, nblocks) + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds, bounds[1:]) if b > a]


def _run(kernel, args_of, jobs):
    _threads.run([(kernel, args_of(b0, b1)) for b0, b1 in jobs], len(jobs))


def _flat_store(t: Tensor) -> np.ndarray:
    """C-contiguous flat uint8 storage of a part (a copy only for non-contiguous views)."""
    return np.ascontiguousarray(t.storage).reshape(-1).view(np.uint8)


def _f32_input(a) -> np.ndarray:
    """float32, C-contiguous and aligned values of ``a`` (converted by numba_qk.astype)."""
    if isinstance(a, ScaledTensor):
        a = decode(a, None)
    if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.dtype.byteorder in "=<|":
        x = a
    else:
        x = convert(a, f32)
    if not (x.flags.c_contiguous and x.flags.aligned):
        x = np.array(x, dtype=np.float32, order="C")
    return x


def _block_where(shape, B, block):
    nb = shape[-1] // B
    row = np.unravel_index(block // nb, shape[:-1]) if len(shape) > 1 else ()
    row = tuple(int(i) for i in row)
    return f"block {block % nb} of row {row}" if row else f"block {block}"


def _out_parts(out, fmt, shape, inputs=()):
    """Writable C-contiguous (elements, scales) Tensors of an encode ``out`` that overlap
    neither each other nor any array in ``inputs`` (the memory the input occupies)."""
    if isinstance(out, ScaledTensor):
        if out.dtype is not fmt:
            raise TypeError(f"out: a {out.dtype.name} ScaledTensor, expected {fmt.name}")
        el, sc = out.elements, out.block_scales
    elif isinstance(out, tuple) and len(out) == 2:
        el = _part(out[0], fmt.element, "out[0] (elements)")
        sc = _part(out[1], fmt.scale, "out[1] (block_scales)")
    else:
        raise TypeError(f"out: expected a {fmt.name} ScaledTensor or a tuple (elements, "
                        f"block_scales), got {type(out).__name__}")
    sshape = shape[:-1] + (shape[-1] // fmt.block_size,)
    if el.shape != shape or sc.shape != sshape:
        raise ValueError(f"out: elements {el.shape} / block_scales {sc.shape}, expected {shape} "
                         f"/ {sshape}")
    for part, what in ((el, "elements"), (sc, "block_scales")):
        if not part.storage.flags.c_contiguous:
            raise ValueError(f"out: {what} must be C-contiguous")
        if not part.storage.flags.writeable:
            raise ValueError(f"out: {what} is read-only")
    if overlaps(el.storage, sc.storage):
        raise ValueError("out: elements and block_scales overlap each other (they must be "
                         "separate memory)")
    for part, what in ((el, "elements"), (sc, "block_scales")):
        if any(overlaps(part.storage, m) for m in inputs):
            raise ValueError(f"out: {what} overlaps the input")
    return el, sc


def _input_memory(a, x) -> list:
    """The arrays whose memory an encode input occupies: ``x`` (its float32 values) and, where
    ``x`` is a conversion, ``a``'s own storage -- a ScaledTensor's two parts, a Tensor's bytes,
    an array or buffer (no copies are made)."""
    if isinstance(a, ScaledTensor):
        return [x, a.elements.storage, a.block_scales.storage]
    if isinstance(a, Tensor):
        return [x, a.storage]
    if isinstance(a, np.ndarray):
        return [x, a]
    try:
        return [x, np.asarray(a) if hasattr(a, "__array_interface__") else
                np.asarray(memoryview(a))]
    except (TypeError, ValueError):                     # a list, a scalar: x is a fresh copy
        return [x]


def encode(a, fmt: ScaledFormat, *, out=None, threads=1, tensor_scale=None) -> ScaledTensor:
    """``a`` (any array/Tensor numba_qk.astype reads; converted to float32 first) encoded to
    block-scaled format ``fmt`` along its last axis (DESIGN.md §9).

    ``out``: a ScaledTensor of ``fmt`` or a tuple (elements, block_scales) of the right shapes,
    writable and C-contiguous, whose two parts overlap neither each other nor the input
    (ValueError naming the part otherwise); on any error nothing is written."""
    threads = check_threads(threads)
    ts = check_tensor_scale(fmt, tensor_scale)
    x = _f32_input(a)
    shape = tuple(x.shape)
    B = fmt.block_size
    if not shape or shape[-1] % B:
        raise ValueError(f"{fmt.name}: the last axis must be a whole number of blocks of {B} "
                         f"elements, got shape {shape}")
    flat = x.reshape(-1)
    amax_bits = int(_k.amax_bits(flat))       # one vectorized pass: also finds inf / NaN
    if amax_bits >= 0x7F800000:
        bad = int(_k.first_nonfinite(flat))
        block = bad // B
        raise QuantizationDomainError(block, f"non-finite value {float(flat[bad])!r} at "
                                      f"element {bad % shape[-1]} ({_block_where(shape, B, block)}"
                                      f" of {fmt.name}; blocks run along the last axis); "
                                      f"nothing written")
    if fmt.has_tensor_scale and ts is None:
        amax = np.uint32(amax_bits).view(np.float32)
        ts = np.float32(amax / np.float32(2688.0))           # R32(amax_tensor / (6 * 448))
        if ts == 0:
            ts = np.float32(1.0)
    if out is not None:
        el, sc = _out_parts(out, fmt, shape, _input_memory(a, x))
    else:
        el = Tensor._wrap(np.empty(shape[:-1] + (shape[-1] // fmt.element.block_size,),
                                   storage_dtype(fmt.element)),
                          fmt.element)
        sc = Tensor._wrap(np.empty(shape[:-1] + (shape[-1] // B,), np.uint8), fmt.scale)
    codes = el.storage.reshape(-1).view(np.uint8)
    scales = sc.storage.reshape(-1).view(np.uint8)
    nblocks = flat.size // B
    jobs = _jobs(nblocks, threads)
    if fmt.has_tensor_scale:
        _run(_k.nvfp4_encode, lambda b0, b1: (flat, ts, codes, scales, b0, b1), jobs)
    else:
        kern = _k.mx_encoder(fmt.element.spec.mx_kernel_kind, fmt.emax, B)
        _run(kern, lambda b0, b1: (flat, codes, scales, b0, b1), jobs)
    if isinstance(out, ScaledTensor):
        ScaledTensor._set(out, el, sc, fmt, ts)           # out's tensor scale is the new one
        return out
    return ScaledTensor._make(el, sc, fmt, ts)


def decode(st: ScaledTensor, dtype, *, out=None, threads=1):
    """Values of ``st`` as element type ``dtype`` (float32 when None): the exact float32 decode
    (DESIGN.md §9), then numba_qk.astype's conversion for other types.

    ``out`` (any target type, as numba_qk.astype takes it) must not overlap ``st``'s elements
    or block scales: ValueError before anything is decoded or written."""
    threads = check_threads(threads)
    t = f32 if dtype is None else as_element_type(dtype)
    fmt = st.dtype
    shape = st.shape
    direct = t is f32 and (out is None or isinstance(out, np.ndarray))
    if out is not None:            # every path: checked before anything is decoded or written
        store = check_astype_out(out, t, shape)
        for part, what in ((st.elements, "elements"), (st.block_scales, "block_scales")):
            if overlaps(store, part.storage):
                raise ValueError(f"out: overlaps the input (the ScaledTensor's {what})")
    codes = _flat_store(st.elements)
    scales = _flat_store(st.block_scales)
    if direct and out is not None:
        result = out
    else:
        store = np.empty(shape, np.float32)
        result = store
    dst = store.reshape(-1)
    B = fmt.block_size
    jobs = _jobs(scales.size, threads)
    # large outputs bypass the caches (non-temporal stores; the same values): kernels/simd/stream.py
    stream = _stream.HAVE_STREAM and dst.nbytes >= _stream.STREAM_MIN_BYTES
    if fmt.has_tensor_scale:
        _run(_k.nvfp4_decode, lambda b0, b1: (codes, scales, st._ts, dst, b0, b1, stream),
             jobs)
    else:
        kern = _k.mx_decoder(fmt.element.spec.mx_kernel_kind, B)
        _run(kern, lambda b0, b1: (codes, scales, dst, b0, b1, stream), jobs)
    if direct:
        return result
    return convert(store, t, out=out, threads=threads)
