"""The grid IQ formats (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M) against ggml
itself (libggml-python, ctypes): agreement counts (dequantize on ggml-quantized and random
records, dots against ggml's vec_dot) and single-thread timings (4096x4096 matvec through
``qk.matmul`` vs ggml's ``ggml_mul_mat`` graph, hot; dequantize vs ggml's ``dequantize_row_*``
and gguf-py's numpy decoder).  Weights come from ggml's ``ggml_quantize_chunk`` with an
importance matrix of U(0.1, 2) weights (IQ2_XXS, IQ2_XS and IQ1_S require one).

    python bench/iq_grid_vs_ggml.py [--rows 4096] [--repeats 5] [--shape 4096x4096]
                                    [--only iq2_xxs,iq1_m]
    python bench/iq_grid_vs_ggml.py --speed [--rounds 7] [--stream-mb 256]

``--speed``: the products only, each numba_qk / ggml pair timed interleaved (round by round, best
of ``--rounds``), ggml in each weight layout it offers for the type (plain CPU buffer, CPU_REPACK
where it converts the type; the fastest counts): the 4096x4096 matvec hot (one matrix) and
DRAM-streamed (distinct matrices totalling ``--stream-mb``, called round robin), and the batch-32
``matmul`` (f32 activations [32, 4096]).  ``NUMBA_QK_GGML_LIB=<dir>`` measures a native ggml build
(libggml-base.so + libggml-cpu.so) instead of the libggml-python wheel.

Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import ctypes as C
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba_qk as qk  # noqa: E402
from numba_qk import _registry as registry  # noqa: E402
from numba_qk.kernels.simd import base as _simd  # noqa: E402
from numba_qk.testing import ggml as ggml_bridge  # noqa: E402

NAMES = ("iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq3_s", "iq2_s", "iq1_m")


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def load_ggml():
    import os

    libdir = os.environ.get("NUMBA_QK_GGML_LIB")
    g = ggml_bridge.load_dir(libdir) if libdir else ggml_bridge.load()
    if g is None:
        return None, ""
    feats = ", ".join(k for k, v in g.features.items() if v) or "none"
    return g, f"{'native ggml from ' + libdir if libdir else 'libggml-python'} {g.version} ({feats})"


def interleaved(cands, rounds):
    """Best seconds per call of each callable of ``cands``, one call of each in turn per round
    (after one warm-up call each)."""
    for fn in cands.values():
        fn()
    best_t = {k: float("inf") for k in cands}
    for _ in range(rounds):
        for k, fn in cands.items():
            t = time.perf_counter()
            fn()
            best_t[k] = min(best_t[k], time.perf_counter() - t)
    return best_t


def cycling(fns):
    state = [0]

    def run():
        fns[state[0] % len(fns)]()
        state[0] += 1
    return run


def speed(args, g) -> None:
    """The speed table (see the module docstring)."""
    rows, cols = (int(v) for v in args.shape.split("x"))
    layouts = (lambda t: g.weight_bufts(t) or [None]) if g.dev is not None else (lambda t: [None])
    print("| format | matvec hot ours ms | ggml ms | ours/ggml | streamed ours ms | ggml ms | "
          "ours/ggml | batch-32 ours ms | ggml ms | ours/ggml |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    xv = np.random.default_rng(6).standard_normal(cols).astype(np.float32)
    xb = np.random.default_rng(7).standard_normal((32, cols)).astype(np.float32)
    for name in args.only.split(","):
        fmt = getattr(qk.quant, name)
        t = fmt.ggml_type
        rng = np.random.default_rng(t)
        wm = quantize_chunk(g, fmt, np.random.default_rng(5).standard_normal((rows, cols)),
                            rng.uniform(0.1, 2.0, cols))
        res = {}
        for kind, batch, x in (("hot", 0, xv), ("b32", 32, xb)):
            ref = np.asarray(qk.matmul(wm, x, lhs_format=fmt, threads=1), np.float64)
            cands = {"ours": lambda x=x: qk.matmul(wm, x, lhs_format=fmt, threads=1)}
            for buft in layouts(t):
                mv = g.matvec(wm, threads=1, batch=batch, type_id=t, buft=buft)
                y = np.asarray(mv(x), np.float64).reshape(ref.shape)
                if np.max(np.abs(y - ref)) <= 1e-4 * np.max(np.abs(ref)):
                    cands[buft or "plain"] = lambda mv=mv, x=x: mv(x)
            r = interleaved(cands, args.rounds)
            res[kind] = (r.pop("ours"), min(r.values()) if r else float("nan"))
        n = max(2, int(np.ceil(args.stream_mb * 1e6 / wm.nbytes)))
        ws = [wm.copy() for _ in range(n)]
        cands = {"ours": cycling([lambda w=w: qk.matmul(w, xv, lhs_format=fmt, threads=1)
                                  for w in ws])}
        mvs = {}
        for buft in layouts(t):
            mvs[buft] = [g.matvec(wm, threads=1, type_id=t, buft=buft) for _ in range(n)]
            cands[buft or "plain"] = cycling([lambda m=m: m(xv) for m in mvs[buft]])
        r = interleaved(cands, args.rounds * n)
        res["stream"] = (r.pop("ours"), min(r.values()))
        del ws, mvs
        cells = " | ".join(f"{o * 1e3:.2f} | {gg * 1e3:.2f} | {o / gg:.2f}"
                           for o, gg in (res["hot"], res["stream"], res["b32"]))
        print(f"| {fmt.name} | {cells} |", flush=True)


def quantize_chunk(g, fmt, x, imatrix):
    qc = g.base.ggml_quantize_chunk
    qc.restype = C.c_size_t
    qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(imatrix, np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // 256, fmt.block_bytes), np.uint8)
    qc(fmt.ggml_type, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], w.ctypes.data)
    return out


def same_rows(a, b):
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    return int(same.reshape(a.shape[0], -1).all(axis=1).sum())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096, help="ggml-quantized rows of 4096 to check")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--only", default=",".join(NAMES))
    ap.add_argument("--speed", action="store_true", help="only the products' speed table")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stream-mb", type=float, default=256.0)
    args = ap.parse_args()
    g, label = load_ggml()
    if g is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    if args.speed:
        print(f"{label}; numba_qk SIMD: {_simd.HAVE_AVX2=} {_simd.HAVE_VNNI=}; 1 thread")
        speed(args, g)
        return 0
    try:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq
    except ImportError:
        gq = None
    rows, cols = (int(v) for v in args.shape.split("x"))
    print(f"libggml-python {g.version}")
    print("| format | dequantize = ggml (quantized / random records) | dots = 0 ulp / compared "
          "(max rel diff) | matvec ours ms | ggml ms | ours/ggml | dequantize 4096 rec ours ms "
          "| ggml ms | gguf-py ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.only.split(","):
        fmt = getattr(qk.quant, name)
        t, b = fmt.ggml_type, registry.BY_FORMAT[fmt]
        rng = np.random.default_rng(fmt.ggml_type)
        imat = rng.uniform(0.1, 2.0, 4096).astype(np.float32)
        x = rng.standard_normal((args.rows, 4096)).astype(np.float32)
        w = quantize_chunk(g, fmt, x, imat)                      # [rows, 16, bytes]
        recs = w.reshape(-1, fmt.block_bytes)
        q_eq = same_rows(qk.dequantize(recs, fmt).reshape(-1, 256), g.dequantize(t, recs))
        rnd = rng.integers(0, 256, recs.shape, dtype=np.uint8)
        r_eq = same_rows(qk.dequantize(rnd, fmt).reshape(-1, 256), g.dequantize(t, rnd))
        act = rng.standard_normal((args.rows * 16, 256)).astype(np.float32)
        xq = np.zeros((args.rows * 16, 292), np.uint8)
        g.quantize_q8_k(act, xq)
        xq = xq.reshape(args.rows, 16, 292)
        dot_eq, maxrel = 0, 0.0
        for k in range(args.rows):
            ours, theirs = np.float32(b.dot(w[k], xq[k])), np.float32(g.vec_dot(t, w[k], xq[k]))
            dot_eq += int(ours == theirs)
            maxrel = max(maxrel, abs(float(ours) - float(theirs)) / max(abs(float(theirs)), 1e-30))
        # timing
        wm = quantize_chunk(g, fmt, np.random.default_rng(5).standard_normal((rows, cols)),
                            rng.uniform(0.1, 2.0, cols))
        xv = np.random.default_rng(6).standard_normal(cols).astype(np.float32)
        t_ours = best(lambda: qk.matmul(wm, xv, lhs_format=fmt, threads=1), args.repeats)
        mv = g.matvec(wm, threads=1, type_id=t)
        t_ggml = best(lambda: mv(xv), args.repeats)
        tr = recs[:4096]
        t_deq = best(lambda: qk.dequantize(tr, fmt), args.repeats)
        t_deq_g = best(lambda: g.dequantize(t, tr), args.repeats)
        gs = "n/a"
        if gq is not None:
            qt = getattr(GGMLQuantizationType, fmt.name)
            with np.errstate(all="ignore"):
                gs = f"{best(lambda: gq.dequantize(tr.reshape(-1), qt), 2) * 1e3:.1f}"
        print(f"| {fmt.name} | {q_eq}/{recs.shape[0]} + {r_eq}/{rnd.shape[0]} | {dot_eq}/"
              f"{args.rows} ({maxrel:.1e}) | {t_ours * 1e3:.2f} | {t_ggml * 1e3:.2f} | "
              f"{t_ours / t_ggml:.2f} | {t_deq * 1e3:.2f} | {t_deq_g * 1e3:.2f} | {gs} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
