"""Row-interleaved weights: ``repack`` (ggml's CPU_REPACK idea for numba_qk's legacy gemv).

``repack(w, format)`` copies Q4_0 or IQ4_NL weight records ``[rows, G, bytes]`` into tiles of 8 rows
whose scales and quants are interleaved (see ``numba_qk.kernels.legacy.x8``), so that one
512-bit load feeds all 8 rows and no per-row horizontal reduction is needed.  ``gemv``,
``gemm`` and ``matmul`` accept the result in place of the plain records and return the same
bits.  It pays off when the same weights serve many products (a model layer): the copy (numpy
transposes) costs about as much as 50 matvecs of its size.
"""

from __future__ import annotations

import operator

import numpy as np

from . import _threads
from ._jit import kernel
from ._validate import as_array, check_records
from .formats import Format, quant
from numba_qk.kernels.legacy import layout as _LL
from numba_qk.kernels.legacy import x8 as _x8
from numba_qk.kernels.kquants import q4_k_x16 as _x16
from numba_qk.kernels.iq import iq4 as _iq4

__all__ = ["repack", "Repacked", "REPACK_FORMATS"]

#: Weight formats ``repack`` accepts (the kernels also do Q8_0, kept private: its tiles were
#: slower than the plain records when streamed from DRAM, see kernels/legacy/x8.py).
REPACK_FORMATS = (quant.q4_0, quant.q4_k, quant.iq4_nl)
#: the x8 code of each 8-row format (kernels/legacy/x8.py; IQ4_NL's tiles have Q4_0's layout)
_X8_CODE = {quant.q4_0: _LL.CODES[quant.q4_0], quant.iq4_nl: _x8.X8_IQ4_NL}


def _bind(code, record_bytes, gemv_x8=None):
    """(gemv, gemm, gemv of whole tiles) on the x8 tiles of ``code``: ``gemv_x8(tiles, tail,
    x, out)`` (default: the legacy formats' ``x8.gemv_x8`` of ``code``)."""
    if gemv_x8 is None:
        gemv_x8 = _x8.GEMV_X8[code]

    @kernel
    def gemv(tiles, tail, x, out):
        gemv_x8(tiles, tail, x, out)

    @kernel
    def gemv_tiles(tiles, x, out):
        """``gemv`` of whole tiles only (the threaded runner's serial kernel)."""
        gemv_x8(tiles, np.empty((0, 1, record_bytes), np.uint8), x, out)

    @kernel
    def gemm(tiles, tail, x, out):
        for a in range(x.shape[0]):
            gemv_x8(tiles, tail, x[a], out[a])
    return gemv, gemm, gemv_tiles


@kernel
def _gemv_q4_k(tiles, tail, x, out):
    _x16.gemv_x16(tiles, tail, x, out)


@kernel
def _gemv_tiles_q4_k(tiles, x, out):
    """``_gemv_q4_k`` of whole tiles only (the threaded runner's serial kernel)."""
    _x16.gemv_x16(tiles, np.empty((0, 1, 144), np.uint8), x, out)


@kernel
def _gemm_q4_k(tiles, tail, x, out):
    for a in range(x.shape[0]):
        _x16.gemv_x16(tiles, tail, x[a], out[a])


#: (gemv, gemm, gemv of whole tiles) per format
_KERNELS = {quant.q4_0: _bind(_LL.CODES[quant.q4_0], quant.q4_0.block_bytes),
            quant.iq4_nl: _bind(_x8.X8_IQ4_NL, quant.iq4_nl.block_bytes,
                                _iq4.gemv_x8_iq4_nl_q8_0),
            quant.q4_k: (_gemv_q4_k, _gemm_q4_k, _gemv_tiles_q4_k)}
#: Rows per tile of each format (Q4_0, IQ4_NL: 8-row interleave; Q4_K: 16-row groups,
#: kernels/kquants/q4_k_x16.py).
_TILE_ROWS = {quant.q4_0: 8, quant.iq4_nl: 8, quant.q4_k: _x16.X16_ROWS}


def _tile_bytes(format, g: int) -> int:
    """Bytes of one tile of ``g`` records per row."""
    if format is quant.q4_k:
        return g * _x16.X16_BYTES
    return _x8.x8_planes(_X8_CODE[format], g)[1]


def _frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` read-only for good: the array owning its memory (numba_qk's own, never a
    user's) is made read-only too, so ``flags.writeable = True`` on ``arr`` raises."""
    owner = arr
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    owner.flags.writeable = False
    arr.flags.writeable = False
    return arr.view()   # a view: an array owning its memory could be made writable again


def _aligned_copy(arr: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``arr`` starting on a 64-byte boundary (a tile per cache line)."""
    buf = np.empty(arr.nbytes + 64, np.uint8)
    at = -buf.ctypes.data % 64
    out = buf[at:at + arr.nbytes].view(arr.dtype).reshape(arr.shape)   # same dtype: no cast
    out[...] = arr
    return out


class Repacked:
    """Weight records of ``format`` repacked by ``repack``: ``shape`` is the plain records'
    ``(rows, G, bytes)``; ``tiles`` holds the full tiles of R rows (uint8 ``[rows // R, tile
    bytes]``; Q4_0, IQ4_NL: R = 8, ``G * (16 + 8 * 16)`` bytes rounded up to 64; Q4_K: R = 16,
    ``G * 2304`` bytes, the size of the plain records), ``tail`` (uint8 ``[rows % R, G,
    bytes]``) the rows after them as plain records.  ``unpack()`` gives the plain records back.

    Immutable: attributes cannot be reassigned and the arrays are read-only (their
    ``writeable`` flag cannot be set again).  The constructor (and unpickling) checks that
    format, shape, tiles and tail agree (a ``ValueError``/``TypeError`` naming what does not)
    and keeps its own copy of the arrays; ``gemv``/``gemm``/``matmul`` check the agreement again
    before any kernel reads the tiles."""

    __slots__ = ("format", "shape", "tiles", "tail", "_checked")
    _PARTS = ("format", "shape", "tiles", "tail")

    def __init__(self, format, shape, tiles, tail):
        self._adopt(format, shape, np.array(as_array(tiles, "tiles"), copy=True),
                    as_array(tail, "tail"))

    def _adopt(self, format, shape, tiles, tail):
        """Check the parts and take ``tiles`` (an array nobody else holds) as it is; ``tail``
        (fewer than a tile's rows, possibly a view of the caller's records) is copied."""
        if isinstance(tail, np.ndarray):
            tail = np.array(tail, copy=True, order="C")
        if isinstance(tiles, np.ndarray) and (not tiles.flags.c_contiguous
                                              or tiles.ctypes.data % 64):
            tiles = _aligned_copy(tiles)
        format, shape = _check_parts(format, shape, tiles, tail)
        parts = (format, shape, _frozen(tiles), _frozen(tail))
        for name, value in zip(self._PARTS, parts):
            object.__setattr__(self, name, value)
        # the parts as checked: by identity, and the arrays' geometry (numpy lets a read-only
        # array's shape and strides be reassigned in place)
        object.__setattr__(self, "_checked", (*parts, _geometry(parts[2], parts[3])))

    @classmethod
    def _of(cls, format, shape, tiles, tail):
        """A Repacked of arrays that are its own (``repack``'s, an unpickled copy's)."""
        self = object.__new__(cls)
        self._adopt(format, shape, tiles, tail)
        return self

    def __setattr__(self, name, value):
        raise AttributeError(f"Repacked is immutable: cannot set {name!r} "
                             f"(repack the plain records again instead)")

    def __delattr__(self, name):
        raise AttributeError(f"Repacked is immutable: cannot delete {name!r}")

    def __reduce__(self):
        return (Repacked._of, (self.format, self.shape, self.tiles, self.tail))

    def __setstate__(self, state):
        """Pickles written before Repacked was immutable: ``(None, {slot: value})``."""
        slots = state[1] if isinstance(state, tuple) else state
        if not isinstance(slots, dict) or set(slots) != set(self._PARTS):
            raise ValueError("Repacked: unpickled state does not hold format, shape, tiles, tail")
        self._adopt(slots["format"], slots["shape"], np.array(slots["tiles"]), slots["tail"])

    def check(self) -> None:
        """Raise ``ValueError``/``TypeError`` unless ``format``, ``shape``, ``tiles`` and
        ``tail`` still agree (the products call this before any kernel reads the tiles).  The
        parts checked on construction are recognised by identity (a few ns); anything forced
        in since (``object.__setattr__``) is checked in full."""
        c = self._checked
        if (self.format is c[0] and self.shape is c[1] and self.tiles is c[2]
                and self.tail is c[3] and _geometry(c[2], c[3]) == c[4]):
            return
        _check_parts(self.format, self.shape, self.tiles, self.tail)

    @property
    def nbytes(self) -> int:
        return self.tiles.nbytes + self.tail.nbytes

    def unpack(self) -> np.ndarray:
        """The plain weight records ``[rows, G, bytes]`` (a new array)."""
        rows, g, nb = self.shape
        if self.format is quant.q4_k:
            return _x16.unpack_x16(self.tiles, self.tail, g)
        return _x8.unpack_x8(_X8_CODE[self.format], self.tiles, self.tail, g, nb)

    def __repr__(self):
        return f"Repacked({self.format.name}, shape={self.shape})"


def _geometry(tiles, tail):
    return (tiles.shape, tiles.strides, tail.shape, tail.strides)


def _check_parts(format, shape, tiles, tail):
    """(format, shape as a tuple of ints) when ``tiles``/``tail`` are what ``repack`` makes of
    records of that shape; else a one-line TypeError/ValueError naming the disagreement."""
    if not (isinstance(format, Format) and format in REPACK_FORMATS):
        raise TypeError(f"Repacked: format must be one of "
                        f"{', '.join(f.name for f in REPACK_FORMATS)}, got {format!r}")
    try:
        shape = tuple(int(operator.index(n)) for n in shape)
    except TypeError:
        raise TypeError(f"Repacked: shape must be (rows, G, bytes) integers, got {shape!r}"
                        ) from None
    if len(shape) != 3 or shape[2] != format.block_bytes or min(shape) < 0:
        raise ValueError(f"Repacked: shape must be (rows, G, {format.block_bytes}) for "
                         f"{format.name}, got {shape}")
    rows, g, nb = shape
    r = _TILE_ROWS[format]
    for name, arr, want in (("tiles", tiles, (rows // r, _tile_bytes(format, g))),
                            ("tail", tail, (rows % r, g, nb))):
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8:
            raise TypeError(f"Repacked: {name} must be a uint8 array, got "
                            f"{getattr(arr, 'dtype', type(arr).__name__)}")
        if arr.shape != want:
            raise ValueError(f"Repacked: {name} of shape {arr.shape} does not match records of "
                             f"shape {shape} ({format.name}, {r}-row tiles: expected {want})")
        if arr.size and not arr.flags.c_contiguous:
            raise ValueError(f"Repacked: {name} must be C-contiguous (the kernels walk it by "
                             f"its shape), got strides {arr.strides}")
    return format, shape


def repack(w, format) -> Repacked:
    """Copy weight records ``w`` (uint8 ``[rows, G, bytes]``, any strides) of ``format``
    (``numba_qk.quant.q4_0``, ``iq4_nl`` or ``q4_k``) into row-interleaved tiles (Q4_0,
    IQ4_NL: 8 rows; Q4_K: 16 rows, one i32 lane per row) for ``gemv`` / ``gemm`` / ``matmul``,
    which then return the same bits as on ``w``.  The speed-up needs AVX-512 VNNI (4096x4096
    Q4_0 matvec on Zen 4: ~0.45x the plain kernel's time with the weights in cache,
    ~0.65-0.75x streamed from DRAM; IQ4_NL: bench/RESULTS_iq_grid.md; Q4_K: see
    kernels/kquants/q4_k_x16.py); elsewhere the portable loops run on the tiles (slower than
    the plain records' kernels).
    A batch (``gemm``, 2-d ``matmul``) runs the repacked gemv once per activation row."""
    if not (isinstance(format, Format) and format in REPACK_FORMATS):
        raise TypeError(f"format: repack expects one of "
                        f"{', '.join(repr(f) for f in REPACK_FORMATS)}, got {format!r}")
    wa = check_records(as_array(w, "w"), "w", format, "weights")
    if format is quant.q4_k:
        tiles, tail = _x16.repack_x16(wa)
    else:
        tiles, tail = _x8.repack_x8(_X8_CODE[format], wa)
    return Repacked._of(format, wa.shape, tiles, tail)


def product(rp: Repacked, kind: str, xa, target, nthreads: int) -> None:
    """gemv (``xa`` [G, bytes]) or gemm (``xa`` [batch, G, bytes]) on ``rp``, tiles split over
    up to ``nthreads`` threads; ``xa`` is made contiguous first (the kernel's record stride is
    a constant)."""
    gemv, gemm, gemv_tiles = _KERNELS[rp.format]
    fn = gemv if kind == "gemv" else gemm
    xa = np.ascontiguousarray(xa)
    t_n = rp.tiles.shape[0]
    n = _threads.effective_threads(nthreads, t_n + (1 if rp.tail.shape[0] else 0)) \
        if nthreads > 1 else 1
    if n == 1:
        fn(rp.tiles, rp.tail, xa, target)
        return
    rt = _TILE_ROWS[rp.format]
    rows = rt * t_n
    if kind == "gemv":   # tiles claimed in compiled code (_threads.run_rows); tail rows first
        if rp.tail.shape[0]:
            fn(rp.tiles[:0], rp.tail, xa, target[rows:])
        _threads.run_rows(gemv_tiles, rp.tiles, xa, target[:rows], n, tile=1, per=rt)
        return
    no_tail = rp.tail[:0]
    tasks = []
    for t0, t1 in _threads.row_chunks(t_n, n, per_thread=4, tile=1):
        part = target[rt * t0:rt * t1] if kind == "gemv" else target[:, rt * t0:rt * t1]
        tasks.append((fn, (rp.tiles[t0:t1], no_tail, xa, part)))
    if rp.tail.shape[0]:
        part = target[rows:] if kind == "gemv" else target[:, rows:]
        tasks.append((fn, (rp.tiles[:0], rp.tail, xa, part)))
    _threads.run(tasks, n)
