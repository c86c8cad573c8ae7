"""F16 / BF16 weight matrices against ggml itself (libggml-python or a native build, ctypes):
agreement of numba_qk.matmul with ggml's own vec_dot (max relative error of both against an
f64 sum of the same rounded products) and single-thread timings (4096x4096 matvec and batch-32
matmul through ``qk.matmul`` vs ggml's ``ggml_mul_mat`` graph, hot, interleaved, best of).

    python bench/halfmat_vs_ggml.py [--repeats 7] [--rounds 3] [--shape 4096x4096] [--dots 512]
        [--libdir DIR]

Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba_qk as qk  # noqa: E402
from numba_qk import _halfmat  # noqa: E402
from numba_qk.testing import ggml as ggml_bridge  # noqa: E402

TYPES = {"F16": (qk.f16, 1), "BF16": (qk.bf16, 30)}


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def weights(name, rows, cols, rng):
    v = rng.standard_normal((rows, cols)).astype(np.float32)
    if name == "F16":
        return v.astype(np.float16).view(np.uint16)
    return _halfmat.convert_activations(qk.bf16, v).view(np.uint32).__rshift__(16).astype(np.uint16)


def as_weights(t, codes):
    return codes.view(np.float16) if t is qk.f16 else qk.Tensor(codes, dtype=qk.bf16)


def agreement(g, name, t, tid, n_dots, k, rng):
    """(bit-equal count, max rel err numba_qk, max rel err ggml, the same errors over
    sum |w_i x_i| instead of |sum|) over n_dots random rows."""
    w = weights(name, n_dots, k, rng)
    x = rng.standard_normal((n_dots, k)).astype(np.float32)
    ours = qk.matmul(as_weights(t, w), x, lhs_format=t)      # [n, n]; take the diagonal
    eq, rel_q, rel_g, abs_q, abs_g = 0, 0.0, 0.0, 0.0, 0.0
    for i in range(n_dots):
        xr = _halfmat.convert_activations(t, x[i])
        xc = (xr.astype(np.float16).view(np.uint16) if t is qk.f16
              else (xr.view(np.uint32) >> 16).astype(np.uint16))
        theirs = np.float32(g.vec_dot(tid, w[i].view(np.uint8).reshape(k, 2),
                                      xc.view(np.uint8).reshape(k, 2)))
        wv = (w[i].view(np.float16).astype(np.float64) if t is qk.f16
              else (w[i].astype(np.uint32) << 16).view(np.float32).astype(np.float64))
        exact = float(np.dot(wv, xr.astype(np.float64)))
        mag = float(np.dot(np.abs(wv), np.abs(xr.astype(np.float64))))
        o = ours[i, i]
        eq += int(o.view(np.uint32) == theirs.view(np.uint32))
        scale = max(abs(exact), 1e-30)
        rel_q = max(rel_q, abs(float(o) - exact) / scale)
        rel_g = max(rel_g, abs(float(theirs) - exact) / scale)
        abs_q = max(abs_q, abs(float(o) - exact) / mag)
        abs_g = max(abs_g, abs(float(theirs) - exact) / mag)
    return eq, rel_q, rel_g, abs_q, abs_g


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--dots", type=int, default=512)
    ap.add_argument("--libdir", default=None)
    args = ap.parse_args()
    g = ggml_bridge.load(args.libdir)
    if g is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    rows, cols = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(24)
    print(f"ggml {g.version}")
    for name, (t, tid) in TYPES.items():
        eq, rq, rg, aq, ag = agreement(g, name, t, tid, args.dots, cols, rng)
        print(f"{name}: {args.dots} dots of K={cols}: bit-equal to ggml vec_dot {eq}/{args.dots}; "
              f"max rel err vs f64: numba_qk {rq:.3g}, ggml {rg:.3g}; max err / sum|w x|: "
              f"numba_qk {aq:.3g}, ggml {ag:.3g}")
    for name, (t, tid) in TYPES.items():
        w = weights(name, rows, cols, rng)
        wq = as_weights(t, w)
        x = rng.standard_normal(cols).astype(np.float32)
        xb = rng.standard_normal((32, cols)).astype(np.float32)
        w3 = w.view(np.uint8).reshape(rows, cols, 2)
        mv, mm = g.matvec(w3, threads=1, type_id=tid), g.matvec(w3, threads=1, batch=32,
                                                                 type_id=tid)
        ours_v, ggml_v, ours_m, ggml_m = [], [], [], []
        for _ in range(args.rounds):     # interleaved: the machine is shared
            ours_v.append(best(lambda: qk.matmul(wq, x, lhs_format=t), args.repeats))
            ggml_v.append(best(lambda: mv(x), args.repeats))
            ours_m.append(best(lambda: qk.matmul(wq, xb, lhs_format=t), max(2, args.repeats // 3)))
            ggml_m.append(best(lambda: mm(xb), max(2, args.repeats // 3)))
        a, b, c, d = min(ours_v), min(ggml_v), min(ours_m), min(ggml_m)
        print(f"{name} {rows}x{cols} 1 thread: matvec numba_qk {a * 1e3:.3f} ms, ggml "
              f"{b * 1e3:.3f} ms ({a / b:.2f}x); batch-32 numba_qk {c * 1e3:.2f} ms, ggml "
              f"{d * 1e3:.2f} ms ({c / d:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
