"""numba_qk's threading policy, in one place: the threading layer, fork(), and how a parallel
product is launched.  ``ops`` calls ``launch``; nothing else in numba_qk starts threads.

* **Layer.** numba chooses the threading layer (``NUMBA_THREADING_LAYER`` is respected; numba's
  default prefers TBB, then OpenMP, then its own ``workqueue``).  numba_qk does not change it:
  a library must not switch a process-wide setting under its users' own ``parallel=True`` code.
* **Threads.** ``workqueue`` must not be entered by two threads at once, so launches on it (or
  before the layer is known) are serialised by a lock; OpenMP and TBB take concurrent launches.
* **fork().** GNU OpenMP cannot be used in a child forked from a process that has started it:
  numba's ``omp`` layer then kills the child ("fork() called from a process already using GNU
  OpenMP, this is unsafe").  An at-fork handler marks such children, and in them every
  numba_qk product runs the serial kernels instead -- the result is bit-identical (no result
  depends on the thread count), only slower.  ``tbb`` and ``workqueue`` are fork-safe and keep
  their threads in the child.  (Only numba_qk's own calls are covered: a child that calls its
  own ``parallel=True`` functions after such a fork still dies; set
  ``NUMBA_THREADING_LAYER=workqueue`` -- or ``forksafe`` -- before the first parallel call, or
  start workers with the ``spawn``/``forkserver`` methods.)
* **Defaults.** Every product defaults to ``threads=1``: on a busy machine (more runnable
  threads than cores) a second thread is descheduled now and then and the product waits for
  it, which costs more than it gains for matrices that take under a few milliseconds (measured;
  see the README).  ``threads=None`` uses every core.
"""

from __future__ import annotations

import os
import threading

_LAUNCH_LOCK = threading.Lock()
_serial_only = False  # set in a child forked from a process that started GNU OpenMP


def threading_layer():
    """numba's threading layer once started (``'omp'``, ``'tbb'``, ``'workqueue'``), else None."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:
        return None


def _fork_unsafe_layer() -> bool:
    if threading_layer() != "omp":
        return False
    try:
        from numba.np.ufunc import omppool

        return omppool.openmp_vendor == "GNU"
    except Exception:  # pragma: no cover - unknown vendor: assume the unsafe one
        return True


def _after_fork_in_child():
    global _LAUNCH_LOCK, _serial_only
    _LAUNCH_LOCK = threading.Lock()  # it may have been held by another parent thread
    if _fork_unsafe_layer():
        _serial_only = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def serial_only() -> bool:
    """True in a forked child where numba_qk runs serial kernels only (see the module notes)."""
    return _serial_only


def launch(serial, parallel, args, rows: int, threads: int) -> None:
    """Run ``serial(*args)``, or ``parallel(*args, nchunks)`` over row chunks of at least 8 rows
    in numba's thread pool.  The thread count is capped by numba's pool size
    (``NUMBA_NUM_THREADS``, all cores by default)."""
    import numba

    n = min(threads, numba.config.NUMBA_NUM_THREADS, max(1, rows // 8))
    if n <= 1 or _serial_only:
        serial(*args)
        return
    layer = threading_layer()
    lock = _LAUNCH_LOCK if layer in (None, "workqueue") else None
    if lock:
        lock.acquire()
    try:
        previous = numba.get_num_threads()
        numba.set_num_threads(n)  # thread-local setting
        try:
            parallel(*args, n)
        finally:
            numba.set_num_threads(previous)
    finally:
        if lock:
            lock.release()
