"""matmul latency with threads=1 vs 2, idle and with a competing busy process per core.

    python bench/threads_contention.py [--rows 1024] [--calls 200]

Prints mean / median / p99 / max per setting.  Figures are only meaningful on an otherwise
quiet machine; the "busy" rows add one spinning process per core to model contention.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

import numba_qk as qk


def spin(stop):
    while not stop.is_set():
        pass


def measure(w, x, threads, calls):
    qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=threads)
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=threads)
        ts.append(time.perf_counter() - t0)
    ts = np.array(ts) * 1e3
    return ts.mean(), np.median(ts), np.percentile(ts, 99), ts.max()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    w = qk.quantize(rng.standard_normal((a.rows * a.cols // 256, 256)).astype(np.float32),
                    format=qk.quant.q4_k).reshape(a.rows, a.cols // 256, 144)
    x = rng.standard_normal(a.cols).astype(np.float32)
    from numba_qk import _threads
    print(f"Q4_K {a.rows}x{a.cols}, {a.calls} calls, {os.cpu_count()} cores; ms per call")
    for busy in (False, True):
        stop = mp.Event()
        procs = [mp.Process(target=spin, args=(stop,))
                 for _ in range(os.cpu_count() if busy else 0)]
        for p in procs:
            p.start()
        try:
            for threads in (1, 2):
                m, med, p99, mx = measure(w, x, threads, a.calls)
                layer = _threads.threading_layer() or "-"
                print(f"{'busy' if busy else 'idle'} threads={threads} ({layer}): mean {m:.3f} "
                      f"median {med:.3f} p99 {p99:.3f} max {mx:.3f}")
        finally:
            stop.set()
            for p in procs:
                p.join()


if __name__ == "__main__":
    main()
