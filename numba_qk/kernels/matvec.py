"""``matmul``'s common case in one compiled call: quantize one float32 activation, then the gemv.

``numba_qk.matmul(w, x, lhs_format=f)`` with one activation row and one thread is two kernels,
the activation quantizer of ``f``'s paired format and ``f``'s gemv; called from Python one after
the other they cost two trips through numba's dispatcher and the scratch array's allocation in
Python (issue 23: ~3.3 us per small call against ~1.0 us for the two in one call).
``quantize_then_gemv(quantize, gemv, block, nbytes)`` is the compiled composition::

    matvec(w, x, out) -> int     w uint8 [rows, G, bytes_f]; x float32 [K], C-contiguous,
                                 K a multiple of ``block``; out float32 [rows]

It returns the quantizer's result: -1 after writing ``out``, else the index of the first
out-of-domain activation block, and then ``out`` is untouched (the quantizer writes nothing
and the gemv does not run).  Same kernels, same bits as the two calls.  One closure per
(quantizer, gemv) pair, named by them (``_jit.closure_named``) and cached like any kernel.
"""

from functools import lru_cache

import numpy as np

from .._jit import kernel


@lru_cache(maxsize=None)
def quantize_then_gemv(quantize, gemv, block: int, nbytes: int):
    """The compiled ``matvec(w, x, out) -> int`` of ``quantize`` (``(values [n, block], records
    [n, nbytes]) -> -1 | first bad block``) followed by ``gemv(w, records, out)``."""

    def matvec(w, x, out):
        n = x.shape[0] // block
        xq = np.empty((n, nbytes), np.uint8)
        bad = quantize(x.reshape(n, block), xq)
        if bad >= 0:
            return bad
        gemv(w, xq, out)
        return -1

    return kernel(matvec)
