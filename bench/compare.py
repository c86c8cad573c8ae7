"""Side-by-side speed comparison of numba_qk and the baselines a user would pick instead.

    python bench/compare.py            # prints the table and writes bench/RESULTS.md
    python bench/compare.py --quick    # fewer repeats, no DRAM-streamed rows

Everything runs in this one process, best of several repeats, after a warm-up call (compile).
Baselines: numpy f32 on dequantized weights, gguf-py's numpy ``dequantize`` + matvec, and ggml's
own kernels through ``libggml-python`` (ctypes) when that package is installed (skipped with a
note when not).  First-call times are measured in fresh subprocesses: cold (empty numba cache)
and warm (cache on disk).  "DRAM" rows cycle through copies of the weights totalling more than
twice the last-level cache, so every call streams its weights from memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numba_qk as qk  # noqa: E402
from numba_qk.kernels import dot_q4_k_q8_k, quantize_q8_k  # noqa: E402

from numba_qk import _ggml_ctypes as ggml_ctypes  # noqa: E402
from _common import activations, q4_k_weights  # noqa: E402

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
REPEAT = 7
MIN_TIME = 0.2


def best(fn, min_time=None, repeat=None) -> float:
    """Best per-call seconds over ``repeat`` batches, each about ``min_time / 5`` long."""
    min_time = MIN_TIME if min_time is None else min_time
    repeat = REPEAT if repeat is None else repeat
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_time / 5 or n >= 1 << 20:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times)


def cycling(fns):
    """One callable that runs the next of ``fns`` each time (DRAM-streamed rows)."""
    state = {"i": 0}

    def run():
        fns[state["i"] % len(fns)]()
        state["i"] += 1
    return run


FIRST_CALL = r"""
import time, json
t0 = time.perf_counter()
import numpy as np
import numba_qk as qk
t1 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32)
w = np.zeros((16, 144), np.uint8)
t2 = time.perf_counter()
xq = qk.quantize(x, format=qk.quant.q8_k)
t3 = time.perf_counter()
qk.quantized_dot(w, xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
t4 = time.perf_counter()
qk.quantized_dot(w, xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
t5 = time.perf_counter()
qk.matmul(np.zeros((64, 16, 144), np.uint8), x.ravel(), lhs_format=qk.quant.q4_k)
t6 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, quantize_first_s=t3 - t2, dot_first_s=t4 - t3,
                      dot_second_s=t5 - t4, matmul_first_s=t6 - t5)))
"""


def first_call_times() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)

        def run():
            r = subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True,
                               text=True, check=True)
            return json.loads(r.stdout)
        return {"cold": run(), "warm": run()}


def machine() -> dict:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import llvmlite
    import llvmlite.binding as llb
    import numba

    from numba_qk.kernels._simd import HAVE_AVX2, HAVE_AVX512

    try:
        l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        l3 = "?"
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu} (LLVM target {llb.get_host_cpu_name()}), {os.cpu_count()} cores, L3 {l3}",
        "numba_qk kernels": ("AVX-512BW" if HAVE_AVX512 else "AVX2" if HAVE_AVX2 else "portable"),
        "python": platform.python_version(), "numba": numba.__version__,
        "llvmlite": llvmlite.__version__, "numpy": np.__version__, "numba_qk": qk.__version__,
    }
    try:
        from importlib.metadata import version
        info["gguf"] = version("gguf")
    except Exception:
        info["gguf"] = "not installed"
    return info


def read_bandwidth(arrays, threads):
    """GB/s of a plain vectorized read (sum of int64 words) cycling through ``arrays``, on 1
    and on ``threads`` threads."""
    from numba import njit, prange, set_num_threads

    @njit(nogil=True, cache=False)
    def total(a):
        s = 0
        for i in range(a.shape[0]):
            s += a[i]
        return s

    @njit(nogil=True, parallel=True, cache=False)
    def total_par(a, nchunks):
        step = (a.shape[0] + nchunks - 1) // nchunks
        parts = np.zeros(nchunks, np.int64)
        for c in prange(nchunks):
            parts[c] = total(a[c * step: min(a.shape[0], (c + 1) * step)])
        return parts.sum()

    words = [a.reshape(-1).view(np.int64) for a in arrays]
    one = best(cycling([lambda v=v: total(v) for v in words]), repeat=3)
    set_num_threads(threads)
    many = best(cycling([lambda v=v: total_par(v, threads) for v in words]), repeat=3)
    return [words[0].nbytes / one / 1e9, words[0].nbytes / many / 1e9]


def fmt_t(s: float) -> str:
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, work, ours, t_ours, base="", t_base=None, nbytes=None):
        self.rows.append((work, ours, t_ours, base, t_base, nbytes))

    def markdown(self) -> str:
        out = ["| work | numba_qk | time | GB/s | baseline | time | ratio |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for work, ours, t, base, tb, nbytes in self.rows:
            gbs = f"{nbytes / t / 1e9:.1f}" if nbytes else ""
            ratio = f"**{t / tb:.2f}x**" if tb else ""
            out.append(f"| {work} | {ours} | {fmt_t(t)} | {gbs} | {base} | "
                       f"{fmt_t(tb) if tb else ''} | {ratio} |")
        return "\n".join(out)


def main(argv=None) -> int:
    global REPEAT, MIN_TIME
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, skip DRAM rows")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="results file")
    args = ap.parse_args(argv)
    if args.quick:
        REPEAT, MIN_TIME = 3, 0.05
    ncores = os.cpu_count() or 1
    tab = Table()
    notes: list[str] = ["ratio = numba_qk time / baseline time (below 1: numba_qk is faster)."]
    ggml = ggml_ctypes.load()
    if ggml is None:
        notes.append("libggml-python is not installed: ggml rows skipped "
                     "(pip install libggml-python to include them).")
    else:
        notes.append("ggml's Q8_K quantizer uses its own numerics (iscale = -128/max), so its "
                     "results differ from numba_qk's canonical ones; the times compare the work.")
    try:
        import gguf.quants as gq
        from gguf import GGMLQuantizationType
    except ImportError:
        gq = None
        notes.append("gguf (gguf-py) is not installed: its dequantize baseline is skipped.")

    # --- Q8_K quantize, 1M floats
    x = activations(4096)
    out = np.empty((4096, 292), np.uint8)
    t_q = best(lambda: qk.quantize(x, format=Q8, out=out))
    if ggml:
        out2 = np.empty((4096, 292), np.uint8)
        tab.add("Q8_K quantize, 1M floats", "quantize", t_q, "ggml quantize_row_q8_K",
                best(lambda: ggml.quantize_q8_k(x, out2)), x.nbytes)
    else:
        tab.add("Q8_K quantize, 1M floats", "quantize", t_q, nbytes=x.nbytes)

    # --- Q4_K quantize (ggml's reference quantizer, bit for bit), 1M floats
    out4 = np.empty((4096, 144), np.uint8)
    t_q4 = best(lambda: qk.quantize(x, format=Q4, out=out4), repeat=3)
    if ggml:
        tab.add("Q4_K quantize, 1M floats", "quantize (= ggml's _ref)", t_q4,
                "ggml quantize_row_q4_K_ref (+ ctypes)",
                best(lambda: ggml.quantize_ref(ggml_ctypes.GGML_TYPE_Q4_K, x), repeat=3), x.nbytes)
    else:
        tab.add("Q4_K quantize, 1M floats", "quantize (= ggml's _ref)", t_q4, nbytes=x.nbytes)

    # --- single dots
    for g in (16, 256):
        w = q4_k_weights(1, g)[0]
        xq = qk.quantize(activations(g), format=Q8)
        wf = qk.dequantize(w, Q4).ravel()
        xf = qk.dequantize(xq, Q8).ravel()
        t_np = best(lambda: np.dot(wf, xf))
        tab.add(f"quantized_dot G={g}", "quantized_dot (API)",
                best(lambda: qk.quantized_dot(w, xq, lhs_format=Q4, rhs_format=Q8)),
                "numpy f32 dot (dequantized)", t_np, w.nbytes)
        t_ker = best(lambda: dot_q4_k_q8_k(w, xq))
        tab.add(f"quantized_dot G={g}", "kernel dot_q4_k_q8_k", t_ker,
                "numpy f32 dot (dequantized)", t_np, w.nbytes)
        if ggml:
            tab.add(f"quantized_dot G={g}", "kernel dot_q4_k_q8_k", t_ker,
                    "ggml vec_dot_q4_K_q8_K (+ ctypes call)",
                    best(lambda: ggml.vec_dot_q4_k_q8_k(w, xq)), w.nbytes)

    # --- matvec / gemm, weights hot in cache
    shapes = [(4096, 4096), (4096, 14336)]
    for rows, cols in shapes:
        g = cols // 256
        w = q4_k_weights(rows, g)
        xv = activations(g).ravel()
        work = f"matvec Q4_K {rows}x{cols}, f32 x"
        t1 = best(lambda: qk.matmul(w, xv, lhs_format=Q4, threads=1))
        tn = best(lambda: qk.matmul(w, xv, lhs_format=Q4, threads=None))
        if rows == 4096 and cols == 4096:
            wd = qk.dequantize(w.reshape(-1, 144), Q4).reshape(rows, -1)
            tab.add(work, "matmul", t1, "numpy f32 matvec (dequantized)",
                    best(lambda: wd @ xv), w.nbytes)
            del wd
            if gq is not None:
                w2 = w.reshape(rows, -1)
                tab.add(work, "matmul", t1, "gguf-py dequantize + matvec",
                        best(lambda: gq.dequantize(w2, GGMLQuantizationType.Q4_K) @ xv,
                             min_time=0.5, repeat=2), w.nbytes)
        if ggml:
            mv1 = ggml.matvec(w, 1)
            tab.add(work, "matmul", t1, "ggml mul_mat, 1 thread", best(lambda: mv1(xv)), w.nbytes)
            mvn = ggml.matvec(w, ncores)
            tab.add(work, f"matmul threads={ncores}", tn, f"ggml mul_mat, {ncores} threads",
                    best(lambda: mvn(xv)), w.nbytes)
            del mv1, mvn
        tab.add(work, f"matmul threads={ncores}", tn, "numba_qk matmul, 1 thread", t1, w.nbytes)
        xq1 = qk.quantize(xv.reshape(g, 256), format=Q8)
        tab.add(f"gemv {rows}x{cols} (Q8_K x given)", f"gemv threads={ncores}",
                best(lambda: qk.gemv(w, xq1, lhs_format=Q4, rhs_format=Q8, threads=None)),
                "numba_qk gemv, 1 thread",
                best(lambda: qk.gemv(w, xq1, lhs_format=Q4, rhs_format=Q8)), w.nbytes)

        # gemm, batch 8
        xb = np.stack([activations(g, seed=s).ravel() for s in range(8)])
        xq8 = qk.quantize(xb.reshape(-1, 256), format=Q8).reshape(8, g, 292)
        t_gemm = best(lambda: qk.gemm(w, xq8, lhs_format=Q4, rhs_format=Q8))
        t_gemv = best(lambda: qk.gemv(w, xq1, lhs_format=Q4, rhs_format=Q8))
        work_b = f"gemm batch 8, {rows}x{cols}"
        tab.add(work_b, "gemm (Q8_K x given)", t_gemm, "8 x numba_qk gemv", 8 * t_gemv, w.nbytes)
        if ggml:
            mv1 = ggml.matvec(w, 1)
            t8 = best(lambda: [mv1(xb[k]) for k in range(8)])
            tab.add(work_b, "gemm (Q8_K x given)", t_gemm, "8 x ggml mul_mat matvec", t8, w.nbytes)
            mvb = ggml.matvec(w, 1, batch=8)
            t_m8 = best(lambda: qk.matmul(w, xb, lhs_format=Q4))
            tab.add(work_b, "matmul, f32 x [8, K]", t_m8, "ggml mul_mat [8, K], 1 thread",
                    best(lambda: mvb(xb)), w.nbytes)
            del mv1, mvb

        # DRAM-streamed
        if not args.quick:
            copies = max(2, int(2.2 * 32 * 2**20 / w.nbytes) + 1)
            ws = [w.copy() for _ in range(copies)]
            work_d = f"matvec Q4_K {rows}x{cols}, DRAM-streamed ({copies} copies)"
            t_d1 = best(cycling([lambda w_=w_: qk.matmul(w_, xv, lhs_format=Q4) for w_ in ws]))
            t_dn = best(cycling([lambda w_=w_: qk.matmul(w_, xv, lhs_format=Q4, threads=None)
                                 for w_ in ws]))
            if ggml:
                mvs = [ggml.matvec(w_, 1) for w_ in ws]
                tab.add(work_d, "matmul", t_d1, "ggml mul_mat, 1 thread",
                        best(cycling([lambda m=m: m(xv) for m in mvs])), w.nbytes)
                del mvs
                mvs = [ggml.matvec(w_, ncores) for w_ in ws]
                tab.add(work_d, f"matmul threads={ncores}", t_dn, f"ggml mul_mat, {ncores} threads",
                        best(cycling([lambda m=m: m(xv) for m in mvs])), w.nbytes)
                del mvs
            else:
                tab.add(work_d, "matmul", t_d1, nbytes=w.nbytes)
                tab.add(work_d, f"matmul threads={ncores}", t_dn, nbytes=w.nbytes)
            notes.append(f"memory read bandwidth over {copies} x {w.nbytes / 2**20:.0f} MiB "
                         f"(plain vectorized read, 1 / {ncores} threads): "
                         + " / ".join(f"{v:.1f}" for v in read_bandwidth(ws, ncores)) + " GB/s")
            del ws

    # --- ggml's legacy block formats: matvec 4096x4096 vs ggml, codecs vs gguf-py and ggml
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(4096).astype(np.float32)
    x1m = rng.standard_normal((32768, 32)).astype(np.float32)
    for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"):
        fmt = getattr(qk.quant, name)
        w = qk.quantize(rng.standard_normal((4096 * 128, 32)).astype(np.float32),
                        format=fmt).reshape(4096, 128, -1)
        t1 = best(lambda: qk.matmul(w, xv, lhs_format=fmt))
        work = f"matvec {fmt.name} 4096x4096, f32 x"
        if ggml:
            mv = ggml.matvec(w, 1, type_id=fmt.ggml_type)
            tab.add(work, "matmul", t1, "ggml mul_mat, 1 thread", best(lambda: mv(xv)), w.nbytes)
            del mv
        else:
            tab.add(work, "matmul", t1, nbytes=w.nbytes)
        t_q = best(lambda: qk.quantize(x1m, format=fmt))
        recs = qk.quantize(x1m, format=fmt)
        t_d = best(lambda: qk.dequantize(recs, fmt))
        if gq is not None:
            gt = getattr(GGMLQuantizationType, fmt.name)
            tab.add(f"{fmt.name} quantize, 1M floats", "quantize", t_q, "gguf-py quantize",
                    best(lambda: gq.quantize(x1m, gt), repeat=2), x1m.nbytes)
            tab.add(f"{fmt.name} dequantize, 1M values", "dequantize", t_d, "gguf-py dequantize",
                    best(lambda: gq.dequantize(recs, gt), repeat=2), recs.nbytes)
        if ggml:
            tab.add(f"{fmt.name} quantize, 1M floats", "quantize", t_q,
                    "ggml quantize_row_*_ref (+ ctypes)",
                    best(lambda: ggml.quantize_ref(fmt.ggml_type, x1m)), x1m.nbytes)

    first = first_call_times()
    info = machine()
    if ggml:
        info["libggml-python"] = ggml.version + " (ggml CPU features: " + ", ".join(
            k for k, v in ggml.features.items() if v) + ")"
    fc = ["| in a fresh process | cold cache (compiles) | warm cache |", "| --- | --- | --- |"]
    for key, label in (("import_s", "import numba_qk"), ("quantize_first_s", "first quantize"),
                       ("dot_first_s", "first quantized_dot (G=16)"),
                       ("dot_second_s", "second quantized_dot (G=16)"),
                       ("matmul_first_s", "first matmul (64x4096)")):
        fc.append(f"| {label} | {fmt_t(first['cold'][key])} | {fmt_t(first['warm'][key])} |")
    mach = "\n".join(f"- {k}: {v}" for k, v in info.items())
    report = (f"# numba_qk benchmark results\n\nGenerated by `python bench/compare.py`"
              f"{' --quick' if args.quick else ''}.\n\n## Machine\n{mach}\n\n"
              f"## Speed (single thread unless stated; best of repeats; GB/s of quantized weight "
              f"bytes or f32 input)\n{tab.markdown()}\n\n## Compile / first-call time\n"
              + "\n".join(fc) + "\n\n## Notes\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    print(report)
    Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
