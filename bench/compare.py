"""Side-by-side speed comparison of numba_qk and the baselines a user would pick instead.

    python bench/compare.py            # prints the table and writes bench/RESULTS.md

Everything runs in this one process (single thread unless stated), best of several repeats,
after a warm-up call (compile).  Baselines: numpy f32 on dequantized weights, gguf-py's numpy
``dequantize`` + matvec, and ggml's own kernels through ``libggml-python`` (ctypes) when that
package is installed (skipped with a note when not).  First-call times are measured in fresh
subprocesses: cold (empty numba cache) and warm (cache on disk).
"""

from __future__ import annotations

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
from numba_qk.kernels import dot_q4_k_q8_k, gemv_q4_k_q8_k, quantize_q8_k  # noqa: E402

import ggml_ctypes  # noqa: E402
from _common import activations, q4_k_weights  # noqa: E402

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def best(fn, min_time=0.2, repeat=5) -> float:
    """Best per-call seconds over ``repeat`` batches, each at least ``min_time`` long."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time / 5 or n >= 1 << 20:
            break
        n *= 2
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times)


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
t5 = time.perf_counter()
qk.quantized_dot(w, xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
t6 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, quantize_first_s=t3 - t2, dot_first_s=t4 - t3,
                      dot_second_s=t6 - t5)))
"""


def first_call_times() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        run = lambda: json.loads(subprocess.run(  # noqa: E731
            [sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True,
            check=True).stdout)
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
    import numba

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "numba": numba.__version__, "llvmlite": llvmlite.__version__, "numpy": np.__version__,
        "numba_qk": qk.__version__,
    }
    try:
        from importlib.metadata import version
        info["gguf"] = version("gguf")
    except Exception:
        info["gguf"] = "not installed"
    return info


def fmt_t(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e3:.3f} ms"


def main() -> int:
    rows_out: list[tuple[str, str, float, str, float | None]] = []
    notes: list[str] = []
    ggml = ggml_ctypes.load()
    if ggml is None:
        notes.append("libggml-python is not installed: ggml columns skipped "
                     "(pip install libggml-python to include them).")
    gq = None
    try:
        import gguf.quants as gq
        from gguf import GGMLQuantizationType
    except ImportError:
        notes.append("gguf (gguf-py) is not installed: its dequantize baseline is skipped.")

    def add(work, ours_name, ours_t, base_name, base_t):
        rows_out.append((work, ours_name, ours_t, base_name, base_t))

    # --- quantize, 1M floats
    groups = 4096
    x = activations(groups)
    out = np.empty((groups, 292), np.uint8)
    t_q = best(lambda: qk.quantize(x, format=Q8, out=out))
    t_qk = best(lambda: quantize_q8_k(x, out))
    add("Q8_K quantize, 1M floats", "qk.quantize", t_q, "", None)
    add("Q8_K quantize, 1M floats", "kernel quantize_q8_k", t_qk, "", None)
    if ggml:
        out2 = np.empty((groups, 292), np.uint8)
        add("Q8_K quantize, 1M floats", "qk.quantize", t_q, "ggml quantize_row_q8_K",
            best(lambda: ggml.quantize_q8_k(x, out2)))

    # --- single dots
    for g in (16, 256):
        w = q4_k_weights(1, g)[0]
        xq = qk.quantize(activations(g), format=Q8)
        t_api = best(lambda: qk.quantized_dot(w, xq, lhs_format=Q4, rhs_format=Q8))
        t_ker = best(lambda: dot_q4_k_q8_k(w, xq))
        wf = qk.dequantize(w, Q4).ravel()
        xf = qk.dequantize(xq, Q8).ravel()
        add(f"quantized_dot G={g}", "qk.quantized_dot", t_api, "numpy f32 dot (dequantized)",
            best(lambda: np.dot(wf, xf)))
        add(f"quantized_dot G={g}", "kernel dot_q4_k_q8_k", t_ker, "numpy f32 dot (dequantized)",
            best(lambda: np.dot(wf, xf)))
        if ggml:
            add(f"quantized_dot G={g}", "kernel dot_q4_k_q8_k", t_ker,
                "ggml vec_dot_q4_K_q8_K (+ctypes call)", best(lambda: ggml.vec_dot_q4_k_q8_k(w, xq)))

    # --- matvec 4096 x 4096, weights in cache-ish (8 MiB of Q4_K)
    rows, g = 4096, 16
    w = q4_k_weights(rows, g)
    xf = activations(g)
    xq = qk.quantize(xf, format=Q8)
    y = np.empty(rows, np.float32)
    t_gemv = best(lambda: gemv_q4_k_q8_k(w, xq, y))

    def ours_matvec():
        quantize_q8_k(xf, xq)
        gemv_q4_k_q8_k(w, xq, y)
    t_mv = best(ours_matvec)
    wd = qk.dequantize(w.reshape(-1, 144), Q4).reshape(rows, -1)
    xv = xf.ravel()
    work = "matvec Q4_K 4096x4096, f32 x"
    add(work, "quantize + gemv kernel", t_mv, "numpy f32 matvec (dequantized)",
        best(lambda: wd @ xv))
    if gq is not None:
        w2 = w.reshape(rows, -1)
        add(work, "quantize + gemv kernel", t_mv, "gguf-py dequantize + matvec",
            best(lambda: gq.dequantize(w2, GGMLQuantizationType.Q4_K) @ xv, min_time=0.5, repeat=2))
    if ggml:
        mv = ggml.matvec(w, 1)
        add(work, "quantize + gemv kernel", t_mv, "ggml mul_mat (1 thread)", best(lambda: mv(xv)))
    add("gemv 4096x4096, Q8_K x given", "gemv kernel", t_gemv, "", None)

    first = first_call_times()
    info = machine()
    if ggml:
        info["libggml-python"] = ggml.version + " (" + ", ".join(
            k for k, v in ggml.features.items() if v) + ")"

    lines = ["| work | numba_qk | time | baseline | time | ratio (numba_qk / baseline) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for work, on, ot, bn, bt in rows_out:
        ratio = f"{ot / bt:.2f}x" if bt else ""
        lines.append(f"| {work} | {on} | {fmt_t(ot)} | {bn} | {fmt_t(bt) if bt else ''} | {ratio} |")
    table = "\n".join(lines)
    fc = ["| first call in a fresh process | cold cache | warm cache |", "| --- | --- | --- |"]
    for key, label in (("import_s", "import numba_qk"), ("quantize_first_s", "first quantize"),
                       ("dot_first_s", "first quantized_dot (G=16)"),
                       ("dot_second_s", "second quantized_dot (G=16)")):
        fc.append(f"| {label} | {fmt_t(first['cold'][key])} | {fmt_t(first['warm'][key])} |")
    fc_table = "\n".join(fc)
    mach = "\n".join(f"- {k}: {v}" for k, v in info.items())
    note_text = "\n".join(f"- {n}" for n in notes) or "- none"
    report = (f"# numba_qk benchmark results\n\nGenerated by `python bench/compare.py`.\n\n"
              f"## Machine\n{mach}\n\n## Speed (single thread, best of repeats)\n{table}\n\n"
              f"## Compile / first-call time\n{fc_table}\n\n## Notes\n{note_text}\n")
    print(report)
    (HERE / "RESULTS.md").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
