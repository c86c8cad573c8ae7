"""matmul with threads=1 vs threads=2 on an idle machine and while other processes keep cores
busy (issue 13: "threads=2 never slower than threads=1 when another process keeps one core
busy").

    python bench/threads_contention.py [--rows 4096] [--cols 4096] [--calls 300] [--copies 1]

Each setting interleaves the variants call by call, rotating their order every round (so a
change in the machine's load hits them alike), and prints mean / median / p99 per call in ms and
the ratios of means and of medians to threads=1 (below 1: two threads are faster).  Variants: ``threads=1``; ``threads=2`` (numba_qk's
default adaptive count: it uses the free cores it sees in /proc/loadavg); ``threads=2 fixed``
(adaptive count off: always two threads).  ``--copies N`` cycles N distinct weight matrices
(N * 9.4 MB for 4096x4096: use >= 4x the L3 for a DRAM-streamed run).  Figures are meaningful
only on an otherwise quiet machine: the spinner processes model the contention.
"""

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

import numba_qk as qk
from numba_qk import _threads


def spin(stop):
    while not stop.is_set():
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--busy", default="0,1,2", help="spinner process counts to run")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    base = [qk.quantize(rng.standard_normal((a.rows * a.cols // 256, 256)).astype(np.float32),
                        format=qk.quant.q4_k).reshape(a.rows, a.cols // 256, 144)
            for _ in range(min(a.copies, 4))]
    ws = [base[i % len(base)] if i < len(base) else base[i % len(base)].copy()
          for i in range(a.copies)]
    x = rng.standard_normal(a.cols).astype(np.float32)
    state = {"i": 0}

    def call(threads, adaptive):
        _threads.ADAPTIVE = adaptive
        state["i"] = (state["i"] + 1) % len(ws)
        t0 = time.perf_counter()
        qk.matmul(ws[state["i"]], x, lhs_format=qk.quant.q4_k, threads=threads)
        return time.perf_counter() - t0

    variants = {"threads=1": (1, True), "threads=2": (2, True), "threads=2 fixed": (2, False)}
    for t, ad in variants.values():
        call(t, ad)
    mb = sum(w.nbytes for w in ws) / 1e6
    print(f"Q4_K {a.rows}x{a.cols}, {a.copies} distinct matrices ({mb:.0f} MB), {a.calls} calls "
          f"per variant, {os.cpu_count()} cores; ms per call")
    print("| busy cores | variant | mean | median | p99 | mean / threads=1 mean | "
          "median / threads=1 median |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for busy in [int(b) for b in a.busy.split(",")]:
        stop = mp.Event()
        procs = [mp.Process(target=spin, args=(stop,)) for _ in range(busy)]
        for p in procs:
            p.start()
        time.sleep(0.3)
        try:
            ts = {k: [] for k in variants}
            order = list(variants.items())
            for i in range(a.calls):
                # rotate the order every round: no variant always follows the same one
                j = i % len(order)
                for k, (t, ad) in order[j:] + order[:j]:
                    ts[k].append(call(t, ad))
        finally:
            stop.set()
            for p in procs:
                p.join()
        base_mean, base_median = np.mean(ts["threads=1"]), np.median(ts["threads=1"])
        for k, v in ts.items():
            v = np.array(v) * 1e3
            print(f"| {busy} | {k} | {v.mean():.3f} | {np.median(v):.3f} | "
                  f"{np.percentile(v, 99):.3f} | {v.mean() / (base_mean * 1e3):.2f} | "
                  f"{np.median(v) / (base_median * 1e3):.2f} |")
    _threads.ADAPTIVE = True


if __name__ == "__main__":
    main()
