"""Q2_K/Q3_K/Q5_K/Q6_K against ggml itself (libggml-python, ctypes): agreement counts and a
rough single-thread timing of the encoders and dequantizers.

    python bench/kquant_vs_ggml.py            # 16,384 blocks per format and input kind
    python bench/kquant_vs_ggml.py --blocks 2048 --repeats 3

Agreement: blocks whose encoded bytes equal ggml's ``quantize_row_<t>_ref`` (inputs: normal,
Student-t(2), scaled 10**U(-36, 36), scaled 10**U(-12, 12) (f16 scale edges), shifted Laplace,
all-positive); records whose dequantized values equal ggml's ``dequantize_row_<t>`` bit for bit
(NaN == NaN), on random bytes and on the encoded records.  Timing: best of ``--repeats`` after a
warm-up call (compile), same process, same inputs; gguf-py's numpy dequantize as a baseline.
Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from numba_qk.testing import ggml as ggml_bridge  # noqa: E402
from numba_qk.formats import kquants as fk  # noqa: E402

NAMES = ("q6_k", "q5_k", "q3_k", "q2_k")


def inputs(n, seed=7):
    rng = np.random.default_rng(seed)
    parts = [
        rng.standard_normal((n, 256)),
        rng.standard_t(2, (n, 256)),
        rng.standard_normal((n, 256)) * 10.0 ** rng.uniform(-36, 36, (n, 1)),
        rng.standard_normal((n, 256)) * 10.0 ** rng.uniform(-12, 12, (n, 1)),
        rng.laplace(size=(n, 256)) + rng.uniform(-3, 3, (n, 1)),
        np.abs(rng.standard_normal((n, 256))) * rng.uniform(0, 5, (n, 1)),
    ]
    return np.concatenate(parts).astype(np.float32)


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=16384, help="blocks per input kind")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ggml = ggml_bridge.load()
    if ggml is None:
        print("libggml-python is not installed", file=sys.stderr)
        return 1
    try:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq
    except ImportError:
        gq = None
    x = inputs(args.blocks)
    timing_x = x[:: max(1, x.shape[0] // 4096)][:4096]  # 1M elements of every kind, for timing
    print(f"libggml-python {ggml.version}; {x.shape[0]} blocks per format")
    print(f"{'format':6} {'encode equal':>22} {'decode equal':>22} {'enc ours':>9} "
          f"{'enc ggml':>9} {'ratio':>6} {'deq ours':>9} {'deq ggml':>9} {'deq gguf-py':>11}")
    rng = np.random.default_rng(11)
    for name in NAMES:
        fmt = getattr(fk, name)
        mod = importlib.import_module(f"numba_qk.kernels.kquants.{name}")
        quantize, dequantize = getattr(mod, f"quantize_{name}"), getattr(mod, f"dequantize_{name}")
        out = np.zeros((x.shape[0], fmt.block_bytes), np.uint8)
        assert quantize(x, out) == -1
        want = ggml.quantize_ref(fmt.ggml_type, x)
        enc_eq = int((out == want).all(axis=1).sum())
        recs = np.concatenate([out, rng.integers(0, 256, out.shape, dtype=np.uint8)])
        y = np.empty((recs.shape[0], 256), np.float32)
        dequantize(recs, y)
        yg = ggml.dequantize(fmt.ggml_type, recs)
        same = (y.view(np.uint32) == yg.view(np.uint32)) | (np.isnan(y) & np.isnan(yg))
        dec_eq = int(same.all(axis=1).sum())
        tq = np.zeros((timing_x.shape[0], fmt.block_bytes), np.uint8)
        t_enc = best(lambda: quantize(timing_x, tq), args.repeats)
        t_ggml = best(lambda: ggml.quantize_ref(fmt.ggml_type, timing_x), args.repeats)
        ty = np.empty((tq.shape[0], 256), np.float32)
        t_deq = best(lambda: dequantize(tq, ty), args.repeats)
        t_deq_g = best(lambda: ggml.dequantize(fmt.ggml_type, tq), args.repeats)
        if gq is not None:
            qt = getattr(GGMLQuantizationType, fmt.name)
            with np.errstate(all="ignore"):
                t_gguf = best(lambda: gq.dequantize(tq.reshape(-1), qt), max(1, args.repeats // 2))
            gguf_s = f"{t_gguf * 1e3:9.1f}ms"
        else:
            gguf_s = "n/a"
        n = x.shape[0]
        print(f"{fmt.name:6} {enc_eq:>10}/{n:<11} {dec_eq:>10}/{recs.shape[0]:<11} "
              f"{t_enc * 1e3:7.1f}ms {t_ggml * 1e3:7.1f}ms {t_ggml / t_enc:6.2f} "
              f"{t_deq * 1e3:7.2f}ms {t_deq_g * 1e3:7.2f}ms {gguf_s:>11}")
    print("timings: 4096 blocks (1M elements), single thread, best of repeats; "
          "ratio = ggml / ours (> 1: ours faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
