"""A/B of software-prefetch schemes for the DRAM-streamed Q4_K gemv tile loop (VNNI tile),
interleaved in one process (alternating batches, best batch of each).  Weights hot and
DRAM-streamed (distinct copies totalling >= 4x L3), plus a plain read of the same bytes.

    python bench/experiments/stream_ab.py [--rows 4096] [--cols 4096] [--variants cur,none,lin1,...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

import numba_qk as qk  # noqa: E402
from numba_qk._jit import kernel  # noqa: E402
from numba_qk.kernels.simd.base import byte_ptr, decl, i8, i32  # noqa: E402
from numba_qk.kernels.simd.q4_k import accumulate_rows_x8_vnni  # noqa: E402
from numba_qk.kernels.drive import fold  # noqa: E402
from numba_qk.kernels.kquants.dot import _Q4_K, _vnni_gemv  # noqa: E402

from _common import activations, q4_k_weights  # noqa: E402
from compare import cycling, l3_bytes, race, read_bandwidth  # noqa: E402


def _make_prefetch(locality):
    @intrinsic
    def pf(typingctx, arr, off):
        sig = types.none(arr, types.intp)

        def codegen(context, builder, signature, args):
            ptr = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            fn = decl(builder, "llvm.prefetch.p0i8", ir.VoidType(),
                       [i8.as_pointer(), i32, i32, i32])
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return sig, codegen
    return pf


pf_t0 = _make_prefetch(3)
pf_t1 = _make_prefetch(2)
pf_t2 = _make_prefetch(1)
pf_nta = _make_prefetch(0)


@kernel
def g_none(w, x, out):
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    acc = np.empty(8, np.float32)
    r = 0
    while rows - r >= 8:
        for b in range(g):
            accumulate_rows_x8_vnni(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
        for k in range(8):
            out[r + k] = acc[k]
        r += 8
    for rr in range(r, rows):
        out[rr] = fold(_Q4_K, w, rr * ws0, ws1, x, 0, xs0, g)


def _make_linear(dist_tiles, which, stride=64):
    """Prefetch the tile ``dist_tiles`` ahead as one linear byte range (rows are contiguous,
    so a tile of 8 rows is one block of 8*ws0 bytes), an equal share of its lines per record
    step."""
    pf = {0: pf_nta, 1: pf_t2, 2: pf_t1, 3: pf_t0}[which]

    @kernel
    def fn(w, x, out):
        rows, g = w.shape[0], w.shape[1]
        ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
        acc = np.empty(8, np.float32)
        tile = 8 * ws0
        lines = (tile + stride - 1) // stride
        per = (lines + g - 1) // g
        total = rows * ws0
        r = 0
        while rows - r >= 8:
            base = (r + 8 * dist_tiles) * ws0
            for b in range(g):
                if base < total:
                    o = base + b * per * stride
                    for j in range(per):
                        pf(w, o + j * stride)
                accumulate_rows_x8_vnni(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
            for k in range(8):
                out[r + k] = acc[k]
            r += 8
        for rr in range(r, rows):
            out[rr] = fold(_Q4_K, w, rr * ws0, ws1, x, 0, xs0, g)
    return fn


def _make_rec(dist_tiles, which):
    """The current scheme (record b of each row of a later tile, 3 lines) at a distance."""
    pf = {0: pf_nta, 1: pf_t2, 2: pf_t1, 3: pf_t0}[which]

    @kernel
    def fn(w, x, out):
        rows, g = w.shape[0], w.shape[1]
        ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
        acc = np.empty(8, np.float32)
        total = rows * ws0
        r = 0
        while rows - r >= 8:
            nxt = (r + 8 * dist_tiles) * ws0
            for b in range(g):
                if nxt < total:
                    for k in range(8):
                        at = nxt + k * ws0 + b * ws1
                        pf(w, at)
                        pf(w, at + 64)
                        pf(w, at + 128)
                accumulate_rows_x8_vnni(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
            for k in range(8):
                out[r + k] = acc[k]
            r += 8
        for rr in range(r, rows):
            out[rr] = fold(_Q4_K, w, rr * ws0, ws1, x, 0, xs0, g)
    return fn


VARIANTS = {
    "cur": _vnni_gemv,
    "none": g_none,
    "rec2": _make_rec(2, 3),
    "rec1t1": _make_rec(1, 2),
    "lin1": _make_linear(1, 3),
    "lin2": _make_linear(2, 3),
    "lin4": _make_linear(4, 3),
    "lin1t1": _make_linear(1, 2),
    "lin2t1": _make_linear(2, 2),
    "lin8t1": _make_linear(8, 2),
    "lin4t1": _make_linear(4, 2),
    "lin2nta": _make_linear(2, 0),
    "lin4t1s128": _make_linear(4, 2, 128),
    "lin4t1s256": _make_linear(4, 2, 256),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-hot", action="store_true")
    a = ap.parse_args()
    names = a.variants.split(",")
    g = a.cols // 256
    w = q4_k_weights(a.rows, g)
    xq = qk.quantize(activations(g), format=qk.quant.q8_k)
    outs = {n: np.empty(a.rows, np.float32) for n in names}
    ref = np.empty(a.rows, np.float32)
    _vnni_gemv(w, xq, ref)
    for n in names:
        VARIANTS[n](w, xq, outs[n])
        assert outs[n].view(np.uint32).tolist() == ref.view(np.uint32).tolist(), n
    if not a.no_hot:
        r = race({n: (lambda n=n: VARIANTS[n](w, xq, outs[n])) for n in names}, repeat=a.repeat)
        print("hot   " + "  ".join(f"{n} {r[n] * 1e6:.0f}us" for n in names), flush=True)
    copies = -(-4 * l3_bytes() // w.nbytes)
    ws = [w.copy() for _ in range(copies)]
    r = race({n: cycling([lambda v=v, n=n: VARIANTS[n](v, xq, outs[n]) for v in ws])
              for n in names}, repeat=a.repeat)
    bw = read_bandwidth(ws, 2)
    print(f"DRAM ({copies} copies, read {bw[0]:.1f}/{bw[1]:.1f} GB/s) " + "  ".join(
        f"{n} {r[n] * 1e6:.0f}us={w.nbytes / r[n] / 1e9:.1f}GB/s" for n in names), flush=True)


if __name__ == "__main__":
    main()
