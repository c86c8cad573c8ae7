"""Spec 004 casts side by side: numba_qk.astype vs numkong.astype vs ml_dtypes' astype.

    python bench/compare_lowp.py                 # 16 M elements; writes bench/RESULTS_lowp.md
    python bench/compare_lowp.py --quick --n 1048576 --no-write

Every row casts with a preallocated ``out=`` in one process, best of several repeats after a
warm-up call (compile).  Rows: f32 -> T and T -> f32 for T in {bf16, f16, e4m3, e5m2, e2m3,
e3m2, e2m1, i4}, 1 thread; a strided source (every other column of a 2-d array); two Python
threads casting concurrently (GIL released?); ``threads=2``.  numkong 7.8.6 has no e2m1 cast
(shown as "--").  The issue's targets: ratio to numkong <= 1.0, >= 10x ml_dtypes, strided >= 5x
numkong's strided path, two Python threads >= 1.6x one, threads=2 >= 1.7x.
Take final figures on a quiet machine: other processes skew every ratio.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import threading
import time
from pathlib import Path

import numpy as np

import numba_qk as qk

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None
try:
    import numkong as nk
except ImportError:  # pragma: no cover
    nk = None

HERE = Path(__file__).resolve().parent
TYPES = [("bf16", "bfloat16", "bfloat16"), ("f16", "float16", None), ("e4m3", "e4m3", "float8_e4m3fn"),
         ("e5m2", "e5m2", "float8_e5m2"), ("e2m3", "e2m3", "float6_e2m3fn"),
         ("e3m2", "e3m2", "float6_e3m2fn"), ("e2m1", None, "float4_e2m1fn"), ("i4", "int4", "int4")]


def best(fn, repeat):
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def ml_dtype(name):
    return np.float16 if name is None else getattr(ml_dtypes, name)


def rows(n, repeat):
    x = (np.random.default_rng(0).standard_normal(n) * 3).astype(np.float32)
    out = []
    for qname, nkname, mlname in TYPES:
        t = qk.from_name(qname)
        q_out = qk.astype(x, t)
        f_out = np.empty(n, np.float32)
        r = {"type": qname}
        r["qk_enc"] = best(lambda: qk.astype(x, t, out=q_out), repeat)
        r["qk_dec"] = best(lambda: qk.astype(q_out, qk.f32, out=f_out), repeat)
        if nk is not None and nkname is not None:
            nk_out = nk.astype(x, nkname)
            nk_f = nk.astype(nk_out, "float32")
            r["nk_enc"] = best(lambda: nk.astype(x, nkname, out=nk_out), repeat)
            r["nk_dec"] = best(lambda: nk.astype(nk_out, "float32", out=nk_f), repeat)
        if ml_dtypes is not None:
            dt = ml_dtype(mlname)
            ml_out = np.empty(n, dt)
            ml_src = x.astype(dt)
            r["ml_enc"] = best(lambda: np.copyto(ml_out, x, casting="unsafe"), max(2, repeat // 3))
            r["ml_dec"] = best(lambda: np.copyto(f_out, ml_src, casting="unsafe"), max(2, repeat // 3))
        out.append(r)
    return out


def strided_rows(n, repeat):
    base = (np.random.default_rng(1).standard_normal((n // 2048, 4096)) * 3).astype(np.float32)
    xs = base[:, ::2]                                    # n elements, every other column
    out = []
    for qname, nkname, _ in TYPES[:4]:
        t = qk.from_name(qname)
        q_out = qk.astype(xs, t)
        r = {"type": qname, "qk": best(lambda: qk.astype(xs, t, out=q_out), repeat)}
        if nk is not None and nkname is not None:
            nk_out = nk.astype(xs, nkname)
            r["nk"] = best(lambda: nk.astype(xs, nkname, out=nk_out), repeat)
        out.append(r)
    return out


def concurrency(n, repeat):
    xs = [(np.random.default_rng(i).standard_normal(n) * 3).astype(np.float32) for i in range(2)]
    outs = [qk.astype(x, qk.bf16) for x in xs]

    def two():
        ths = [threading.Thread(target=qk.astype, args=(xs[i], qk.bf16), kwargs={"out": outs[i]})
               for i in range(2)]
        [th.start() for th in ths]
        [th.join() for th in ths]

    def threads2():
        qk.astype(xs[0], qk.bf16, out=outs[0], threads=2)

    def single():
        qk.astype(xs[0], qk.bf16, out=outs[0])

    # interleaved rounds (one of each per round, best of each): a drift of the machine's speed
    # hits the three alike, so the speedups compare like with like
    fns = {"one": single, "two": two, "t2": threads2}
    ts = {k: float("inf") for k in fns}
    for f in fns.values():
        f()
    for _ in range(max(repeat, 7)):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k] = min(ts[k], time.perf_counter() - t0)
    one, both, t2 = ts["one"], ts["two"], ts["t2"]
    return {"one": one, "two_python_threads": both, "threads2": t2,
            "py_threads_speedup": 2 * one / both, "threads2_speedup": one / t2}


def fmt(s):
    return "--" if s is None else f"{s * 1e3:.2f}"


def ratio(a, b):
    return "--" if a is None or b is None else f"{a / b:.2f}"


def table(n, repeat):
    lines = [f"## numba_qk.astype vs numkong / ml_dtypes ({n:,} elements, out=, 1 thread, ms)", "",
             "| cast | numba_qk | numkong | ml_dtypes | qk/nk | ml/qk |", "|---|---|---|---|---|---|"]
    for r in rows(n, repeat):
        for d, label in (("enc", f"f32 -> {r['type']}"), ("dec", f"{r['type']} -> f32")):
            q, k, m = r[f"qk_{d}"], r.get(f"nk_{d}"), r.get(f"ml_{d}")
            lines.append(f"| {label} | {fmt(q)} | {fmt(k)} | {fmt(m)} | {ratio(q, k)} | {ratio(m, q)} |")
    lines += ["", "### strided source (every other column), f32 -> T", "",
              "| cast | numba_qk | numkong | nk/qk |", "|---|---|---|---|"]
    for r in strided_rows(n, repeat):
        lines.append(f"| f32 -> {r['type']} | {fmt(r['qk'])} | {fmt(r.get('nk'))} | "
                     f"{ratio(r.get('nk'), r['qk'])} |")
    c = concurrency(n, repeat)
    lines += ["", "### concurrency (f32 -> bf16)", "",
              f"- one call: {fmt(c['one'])} ms; two Python threads, one call each: "
              f"{fmt(c['two_python_threads'])} ms -> {c['py_threads_speedup']:.2f}x throughput",
              f"- threads=2: {fmt(c['threads2'])} ms -> {c['threads2_speedup']:.2f}x"]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    repeat = 3 if a.quick else 9
    head = [f"# spec 004 cast benchmarks", "",
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
            f"{platform.processor() or platform.machine()}; python {platform.python_version()}; "
            f"numpy {np.__version__}; ml_dtypes {getattr(ml_dtypes, '__version__', '--')}; "
            f"numkong {getattr(nk, '__version__', '--') if nk else '--'}", ""]
    text = "\n".join(head + table(a.n, repeat)) + "\n"
    print(text)
    if not a.no_write:
        (HERE / "RESULTS_lowp.md").write_text(text)


if __name__ == "__main__":
    main()
