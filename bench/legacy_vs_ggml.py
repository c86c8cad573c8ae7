"""Legacy matvec (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; also any record format named, e.g. iq4_nl
iq4_xs; 4096x4096, 1 thread, f32 x) against native ggml,
hot and DRAM-streamed, each pair interleaved in one process -- the legacy rows of
bench/compare.py without the rest of its table (a short check while working on these kernels).

    NUMBA_QK_GGML_LIB=<native ggml lib folder> python bench/legacy_vs_ggml.py [q4_0 ...] [--hot-only]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_ctypes  # noqa: E402

import compare  # noqa: E402
from compare import GGMLBase, Table, cycling, l3_bytes, pair_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("formats", nargs="*", default=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None)
    ap.add_argument("--hot-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    compare.REPEAT = a.repeat
    ggml = ggml_ctypes.load(a.ggml_lib) if a.ggml_lib else ggml_ctypes.load()
    native = bool(a.ggml_lib) and ggml is not None
    gb = GGMLBase(ggml, native, False) if ggml else None
    tab = Table()
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(4096).astype(np.float32)
    for name in a.formats:
        fmt = getattr(qk.quant, name)
        bs = fmt.block_size
        w = qk.quantize(rng.standard_normal((4096 * 4096 // bs, bs)).astype(np.float32),
                        format=fmt).reshape(4096, 4096 // bs, -1)
        pair_rows(tab, f"{fmt.name} matvec 4096x4096, hot", "matmul threads=1",
                  lambda: qk.matmul(w, xv, lhs_format=fmt, threads=1), gb, w, fmt.ggml_type, 1,
                  0, xv, w.nbytes)
        if not a.hot_only:
            copies = -(-4 * l3_bytes() // w.nbytes)
            ws = [w.copy() for _ in range(copies)]
            pair_rows(tab, f"{fmt.name} matvec 4096x4096, DRAM-streamed ({copies} copies)",
                      "matmul threads=1",
                      cycling([lambda w_=w_: qk.matmul(w_, xv, lhs_format=fmt, threads=1)
                               for w_ in ws]),
                      gb, ws, fmt.ggml_type, 1, 0, xv, w.nbytes, streamed=True)
            del ws
    print(tab.markdown())
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
