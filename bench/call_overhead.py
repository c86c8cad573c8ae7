"""Fixed cost of one small product call from Python (issue 23's "<= 1.5 us per call").

For each format and shape: numba's floor (an empty ``@njit`` function of three arrays), the
``@njit`` building block the model runner calls (``registry`` binding's ``gemv(w, xq, out)``),
the public ``numba_qk.gemv`` (with and without ``out=``), the two building blocks of
``matmul`` called one after the other (activation quantize, then gemv), the one compiled call
that ``matmul`` runs for one activation row (``kernels.drive.quantize_then_gemv``: both in
one) and the public ``numba_qk.matmul``; best and median of ``--rounds`` interleaved rounds,
each the best of 3 x ``--number`` calls.  The last column, the fixed cost, is a call's best minus the work of its
compiled part (that part's best minus the floor): the dispatch and the argument checks.

    python bench/call_overhead.py [--formats q4_0,q4_k] [--shapes 8x256,192x576]
"""

from __future__ import annotations

import argparse
import os
import platform
import timeit

import numpy as np

import numba_qk as qk
from numba import njit

from numba_qk import _registry as registry
from numba_qk.kernels.drive import quantize_then_gemv
from numba_qk.formats import activation_format


@njit(nogil=True)
def _empty(a, b, c):
    return -1


def cases(fmt, rows, k, rng):
    act = activation_format(fmt)
    w = qk.quantize(rng.standard_normal((rows * k // fmt.block_size, fmt.block_size))
                    .astype(np.float32), fmt).reshape(rows, k // fmt.block_size, -1)
    x = rng.standard_normal(k).astype(np.float32)
    xq = qk.quantize(x.reshape(-1, act.block_size), act)
    wb, ab = registry.BY_FORMAT[fmt], registry.BY_FORMAT[act]
    out, scratch = np.empty(rows, np.float32), np.empty_like(xq)
    matvec = quantize_then_gemv(ab.quantize, wb.gemv, act.block_size, act.block_bytes)
    # (label, call, the label of its compiled part: fixed cost = best - (part's best - floor))
    return [
        ("empty @njit call (numba's floor)", lambda: _empty(w, x, out), None),
        ("building block gemv", lambda: wb.gemv(w, xq, out), None),
        ("qk.gemv", lambda: qk.gemv(w, xq, lhs_format=fmt, rhs_format=act),
         "building block gemv"),
        ("qk.gemv out=", lambda: qk.gemv(w, xq, lhs_format=fmt, rhs_format=act, out=out),
         "building block gemv"),
        ("building blocks quantize, then gemv",
         lambda: (ab.quantize(x.reshape(-1, act.block_size), scratch), wb.gemv(w, scratch, out)),
         None),
        ("building block matvec (both in one call)", lambda: matvec(w, x, out), None),
        ("qk.matmul", lambda: qk.matmul(w, x, lhs_format=fmt),
         "building block matvec (both in one call)"),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="q4_0,q4_k")
    ap.add_argument("--shapes", default="8x256,192x576")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.2f}; best / median of {args.rounds} rounds, us per call\n")
    print("| format | rows x K | call | best us | median us | fixed cost us |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.formats.split(","):
        fmt = getattr(qk.quant, name)
        for shape in args.shapes.split(","):
            rows, k = (int(v) for v in shape.split("x"))
            if k % fmt.block_size:
                continue   # rows of whole records only (Q4_K: K a multiple of 256)
            todo = cases(fmt, rows, k, rng)
            times = {label: [] for label, _, _ in todo}
            for _ in range(args.rounds):
                for label, fn, _ in todo:
                    fn()
                    times[label].append(min(timeit.repeat(fn, number=args.number, repeat=3))
                                        / args.number * 1e6)
            best = {label: min(ts) for label, ts in times.items()}
            floor = best["empty @njit call (numba's floor)"]
            for label, _, part in todo:
                ts = sorted(times[label])
                fixed = f"{best[label] - (best[part] - floor):.2f}" if part else ""
                print(f"| {fmt.name} | {rows} x {k} | {label} | {ts[0]:.2f} | "
                      f"{ts[len(ts) // 2]:.2f} | {fixed} |")


if __name__ == "__main__":
    main()
