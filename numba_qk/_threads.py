"""numba_qk's threading policy, in one place.  ``ops``, ``_convert`` (astype's element
conversion), ``scaled`` and ``repack`` call ``run``; ``models`` owns a ``Helpers`` group per
model with threads; nothing else in numba_qk starts threads.

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
  and uses at most the cores that are free (the caller counts itself); a core counts as busy
  once ``BUSY_SAMPLES`` (3) samples in a row, at least 5 ms apart, saw it busy.  A second
  thread on a core that another process keeps busy costs more than it gains (each
  descheduling stalls the product), so with one core of two busy, ``threads=2`` runs like
  ``threads=1``.  Set
  ``NUMBA_QK_ADAPTIVE_THREADS=0`` (read at import) or ``numba_qk._threads.ADAPTIVE = False`` to
  always use the requested count.  Where ``/proc/loadavg`` is missing the requested count is
  used.
* **Defaults.**  Products and casts default to ``threads=1``; ``threads=None`` means every
  core this process may run on.
* **Short spins, then sleep.**  After a job a worker spins (a compiled loop, GIL released) for
  ``NUMBA_QK_SPIN_US`` microseconds (default 200, 0 = never) watching for the next one before it
  sleeps on its queue: back-to-back products (a token's matvecs) then skip the wake-up, which
  on a VM costs 15-30 us.  The adaptive count does not take a worker of ours that is awake
  (spinning, working, or between the two) for another process's busy core.  Threaded gemv and
  gemm claim their row chunks in compiled code (``kernels/_pool.py``): one call per thread, no
  GIL round trip per chunk, and the caller spins (bounded) for the last chunk instead of
  sleeping on an event.
* **Standing helpers for a fixed set of products** (``Helpers``; a model's decoding, decision
  051).  A pool job still takes the worker through Python (~13 us of hand-off); a helper instead
  stays in compiled code between products and the caller posts each product by address, so a
  hand-off costs about a microsecond.  A helper idle for ``HELPER_IDLE_US`` sleeps; the next
  product wakes it and runs without it until it is back.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
import time
import weakref

import numpy as np

from .kernels import _pool

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(name: str, default: bool) -> bool:
    """A yes/no setting from the environment (1/true/yes/on, 0/false/no/off, any case; empty:
    ``default``); anything else is an error naming the variable."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    if v.lower() in _TRUE:
        return True
    if v.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={v!r}: expected one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}")


#: The most ``NUMBA_QK_SPIN_US`` may ask for: one second of spinning after each job.
MAX_SPIN_US = 1_000_000


def _env_us(name: str, default: int, maximum: int = MAX_SPIN_US) -> int:
    """Microseconds from the environment, 0..``maximum``; a bad value is an error naming the
    variable."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        us = int(v)
    except ValueError:
        us = -1
    if not 0 <= us <= maximum:
        raise ValueError(f"{name}={v!r}: expected a whole number of microseconds from 0 to "
                         f"{maximum}")
    return us


ADAPTIVE = _env_flag("NUMBA_QK_ADAPTIVE_THREADS", True)


# How long a worker spins for its next job before it sleeps, and how long a gemv caller spins
# for the helpers' last chunks before it sleeps on the job's event.
SPIN_US = _env_us("NUMBA_QK_SPIN_US", 200) if _pool.HAVE_ATOMICS else 0
_JOIN_SPIN_US = 2000
_polls_per_us = [0.0]     # measured once, the first time a worker is started


def _polls(us: float) -> int:
    """Spin polls that take about ``us`` microseconds on this machine."""
    if not _polls_per_us[0]:
        cell, flags, n = np.zeros(2, np.int64), np.zeros(1, np.int64), 20000
        _pool.spin_until_changed(cell, 0, 1, flags, 0, flags, 0, flags)   # compiled first
        t0 = time.perf_counter()
        _pool.spin_until_changed(cell, 0, n, flags, 0, flags, 0, flags)
        _polls_per_us[0] = n / max((time.perf_counter() - t0) * 1e6, 1.0)
    return int(us * _polls_per_us[0])


def cpu_count() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


_LOADAVG = "/proc/loadavg"
_SAMPLE_S = 0.005         # a sample is reused for this long (reading it is a few syscalls)
_sample = [-1.0, None]    # [monotonic time, free cores]


_loadavg_fd = [None, -1]   # [path, descriptor kept open: a pread costs 1 us, an open 10 us]


def _read_loadavg() -> bytes:
    path = _LOADAVG
    if _loadavg_fd[0] != path:
        if _loadavg_fd[1] >= 0:
            os.close(_loadavg_fd[1])
            _loadavg_fd[:] = [None, -1]
        _loadavg_fd[1] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        _loadavg_fd[0] = path
    return os.pread(_loadavg_fd[1], 256, 0)


#: A core counts as busy once this many samples in a row (at least ``_SAMPLE_S`` apart) saw
#: another task runnable on it: a momentary sample also catches a transient task (a process
#: exiting, a kernel thread), which put a 32-token prompt's steps on one thread for 5 ms at a
#: time (SmolLM2 with two threads after llama.cpp's runs: 768-886 tok/s, 926 with the count off).
BUSY_SAMPLES = 3
_others = collections.deque(maxlen=BUSY_SAMPLES)   # other tasks runnable, latest samples
_others_of = [None]                                  # the file those samples came from


def free_cores() -> int | None:
    """Online cores minus the runnable tasks of other threads (the caller is one of them) seen
    in each of the latest ``BUSY_SAMPLES`` samples, or None where the kernel does not say.
    Momentary samples (``/proc/loadavg``'s 4th field), taken at most every 5 ms."""
    now = time.monotonic()
    if now - _sample[0] < _SAMPLE_S:
        return _sample[1]
    try:
        running = int(_read_loadavg().split()[3].split(b"/")[0])
        if _others_of[0] != _LOADAVG:
            _others.clear()
            _others_of[0] = _LOADAVG
        # our own workers (spinning for their next job, working, or on their way between
        # the two) are not another process's load
        _others.append(max(0, running - 1 - _POOL.awake() - _helpers_awake()))
        free = max(1, (os.cpu_count() or 1) - min(_others))
    except (OSError, ValueError, IndexError, AttributeError):
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


class _Pieces:
    """Bookkeeping shared by the jobs: ``left`` pieces to finish, the first error a piece
    raised, and ``done``, a lock held until the last piece finishes (``wait()`` blocks until
    then; a lock, not an Event: one is made on every threaded call, and an Event costs 2 us).

    ``abandon()`` is the caller's way out when an exception (Ctrl-C) reaches it outside a
    piece.  Such an exception can land between any two bytecodes of the caller -- after a
    claim, before a count -- so the caller's own bookkeeping cannot be trusted then; only the
    workers', which never receive asynchronous exceptions, is: each worker counts itself
    ``inside`` the job while it works on it (``enter``/``leave``)."""
    __slots__ = ("left", "lock", "done", "error", "cancelled", "inside")

    def __init__(self, left):
        self.left = left
        self.lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()
        self.error = None
        self.cancelled = False   # set by abandon(): no piece starts any more
        self.inside = []         # one entry per worker working on this job (enter/leave)

    def _run_one(self, fn, args):
        try:
            if not self.cancelled:
                fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            if self.error is None:
                self.error = e
        finally:
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.done.release()

    def wait(self):
        self.done.acquire()
        self.done.release()

    def enter(self) -> bool:
        """A worker starts on the job; False (and it must not) once the caller abandoned it.
        No lock: ``list.append``/``pop`` and attribute reads are atomic under the GIL, and the
        worker announces itself *before* it reads ``cancelled`` while ``abandon`` sets
        ``cancelled`` *before* it reads ``inside``, so one of the two always sees the other."""
        self.inside.append(None)
        if self.cancelled:
            self.inside.pop()
            return False
        return True

    def leave(self):
        self.inside.pop()

    def abandon(self):
        """The caller stops: no piece starts from now on, and this returns once every worker
        has left the job, so nothing writes the caller's buffers after the exception reaches
        it.  A further interrupt does not cut the wait short (it is bounded by one piece, and
        polled: this runs only on the way out of an interrupted call)."""
        self.cancelled = True
        while True:
            try:
                while self.inside:
                    time.sleep(50e-6)
                return
            except BaseException:  # noqa: BLE001 - keep waiting; the first exception wins
                continue


class _Job(_Pieces):
    """Pieces ``(fn, args)`` claimed one at a time by the caller and the workers (``run``)."""
    __slots__ = ("tasks", "claim")

    def __init__(self, tasks):
        super().__init__(len(tasks))
        self.tasks = tasks
        self.claim = itertools.count()  # next() is atomic under the GIL

    def work(self):
        """Claim and run pieces until none is left unclaimed."""
        n = len(self.tasks)
        while True:
            i = next(self.claim)
            if i >= n:
                return
            self._run_one(*self.tasks[i])


_NO_ACK = np.zeros(8, np.int64)   # where workers count acks of jobs that want none
# Every run_rows caller's runner counts ``_GO[0] += 1`` once it has released the GIL; a
# spinning worker handed that caller's job waits for it before it takes the GIL.
_GO = np.zeros(8, np.int64)


class _Call(_Pieces):
    """One call of ``fn(*args)`` on each of ``helpers`` workers (``run_rows``); each worker,
    once back in its spin loop (or about to run its next job), counts ``ack[2] += 1``."""
    __slots__ = ("fn", "args", "ack")

    def __init__(self, fn, args, helpers, ack):
        super().__init__(helpers)
        self.fn, self.args, self.ack = fn, args, ack

    def work(self):
        self._run_one(self.fn, self.args)


class _Worker:
    __slots__ = ("thread", "queue", "lock", "pending", "sleeping", "gen", "flag", "alive")

    def __init__(self):
        self.queue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.pending = collections.deque()
        self.sleeping = True          # on its queue: a job must be put there
        # [bumped for each job left in ``pending``, the ``_GO`` count that job's caller reaches
        #  once it released the GIL (0: none to wait for)]
        self.gen = np.zeros(8, np.int64)[:2]
        self.flag = np.zeros(8, np.int64)[:1]   # 1 while it spins (``free_cores``)
        self.alive = True             # False once its thread has ended


class _Pool:
    """Worker threads.  A worker that finished a job looks for the next one for ``SPIN_US``
    (its ``pending`` jobs, announced by a bump of ``gen`` that its spin loop watches), then
    sleeps on its queue until handed one."""

    def __init__(self):
        self.workers = []
        self.lock = threading.Lock()

    def spinning(self) -> int:
        return sum(int(w.flag[0]) for w in self.workers)

    def awake(self) -> int:
        """Workers not asleep on their queue: spinning, working or between the two (all our
        own load; ``free_cores`` does not count them as other processes' tasks)."""
        return sum(1 for w in self.workers if w.flag[0] or not w.sleeping)

    @staticmethod
    def _pending_or_sleep(w):
        """(Under ``w.lock``.)  The worker's oldest pending job, or None after marking it
        asleep, so that the next ``hand`` puts a job on its queue."""
        if w.pending:
            return w.pending.popleft()
        w.sleeping = True
        return None

    def _next(self, w, job):
        """The worker's next job after ``job``, or None once it should sleep."""
        ack = getattr(job, "ack", None)
        with w.lock:
            if w.pending or not SPIN_US:
                if ack is not None:
                    ack[2] += 1
                return self._pending_or_sleep(w)
            seen = int(w.gen[0])
            w.flag[0] = 1
        _pool.spin_until_changed(w.gen, seen, _polls(SPIN_US), w.flag, 0,
                                 _NO_ACK if ack is None else ack, 2, _GO)
        with w.lock:
            return self._pending_or_sleep(w)

    def _loop(self, w):
        try:
            self._serve(w)
        finally:
            w.alive = False

    def _serve(self, w):
        while True:
            job = w.queue.get()
            while job is not None:
                if job.enter():
                    try:
                        job.work()         # never raises: a piece's error goes to its caller
                    finally:
                        job.leave()
                try:
                    job = self._next(w, job)
                except BaseException:  # noqa: BLE001 - a worker never dies: it sleeps instead
                    w.flag[0] = 0
                    with w.lock:
                        job = self._pending_or_sleep(w)

    def hand(self, job, helpers: int):
        with self.lock:
            # a worker thread that ended (it cannot, short of interpreter shutdown) is replaced,
            # so that no job is ever queued to a thread that will not take it
            if not all(w.alive for w in self.workers):
                self.workers = [w for w in self.workers if w.alive]
            while len(self.workers) < helpers:
                w = _Worker()
                if SPIN_US:
                    _polls(SPIN_US)
                w.thread = threading.Thread(target=self._loop, args=(w,), daemon=True,
                                            name=f"numba_qk-{len(self.workers)}")
                w.thread.start()
                self.workers.append(w)
            chosen = self.workers[:helpers]
        for w in chosen:
            with w.lock:
                if w.sleeping:
                    w.sleeping = False
                    w.queue.put(job)
                else:
                    w.pending.append(job)
                    w.gen[1] = int(_GO[0]) + 1 if isinstance(job, _Call) else 0
                    w.gen[0] += 1


_POOL = _Pool()


def _after_fork_in_child():
    global _POOL
    _POOL = _Pool()  # the parent's workers do not exist in the child
    for h in list(_HELPERS):
        h._after_fork()


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
    try:
        _POOL.hand(job, n - 1)
        job.work()
        job.wait()
    except BaseException:   # e.g. Ctrl-C between pieces: no piece may outlive the call
        job.abandon()
        raise
    if job.error is not None:
        raise job.error
    return n


def _gemm_rows(gemm, w, x, out, r0, r1):
    """gemm of weight rows [r0, r1) into a contiguous block, then copied to ``out[:, r0:r1]``
    (the serial kernels stay compiled for contiguous outputs only)."""
    block = np.empty((out.shape[0], r1 - r0), np.float32)
    gemm(w[r0:r1], x, block)
    out[:, r0:r1] = block


def run_rows(gemv, w, x, out, threads: int, per_thread: int = 4, tile: int = 8,
             per: int = 1, gemm: bool = False) -> int:
    """``gemv(w, x, out)`` over row chunks of ``w`` on up to ``threads`` threads including the
    caller, claimed in compiled code (``kernels/_pool.py``); the chunk boundaries are those of
    ``row_chunks``, and weight rows ``[r0, r1)`` write ``out[per * r0:per * r1]``.  With
    ``gemm=True``, ``gemv`` is a gemm and rows ``[r0, r1)`` write ``out[:, r0:r1]`` (``per`` =
    1).  Returns the thread count used.  Where the compiled runner cannot run
    (``NUMBA_DISABLE_JIT``) the chunks run as Python pieces through ``run``."""
    rows = w.shape[0]
    chunk = _chunk_rows(rows, threads, per_thread, tile)
    n = max(1, min(threads, -(-rows // chunk)))
    if n <= 1:
        gemv(w, x, out)
        return 1
    if not _pool.HAVE_ATOMICS:
        if gemm:
            return run([(_gemm_rows, (gemv, w, x, out, r0, min(rows, r0 + chunk)))
                        for r0 in range(0, rows, chunk)], n)
        return run([(gemv, (w[r0:r0 + chunk], x, out[per * r0:per * (r0 + chunk)]))
                    for r0 in range(0, rows, chunk)], n)
    runner = _pool.rows_runner(gemv, gemm)
    ctl = np.zeros(4, np.int64)   # [next chunk, chunks done, helpers back, threads entered]
    call = _Call(runner, (w, x, out, ctl, chunk, 0, 0, _GO, per), n - 1, ctl)
    try:
        _POOL.hand(call, n - 1)
        complete = runner(w, x, out, ctl, chunk, _polls(_JOIN_SPIN_US), 1, _GO, per)
        if not complete:
            call.wait()
    except BaseException:   # e.g. Ctrl-C: the helpers' running calls finish first
        call.abandon()
        raise
    if not complete and call.error is not None:
        raise call.error
    return n


def row_chunks(rows: int, threads: int, per_thread: int = 4, tile: int = 8):
    """``[(r0, r1), ...]``: contiguous row ranges, multiples of ``tile`` rows except the last,
    about ``per_thread`` per thread (so a descheduled thread holds little of the work)."""
    step = _chunk_rows(rows, threads, per_thread, tile)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)] if rows else [(0, 0)]


def _chunk_rows(rows: int, threads: int, per_thread: int, tile: int) -> int:
    """Rows per chunk of ``row_chunks`` (all chunks but the last have this many)."""
    if threads <= 1 or rows <= tile:
        return max(rows, 1)
    pieces = min(per_thread * threads, -(-rows // tile))
    return -(-(-(-rows // pieces)) // tile) * tile


#: How long a standing helper spins with nothing posted before it sleeps (between a model's
#: decoded tokens the caller samples, streams text, ...: a wake-up costs 15-30 us on a VM).
HELPER_IDLE_US = 2000
_HELPERS = weakref.WeakSet()   # every live Helpers, for free_cores and fork


def _helpers_awake() -> int:
    return sum(h.awake() for h in list(_HELPERS))


class Helpers:
    """Standing helper threads for a fixed set of kernels run again and again (one model's
    products, attention heads and row-wise steps): a helper stays in compiled code between
    products (``_pool.server_of``) and the caller posts each product by address
    (``_pool.caller_of``), so a hand-off costs about a microsecond instead of the pool's ~13
    (two GIL round trips); both claim the product's row chunks as ``run_rows`` does, each chunk
    one serial kernel call, so the bits do not depend on the thread count or on who ran which
    chunk.

    ``product(fn, w, per, tile)`` registers a serial kernel ``fn(w, x, out)`` on weights ``w``
    (before the first product runs) and returns ``split(x, out)``, or None where ``fn`` would be
    a kind more than ``_pool.KINDS``; ``batch_product(gemm, weights)`` the same for a batch's
    gemm over several weights at once; ``kind_of(job)`` and ``run(call, ...)`` do the same for a
    job and a compiled caller of one's own (``models.kernels.attention_split``).  A helper
    asleep (spun ``HELPER_IDLE_US`` with nothing posted) is woken by the next product, which
    runs without it meanwhile (the caller claims every chunk no helper took).  ``close()`` ends
    the threads (also when the group is garbage-collected: ``weakref.finalize``).  A group has
    one product slot: it serves one caller thread at a time (the model's calls hold its
    lock)."""

    #: chunks of a one-token product per thread (caller included); a batch's product takes
    #: one chunk per thread (each gemm call lays out the activations and decodes its panel
    #: anew: Q4_1 32 x 1536 x 576 split 1.52-1.75x with one chunk a thread, 1.42-1.55x with two)
    CHUNKS_PER_THREAD = 2

    def __init__(self, helpers: int):
        if helpers < 1:
            raise ValueError(f"Helpers needs at least one helper, not {helpers}")
        self.helpers = helpers
        self.jobs = []           # job kernels (_pool's signature); a product names its own by index
        self._kinds = {}         # job -> index in jobs
        self.ctl = np.zeros(_pool.ctl_words(helpers), np.int64)
        self.serve = None
        self.events = []
        self.closed = False
        self._wait = _polls(_JOIN_SPIN_US)
        self._idle = _polls(HELPER_IDLE_US)
        self._finalizer = weakref.finalize(self, Helpers._stop, self.ctl, self.events)
        _HELPERS.add(self)

    def awake(self) -> int:
        """Helpers in their compiled loop (or woken and on their way there)."""
        return sum(int(self.ctl[_pool.AWAKE + 8 * h]) for h in range(len(self.events)))

    def chunks_run(self) -> list:
        """Chunks each helper has run so far."""
        return [int(self.ctl[_pool.AWAKE + 8 * h + 2]) for h in range(self.helpers)]

    def product(self, fn, w, per: int = 1, tile: int = 8):
        """``split(x, out)``: one token's ``fn(w, x, out)`` with ``w``'s rows (C-contiguous
        uint8, 2 or 3 dimensions; ``per`` outputs per row) claimed in chunks of a multiple of
        ``tile`` rows by the caller and the helpers; ``x`` ``[g, b]`` and ``out`` ``[n]``
        C-contiguous.  None where the group has no room for another kernel."""
        self._check_weights(w, (2, 3))
        job = _pool.rows_job(fn, w.ndim)
        kind = self.kind_of(job)
        if kind is None:
            return None
        run = _pool.caller_of(job)
        rows = w.shape[0]
        chunk = _chunk_rows(rows, self.helpers + 1, self.CHUNKS_PER_THREAD, tile)
        chunks = -(-rows // chunk) if rows else 0
        d = tuple(w.shape) + (0,) * (3 - w.ndim)
        w_at = w.ctypes.data
        ctl, wait = self.ctl, self._wait

        def split(x, out):
            self._ensure_awake()
            if not run(ctl, kind, w_at, d[0], d[1], d[2], x, out, chunks, chunk, per, wait):
                self._join(chunks)
        split.keep = w       # the weights stay alive while the product can run
        return split

    def batch_product(self, gemm, weights, tile: int = 8):
        """``split(x, out)``: a batch's ``gemm(w, x, out_w)`` for each of ``weights`` (3-D
        C-contiguous uint8 records with the same records per row, read by the same activations)
        in one product with the caller and the helpers, their rows stacked; ``x`` ``[t, g, b]``
        C-contiguous, ``out`` f32 ``[t * rows of all]`` C-contiguous: each weight's
        ``[t, rows]`` one after another.  Where ``gemm`` carries a ``band_job`` (the panel
        gemms) each thread lays out the activations once and claims bands of 8 rows
        (``_pool.band_caller_of``, decision 052), else each takes one chunk of a multiple of
        ``tile`` rows.  None where the group has no room for another kernel."""
        for w in weights:
            self._check_weights(w, (3,))
            if w.shape[1:] != weights[0].shape[1:]:
                raise ValueError("Helpers.batch_product: weights with different records per "
                                 f"row: {weights[0].shape} and {w.shape}")
        table = np.array([(w.ctypes.data, w.shape[0]) for w in weights], np.int64)
        d1, d2 = weights[0].shape[1:]
        ctl, wait = self.ctl, self._wait
        band_job = getattr(gemm, "band_job", None)
        kind = self.kind_of(band_job) if band_job is not None else None
        if kind is not None:
            run = _pool.band_caller_of(band_job)
            args = np.zeros(_pool.BAND_ARGS, np.int64)
            regions = np.zeros((self.helpers + 1) * _pool.REGION_WORDS, np.int64)
            chunks = self.helpers + 1      # a region a thread

            def split(x, out):
                self._ensure_awake()
                if not run(ctl, kind, args, regions, table, d2, x, out, wait):
                    self._join(chunks)
        else:
            job = _pool.batch_rows_job(gemm)
            kind = self.kind_of(job)
            if kind is None:
                return None
            run = _pool.batch_caller_of(job)
            rows = int(table[:, 1].sum())
            chunk = _chunk_rows(rows, self.helpers + 1, 1, tile)
            chunks = -(-rows // chunk) if rows else 0

            def split(x, out):
                self._ensure_awake()
                if not run(ctl, kind, table, d1, d2, x, out, chunks, chunk, wait):
                    self._join(chunks)
        split.keep = (table, weights)   # the weights stay alive while the product can run
        return split

    def _check_weights(self, w, ndims):
        if self.serve is not None:
            raise RuntimeError("Helpers: a new product after the helpers started")
        if not (w.dtype == np.uint8 and w.flags.c_contiguous and w.ndim in ndims):
            raise ValueError(f"Helpers: weights must be C-contiguous uint8 of "
                             f"{' or '.join(map(str, ndims))} dimensions, not {w.dtype} "
                             f"{w.shape}{'' if w.flags.c_contiguous else ' (strided)'}")

    def kind_of(self, job):
        """The index of ``job`` (a kernel of ``_pool``'s job signature) among the kernels the
        helpers run, registered if new (before the helpers start); None once the group holds
        ``_pool.KINDS``.  A caller of its own posts it (``_pool.post``) with that index."""
        kind = self._kinds.get(job)
        if kind is None:
            if self.serve is not None:
                raise RuntimeError("Helpers: a new kernel after the helpers started")
            if len(self.jobs) == _pool.KINDS:
                return None
            kind = self._kinds[job] = len(self.jobs)
            self.jobs.append(job)
        return kind

    def run(self, call, chunks, *args):
        """``call(ctl, *args, wait_iters)``: a compiled caller that posts a product of
        ``chunks`` chunks (``_pool.post``), runs chunks alongside the helpers, spins up to
        ``wait_iters`` polls for the last and returns 1 once all are done (else 0: this then
        waits for the helper's last)."""
        self._ensure_awake()
        if not call(self.ctl, *args, self._wait):
            self._join(chunks)

    def _join(self, chunks):
        try:
            while not _pool.wait_count(self.ctl, _pool.DONE, chunks, self._wait):
                time.sleep(20e-6)
        except BaseException:   # e.g. Ctrl-C: no helper may still write the output afterwards
            while not _pool.wait_count(self.ctl, _pool.DONE, chunks, self._wait):
                pass
            raise

    def start(self):
        """Compile the helpers' loop (if not yet) so that the first product does not."""
        if self.serve is None:
            self.serve = _pool.server_of(tuple(self.jobs))
            self.serve(self.ctl, 0, 0)

    def _ensure_awake(self):
        ctl = self.ctl
        for h in range(self.helpers):
            if not ctl[_pool.AWAKE + 8 * h]:
                self._wake(h)

    def _wake(self, h):
        if self.closed:
            return
        self.start()
        while len(self.events) < self.helpers:
            ev = threading.Event()
            self.events.append(ev)
            t = threading.Thread(target=Helpers._loop, daemon=True,
                                 args=(self.serve, self.ctl, len(self.events) - 1, ev,
                                       self._idle),
                                 name=f"numba_qk-helper-{len(self.events) - 1}")
            t.start()
        ctl, at = self.ctl, _pool.AWAKE + 8 * h
        entered = int(ctl[at + 1]) + 1
        ctl[at] = 1    # before the helper runs: the next check sees it
        self.events[h].set()
        # wait, with the GIL released, until the helper is in its compiled loop: it needs the
        # GIL to get there, and a caller busy in Python would keep it out for the interpreter's
        # whole switch interval (5 ms), though it releases the GIL in every kernel it calls
        _pool.wait_count(ctl, at + 1, entered, self._wait)

    @staticmethod
    def _loop(serve, ctl, me, event, idle):
        # holds no reference to the group (its finalizer stops this loop)
        while True:
            event.wait()
            event.clear()
            if ctl[_pool.STOP]:
                return
            serve(ctl, me, idle)

    @staticmethod
    def _stop(ctl, events):
        ctl[_pool.STOP] = 1
        ctl[_pool.SEQ] += 1   # a helper spinning in serve sees a new product, then STOP
        for ev in events:
            ev.set()

    def close(self):
        """End the helper threads (they finish the product in hand first)."""
        self.closed = True
        self._finalizer()

    def _after_fork(self):
        # the child has none of the parent's threads
        self.events = []
        for h in range(self.helpers):
            self.ctl[_pool.AWAKE + 8 * h] = 0
