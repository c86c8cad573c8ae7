"""Encode/decode throughput of the block-scaled formats (issue 11): 16 M float32 values, 1 thread.

    python bench/speed_mx.py [--threads N]

Prints GB/s of float32 input (encode) and output (decode into a preallocated float32 array),
best of 3.  Take final figures on a quiet machine.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba_qk as qk  # noqa: E402


def best(fn, reps=3):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(a.n).astype(np.float32)
    out = np.empty_like(x)
    print(f"| format | encode GB/s | decode GB/s |  ({a.n} f32 values, threads={a.threads})")
    print("| --- | --- | --- |")
    for fmt in qk.mx.FORMATS:
        st = qk.astype(x[:4096], fmt)                  # compile outside the timing
        qk.astype(st, qk.f32)
        st = qk.astype(x, fmt, threads=a.threads)
        te = best(lambda: qk.astype(x, fmt, out=st, threads=a.threads))
        td = best(lambda: qk.astype(st, qk.f32, out=out, threads=a.threads))
        print(f"| {fmt.name} | {x.nbytes / te / 1e9:.2f} | {x.nbytes / td / 1e9:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
