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

from _common import best, load_ggml, speed_table  # noqa: E402

NAMES = ("iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq3_s", "iq2_s", "iq1_m")


def _weights(g):
    """The speed table's weights: ggml_quantize_chunk with an importance matrix."""
    def weights(fmt, rows, cols):
        rng = np.random.default_rng(fmt.ggml_type)
        return quantize_chunk(g, fmt, np.random.default_rng(5).standard_normal((rows, cols)),
                              rng.uniform(0.1, 2.0, cols))
    return weights


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
    ap.add_argument("--cpu-time", action="store_true",
                    help="--speed: best CPU time of the process instead of wall time")
    args = ap.parse_args()
    g, label = load_ggml()
    if g is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    if args.speed:
        print(f"{label}; numba_qk SIMD: {_simd.HAVE_AVX2=} {_simd.HAVE_VNNI=}; 1 thread; "
              f"{'CPU' if args.cpu_time else 'wall'} time")
        speed_table(g, [getattr(qk.quant, n) for n in args.only.split(",")], _weights(g),
                    args.shape, args.rounds, args.stream_mb,
                    time.process_time if args.cpu_time else time.perf_counter)
        return 0
    try:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq
    except ImportError:
        gq = None
    rows, cols = (int(v) for v in args.shape.split("x"))
    print(label)
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
