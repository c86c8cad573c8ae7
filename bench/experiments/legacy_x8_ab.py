"""A/B of the legacy matvec on plain records (``qk.matmul(w, x)``) against row-interleaved
weights (``qk.matmul(qk.repack(w, fmt), x)``, the x8 tile kernel) and native ggml's layouts
(plain CPU buffer, CPU_REPACK where ggml has one), all raced interleaved in one process, weights
hot and DRAM-streamed (distinct copies totalling >= 4x L3); ratios are to ggml's best.  Results
are checked bit-equal first.  Q8_0, which ``repack`` does not offer, races the private x8
kernel (quantizing x the way matmul does) as "x8 (kernel)".

    NUMBA_QK_GGML_LIB=<native ggml lib folder> python bench/experiments/legacy_x8_ab.py [q4_0 q8_0 ...]
        [--rows 4096] [--cols 4096] [--hot-only] [--repeat 7]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_ctypes  # noqa: E402
from numba_qk._jit import kernel  # noqa: E402
from numba_qk.kernels.legacy import layout as _LL
from numba_qk.kernels.legacy import x8 as legacy_x8  # noqa: E402

from compare import cycling, l3_bytes, race  # noqa: E402


def ab(name, rows, cols, repeat, ggml, hot_only):
    fmt = getattr(qk.quant, name)
    rng = np.random.default_rng(0)
    bs = fmt.block_size
    g = cols // bs
    w = qk.quantize(rng.standard_normal((rows * g, bs)).astype(np.float32),
                    format=fmt).reshape(rows, g, -1)
    x = rng.standard_normal(cols).astype(np.float32)
    code = _LL.CODES.get(fmt, -1)
    public = fmt in qk.REPACK_FORMATS
    private = not public and code in legacy_x8.X8_CODES

    @kernel
    def gemv_x8(tiles, tail, xq, out):   # the format code a compile-time constant
        legacy_x8.gemv_x8(code, tiles, tail, xq, out)

    def x8_call(v):
        if public:
            return lambda: qk.matmul(v, x, lhs_format=fmt, threads=1)
        out = np.empty(rows, np.float32)

        def run():
            xq = qk.quantize(x.reshape(-1, bs), format=qk.activation_format(fmt))
            gemv_x8(v[0], v[1], xq, out)
            return out
        return run

    def x8_repack(v):
        return qk.repack(v, fmt) if public else legacy_x8.repack_x8(code, v)

    ref = qk.matmul(w, x, lhs_format=fmt, threads=1)
    if public or private:
        got = x8_call(x8_repack(w))()
        assert (got.view(np.uint32) == ref.view(np.uint32)).all(), "bits differ"
    copies = -(-4 * l3_bytes() // w.nbytes)
    sets = [("hot", 1)] + ([] if hot_only else [(f"DRAM x{copies}", copies)])
    for label, n in sets:
        ws = [w] if n == 1 else [w.copy() for _ in range(n)]
        cands = {"plain": cycling([lambda v=v: qk.matmul(v, x, lhs_format=fmt, threads=1)
                                   for v in ws])}
        if public or private:
            cands["x8" if public else "x8 (kernel)"] = cycling([x8_call(x8_repack(v))
                                                                for v in ws])
        if ggml is not None:
            for buft in ggml.weight_bufts(fmt.ggml_type):
                if buft == "AMX":
                    continue
                mvs = [ggml.matvec(v, 1, batch=0, type_id=fmt.ggml_type, buft=buft) for v in ws]
                cands[f"ggml {buft or 'plain'}"] = cycling([lambda m=m: m(x) for m in mvs])
        r = race(cands, repeat=repeat)
        base = min(v for k, v in r.items() if k.startswith("ggml")) if ggml else r["plain"]
        cells = "  ".join(f"{k} {t * 1e6:.0f} us ({t / base:.3f}x)" for k, t in r.items())
        print(f"{fmt.name} {label} {rows}x{cols}: {cells}", flush=True)
        del ws, cands


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("formats", nargs="*", default=["q4_0", "q8_0"])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--hot-only", action="store_true")
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None)
    a = ap.parse_args()
    ggml = ggml_ctypes.load(a.ggml_lib) if a.ggml_lib else None
    for name in a.formats:
        ab(name, a.rows, a.cols, a.repeat, ggml, a.hot_only)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
