"""Two Python threads casting concurrently: where does the throughput go? (one process)

    python bench/experiments/lowp_threads_ab.py [--n 16777216] [--repeat 7]

For each workload, one call alone and two calls from two ``threading.Thread`` at once (each on
its own source and preallocated destination), interleaved, best of N; ``speedup`` is
2 * one / both (2.0 = perfect overlap).  Workloads:

  qk astype     numba_qk.astype(x, bf16, out=) -- the public call (validation + kernel)
  qk kernel     the compiled f32 -> bf16 converter called directly (no Python-side work)
  qk kernel nt  the same with non-temporal stores (no read-for-ownership of the output lines)
  numkong       numkong.astype(x, "bfloat16", out=)
  numpy copy    np.copyto of the f32 source into an f32 buffer (no arithmetic at all)
  qk n/2        the public call on half the elements per thread (a smaller working set)

plus ``threads=2`` in one call against ``threads=1`` and a GIL probe: how many iterations a pure-Python loop in the main thread completes while a
worker thread runs one cast, against the same time spent in ``time.sleep`` (ratio ~1: the GIL is
released for the whole kernel).  If numpy's copy and numkong scale like numba_qk, the limit is
the memory system, not ours.  Figures under load are ratios only; the quiet figure comes from
bench/compare_lowp.py.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import numba_qk as qk
from numba_qk.kernels.lowp import codecs as L

try:
    import numkong as nk
except ImportError:  # pragma: no cover
    nk = None


def pair(f0, f1):
    """Run f0 and f1 at once in two Python threads; wall time."""
    ths = [threading.Thread(target=f) for f in (f0, f1)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t0


def solo(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def gil_probe(f, repeat=3):
    """Python-loop iterations in the main thread while ``f`` runs in a worker, divided by the
    iterations during an equally long sleep in the worker (1.0: the GIL was free throughout)."""
    def spin_while(th):
        k = 0
        th.start()
        while th.is_alive():
            k += 1
        th.join()
        return k

    best = 0.0
    for _ in range(repeat):
        t = solo(f)
        busy = spin_while(threading.Thread(target=f))
        idle = spin_while(threading.Thread(target=time.sleep, args=(t,)))
        best = max(best, busy / max(idle, 1))
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(a.n) * 3).astype(np.float32) for _ in range(2)]
    outs = [qk.astype(x, qk.bf16) for x in xs]
    half = [x[: a.n // 2].copy() for x in xs]
    houts = [qk.astype(x, qk.bf16) for x in half]
    conv = L.converter(L.K_F32, L.K_BF16, 1, 1)
    views = [x.view(np.uint32).reshape(1, 1, -1) for x in xs]
    couts = [(o.storage if isinstance(o, qk.Tensor) else o).reshape(-1).view(np.uint16)
             for o in outs]
    fcopy = [np.empty_like(x) for x in xs]

    def qk_call(i):
        return lambda: qk.astype(xs[i], qk.bf16, out=outs[i])

    work = {
        "qk astype": qk_call,
        "qk kernel": lambda i: (lambda: conv(views[i], couts[i], L._T_E8M0, 0, False)),
        "qk kernel nt": lambda i: (lambda: conv(views[i], couts[i], L._T_E8M0, 0, True)),
        "numpy copy": lambda i: (lambda: np.copyto(fcopy[i], xs[i])),
        "qk n/2": lambda i: (lambda: qk.astype(half[i], qk.bf16, out=houts[i])),
    }
    if nk is not None:
        nouts = [nk.astype(x, "bfloat16") for x in xs]
        work["numkong"] = lambda i: (lambda: nk.astype(xs[i], "bfloat16", out=nouts[i]))
    fs = {k: (w(0), w(1)) for k, w in work.items()}
    for f0, f1 in fs.values():                     # warm up (compile, fault pages in)
        f0(), f1(), pair(f0, f1)
    t1 = {k: [] for k in fs}
    t2 = {k: [] for k in fs}
    for _ in range(a.repeat):                      # interleaved: load hits every workload alike
        for k, (f0, f1) in fs.items():
            t1[k].append(min(solo(f0), solo(f1)))
            t2[k].append(pair(f0, f1))
    print(f"{a.n:,} elements per call; best of {a.repeat}, interleaved")
    print("| workload | one call ms | two threads ms | speedup (2*one/both) |")
    print("|---|---|---|---|")
    for k in fs:
        one, both = min(t1[k]), min(t2[k])
        print(f"| {k} | {one * 1e3:.2f} | {both * 1e3:.2f} | {2 * one / both:.2f} |")
    t_one = t_two = float("inf")                   # threads=2 inside one call, interleaved
    for _ in range(a.repeat):
        t_one = min(t_one, solo(lambda: qk.astype(xs[0], qk.bf16, out=outs[0])))
        t_two = min(t_two, solo(lambda: qk.astype(xs[0], qk.bf16, out=outs[0], threads=2)))
    print(f"qk astype threads=2 (one call): {t_two * 1e3:.2f} ms vs threads=1 {t_one * 1e3:.2f} ms"
          f" -> {t_one / t_two:.2f}x")
    print(f"GIL probe (main-thread Python progress during a cast / during a sleep): "
          f"qk astype {gil_probe(fs['qk astype'][0]):.2f}"
          + (f", numkong {gil_probe(fs['numkong'][0]):.2f}" if nk is not None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
