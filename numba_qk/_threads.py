"""numba_qk's threading policy, in one place.  ``ops``, ``cast`` and ``scaled`` call ``run``;
nothing else in numba_qk starts threads.

* **Own pool, not numba's.**  Every kernel is an ordinary ``nogil`` function; ``threads=N``
  runs pieces of the work (row chunks of a product, slices of a cast) on numba_qk's own pool of
  Python threads, which call those kernels with the GIL released.  numba_qk has no
  ``parallel=True`` code, so it never starts numba's threading layer: it cannot collide with a
  user's own ``parallel=True`` code, it is fork-safe on every platform (a forked child gets a
  fresh, empty pool), and there is no spin-waiting (an idle worker sleeps on a lock).
* **Dynamic claiming, caller included.**  The pieces are claimed one at a time by the calling
  thread and the workers alike, so a worker that the OS deschedules only delays the piece it
  holds, and a call never waits for a worker that has not started: the caller alone finishes
  every unclaimed piece.  Each output element is still written by exactly one serial kernel
  call, so no result depends on the thread count.
* **Adaptive count.**  ``threads=N`` is an upper bound.  Before a call that would use more than
  one thread, numba_qk reads the number of runnable tasks on the machine (``/proc/loadavg``)
  and uses at most the cores that are free (the caller counts itself).  A second thread on a
  core that another process keeps busy costs more than it gains (each descheduling stalls the
  product), so with one core of two busy, ``threads=2`` runs like ``threads=1``.  Set
  ``NUMBA_QK_ADAPTIVE_THREADS=0`` (read at import) or ``numba_qk._threads.ADAPTIVE = False`` to
  always use the requested count.  Where ``/proc/loadavg`` is missing the requested count is
  used.
* **Defaults.**  Products and casts default to ``threads=1``; ``threads=None`` means every
  core this process may run on.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time

ADAPTIVE = os.environ.get("NUMBA_QK_ADAPTIVE_THREADS", "1").strip() not in ("0", "false", "no")


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


_LOADAVG = "/proc/loadavg"
_SAMPLE_S = 0.005         # a sample is reused for this long (reading it is a few syscalls)
_sample = [-1.0, None]    # [monotonic time, free cores]


def free_cores() -> int | None:
    """Online cores minus the runnable tasks of other threads (the caller is one of them), or
    None where the kernel does not say.  A momentary sample (``/proc/loadavg``'s 4th field),
    taken at most every 5 ms."""
    now = time.monotonic()
    if now - _sample[0] < _SAMPLE_S:
        return _sample[1]
    try:
        with open(_LOADAVG, "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        free = max(1, (os.cpu_count() or 1) - (running - 1))
    except (OSError, ValueError, IndexError):
        free = None
    _sample[0], _sample[1] = now, free
    return free


def effective_threads(threads: int, pieces: int) -> int:
    """How many threads ``run`` uses for ``pieces`` pieces when ``threads`` are asked for."""
    n = min(threads, pieces)
    if n > 1 and ADAPTIVE:
        free = free_cores()
        if free is not None:
            n = min(n, free)
    return max(1, n)


class _Job:
    __slots__ = ("tasks", "claim", "left", "lock", "done", "error")

    def __init__(self, tasks):
        self.tasks = tasks
        self.claim = itertools.count()  # next() is atomic under the GIL
        self.left = len(tasks)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None

    def work(self):
        """Claim and run pieces until none is left unclaimed."""
        n = len(self.tasks)
        while True:
            i = next(self.claim)
            if i >= n:
                return
            fn, args = self.tasks[i]
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                if self.error is None:
                    self.error = e
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.set()


class _Pool:
    """Worker threads that sleep on their own queue until handed a job."""

    def __init__(self):
        self.workers = []  # (thread, queue)
        self.lock = threading.Lock()

    def _loop(self, q):
        while True:
            job = q.get()
            if job is None:  # pragma: no cover - never sent; workers are daemons
                return
            job.work()

    def hand(self, job, helpers: int):
        with self.lock:
            while len(self.workers) < helpers:
                q = queue.SimpleQueue()
                t = threading.Thread(target=self._loop, args=(q,), daemon=True,
                                     name=f"numba_qk-{len(self.workers)}")
                t.start()
                self.workers.append((t, q))
            chosen = self.workers[:helpers]
        for _, q in chosen:
            q.put(job)


_POOL = _Pool()


def _after_fork_in_child():
    global _POOL
    _POOL = _Pool()  # the parent's workers do not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def run(tasks, threads: int) -> int:
    """Run every ``fn(*args)`` of ``tasks`` (a list of ``(fn, args)``) once, on up to
    ``threads`` threads including the caller (callers take ``threads`` from
    ``effective_threads``); returns the thread count used.  Re-raises the first exception a
    piece raised, after every piece has finished."""
    n = max(1, min(threads, len(tasks)))
    if n <= 1:
        for fn, args in tasks:
            fn(*args)
        return 1
    job = _Job(tasks)
    _POOL.hand(job, n - 1)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error
    return n


def row_chunks(rows: int, threads: int, per_thread: int = 4, tile: int = 8):
    """``[(r0, r1), ...]``: contiguous row ranges, multiples of ``tile`` rows except the last,
    about ``per_thread`` per thread (so a descheduled thread holds little of the work)."""
    if threads <= 1 or rows <= tile:
        return [(0, rows)]
    pieces = min(per_thread * threads, -(-rows // tile))
    step = -(-rows // pieces)
    step = -(-step // tile) * tile
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]
