"""K-quants side by side with ggml, one process, one thread.

    python bench/compare_kquants.py                      # full run (>= 1.2 GB streamed per format)
    python bench/compare_kquants.py --quick              # small, to check that it runs
    NUMBA_QK_GGML_LIB=/path/to/lib python bench/compare_kquants.py   # another ggml build

ggml: the folder in ``NUMBA_QK_GGML_LIB`` (``libggml-base.so`` + ``libggml-cpu.so``, e.g. a
``-march=native`` build), else the ``libggml-python`` wheel; the first line printed says which,
with its version and CPU features.

Per format (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K):
* matvec 4096x4096, f32 vector in, f32 out (both sides quantize the vector to Q8_K inside the
  call: ``numba_qk.matmul(threads=1)`` vs ``ggml_mul_mat`` with 1 thread): *hot* (one matrix,
  repeated) and *streamed* (distinct matrices totalling ``--stream-mb``, default 1,229 MB = 4x a
  300 MiB L3, called round robin so every call reads its weights from DRAM);
* encode 4096 blocks of N(0,1): ``numba_qk.quantize`` vs ggml ``quantize_row_<t>_ref``;
* dequantize 4096x4096: ``numba_qk.dequantize`` vs gguf-py ``gguf.quants.dequantize`` vs ggml
  ``dequantize_row_<t>``;
* gguf-py's ``quantize``/``dequantize`` before and after ``numba_qk.gguf.accelerate_gguf_py()``
  for every routed type (and whether the bytes/values are the same).
Times: best of ``--repeats`` (after a warm-up call) in ms; ratios > 1 mean numba_qk is faster.
Outputs are compared too (matvec: |ours - ggml| relative; the numerics differ by design: ggml
quantizes activations with its own Q8_K rounding, numba_qk with spec 000's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba_qk as qk  # noqa: E402
from numba_qk import _ggml_ctypes  # noqa: E402
from numba_qk.kernels import _simd  # noqa: E402

NAMES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
FP4_NAMES = ("mxfp4", "nvfp4")  # ggml's FP4 records (activations Q8_0): bench/compare_mxrec.py


def load_ggml():
    libdir = os.environ.get("NUMBA_QK_GGML_LIB")
    if libdir:
        g = _ggml_ctypes.load_dir(libdir)
        label = f"native ggml {g.version} from NUMBA_QK_GGML_LIB={libdir}"
    else:
        g = _ggml_ctypes.load()
        if g is None:
            sys.exit("no ggml: install libggml-python or set NUMBA_QK_GGML_LIB")
        label = f"libggml-python wheel {g.version}"
    feats = ", ".join(k for k, v in g.features.items() if v) or "none"
    return g, f"{label} (CPU features: {feats})"


def best(fn, repeats):
    fn()
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t) * 1e3


def round_robin(fns, rounds):
    """ms per call, calling each of ``fns`` in turn ``rounds`` times (after one warm round)."""
    for f in fns:
        f()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for f in fns:
            f()
    return (time.perf_counter() - t0) * 1e3 / (rounds * len(fns))


def gguf_py_section(args, rng, names=None):
    """gguf-py's own quantize/dequantize, then the same calls after accelerate_gguf_py()."""
    try:
        import gguf
    except ImportError:
        return
    from numba_qk import gguf as qg

    n = args.rows * args.cols // 4
    x = rng.standard_normal((n // 4096, 4096)).astype(np.float32)
    print(f"\ngguf-py with and without numba_qk.gguf.accelerate_gguf_py() ({n:,} values, ms)")
    print("| type | dequantize gguf-py | accelerated | speedup | quantize gguf-py | accelerated | "
          "speedup | same bytes/values |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    reps = max(1, args.repeats // 3)
    for fmt in qg.GGUF_PY_ROUTED:
        if names is not None and fmt._attr not in names:
            continue
        t = gguf.GGMLQuantizationType[fmt.name]
        qg.restore_gguf_py()
        recs = qk.quantize(x.reshape(-1, fmt.block_size), format=fmt).reshape(x.shape[0], -1)
        d0 = best(lambda: gguf.quants.dequantize(recs, t), reps)
        want_d = gguf.quants.dequantize(recs, t)
        try:
            q0 = best(lambda: gguf.quants.quantize(x, t), reps)
            want_q = gguf.quants.quantize(x, t)
        except NotImplementedError:
            q0, want_q = float("nan"), None
        qg.accelerate_gguf_py()
        d1 = best(lambda: gguf.quants.dequantize(recs, t), args.repeats)
        q1 = best(lambda: gguf.quants.quantize(x, t), args.repeats)
        same = (np.array_equal(gguf.quants.dequantize(recs, t).view(np.uint32),
                               want_d.view(np.uint32))
                and (want_q is None or np.array_equal(gguf.quants.quantize(x, t), want_q)))
        qg.restore_gguf_py()
        qtxt = "n/a (gguf-py cannot)" if want_q is None else f"{q0:.1f}"
        qsp = "-" if want_q is None else f"{q0 / q1:.1f}x"
        print(f"| {fmt.name} | {d0:.1f} | {d1:.2f} | {d0 / d1:.1f}x | {qtxt} | {q1:.1f} | {qsp} | "
              f"{'yes' if same else 'NO'} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--stream-mb", type=float, default=1229.0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1024x1024, 64 MB streamed, 3 repeats")
    ap.add_argument("--formats", default=",".join(NAMES),
                    help=f"comma-separated, from {', '.join(NAMES + FP4_NAMES)}")
    ap.add_argument("--gguf-py-formats", default="",
                    help="comma-separated types for the gguf-py section (default: every routed type)")
    args = ap.parse_args()
    if args.quick:
        args.rows = args.cols = 1024
        args.stream_mb, args.repeats, args.rounds = 64.0, 3, 1
    g, label = load_ggml()
    print(f"ggml: {label}")
    print(f"numba_qk: SIMD avx2={_simd.HAVE_AVX2} avx512bw={_simd.HAVE_AVX512}"
          f"; 1 thread; load average {os.getloadavg()[0]:.2f} at start")
    rng = np.random.default_rng(0)
    rows, cols = args.rows, args.cols
    x = rng.standard_normal(cols).astype(np.float32)
    print(f"\nmatvec {rows}x{cols}, ms per call (ratio = ggml / numba_qk; > 1: numba_qk faster)")
    print("| format | hot ours | hot ggml | ratio | streamed ours | streamed ggml | ratio | "
          "matrices | rel. diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    extra = []
    for name in args.formats.split(","):
        fmt = getattr(qk.quant, name)
        n = fmt.block_size
        vals = rng.standard_normal((rows * cols // n, n)).astype(np.float32)
        w = qk.quantize(vals, format=fmt).reshape(rows, cols // n, fmt.block_bytes)
        n_stream = max(2, int(np.ceil(args.stream_mb * 1e6 / w.nbytes)))
        ours = lambda w=w: qk.matmul(w, x, lhs_format=fmt, threads=1)  # noqa: E731
        mv = g.matvec(w, threads=1, type_id=fmt.ggml_type)
        y_ours, y_ggml = ours(), mv(x).copy()
        rel = float(np.max(np.abs(y_ours - y_ggml)) / np.max(np.abs(y_ggml)))
        hot_o, hot_g = best(ours, args.repeats), best(lambda: mv(x), args.repeats)
        del mv
        # streamed: distinct copies (values do not change the work), ours first, then ggml's
        ws = [w.copy() for _ in range(n_stream)]
        st_o = round_robin([lambda w=wi: qk.matmul(w, x, lhs_format=fmt, threads=1)
                            for wi in ws], args.rounds)
        mvs = []
        for wi in ws:
            mvs.append(g.matvec(wi, threads=1, type_id=fmt.ggml_type))
        del ws
        st_g = round_robin([lambda m=m: m(x) for m in mvs], args.rounds)
        del mvs
        print(f"| {fmt.name} | {hot_o:.2f} | {hot_g:.2f} | {hot_g / hot_o:.2f} | {st_o:.2f} | "
              f"{st_g:.2f} | {st_g / st_o:.2f} | {n_stream} x {w.nbytes / 1e6:.1f} MB | "
              f"{rel:.1e} |")
        # encoders and decoders on the same data
        blocks = vals[:4096 * 256 // n]  # 1 M values
        enc_o = best(lambda: qk.quantize(blocks, format=fmt), args.repeats)
        enc_g = best(lambda: g.quantize_ref(fmt.ggml_type, blocks), args.repeats)
        same = int((qk.quantize(blocks, format=fmt)
                    == g.quantize_ref(fmt.ggml_type, blocks)).all(axis=1).sum())
        recs = w.reshape(-1, fmt.block_bytes)
        deq_o = best(lambda: qk.dequantize(recs, fmt), args.repeats)
        deq_g = best(lambda: g.dequantize(fmt.ggml_type, recs), args.repeats)
        deq_p = np.nan
        try:
            import gguf

            gt = gguf.GGMLQuantizationType[fmt.name]
            deq_p = best(lambda: gguf.quants.dequantize(recs, gt), max(1, args.repeats // 3))
        except ImportError:
            pass
        extra.append((fmt.name, enc_o, enc_g, same, len(blocks), deq_o, deq_p, deq_g))
        del w, vals
    print("\nencode 1 M values (ms) and dequantize the whole matrix (ms)")
    print("| format | encode ours | ggml _ref | ggml/ours | equal blocks | dequantize ours | "
          "gguf-py | gguf-py/ours | ggml | ggml/ours |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, eo, eg, same, nb, do, dp, dg in extra:
        print(f"| {name} | {eo:.2f} | {eg:.2f} | {eg / eo:.2f} | {same}/{nb} | {do:.2f} | "
              f"{dp:.1f} | {dp / do:.1f} | {dg:.2f} | {dg / do:.2f} |")
    gguf_py_section(args, rng, args.gguf_py_formats.split(",") if args.gguf_py_formats else None)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
