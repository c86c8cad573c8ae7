"""A/B of the Q4_K gemv tile loop with and without the next-tile software prefetch, interleaved
in one process (alternating batches, best batch of each), weights hot and DRAM-streamed
(distinct copies totalling >= 4x L3).  Also a plain read of the same bytes for the bandwidth.

    python bench/experiments/gemv_prefetch_ab.py [--rows 4096] [--cols 4096] [--legacy q4_0 q8_0 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

import numba_qk as qk  # noqa: E402
from numba_qk._jit import kernel  # noqa: E402
from numba_qk.kernels.simd.q4_k import accumulate_rows_x8  # noqa: E402
from numba_qk.kernels.drive import fold  # noqa: E402
from numba_qk.kernels.kquants.dot import _Q4_K, _simd_gemv  # noqa: E402
from numba import literally  # noqa: E402
from numba_qk.kernels.legacy import layout as _LL
from numba_qk.kernels.legacy import kernels as legacy  # noqa: E402
from numba_qk.kernels.simd.legacy import legacy_accumulate_x8  # noqa: E402

from _common import activations, q4_k_weights  # noqa: E402
from compare import cycling, l3_bytes, race, read_bandwidth  # noqa: E402


@kernel
def gemv_no_prefetch(w, x, out):
    """The tile loop as it was before the prefetch (baseline for the A/B)."""
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    acc = np.empty(8, np.float32)
    r = 0
    while rows - r >= 8:
        for b in range(g):
            accumulate_rows_x8(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
        for k in range(8):
            out[r + k] = acc[k]
        r += 8
    for rr in range(r, rows):
        out[rr] = fold(_Q4_K, w, rr * ws0, ws1, x, 0, xs0, g)


@kernel
def legacy_gemv_no_prefetch(wcode, w, x, out):
    """The legacy tile loop as it was before the prefetch."""
    literally(wcode)
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    acc = np.empty(8, np.float32)
    r = 0
    while rows - r >= 8:
        for b in range(g):
            legacy_accumulate_x8(wcode, True, w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0,
                                 b == 0)
        for k in range(8):
            out[r + k] = acc[k]
        r += 8
    for rr in range(r, rows):
        out[rr] = legacy.simd_dot_at(wcode, w, rr * ws0, ws1, x, xs0, g)


def _legacy_pair(code):
    """Old and new legacy gemv with the format code a compile-time constant (as the registry's
    per-format closures call them)."""
    @kernel
    def old_fn(w, x, out):
        legacy_gemv_no_prefetch(code, w, x, out)

    return old_fn, legacy.DRIVEN[code][1]   # the driver's pmaddwd tile loop


def legacy_ab(name, rows, cols, repeat):
    fmt = getattr(qk.quant, name)
    act = qk.activation_format(fmt)
    rng = np.random.default_rng(0)
    g = cols // 32
    w = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32),
                    format=fmt).reshape(rows, g, -1)
    xq = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
    code = _LL.FORMATS.index(fmt)  # the legacy kernels' format code
    old_fn, new_fn = _legacy_pair(code)
    out_a, out_b = np.empty(rows, np.float32), np.empty(rows, np.float32)
    old_fn(w, xq, out_a)
    new_fn(w, xq, out_b)
    assert out_a.view(np.uint32).tolist() == out_b.view(np.uint32).tolist()
    copies = -(-4 * l3_bytes() // w.nbytes)
    ws = [w.copy() for _ in range(copies)]
    for label, ws_ in (("hot", [w]), (f"DRAM ({copies} copies)", ws)):
        r = race({"old": cycling([lambda v=v: old_fn(v, xq, out_a) for v in ws_]),
                  "new": cycling([lambda v=v: new_fn(v, xq, out_b) for v in ws_])},
                 repeat=repeat)
        print(f"{fmt.name} {label} {rows}x{cols}: no prefetch {r['old'] * 1e3:.3f} ms "
              f"({w.nbytes / r['old'] / 1e9:.1f} GB/s), prefetch {r['new'] * 1e3:.3f} ms "
              f"({w.nbytes / r['new'] / 1e9:.1f} GB/s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--legacy", nargs="*", default=[], help="also these legacy formats")
    a = ap.parse_args()
    for name in a.legacy:
        legacy_ab(name, a.rows, a.cols, a.repeat)
    g = a.cols // 256
    w = q4_k_weights(a.rows, g)
    xq = qk.quantize(activations(g), format=qk.quant.q8_k)
    out_a, out_b = np.empty(a.rows, np.float32), np.empty(a.rows, np.float32)
    gemv_no_prefetch(w, xq, out_a)
    _simd_gemv(w, xq, out_b)
    assert out_a.view(np.uint32).tolist() == out_b.view(np.uint32).tolist()
    r = race({"old": lambda: gemv_no_prefetch(w, xq, out_a),
              "new": lambda: _simd_gemv(w, xq, out_b)}, repeat=a.repeat)
    print(f"hot     {a.rows}x{a.cols}: no prefetch {r['old'] * 1e3:.3f} ms, "
          f"prefetch {r['new'] * 1e3:.3f} ms ({w.nbytes / r['new'] / 1e9:.1f} GB/s)")
    copies = -(-4 * l3_bytes() // w.nbytes)
    ws = [w.copy() for _ in range(copies)]
    r = race({"old": cycling([lambda v=v: gemv_no_prefetch(v, xq, out_a) for v in ws]),
              "new": cycling([lambda v=v: _simd_gemv(v, xq, out_b) for v in ws])},
             repeat=a.repeat)
    bw = read_bandwidth(ws, 2)
    print(f"DRAM    {a.rows}x{a.cols} ({copies} copies): no prefetch {r['old'] * 1e3:.3f} ms "
          f"({w.nbytes / r['old'] / 1e9:.1f} GB/s), prefetch {r['new'] * 1e3:.3f} ms "
          f"({w.nbytes / r['new'] / 1e9:.1f} GB/s); plain read 1 / 2 threads "
          f"{bw[0]:.1f} / {bw[1]:.1f} GB/s")


if __name__ == "__main__":
    main()
