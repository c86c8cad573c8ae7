"""K-quants side by side with ggml, one process, one thread.

    python bench/compare_kquants.py                      # full run (>= 1.2 GB streamed per format)
    python bench/compare_kquants.py --quick              # small, to check that it runs
    NUMBA_QK_GGML_LIB=/path/to/lib python bench/compare_kquants.py   # another ggml build

ggml: the folder in ``NUMBA_QK_GGML_LIB`` (``libggml-base.so`` + ``libggml-cpu.so``, e.g. a
``-march=native`` build), else the ``libggml-python`` wheel; the first line printed says which,
with its version and CPU features.  ggml's matvec is measured in every weight layout it offers
for the type (``GGML.weight_bufts``: its plain CPU buffer and each extra buffer type that converts
the type, e.g. AMX, CPU_REPACK -- the layouts llama.cpp picks from), as bench/compare.py does; a
layout counts only if its output is finite and agrees with numba_qk's (relative max error
< 1e-5; an unsupported layout gives NaN or garbage), and each ggml cell names the fastest valid
layout, the others in brackets.  Everything printed also goes to ``--out`` (default
bench/RESULTS_kquants.md) under a machine header (CPU, ISA, ggml build features, date, load).

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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_bridge  # noqa: E402
from numba_qk.kernels.simd import base as _simd  # noqa: E402

NAMES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
FP4_NAMES = ("mxfp4", "nvfp4")  # ggml's FP4 records (activations Q8_0): bench/compare_mxrec.py
LAYOUT_RTOL = 1e-5  # a ggml layout whose output is further than this from ours is not counted
LINES: list[str] = []  # everything printed, for the results file


def out(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def layouts(g) -> "callable":
    """``type_id -> [buft, ...]``: ggml's weight layouts for a type (None: the plain graph of
    a ggml without the backend registry)."""
    return lambda type_id: (g.weight_bufts(type_id) or [None]) if g.dev is not None else [None]


def layout_name(buft) -> str:
    return {None: "plain", "CPU": "CPU"}.get(buft, buft)


def rel_err(y, ref) -> float:
    y = np.asarray(y, np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.max(np.abs(y - ref)) / max(np.max(np.abs(ref)), 1e-30))


def ggml_cell(times: dict, rejected: dict) -> str:
    """'0.72 AMX [CPU 1.29; CPU_REPACK rejected: rel 1e+00]' from layout -> ms."""
    if not times:
        return "n/a"
    win = min(times, key=times.get)
    others = [f"{layout_name(k)} {v:.2f}" for k, v in times.items() if k != win]
    others += [f"{layout_name(k)} rejected ({why})" for k, why in rejected.items()]
    return f"{times[win]:.2f} {layout_name(win)}" + (f" [{'; '.join(others)}]" if others else "")


def load_ggml():
    libdir = os.environ.get("NUMBA_QK_GGML_LIB")
    if libdir:
        g = ggml_bridge.load_dir(libdir)
        label = f"native ggml {g.version} from NUMBA_QK_GGML_LIB={libdir}"
    else:
        g = ggml_bridge.load()
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
    out(f"\ngguf-py with and without numba_qk.gguf.accelerate_gguf_py() ({n:,} values, ms)")
    out("| type | dequantize gguf-py | accelerated | speedup | quantize gguf-py | accelerated | "
          "speedup | same bytes/values |")
    out("| --- | --- | --- | --- | --- | --- | --- | --- |")
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
        out(f"| {fmt.name} | {d0:.1f} | {d1:.2f} | {d0 / d1:.1f}x | {qtxt} | {q1:.1f} | {qsp} | "
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
    ap.add_argument("--out", default=str(HERE / "RESULTS_kquants.md"),
                    help="results file (what is printed, under a machine header)")
    args = ap.parse_args()
    if args.quick:
        args.rows = args.cols = 1024
        args.stream_mb, args.repeats, args.rounds = 64.0, 3, 1
    g, label = load_ggml()
    load_start = os.getloadavg()[0]
    out(f"ggml: {label}")
    out(f"numba_qk: SIMD avx2={_simd.HAVE_AVX2} avx512bw={_simd.HAVE_AVX512}"
        f"; 1 thread; load average {load_start:.2f} at start")
    rng = np.random.default_rng(0)
    rows, cols = args.rows, args.cols
    x = rng.standard_normal(cols).astype(np.float32)
    lay = layouts(g)
    out(f"\nmatvec {rows}x{cols}, ms per call (ratio = ggml / numba_qk; > 1: numba_qk faster; "
        f"ggml: its fastest valid weight layout, the others in brackets)")
    out("| format | hot ours | hot ggml | ratio | streamed ours | streamed ggml | ratio | "
        "matrices | rel. diff |")
    out("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    extra = []
    for name in args.formats.split(","):
        fmt = getattr(qk.quant, name)
        n = fmt.block_size
        vals = rng.standard_normal((rows * cols // n, n)).astype(np.float32)
        w = qk.quantize(vals, format=fmt).reshape(rows, cols // n, fmt.block_bytes)
        n_stream = max(2, int(np.ceil(args.stream_mb * 1e6 / w.nbytes)))
        ours = lambda w=w: qk.matmul(w, x, lhs_format=fmt, threads=1)  # noqa: E731
        y_ours = ours().astype(np.float64)
        hot_o = best(ours, args.repeats)
        hot_g, rejected, rels = {}, {}, {}
        for buft in lay(fmt.ggml_type):
            try:
                mv = g.matvec(w, threads=1, type_id=fmt.ggml_type, buft=buft)
            except (MemoryError, KeyError) as e:
                rejected[buft] = f"{type(e).__name__}"
                continue
            rel = rel_err(mv(x), y_ours)
            if not rel < LAYOUT_RTOL:
                rejected[buft] = f"rel. diff {rel:.1e}"
                continue
            rels[buft] = rel
            hot_g[buft] = best(lambda mv=mv: mv(x), args.repeats)
            del mv
        # streamed: distinct copies (values do not change the work), ours first, then each
        # valid ggml layout (ggml copies the weights into its own buffers, so they are built
        # from w; the ours copies are freed first)
        ws = [w.copy() for _ in range(n_stream)]
        st_o = round_robin([lambda w=wi: qk.matmul(w, x, lhs_format=fmt, threads=1)
                            for wi in ws], args.rounds)
        del ws
        st_g = {}
        for buft in hot_g:
            mvs = [g.matvec(w, threads=1, type_id=fmt.ggml_type, buft=buft)
                   for _ in range(n_stream)]
            st_g[buft] = round_robin([lambda m=m: m(x) for m in mvs], args.rounds)
            del mvs
        rel = max(rels.values()) if rels else float("nan")
        bh = min(hot_g.values()) if hot_g else float("nan")
        bs = min(st_g.values()) if st_g else float("nan")
        out(f"| {fmt.name} | {hot_o:.2f} | {ggml_cell(hot_g, rejected)} | {bh / hot_o:.2f} | "
            f"{st_o:.2f} | {ggml_cell(st_g, rejected)} | {bs / st_o:.2f} | "
            f"{n_stream} x {w.nbytes / 1e6:.1f} MB | {rel:.1e} |")
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
    out("\nencode 1 M values (ms) and dequantize the whole matrix (ms)")
    out("| format | encode ours | ggml _ref | ggml/ours | equal blocks | dequantize ours | "
          "gguf-py | gguf-py/ours | ggml | ggml/ours |")
    out("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, eo, eg, same, nb, do, dp, dg in extra:
        out(f"| {name} | {eo:.2f} | {eg:.2f} | {eg / eo:.2f} | {same}/{nb} | {do:.2f} | "
              f"{dp:.1f} | {dp / do:.1f} | {dg:.2f} | {dg / do:.2f} |")
    gguf_py_section(args, rng, args.gguf_py_formats.split(",") if args.gguf_py_formats else None)
    out(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    write_results(args, g, label, load_start)
    return 0


def write_results(args, g, label, load_start) -> None:
    """``args.out``: a machine header (as bench/compare.py's) and the tables printed above."""
    from compare import machine

    info = machine()
    info["load average (1 min) at start / end"] = (f"{load_start:.2f} / "
                                                   f"{os.getloadavg()[0]:.2f}")
    info["ggml"] = label
    if g.build_features:
        info["ggml build (ggml_backend_get_features)"] = ", ".join(
            k if v == "1" else f"{k}={v}" for k, v in g.build_features.items())
    if g.extra_bufts:
        info["ggml extra buffer types"] = ", ".join(g.extra_bufts)
    argv, skip = [], False
    for a in sys.argv[1:]:  # the command line, without --out and its value
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        argv.append(a)
    cmd = " ".join(["python", "bench/" + Path(sys.argv[0]).name] + argv)
    text = (f"# numba_qk vs ggml, 1 thread: {args.formats}\n\nGenerated by `{cmd}`"
            f"{' (NUMBA_QK_GGML_LIB set)' if os.environ.get('NUMBA_QK_GGML_LIB') else ''}.\n\n"
            "## Machine\n" + "\n".join(f"- {k}: {v}" for k, v in info.items())
            + "\n\n## Results (1 thread)\n" + "\n".join(LINES) + "\n")
    Path(args.out).write_text(text)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
