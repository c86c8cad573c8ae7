"""The JIT policy, in one place.  Every kernel in numba_qk is compiled with these options.

* ``fastmath=False``: no reassociation, no FMA contraction, no flush-to-zero -- each float
  operation is one IEEE round-to-nearest-even step, as the numerics require.
* ``error_model='numpy'``: float division follows IEEE (x/0 -> inf/nan), never raises.
* ``cache=True``: compiled code is stored beside the modules, so later processes start fast.
* ``nogil=True``: kernels release the GIL; callers may run them from several threads.
* ``parallel=False``: record order is part of the semantics; kernels never reorder it.
"""

from numba import njit

JIT_OPTIONS = dict(
    fastmath=False,
    error_model="numpy",
    cache=True,
    nogil=True,
    parallel=False,
    boundscheck=False,
)


def kernel(fn):
    """Compile ``fn`` with numba_qk's JIT policy."""
    return njit(**JIT_OPTIONS)(fn)


def inline_kernel(fn):
    """``kernel`` inlined into its callers at numba's IR level (``inline='always'``): for small
    per-block helpers called once per block from a hot loop, where LLVM kept the call (measured:
    the legacy encoders' absmax / min-max helpers cost 0.19 ms per 1 M floats as calls)."""
    return njit(inline="always", **JIT_OPTIONS)(fn)
