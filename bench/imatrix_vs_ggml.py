"""Importance-weighted encoders: ``numba_qk.quantize(x, fmt, imatrix=w)`` against ggml's
``ggml_quantize_chunk(type, x, ..., imatrix=w)`` (same rows, same weights, 1 thread), each pair
interleaved in one process, best of ``--repeat``; the unweighted path (``imatrix=None``, ggml's
``quantize_chunk`` without weights) beside it ("-" for IQ2_XXS / IQ2_XS / IQ1_S, which need weights).
Checks the bytes are equal before timing.

    NUMBA_QK_GGML_LIB=<native ggml lib folder> python bench/imatrix_vs_ggml.py [q4_k ...]
        [--rows 64] [--cols 4096] [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import numba_qk as qk
from numba_qk.testing import ggml as ggml_ctypes

ALL = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs",
       "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"]


def best(fn, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("formats", nargs="*", default=ALL)
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    g = ggml_ctypes.load(a.ggml_lib) if a.ggml_lib else ggml_ctypes.load()
    if g is None:
        raise SystemExit("no ggml library")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.cols)).astype(np.float32)
    w = (rng.standard_t(3, a.cols) ** 2).astype(np.float32)
    print(f"ggml: {g.version}; {a.rows} rows x {a.cols}, 1 thread, best of {a.repeat} (ms)")
    print(f"{'format':8} {'qk imatrix':>11} {'ggml imatrix':>13} {'ratio':>6}   "
          f"{'qk none':>8} {'ggml none':>10} {'ratio':>6}")
    for name in a.formats:
        fmt = getattr(qk.quant, name)
        xb = x.reshape(-1, fmt.block_size)
        out = np.empty((xb.shape[0], fmt.block_bytes), np.uint8)
        row = []
        for qw in (w, None):
            if qw is None and fmt in qk._registry.REQUIRES_IMATRIX:
                row += [float("nan")] * 3
                continue
            got = qk.quantize(xb, fmt, imatrix=qw)   # compiles; and the bytes must agree
            want = g.quantize_chunk(fmt.ggml_type, x, qw)
            assert (got == want).all(), name
            tq = tg = float("inf")
            for _ in range(a.repeat):   # interleaved
                tq = min(tq, best(lambda: qk.quantize(xb, fmt, imatrix=qw, out=out), 1))
                tg = min(tg, best(lambda: g.quantize_chunk(fmt.ggml_type, x, qw), 1))
            row += [tq * 1e3, tg * 1e3, tq / tg]
        print(f"{name:8} {row[0]:11.2f} {row[1]:13.2f} {row[2]:6.2f}   {row[3]:8.2f} {row[4]:10.2f} "
              f"{row[5]:6.2f}")


if __name__ == "__main__":
    main()
