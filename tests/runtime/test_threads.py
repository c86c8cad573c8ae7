"""numba_qk._threads: its own pool (dynamic claiming, caller included) and the adaptive count."""

import os
import threading
import time

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _threads


def _loadavg(tmp_path, monkeypatch, running, cpus):
    p = tmp_path / "loadavg"
    p.write_text(f"1.00 0.50 0.25 {running}/321 4242\n")
    monkeypatch.setattr(_threads, "_LOADAVG", str(p))
    monkeypatch.setattr(_threads.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(_threads, "_SAMPLE_S", 0.0)
    # the faked task count is the whole load: a worker of ours still awake after an earlier
    # job (free_cores counts it as a free core) would otherwise add one free core at random
    monkeypatch.setattr(_threads._POOL, "awake", lambda: 0)
    # ... and so would a standing helper of an earlier test's model, still spinning
    monkeypatch.setattr(_threads, "_helpers_awake", lambda: 0)
    # a fresh machine: no samples of the busy-core history (BUSY_SAMPLES) from before
    monkeypatch.setattr(_threads, "_others_of", [None])


@pytest.mark.parametrize("running, cpus, asked, want", [
    (1, 2, 2, 2),     # only the caller runs: both cores are free
    (2, 2, 2, 1),     # another process keeps one core busy: one thread
    (3, 2, 2, 1),     # both busy: still one (the caller itself)
    (1, 8, 4, 4),
    (4, 8, 8, 5),     # three others: five free
    (1, 2, 1, 1),
])
def test_adaptive_count_uses_only_free_cores(tmp_path, monkeypatch, running, cpus, asked, want):
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running, cpus)
    assert _threads.effective_threads(asked, pieces=64) == want
    assert _threads.effective_threads(asked, pieces=1) == 1
    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    assert _threads.effective_threads(asked, pieces=64) == asked


def test_adaptive_count_without_loadavg(tmp_path, monkeypatch):
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    monkeypatch.setattr(_threads, "_SAMPLE_S", 0.0)
    monkeypatch.setattr(_threads, "_LOADAVG", str(tmp_path / "missing"))
    assert _threads.free_cores() is None
    assert _threads.effective_threads(3, pieces=64) == 3
    (tmp_path / "garbled").write_text("no numbers here\n")
    monkeypatch.setattr(_threads, "_LOADAVG", str(tmp_path / "garbled"))
    assert _threads.effective_threads(3, pieces=64) == 3


@pytest.mark.parametrize("running, want", [(2, []), (1, [2])])
def test_busy_machine_runs_a_product_serially(tmp_path, monkeypatch, rng, running, want):
    """With one core of two busy, threads=2 runs the serial kernel on the caller alone (no
    chunks); with both free it runs two threads.  The bits are the same either way."""
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running=running, cpus=2)
    used = []
    real_run, real_rows = _threads.run, _threads.run_rows
    monkeypatch.setattr(_threads, "run", lambda tasks, n: used.append(real_run(tasks, n)))
    monkeypatch.setattr(_threads, "run_rows",
                        lambda *a, **k: used.append(real_rows(*a, **k)))
    w = qk.quantize(rng.standard_normal((64 * 2, 256)).astype(np.float32),
                    format=qk.quant.q4_k).reshape(64, 2, 144)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    want_bits = [qk.matmul(w, x[0], lhs_format=qk.quant.q4_k).view(np.uint32).tolist(),
                 qk.matmul(w, x, lhs_format=qk.quant.q4_k).view(np.uint32).tolist()]
    got = [qk.matmul(w, x[0], lhs_format=qk.quant.q4_k, threads=2),
           qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2)]
    assert used == want * 2
    assert [g.view(np.uint32).tolist() for g in got] == want_bits
    cast = qk.astype(x, qk.bf16, threads=2)
    assert used[-1] == (1 if running == 2 else 2)
    assert cast.storage.tolist() == qk.astype(x, qk.bf16).storage.tolist()


def test_samples_are_reused_briefly(tmp_path, monkeypatch):
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running=1, cpus=2)
    monkeypatch.setattr(_threads, "_SAMPLE_S", 3600.0)
    monkeypatch.setattr(_threads, "_sample", [-1e9, None])
    assert _threads.free_cores() == 2
    _loadavg(tmp_path, monkeypatch, running=2, cpus=2)
    monkeypatch.setattr(_threads, "_SAMPLE_S", 3600.0)
    assert _threads.free_cores() == 2          # within the reuse window
    monkeypatch.setattr(_threads, "_SAMPLE_S", 0.0)
    assert _threads.free_cores() == 1          # a fresh history: its first sample decides


def test_a_core_counts_busy_once_several_samples_in_a_row_see_it(tmp_path, monkeypatch):
    """A transient task (one sample) does not take a core away; a task runnable in
    ``BUSY_SAMPLES`` samples in a row does, and one free sample gives it back."""
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running=1, cpus=2)
    assert _threads.free_cores() == 2
    p = tmp_path / "loadavg"
    seen = []
    for running in (2, 1, 2, 2, 2, 2, 1):
        p.write_text(f"1.00 0.50 0.25 {running}/321 4242\n")
        seen.append(_threads.free_cores())
    n = _threads.BUSY_SAMPLES
    assert seen == [2, 2] + [2] * (n - 1) + [1] * (4 - n + 1) + [2], seen


def test_pieces_run_concurrently_on_the_asked_threads():
    """Each of 3 pieces waits for the other two: it finishes only on 3 concurrent threads."""
    barrier = threading.Barrier(3, timeout=20)
    seen = []

    def piece(i):
        seen.append((i, threading.get_ident()))
        barrier.wait()

    assert _threads.run([(piece, (i,)) for i in range(3)], 3) == 3
    assert sorted(i for i, _ in seen) == [0, 1, 2]
    assert len({t for _, t in seen}) == 3
    assert threading.get_ident() in {t for _, t in seen}   # the caller works too


def test_every_piece_runs_once_and_errors_reach_the_caller():
    hits = np.zeros(50, np.int64)
    lock = threading.Lock()

    def piece(i):
        with lock:
            hits[i] += 1
        if i == 17:
            raise KeyError("piece 17")

    with pytest.raises(KeyError, match="piece 17"):
        _threads.run([(piece, (i,)) for i in range(50)], 4)
    assert hits.tolist() == [1] * 50          # the others still ran, each once
    # the pool is usable afterwards
    assert _threads.run([(piece, (0,))], 4) == 1


def test_concurrent_callers_share_the_pool(rng):
    """Products from several Python threads at once, each asking for 2 threads: every result
    equals the serial one (callers never wait on each other's pieces)."""
    w = qk.quantize(rng.standard_normal((96 * 4, 256)).astype(np.float32),
                    format=qk.quant.q4_k).reshape(96, 4, 144)
    # one vector (gemv) and batches of 3 and 17 activations (gemm; AMX tiles where the CPU
    # has them: every worker thread configures its own tiles)
    xs = [rng.standard_normal(1024).astype(np.float32) if i % 3 == 0 else
          rng.standard_normal((3 if i % 3 == 1 else 17, 1024)).astype(np.float32)
          for i in range(6)]
    want = [qk.matmul(w, x, lhs_format=qk.quant.q4_k) for x in xs]
    got = [None] * len(xs)

    def call(i):
        for _ in range(5):
            got[i] = qk.matmul(w, xs[i], lhs_format=qk.quant.q4_k, threads=2)

    ts = [threading.Thread(target=call, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    for g, e in zip(got, want):
        assert g.view(np.uint32).tolist() == e.view(np.uint32).tolist()


@pytest.mark.parametrize("rows, threads", [(1, 2), (8, 2), (9, 2), (64, 3), (4096, 2), (100, 7)])
def test_row_chunks_cover_rows_in_tiles(rows, threads):
    chunks = _threads.row_chunks(rows, threads)
    assert chunks[0][0] == 0 and chunks[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    assert all((r1 - r0) % 8 == 0 for r0, r1 in chunks[:-1])
    assert len(chunks) <= max(1, 4 * threads)


# ----------------------------------------------------------------- compiled row claiming (gemv)

from numba_qk._jit import kernel  # noqa: E402
from numba_qk.kernels import _pool  # noqa: E402


@kernel
def _count_rows(w, x, out):
    """A toy serial 'gemv': adds 1 to each of its rows (a row run twice would show 2) and
    raises on a row whose weight is 13."""
    for r in range(w.shape[0]):
        if w[r, 0] == 13.0:
            raise ValueError("row 13")
        out[r] += np.float32(1.0) + np.float32(x[0]) * np.float32(0.0)


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 100, 1001])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_run_rows_runs_every_row_once(rows, threads):
    w = np.zeros((rows, 2), np.float32)
    x = np.ones(2, np.float32)
    for per_thread in (1, 4):
        out = np.zeros(rows, np.float32)
        used = _threads.run_rows(_count_rows, w, x, out, threads, per_thread=per_thread)
        assert out.tolist() == [1.0] * rows
        assert used == min(threads, len(_threads.row_chunks(rows, threads, per_thread)))


def test_run_rows_errors_reach_the_caller_from_any_thread():
    """The raising chunk lands on the caller or on a worker, whichever claims it; either way
    the caller gets the error after every thread is done, and the pool still works."""
    w = np.zeros((64, 2), np.float32)
    x = np.ones(2, np.float32)
    for bad in (0, 17, 63):          # first, middle and last chunk
        w[:] = 0.0
        w[bad, 0] = 13.0
        for _ in range(10):
            with pytest.raises(ValueError, match="row 13"):
                _threads.run_rows(_count_rows, w, x, np.zeros(64, np.float32), 2,
                                  per_thread=4)
    w[:] = 0.0
    out = np.zeros(64, np.float32)
    _threads.run_rows(_count_rows, w, x, out, 2)
    assert out.tolist() == [1.0] * 64


def test_run_rows_without_compiled_atomics_uses_python_pieces(monkeypatch, rng):
    """Under NUMBA_DISABLE_JIT the runner cannot run: the same chunks go through ``run``."""
    pieces = []
    real_run = _threads.run
    monkeypatch.setattr(_pool, "HAVE_ATOMICS", False)
    monkeypatch.setattr(_threads, "run", lambda tasks, n: pieces.append(len(tasks))
                        or real_run(tasks, n))
    w = np.zeros((100, 2), np.float32)
    out = np.zeros(100, np.float32)
    assert _threads.run_rows(_count_rows, w, np.ones(2, np.float32), out, 2) == 2
    assert out.tolist() == [1.0] * 100
    assert pieces == [len(_threads.row_chunks(100, 2))]


def test_runner_cache_is_keyed_by_the_serial_kernel():
    """Each serial kernel gets its own runner, named and cached by the kernel's stable
    identity (numba's default key for a closure would pickle a per-process UUID and never
    hit; ``_jit.DependencyCache`` keys closures by ``closure_key``)."""
    from numba_qk import _registry as registry
    from numba_qk._jit import DependencyCache, kernel_identity

    gemvs = [b.gemv for b in registry.BY_FORMAT.values() if b.gemv is not None]
    idents = {kernel_identity(g) for g in gemvs}
    assert len(idents) == len(set(gemvs))
    runners = [_pool.rows_runner(g) for g in set(gemvs)]
    assert runners[0] is _pool.rows_runner(next(iter(set(gemvs))))
    assert len({kernel_identity(r) for r in runners}) == len(runners)
    assert all(isinstance(r._cache, DependencyCache) for r in runners)


def test_awake_workers_are_not_counted_as_busy_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running=2, cpus=2)
    monkeypatch.setattr(_threads._POOL, "awake", lambda: 1)
    assert _threads.free_cores() == 2       # the other runnable task is our own worker
    monkeypatch.setattr(_threads._POOL, "awake", lambda: 0)
    monkeypatch.setattr(_threads, "_others_of", [None])
    assert _threads.free_cores() == 1


def test_a_worker_is_awake_unless_asleep_on_its_queue(monkeypatch):
    """``awake`` counts the workers spinning (``flag``), working or between the two (not
    ``sleeping``): the runnable tasks of ours that ``free_cores`` leaves out of the load.  A
    worker that finished its spin and went back to its Python loop (flag cleared, not yet
    asleep) was counted as another process's task: 11 % of SmolLM2's decoding products ran on
    one thread for it."""
    pool = _threads._Pool()
    states = [(True, 0), (False, 0), (False, 1), (True, 1)]   # (sleeping, flag)
    for sleeping, flag in states:
        w = _threads._Worker()
        w.sleeping, w.flag[0] = sleeping, flag
        pool.workers.append(w)
    assert pool.awake() == 3 and pool.spinning() == 2


@pytest.mark.skipif(_threads.SPIN_US == 0, reason="spinning is off here")
def test_workers_spin_briefly_then_sleep(rng):
    w = qk.quantize(rng.standard_normal((64 * 2, 256)).astype(np.float32),
                    format=qk.quant.q4_k).reshape(64, 2, 144)
    x = rng.standard_normal(512).astype(np.float32)
    want = qk.matmul(w, x, lhs_format=qk.quant.q4_k).view(np.uint32).tolist()
    # back to back: jobs reach spinning workers through ``pending``, gemv and casts alike
    for i in range(60):
        got = qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2 + i % 2)
        assert got.view(np.uint32).tolist() == want
        if i % 10 == 0:
            assert qk.astype(x, qk.bf16, threads=2).storage.tolist() == \
                qk.astype(x, qk.bf16).storage.tolist()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not all(
            wk.sleeping and not wk.flag[0] for wk in _threads._POOL.workers):
        time.sleep(0.01)
    assert _threads._POOL.workers and _threads._POOL.spinning() == 0
    assert all(wk.sleeping for wk in _threads._POOL.workers)


def test_spin_setting_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("NUMBA_QK_SPIN_US", "50")
    assert _threads._env_us("NUMBA_QK_SPIN_US", 200) == 50
    monkeypatch.setenv("NUMBA_QK_SPIN_US", "")
    assert _threads._env_us("NUMBA_QK_SPIN_US", 200) == 200
    monkeypatch.setenv("NUMBA_QK_SPIN_US", str(_threads.MAX_SPIN_US))
    assert _threads._env_us("NUMBA_QK_SPIN_US", 200) == _threads.MAX_SPIN_US
    # 10**20 passed the check before, then killed the pool's worker (OverflowError in the
    # compiled spin): every later job was queued to a dead thread
    for bad in ("-1", "fast", "1.5", "100000000000000000000", str(_threads.MAX_SPIN_US + 1)):
        monkeypatch.setenv("NUMBA_QK_SPIN_US", bad)
        with pytest.raises(ValueError, match="NUMBA_QK_SPIN_US"):
            _threads._env_us("NUMBA_QK_SPIN_US", 200)


def test_adaptive_setting_is_read_and_checked(monkeypatch):
    for v, want in (("0", False), ("FALSE", False), ("No", False), ("off", False),
                    ("1", True), ("True", True), ("YES", True), ("on", True), (" ", True)):
        monkeypatch.setenv("NUMBA_QK_ADAPTIVE_THREADS", v)
        assert _threads._env_flag("NUMBA_QK_ADAPTIVE_THREADS", True) is want, v
    for bad in ("maybe", "2", "f"):
        monkeypatch.setenv("NUMBA_QK_ADAPTIVE_THREADS", bad)
        with pytest.raises(ValueError, match="NUMBA_QK_ADAPTIVE_THREADS"):
            _threads._env_flag("NUMBA_QK_ADAPTIVE_THREADS", True)


@pytest.mark.parametrize("var, value", [("NUMBA_QK_SPIN_US", "100000000000000000000"),
                                        ("NUMBA_QK_ADAPTIVE_THREADS", "maybe")])
def test_bad_thread_settings_fail_at_import_naming_the_variable(var, value):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import numba_qk"], capture_output=True,
                       text=True, env={**__import__("os").environ, var: value}, timeout=300)
    assert r.returncode != 0 and var in r.stderr.strip().splitlines()[-1]


def test_a_worker_survives_a_failing_spin(monkeypatch, rng):
    """Whatever goes wrong between jobs, the worker sleeps instead of dying, and jobs keep
    reaching live threads (issue 21, item 8: a dead worker took every later job)."""
    real = _threads._polls
    monkeypatch.setattr(_threads, "SPIN_US", 50)
    monkeypatch.setattr(_threads, "_polls", lambda us: real(us) if us != 50 else 10 ** 30)
    ran = []
    for _ in range(5):
        _threads.run([(lambda i=i: (time.sleep(0.01), ran.append(threading.get_ident())), ())
                      for i in range(6)], 2)
    workers = _threads._POOL.workers
    assert workers and all(w.thread.is_alive() for w in workers)
    assert {w.thread.ident for w in workers} & set(ran), "no piece ran on a worker"


def test_interrupt_outside_a_piece_waits_for_running_pieces(monkeypatch):
    """Ctrl-C landing in the caller between pieces (here: in its wait for the last piece)
    reaches the caller only after every started piece has finished, and no piece starts
    afterwards (issue 21, item 7: a worker kept writing ``out`` for up to 0.5 s)."""
    state = {"running": 0, "started": 0, "finished": 0}
    lock = threading.Lock()

    def piece():
        with lock:
            state["running"] += 1
            state["started"] += 1
        # the worker's pieces outlast the caller's: it is mid-piece when the caller stops
        time.sleep(0.01 if threading.current_thread() is threading.main_thread() else 0.3)
        with lock:
            state["running"] -= 1
            state["finished"] += 1

    real_wait = _threads._Job.wait
    calls = []

    def interrupted_wait(self):
        if not calls and threading.current_thread() is threading.main_thread():
            calls.append(1)
            raise KeyboardInterrupt
        real_wait(self)

    monkeypatch.setattr(_threads._Job, "wait", interrupted_wait)
    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    with pytest.raises(KeyboardInterrupt):
        _threads.run([(piece, ()) for _ in range(4)], 2)
    assert calls and state["running"] == 0 and state["started"] == state["finished"]
    started = state["started"]
    time.sleep(0.2)
    assert state["started"] == started


def test_interrupt_in_the_claim_loop_stops_unstarted_pieces(monkeypatch):
    """An interrupt while the caller claims: the remaining pieces never start."""
    state = {"started": 0, "finished": 0}
    lock = threading.Lock()
    main = threading.main_thread()

    def piece(i):
        with lock:
            state["started"] += 1
        time.sleep(0.02)
        with lock:
            state["finished"] += 1

    class Claims:
        def __init__(self):
            self.n = self.mine = 0
            self.lock = threading.Lock()

        def __next__(self):
            if threading.current_thread() is main:
                self.mine += 1
                if self.mine == 3:           # the caller's third claim is interrupted
                    raise KeyboardInterrupt
            with self.lock:
                i, self.n = self.n, self.n + 1
            return i

    real_init = _threads._Job.__init__

    def init(self, tasks):
        real_init(self, tasks)
        self.claim = Claims()

    monkeypatch.setattr(_threads._Job, "__init__", init)
    with pytest.raises(KeyboardInterrupt):
        _threads.run([(piece, (i,)) for i in range(40)], 2)
    done = state["finished"]
    assert state["started"] == done < 40
    time.sleep(0.1)
    assert state["started"] == done


def test_real_interrupts_during_threaded_gemm_leave_out_alone(rng):
    """SIGINT at random moments of ``matmul(..., threads=2, out=out)``: once
    KeyboardInterrupt reaches the caller, nothing writes ``out`` any more.  Python's own SIGINT
    handler is installed for the test: ``interrupt_main`` does nothing where SIGINT is ignored,
    as it is in every process started in the background by a non-interactive shell
    (``cmd &``), which Python then leaves ignored."""
    import _thread
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_products(rng, _thread)
    finally:
        signal.signal(signal.SIGINT, old)


def _interrupt_products(rng, _thread):
    w = rng.integers(0, 256, (512, 4, 144), dtype=np.uint8)
    w[..., 0:4] = np.array([0x00, 0x2C, 0x00, 0x28], np.uint8)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2)   # compile first
    interrupted = 0
    for i in range(16):
        out = np.zeros((64, 512), np.float32)
        timer = threading.Timer(0.0005 * (i + 1), _thread.interrupt_main)
        in_products = True
        # One try around everything up to the interrupt's arrival: the timer always fires, and
        # the KeyboardInterrupt must be caught wherever it lands (after the products, too: a
        # handler-free gap there let it escape and kill the pytest worker on a loaded machine).
        try:
            timer.start()
            for _ in range(50):
                qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2, out=out)
            in_products = False
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                time.sleep(0.001)
            raise AssertionError("the timed interrupt never arrived")
        except KeyboardInterrupt:
            if in_products:
                interrupted += 1
                seen = out.copy()
                time.sleep(0.05)
                np.testing.assert_array_equal(out.view(np.uint32), seen.view(np.uint32))
        timer.join()
    assert interrupted


def test_spin_off_workers_sleep_after_each_job(monkeypatch, rng):
    monkeypatch.setattr(_threads, "SPIN_US", 0)
    w = qk.quantize(rng.standard_normal((64 * 2, 256)).astype(np.float32),
                    format=qk.quant.q4_k).reshape(64, 2, 144)
    x = rng.standard_normal(512).astype(np.float32)
    want = qk.matmul(w, x, lhs_format=qk.quant.q4_k).view(np.uint32).tolist()
    for _ in range(20):
        got = qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=2)
        assert got.view(np.uint32).tolist() == want


# -- standing helpers (_threads.Helpers) ---------------------------------------------------------

@kernel
def _count_outputs(w, x, out):
    """A toy serial kernel on uint8 weights: adds 1 to each of its outputs (an output written
    twice would show 2), after a busy loop as long as ``w[0, 0]`` asks (so that a product lasts
    long enough for a helper to claim chunks)."""
    s = np.int64(0)
    for r in range(w.shape[0]):
        for i in range(np.int64(w[r].ravel()[0]) * np.int64(2000)):
            s += i ^ np.int64(x[0, 0])
    for k in range(out.shape[0]):
        out[k] += np.float32(1.0) + np.float32(s & np.int64(0))


needs_atomics = pytest.mark.skipif(not _pool.HAVE_ATOMICS, reason="no compiled atomics here")


@needs_atomics
@pytest.mark.parametrize("helpers", [1, 2])
@pytest.mark.parametrize("rows, per, tile", [(1, 1, 8), (7, 1, 8), (100, 1, 8), (37, 8, 1),
                                             (1000, 16, 1)])
def test_helpers_run_every_output_once(helpers, rows, per, tile):
    group = _threads.Helpers(helpers)
    x = np.ones((2, 3), np.uint8)
    splits = [group.product(_count_outputs, np.zeros((rows, 2, 2)[:ndim], np.uint8), per, tile)
              for ndim in (2, 3)]
    for split in splits:
        for _ in range(20):
            out = np.zeros(rows * per, np.float32)
            split(x, out)
            assert out.tolist() == [1.0] * (rows * per)
    group.close()


@kernel
def _mark_rows(w, x, out):
    """A toy serial gemm (``out[t, rows]``): ``out[a, r] = w[r, 0, 0] + 1000 x[a, 0, 0]`` (an
    output in another weight's place, or one left out, shows)."""
    for a in range(out.shape[0]):
        for r in range(out.shape[1]):
            out[a, r] = np.float32(w[r, 0, 0]) + np.float32(1000.0) * np.float32(x[a, 0, 0])


@needs_atomics
@pytest.mark.parametrize("helpers", [1, 2])
@pytest.mark.parametrize("rows", [(5,), (40, 3, 17), (1, 1), (64, 64), (0, 9)])
def test_batch_products_stack_their_weights_and_write_each_output_once(helpers, rows):
    """``batch_product`` over several weights: each weight's ``[t, rows]`` one after another,
    every element from its own weight's rows, whatever chunk holds it (``tile=1``: chunk edges
    fall inside weights)."""
    group = _threads.Helpers(helpers)
    ws = []
    for i, n in enumerate(rows):
        w = np.zeros((n, 2, 3), np.uint8)
        w[:, 0, 0] = (37 * i + np.arange(n)) % 256
        ws.append(w)
    t = 3
    x = np.zeros((t, 2, 3), np.uint8)
    x[:, 0, 0] = np.arange(t)
    with pytest.raises(ValueError, match="different records per row"):
        group.batch_product(_mark_rows, [ws[0], np.zeros((4, 3, 3), np.uint8)])
    with pytest.raises(ValueError, match="C-contiguous uint8 of 3 dimensions"):
        group.batch_product(_mark_rows, [np.zeros((4, 6), np.uint8)])
    split = group.batch_product(_mark_rows, ws, tile=1)
    want = np.concatenate([(w[None, :, 0, 0].astype(np.float32)
                            + 1000 * np.arange(t, dtype=np.float32)[:, None]).ravel()
                           for w in ws])
    for _ in range(20):
        out = np.full(t * sum(rows), np.nan, np.float32)
        split(x, out)
        assert out.tolist() == want.tolist()
    group.close()


@needs_atomics
def test_helpers_take_chunks_and_sleep_when_idle_then_wake(monkeypatch):
    """A helper claims chunks of the products it sees posted; with nothing posted for
    ``HELPER_IDLE_US`` it leaves its loop (``awake()`` 0), and the next product wakes it
    (and waits, with the GIL released, until it is back in compiled code)."""
    monkeypatch.setattr(_threads, "HELPER_IDLE_US", 20_000)
    group = _threads.Helpers(1)
    w = np.full((64, 2), 5, np.uint8)          # ~10 us a row
    x = np.ones((2, 3), np.uint8)
    split = group.product(_count_outputs, w, 1, 1)
    deadline = time.monotonic() + 30        # on a loaded machine the helper may wait for a core
    while time.monotonic() < deadline:
        out = np.zeros(64, np.float32)
        split(x, out)
        assert out.tolist() == [1.0] * 64
        if group.chunks_run()[0] > 0:
            break
    assert group.chunks_run()[0] > 0, "the helper never ran a chunk"
    assert group.awake() == 1
    deadline = time.monotonic() + 10
    while group.awake() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert group.awake() == 0, "the helper did not go to sleep"
    out = np.zeros(64, np.float32)
    split(x, out)
    assert out.tolist() == [1.0] * 64 and group.awake() == 1
    group.close()


@needs_atomics
def test_helpers_end_with_their_group():
    """``close()`` (or the group's garbage collection) ends its threads."""
    import gc

    def helper_threads():
        return {t for t in threading.enumerate() if t.name.startswith("numba_qk-helper")}

    for close in (True, False):
        before = helper_threads()
        group = _threads.Helpers(2)
        split = group.product(_count_outputs, np.zeros((16, 2), np.uint8), 1, 8)
        split(np.ones((2, 3), np.uint8), np.zeros(16, np.float32))
        mine = helper_threads() - before
        assert len(mine) == 2
        if close:
            group.close()
        del group, split
        gc.collect()
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in mine) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not any(t.is_alive() for t in mine)


@needs_atomics
def test_helpers_refuse_what_they_cannot_run():
    group = _threads.Helpers(1)
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        group.product(_count_outputs, np.zeros((8, 2), np.float32))
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        group.product(_count_outputs, np.zeros((8, 4), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="at least one helper"):
        _threads.Helpers(0)
    # one kind per (kernel, dimensions), shared by the products that use it
    w = np.zeros((8, 2), np.uint8)
    assert group.product(_count_outputs, w) is not None
    assert group.product(_count_outputs, w[:, :1].copy()) is not None and len(group.jobs) == 1
    group.start()
    with pytest.raises(RuntimeError, match="after the helpers started"):
        group.product(_count_outputs, w)
    group.close()
    # at most _pool.KINDS kernels: a product of one more gets None (the caller then splits it
    # another way); nothing is compiled before start()
    from numba import njit
    many = _threads.Helpers(1)
    kernels = [njit(_count_outputs.py_func) for _ in range(_pool.KINDS + 1)]
    made = [many.product(k, w) for k in kernels]
    assert all(m is not None for m in made[:-1]) and made[-1] is None
    many.close()


@needs_atomics
def test_a_late_claim_never_takes_a_chunk_of_the_next_product():
    """The claim word holds the product's number and chunk count with the count claimed."""
    ctl = np.zeros(_pool.ctl_words(1), np.int64)
    ctl[_pool.NEXT] = (5 << 32) | (3 << 16)
    assert [_pool.claim(ctl, 5) for _ in range(4)] == [0, 1, 2, -1]
    assert _pool.claim(ctl, 4) == -1           # an older product's claim
    ctl[_pool.NEXT] = (6 << 32) | (1 << 16)
    assert _pool.claim(ctl, 5) == -1 and _pool.claim(ctl, 6) == 0


def test_awake_helpers_are_not_counted_as_busy_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(_threads, "ADAPTIVE", True)
    _loadavg(tmp_path, monkeypatch, running=2, cpus=2)
    monkeypatch.setattr(_threads, "_helpers_awake", lambda: 1)
    assert _threads.free_cores() == 2
    monkeypatch.setattr(_threads, "_helpers_awake", lambda: 0)
    monkeypatch.setattr(_threads, "_others_of", [None])
    assert _threads.free_cores() == 1


@needs_atomics
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_gets_helpers_of_its_own():
    """The child of a fork has none of the parent's threads: its groups forget theirs and the
    next product starts new ones (until then the caller runs every chunk alone)."""
    group = _threads.Helpers(1)
    w = np.full((64, 2), 2, np.uint8)
    x = np.ones((2, 3), np.uint8)
    split = group.product(_count_outputs, w, 1, 1)
    for _ in range(3):   # the first call loads the compiled callers; the helper thread runs
        split(x, np.zeros(64, np.float32))
    assert len(group.events) == 1
    pid = os.fork()
    if pid == 0:   # the child: report through the exit code, never return into pytest
        code = 1
        try:
            entries = int(group.ctl[_pool.AWAKE + 1])
            out = np.zeros(64, np.float32)
            split(x, out)
            ok = out.tolist() == [1.0] * 64
            deadline = time.monotonic() + 20   # on a loaded machine it may wait for a core
            while group.ctl[_pool.AWAKE + 1] == entries and time.monotonic() < deadline:
                time.sleep(0.001)
            ok = ok and group.ctl[_pool.AWAKE + 1] == entries + 1
            alive = [t for t in group_threads() if t.is_alive()]
            code = 0 if ok and len(alive) == 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    group.close()


def group_threads():
    return [t for t in threading.enumerate() if t.name.startswith("numba_qk-helper")]
