"""Q4_K matvec (``qk.matmul`` with one f32 activation row, 1 thread) against native ggml's
mul_mat in every weight layout it offers, side by side in one process (each pair interleaved,
best of each) -- the hot matvec rows of ``bench/compare.py`` alone, for a short check.

    NUMBA_QK_GGML_LIB=/path/to/llama_cpp/lib python bench/gemv_vs_ggml.py [--shapes 4096x4096 ...]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_ctypes  # noqa: E402

import compare  # noqa: E402
from _common import activations, q4_k_weights  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4096x4096", "14336x4096", "4096x14336"])
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2)
    args = ap.parse_args(argv)
    compare.REPEAT, compare.MIN_TIME = args.repeat, args.min_time
    g = ggml_ctypes.load(args.ggml_lib) if args.ggml_lib else None
    if g is None:
        print("no native ggml build (--ggml-lib / NUMBA_QK_GGML_LIB)")
        return 1
    gb = compare.GGMLBase(g, True, False)
    tab = compare.Table()
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    for shape in args.shapes:
        rows, cols = (int(v) for v in shape.split("x"))
        w = q4_k_weights(rows, cols // 256)
        xv = activations(cols // 256).ravel()
        compare.pair_rows(tab, f"Q4_K matvec {rows}x{cols}, f32 x, hot", "matmul threads=1",
                          lambda: qk.matmul(w, xv, lhs_format=qk.quant.q4_k, threads=1), gb, w,
                          ggml_ctypes.GGML_TYPE_Q4_K, 1, 0, xv, w.nbytes)
    print(tab.markdown())
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
