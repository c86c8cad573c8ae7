"""The products' speed table (``_common.speed_table``) for any record formats against native
ggml (or the libggml-python wheel): 4096x4096 matvec hot and DRAM-streamed, and batch-32
``matmul``, 1 thread, each pair interleaved, ggml in each weight layout it offers (CPU_REPACK
included), weights quantized by numba_qk from normal values.

    NUMBA_QK_GGML_LIB=<native ggml lib folder> python bench/products_vs_ggml.py q6_k q5_0 ...
        [--shape 4096x4096] [--rounds 5] [--stream-mb 64] [--cpu-time]

``--cpu-time`` times by the process's CPU time (steadier than wall time on a shared machine;
both sides run one thread)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba_qk as qk  # noqa: E402
from _common import load_ggml, speed_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", nargs="+", help="format names, e.g. q6_k q5_0 iq4_xs")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stream-mb", type=float, default=64.0)
    ap.add_argument("--cpu-time", action="store_true")
    args = ap.parse_args(argv)
    fmts = []
    for name in args.formats:
        f = getattr(qk.quant, name.lower(), None)
        if f is None or f.ggml_type is None:
            ap.error(f"{name}: not a GGML record format of numba_qk.quant")
        fmts.append(f)
    g, label = load_ggml()
    if g is None:
        print("no ggml library (NUMBA_QK_GGML_LIB or the libggml-python wheel)")
        return 1
    print(f"{label}; load {os.getloadavg()[0]:.2f}; clock: "
          f"{'process CPU time' if args.cpu_time else 'wall time'}", flush=True)
    rng = np.random.default_rng(3)

    def weights(fmt, rows, cols):
        x = rng.standard_normal((rows * cols // fmt.block_size, fmt.block_size))
        return qk.quantize(x.astype(np.float32), format=fmt).reshape(rows, cols // fmt.block_size, -1)

    speed_table(g, fmts, weights, shape=args.shape, rounds=args.rounds, stream_mb=args.stream_mb,
                clock=time.process_time if args.cpu_time else time.perf_counter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
