"""A/B of the Q4_K gemv (``gemv_q4_k_q8_k``) against an older revision, interleaved in one
process (old and new calls alternate, best of each kept, so machine load slows both alike):
hot (one matrix, repeated) and DRAM-streamed (distinct copies totalling ``--stream-mb``, round
robin), for each ``--shapes`` entry.  Outputs are compared bit for bit first.

    python bench/experiments/gemv_vnni_ab.py --old-rev 82cb632
    python bench/experiments/gemv_vnni_ab.py --old-rev 82cb632 --shapes 4096x4096 --stream-mb 0 --rounds 50

Ratio = new / old (< 1: the working tree is faster).  Take final figures on a quiet machine.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

from kquant_ab import (ROOT, best_interleaved, extract_old, old_kernel_module,  # noqa: E402
                       same_bits)

sys.path.insert(0, str(ROOT))
import numba_qk as qk  # noqa: E402

from _common import q4_k_weights  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", required=True)
    ap.add_argument("--shapes", nargs="+", default=["4096x4096", "14336x4096"])
    ap.add_argument("--stream-mb", type=float, default=1229.0, help="0: hot only")
    ap.add_argument("--rounds", type=int, default=200, help="hot: best of this many calls")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(extract_old(args.old_rev)))
    new = importlib.import_module("numba_qk.kernels.kquants.dot")
    old = old_kernel_module("dot")
    from numba_qk.kernels.simd import base as _simd
    print(f"old = {args.old_rev}, new = working tree (VNNI gemv: {_simd.HAVE_VNNI and _simd.HAVE_AVX512});"
          f" 1 thread; ms per call, best interleaved; load {os.getloadavg()[0]:.2f}")
    print("| shape | hot old | new | new/old | streamed old | new | new/old | new GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    fns = {"old": old.gemv_q4_k_q8_k, "new": new.gemv_q4_k_q8_k}
    for shape in args.shapes:
        rows, cols = (int(v) for v in shape.split("x"))
        g = cols // 256
        w = q4_k_weights(rows, g)
        xf = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
        x = qk.quantize(xf.reshape(-1, 256), format=qk.quant.q8_k)
        outs = {k: np.empty(rows, np.float32) for k in fns}
        for k, f in fns.items():
            f(w, x, outs[k])
        assert same_bits(outs["old"], outs["new"]), f"{shape}: gemv bits differ"
        hot = best_interleaved({k: (lambda i, f=f, o=outs[k]: f(w, x, o)) for k, f in fns.items()},
                               1, args.rounds)
        cells = [f"{hot['old'] * 1e3:.3f}", f"{hot['new'] * 1e3:.3f}",
                 f"{hot['new'] / hot['old']:.2f}"]
        if args.stream_mb > 0:
            n = int(args.stream_mb * 1e6 / w.nbytes) + 1
            ws = [w.copy() for _ in range(n)]
            st = best_interleaved({k: (lambda i, f=f, o=outs[k]: f(ws[i], x, o))
                                   for k, f in fns.items()}, n, 3)
            del ws
            cells += [f"{st['old'] * 1e3:.3f}", f"{st['new'] * 1e3:.3f}",
                      f"{st['new'] / st['old']:.2f}", f"{w.nbytes / st['new'] / 1e9:.1f}"]
        else:
            cells += ["-"] * 4
        print(f"| {shape} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
