"""TQ1_0 / TQ2_0 against ggml itself (libggml-python, ctypes): agreement counts (encode,
dequantize, dot) and single-thread timings (4096x4096 matvec through ``qk.matmul`` vs ggml's
``ggml_mul_mat`` graph, hot; encoders; dequantizers; gguf-py's numpy dequantize).

    python bench/ternary_vs_ggml.py [--blocks 16384] [--repeats 5] [--shape 4096x4096]
    python bench/ternary_vs_ggml.py --speed [--rounds 7] [--stream-mb 256]

``--speed``: the products only, the table of ``bench/_common.speed_table`` (matvec hot and
DRAM-streamed, batch-32 ``matmul``; each numba_qk / ggml pair interleaved, ggml in each weight
layout it offers, the fastest counts); weights from ``qk.quantize`` (byte-identical to ggml's
``quantize_row_tq*_0_ref``).  ``NUMBA_QK_GGML_LIB=<dir>`` measures a native ggml build
(libggml-base.so + libggml-cpu.so) instead of the libggml-python wheel.

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
from numba_qk import _registry as registry  # noqa: E402
from numba_qk.kernels.simd import base as _simd  # noqa: E402

from _common import best, load_ggml, speed_table  # noqa: E402


def weights(fmt, rows, cols):
    """The speed table's weights: N(0, 1) rows through ``qk.quantize``."""
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    return qk.quantize(x.reshape(-1, 256), fmt).reshape(rows, cols // 256, fmt.block_bytes)


def inputs(n, seed=7):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        parts = [rng.standard_normal((n, 256)), rng.standard_t(2, (n, 256)),
                 rng.standard_normal((n, 256)) * 10.0 ** rng.uniform(-40, 38, (n, 1))]
    return np.concatenate(parts).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shape", default="4096x4096")
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
        speed_table(g, (qk.quant.tq1_0, qk.quant.tq2_0), weights, args.shape, args.rounds,
                    args.stream_mb,
                    time.process_time if args.cpu_time else time.perf_counter)
        return 0
    try:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq
    except ImportError:
        gq = None
    rows, cols = (int(v) for v in args.shape.split("x"))
    x = inputs(args.blocks)
    rng = np.random.default_rng(11)
    print(label)
    for fmt in (qk.quant.tq1_0, qk.quant.tq2_0):
        t, b = fmt.ggml_type, registry.BY_FORMAT[fmt]
        enc = qk.quantize(x, fmt)
        enc_eq = int((enc == g.quantize_ref(t, x)).all(axis=1).sum())
        recs = np.concatenate([enc, rng.integers(0, 256, enc.shape, dtype=np.uint8)])
        y, yg = qk.dequantize(recs, fmt), g.dequantize(t, recs)
        same = (y.view(np.uint32) == yg.view(np.uint32)) | (np.isnan(y) & np.isnan(yg))
        dec_eq = int(same.all(axis=1).sum())
        # dots: 4096 pairs of 16-record rows, ggml-quantized weights and activations
        n_dot, dot_eq, maxrel = min(2048, enc.shape[0] // 16), 0, 0.0
        w = enc[: n_dot * 16].reshape(n_dot, 16, fmt.block_bytes)
        act = np.random.default_rng(3).standard_normal((n_dot * 16, 256)).astype(np.float32)
        xq = np.zeros((n_dot * 16, 292), np.uint8)
        g.quantize_q8_k(act, xq)
        xq = xq.reshape(n_dot, 16, 292)
        for k in range(n_dot):
            ours, theirs = np.float32(b.dot(w[k], xq[k])), np.float32(g.vec_dot(t, w[k], xq[k]))
            dot_eq += int(ours == theirs)
            maxrel = max(maxrel, abs(float(ours) - float(theirs)) / max(abs(float(theirs)), 1e-30))
        print(f"{fmt.name}: encode {enc_eq}/{x.shape[0]} equal, dequantize {dec_eq}/"
              f"{recs.shape[0]} equal, dot {dot_eq}/{n_dot} equal (max rel diff {maxrel:.2e})")
        # timing
        wm = weights(fmt, rows, cols)
        xv = np.random.default_rng(6).standard_normal(cols).astype(np.float32)
        t_ours = best(lambda: qk.matmul(wm, xv, lhs_format=fmt, threads=1), args.repeats)
        mv = g.matvec(wm, threads=1, type_id=t)
        t_ggml = best(lambda: mv(xv), args.repeats)
        tx = x[:4096]
        t_enc = best(lambda: qk.quantize(tx, fmt), args.repeats)
        t_enc_g = best(lambda: g.quantize_ref(t, tx), args.repeats)
        tr = enc[:4096]
        t_deq = best(lambda: qk.dequantize(tr, fmt), args.repeats)
        t_deq_g = best(lambda: g.dequantize(t, tr), args.repeats)
        gs = "n/a"
        if gq is not None:
            qt = getattr(GGMLQuantizationType, fmt.name)
            with np.errstate(all="ignore"):
                gs = f"{best(lambda: gq.dequantize(tr.reshape(-1), qt), 2) * 1e3:.1f} ms"
        print(f"  matvec {rows}x{cols} 1 thread: ours {t_ours * 1e3:.2f} ms, ggml "
              f"{t_ggml * 1e3:.2f} ms (ours/ggml {t_ours / t_ggml:.2f})")
        print(f"  encode 4096 blocks: ours {t_enc * 1e3:.2f} ms, ggml {t_enc_g * 1e3:.2f} ms; "
              f"dequantize: ours {t_deq * 1e3:.2f} ms, ggml {t_deq_g * 1e3:.2f} ms, gguf-py {gs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
