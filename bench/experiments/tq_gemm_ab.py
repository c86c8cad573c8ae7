"""A/B of the ternary formats' batched products (issue #24): the 8-activation gemm tile with
record blocks of 1..16 records against gemv per activation (the 8-row tile), interleaved in one
process, by CPU time (``time.process_time``; best of ``--rounds``), every output compared bit
for bit with the registered gemm first.

    python bench/experiments/tq_gemm_ab.py [--batch 32] [--rounds 15] [--shape 4096x4096]

Each variant is the driver (``kernels/drive.py``) bound under a spare code to the same pieces
as ``kernels/ternary/tq.py`` registers, only ``record_block`` / ``acts_x8`` differ.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numba_qk as qk  # noqa: E402
from numba_qk.kernels import drive  # noqa: E402
from numba_qk.kernels.simd import ternary as st  # noqa: E402
from numba_qk.kernels.ternary import tq  # noqa: E402

BLOCKS = (1, 2, 4, 8, 16, 32)


def variants(name):
    """{label: gemm} for the record blocks and the gemv-per-activation path."""
    loop = getattr(tq, f"dot_{name}_q8_k_portable")
    pieces = dict(loop_dot=loop, value=getattr(st, f"{name}_q8_k_value"),
                  rows_x8=getattr(st, f"{name}_rows_x8"))
    base = 9000 + 100 * int(name[2])
    out = {}
    for k, rb in enumerate(BLOCKS):
        drive.register(base + k, acts_x8=getattr(st, f"{name}_acts_x8"), record_block=rb,
                       **pieces)
        out[f"acts rb={rb}"] = drive.kernels_for(base + k)[2]
    drive.register(base + 50, **pieces)
    out["gemv per act"] = drive.kernels_for(base + 50)[2]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shape", default="4096x4096")
    args = ap.parse_args()
    rows, cols = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(5)
    print(f"{args.batch} activations, {rows}x{cols}, best CPU ms of {args.rounds} "
          f"(load {open('/proc/loadavg').read().split()[0]})")
    for fmt in (qk.quant.tq1_0, qk.quant.tq2_0):
        name = fmt.name.lower()
        w = qk.quantize(rng.standard_normal((rows, cols)).astype(np.float32).reshape(-1, 256),
                        fmt).reshape(rows, cols // 256, fmt.block_bytes)
        x = qk.quantize(rng.standard_normal((args.batch * cols // 256, 256)).astype(np.float32),
                        qk.quant.q8_k).reshape(args.batch, cols // 256, 292)
        want = np.empty((args.batch, rows), np.float32)
        getattr(tq, f"gemm_{name}_q8_k")(w, x, want)
        cands, outs = {}, {}
        for label, gemm in variants(name).items():
            outs[label] = np.empty_like(want)
            gemm(w, x, outs[label])
            assert outs[label].tobytes() == want.tobytes(), label
            cands[label] = lambda g=gemm, o=outs[label]: g(w, x, o)
        best = {k: float("inf") for k in cands}
        for _ in range(args.rounds):
            for k, fn in cands.items():
                t = time.process_time()
                fn()
                best[k] = min(best[k], time.process_time() - t)
        print(fmt.name, "  ".join(f"{k}: {v * 1e3:.2f}" for k, v in best.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
