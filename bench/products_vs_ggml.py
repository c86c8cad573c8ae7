"""The products' speed table (``_common.speed_table``) for any record formats against native
ggml (or the libggml-python wheel): 4096x4096 matvec hot and DRAM-streamed, and batch-32
``matmul``, 1 thread, each pair interleaved, ggml in each weight layout it offers (CPU_REPACK
included), weights quantized by numba_qk from normal values.

    NUMBA_QK_GGML_LIB=<native ggml lib folder> python bench/products_vs_ggml.py q6_k q5_0 ...
        [--shape 4096x4096] [--rounds 5] [--stream-mb 64] [--cpu-time] [--batches 8,32,128]

``--batches`` prints instead the ``matmul`` table over those batch sizes (f32 activations
quantized inside each call on both sides, ggml's fastest layout that agrees).  ``--cpu-time`` times by the process's CPU time (steadier than wall time on a shared machine;
both sides run one thread)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba_qk as qk
from numba_qk import _registry  # noqa: E402
from _common import interleaved, load_ggml, speed_table  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", nargs="+", help="format names, e.g. q6_k q5_0 iq4_xs")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stream-mb", type=float, default=64.0)
    ap.add_argument("--cpu-time", action="store_true")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes")
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
        # the formats ggml quantizes only with an importance matrix get a random one
        imatrix = (rng.uniform(0.5, 2.0, cols).astype(np.float32)
                   if fmt in _registry.REQUIRES_IMATRIX else None)
        return qk.quantize(x.astype(np.float32), format=fmt, imatrix=imatrix).reshape(
            rows, cols // fmt.block_size, -1)

    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.batches:
        batch_table(g, fmts, weights, [int(b) for b in args.batches.split(",")],
                    shape=args.shape, rounds=args.rounds, clock=clock)
    else:
        speed_table(g, fmts, weights, shape=args.shape, rounds=args.rounds,
                    stream_mb=args.stream_mb, clock=clock)
    return 0


def batch_table(g, fmts, weights, batches, shape, rounds, clock):
    """ms per ``matmul`` of each format at each batch size, ours and ggml's (its fastest weight
    layout whose result agrees with ours to 1e-4 of the largest value, with either activation
    quantizer), interleaved, 1 thread."""
    rows, cols = (int(v) for v in shape.split("x"))
    print("| format | " + " | ".join(f"b{b} ours ms | ggml ms | ours/ggml" for b in batches) + " |")
    print("| --- |" + " --- | --- | --- |" * len(batches))
    for fmt in fmts:
        wm = weights(fmt, rows, cols)
        cells = []
        for batch in batches:
            x = np.random.default_rng(batch).standard_normal((batch, cols)).astype(np.float32)
            refs = [np.asarray(qk.matmul(wm, x, lhs_format=fmt, threads=1), np.float64),
                    np.asarray(qk.matmul_many([wm], x, lhs_formats=fmt, threads=1,
                                              numerics="ggml_cpu")[0], np.float64)]
            cands = {"ours": lambda x=x: qk.matmul(wm, x, lhs_format=fmt, threads=1)}
            for buft in (g.weight_bufts(fmt.ggml_type) or [None]) if g.dev is not None else [None]:
                mv = g.matvec(wm, threads=1, batch=batch, type_id=fmt.ggml_type, buft=buft)
                y = np.asarray(mv(x), np.float64).reshape(refs[0].shape)
                if any(np.max(np.abs(y - r)) <= 1e-4 * np.max(np.abs(r)) for r in refs):
                    cands[buft or "plain"] = lambda mv=mv, x=x: mv(x)
            t = interleaved(cands, rounds, clock)
            ours = t.pop("ours")
            gg = min(t.values()) if t else float("nan")
            cells.append(f"{ours * 1e3:.2f} | {gg * 1e3:.2f} | {ours / gg:.2f}")
        print(f"| {fmt.name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
