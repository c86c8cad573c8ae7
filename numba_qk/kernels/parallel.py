"""Row-parallel drivers for the composed products, made by one factory.

The only ``parallel=True`` code in numba_qk.  A driver splits the weight *rows* into contiguous
chunks (multiples of 8 rows, the kernels' row tile) and runs a format's serial gemv or gemm on
each chunk in a numba thread (``prange``).  Every output element is still computed by exactly
one serial, in-order fold, so the results do not depend on the number of threads.  Numba's
OpenMP threading layer (when available) spins briefly between launches, which keeps the
hand-off cost of sub-millisecond products low.

``row_parallel(code)`` makes the driver of the serial kernels registered under the int ``code``
(``register``; the registry uses the format's GGML type id).  The driver is a closure over that
int only: numba's on-disk cache keys a closure by its pickled cell values, so an int keeps the
driver cached across processes, where a closure over a dispatcher (whose pickle carries a fresh
uuid each process) would compile again every time.  The serial kernel is picked at typing time
by the ``_serial`` overload from the table below.  One driver serves gemv (``out`` ``[rows]``,
chunk ``out[r0:r1]``) and gemm (``out`` ``[batch, rows]``, chunk ``out[:, r0:r1]``).
"""

from numba import njit, prange
from numba.core import types
from numba.extending import overload

from .._jit import JIT_OPTIONS, kernel

PARALLEL_OPTIONS = dict(JIT_OPTIONS, parallel=True)

_SERIAL = {}  # code -> (gemv, gemm): serial @njit kernels (w, x, out)
_DRIVERS = {}  # code -> its driver


@kernel
def _chunk_step(rows, nchunks):
    step = (rows + nchunks - 1) // nchunks
    return (step + 7) // 8 * 8


def _serial(code, w, x, out):
    """Placeholder resolved by the overload below (never called from Python)."""
    raise NotImplementedError


@overload(_serial, jit_options=JIT_OPTIONS)
def _serial_overload(code, w, x, out):
    if not isinstance(code, types.IntegerLiteral) or not isinstance(out, types.Array):
        return None
    gemv, gemm = _SERIAL[code.literal_value]
    if out.ndim == 1:
        def gemv_chunk(code, w, x, out):
            gemv(w, x, out)
        return gemv_chunk
    if out.ndim == 2:
        def gemm_chunk(code, w, x, out):
            gemm(w, x, out)
        return gemm_chunk
    return None


def _rows(out, r0, r1):
    """Placeholder: the chunk of ``out`` holding rows [r0, r1)."""
    raise NotImplementedError


@overload(_rows, jit_options=JIT_OPTIONS)
def _rows_overload(out, r0, r1):
    if isinstance(out, types.Array) and out.ndim == 1:
        return lambda out, r0, r1: out[r0:r1]
    if isinstance(out, types.Array) and out.ndim == 2:
        return lambda out, r0, r1: out[:, r0:r1]
    return None


def register(code: int, gemv, gemm) -> None:
    """Bind serial kernels ``gemv(w, x, out)`` / ``gemm(w, x, out)`` to ``code``."""
    if code in _SERIAL and _SERIAL[code] != (gemv, gemm):
        raise AssertionError(f"parallel driver code {code} bound twice")
    _SERIAL[code] = (gemv, gemm)


def row_parallel(code: int):
    """The row-parallel driver ``driver(w, x, out, nchunks)`` of the kernels bound to ``code``."""
    if code not in _SERIAL:
        raise KeyError(f"no serial kernels registered under code {code}")
    if code in _DRIVERS:
        return _DRIVERS[code]

    @njit(**PARALLEL_OPTIONS)
    def driver(w, x, out, nchunks):
        step = _chunk_step(w.shape[0], nchunks)
        for c in prange(nchunks):
            r0 = c * step
            r1 = min(w.shape[0], r0 + step)
            if r0 < r1:
                _serial(code, w[r0:r1], x, _rows(out, r0, r1))

    _DRIVERS[code] = driver
    return driver
