"""Row-parallel drivers for the composed products.

The only ``parallel=True`` code in numba_qk.  Each driver splits the weight *rows* into
contiguous chunks (multiples of 8 rows, the kernels' row tile) and runs the serial kernel on
each chunk in a numba thread (``prange``).  Every output element is still computed by exactly
one serial, in-order fold, so the results do not depend on the number of threads.  Numba's
OpenMP threading layer (when available) spins briefly between launches, which keeps the
hand-off cost of sub-millisecond products low.
"""

from numba import njit, prange

from .._jit import JIT_OPTIONS, kernel
from .dot import gemm_q4_k_q8_k, gemv_q4_k_q8_k
from .legacy import gemm_legacy, gemv_legacy

PARALLEL_OPTIONS = dict(JIT_OPTIONS, parallel=True)


@kernel
def _chunk_step(rows, nchunks):
    step = (rows + nchunks - 1) // nchunks
    return (step + 7) // 8 * 8


@njit(**PARALLEL_OPTIONS)
def gemv_parallel(w, x, out, nchunks):
    """gemv_q4_k_q8_k over ``nchunks`` row chunks in parallel."""
    step = _chunk_step(w.shape[0], nchunks)
    for c in prange(nchunks):
        r0 = c * step
        r1 = min(w.shape[0], r0 + step)
        if r0 < r1:
            gemv_q4_k_q8_k(w[r0:r1], x, out[r0:r1])


@njit(**PARALLEL_OPTIONS)
def gemm_parallel(w, x, out, nchunks):
    """gemm_q4_k_q8_k over ``nchunks`` row chunks in parallel (``out[:, r0:r1]`` per chunk)."""
    step = _chunk_step(w.shape[0], nchunks)
    for c in prange(nchunks):
        r0 = c * step
        r1 = min(w.shape[0], r0 + step)
        if r0 < r1:
            gemm_q4_k_q8_k(w[r0:r1], x, out[:, r0:r1])


@njit(**PARALLEL_OPTIONS)
def gemv_legacy_parallel(code, w, x, out, nchunks):
    """legacy.gemv_legacy over ``nchunks`` row chunks in parallel."""
    step = _chunk_step(w.shape[0], nchunks)
    for c in prange(nchunks):
        r0 = c * step
        r1 = min(w.shape[0], r0 + step)
        if r0 < r1:
            gemv_legacy(code, w[r0:r1], x, out[r0:r1])


@njit(**PARALLEL_OPTIONS)
def gemm_legacy_parallel(code, w, x, out, nchunks):
    """legacy.gemm_legacy over ``nchunks`` row chunks in parallel."""
    step = _chunk_step(w.shape[0], nchunks)
    for c in prange(nchunks):
        r0 = c * step
        r1 = min(w.shape[0], r0 + step)
        if r0 < r1:
            gemm_legacy(code, w[r0:r1], x, out[:, r0:r1])
