"""Side-by-side speed comparison of numba_qk and the baselines a user would pick instead.

    python bench/compare.py --ggml-lib DIR   # or NUMBA_QK_GGML_LIB=DIR: a native ggml build
    python bench/compare.py --quick          # fewer repeats, no DRAM-streamed rows

ggml baseline: the folder named by ``--ggml-lib`` / ``NUMBA_QK_GGML_LIB`` (libggml-base.so and
libggml-cpu.so of a ggml built for this CPU, e.g. by ../shared/tools/build-native-ggml.sh), else
the prebuilt AVX2 wheel ``libggml-python`` (labelled as such), else none.  With a native build
every ggml row is the best of ggml's plain CPU buffer and each extra buffer type that converts
the weight type (CPU_REPACK, AMX) -- the layouts llama.cpp uses -- and names the winner.

Everything runs in this one process.  Each numba_qk / ggml pair is timed interleaved: batches of
calls alternate between the candidates, best batch of each wins, so a machine shared with other
work slows both sides alike.  "DRAM" rows cycle through distinct copies of the weights totalling
at least 4x the last-level cache (measured from sysfs), so every call streams its weights from
memory; the plain read bandwidth of that working set is printed beside them.  First-call times
are measured in fresh subprocesses: cold (empty numba cache) and warm (cache on disk).
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
from numba_qk import _threads  # noqa: E402
from numba_qk.kernels import dot_q4_k_q8_k, quantize_q8_k  # noqa: E402

from numba_qk.testing import ggml as ggml_ctypes  # noqa: E402
from _common import activations, q4_k_weights  # noqa: E402

GGML_PY_LABEL = "libggml-python (prebuilt AVX2 wheel, not a native build)"

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

    from numba_qk.kernels.simd.base import HAVE_AVX2, HAVE_AVX512

    try:
        l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        l3 = "?"
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split()
        isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                           "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]
    except (OSError, StopIteration):
        isa = ["?"]
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{cpu} (LLVM target {llb.get_host_cpu_name()}), {os.cpu_count()} cores, L3 {l3}",
        "CPU ISA (/proc/cpuinfo)": " ".join(isa),
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
    thread and on ``threads`` Python threads that each read their share of every array,
    free-running over all of them (nogil numba, no per-array hand-off), best of 3 passes."""
    import threading

    from numba import njit

    @njit(nogil=True, cache=False)
    def total(a):
        s = 0
        for i in range(a.shape[0]):
            s += a[i]
        return s

    words = [a.reshape(-1).view(np.int64) for a in arrays]
    one = best(cycling([lambda v=v: total(v) for v in words]), repeat=3)

    def share(k):
        for v in words:
            step = -(-v.shape[0] // threads)
            total(v[k * step:(k + 1) * step])

    many = float("inf")
    for _ in range(3):
        ths = [threading.Thread(target=share, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        many = min(many, (time.perf_counter() - t0) / len(words))
    return [words[0].nbytes / one / 1e9, words[0].nbytes / many / 1e9]


def _spin(stop):
    while not stop.is_set():
        pass


def contention_means(cands: dict, calls: int = 300) -> dict:
    """Mean seconds per call of each callable while one other process keeps a core busy (a
    spinning child process), calls interleaved one by one, the order reversed every other
    round so that neither candidate always follows the same one (means, not minima: a stalled
    call counts)."""
    import multiprocessing as mp

    stop = mp.Event()
    proc = mp.Process(target=_spin, args=(stop,))
    proc.start()
    time.sleep(0.3)
    try:
        for fn in cands.values():
            fn()
        ts = {k: [] for k in cands}
        order = list(cands.items())
        for i in range(calls):
            for k, fn in (order if i % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                fn()
                ts[k].append(time.perf_counter() - t0)
    finally:
        stop.set()
        proc.join()
    out = {k: float(np.mean(v)) for k, v in ts.items()}
    out.update({k + "_median": float(np.median(v)) for k, v in ts.items()})
    return out


def hot_read_ceiling(a) -> float:
    """GB/s of the fastest plain read of ``a`` while it stays resident in the caches
    (``np.bitwise_or.reduce`` over its 64-bit words, 1 thread)."""
    v = a.reshape(-1).view(np.uint64)
    return a.nbytes / best(lambda: np.bitwise_or.reduce(v), repeat=7) / 1e9


def fmt_t(s: float) -> str:
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


class Table:
    def __init__(self):
        self.rows = []

    def add(self, work, ours, t_ours, base="", t_base=None, nbytes=None, t_plain=None):
        self.rows.append((work, ours, t_ours, base, t_base, nbytes, t_plain))

    def markdown(self) -> str:
        out = ["| work | numba_qk | time | GB/s | baseline | time | ratio | ratio vs plain/"
               "CPU_REPACK |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for work, ours, t, base, tb, nbytes, tp in self.rows:
            gbs = f"{nbytes / t / 1e9:.1f}" if nbytes else ""
            ratio = f"**{t / tb:.2f}x**" if tb else ""
            rp = "" if tp is None else (f"{t / tp:.2f}x" if tp == tb else f"**{t / tp:.2f}x**")
            out.append(f"| {work} | {ours} | {fmt_t(t)} | {gbs} | {base} | "
                       f"{fmt_t(tb) if tb else ''} | {ratio} | {rp} |")
        return "\n".join(out)


def race(cands: dict, min_time=None, repeat=None) -> dict:
    """Best per-call seconds of each callable in ``cands``, timed interleaved: every round runs
    one batch of each candidate in turn (batch sizes calibrated to ~min_time/5 each)."""
    min_time = MIN_TIME if min_time is None else min_time
    repeat = REPEAT if repeat is None else repeat
    sizes = {}
    for name, fn in cands.items():
        fn()
        n = 1
        while True:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            if time.perf_counter() - t0 >= min_time / 5 or n >= 1 << 20:
                break
            n *= 2
        sizes[name] = n
    out = {name: float("inf") for name in cands}
    for _ in range(repeat):
        for name, fn in cands.items():
            n = sizes[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[name] = min(out[name], (time.perf_counter() - t0) / n)
    return out


def l3_bytes() -> int:
    try:
        txt = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1], 1)
        return int(txt.rstrip("KMG")) * mult
    except (OSError, ValueError):
        return 32 << 20


AMX_PROBE = r"""
import sys, numpy as np
from numba_qk.testing import ggml as G
g = G.load(sys.argv[1])
w = np.zeros((64, 1, 144), np.uint8)
m = g.matvec(w, 1, batch=32, type_id=G.GGML_TYPE_Q4_K, buft="AMX")
m(np.zeros((32, 256), np.float32))
print("ok")
"""


def amx_batches_work(libdir) -> bool:
    """Whether ggml's AMX buffer survives a batched mul_mat here (its tile instructions need
    kernel permission; in some VMs they fault).  Probed in a subprocess."""
    r = subprocess.run([sys.executable, "-c", AMX_PROBE, str(libdir)], capture_output=True,
                       text=True)
    return r.returncode == 0 and "ok" in r.stdout


class GGMLBase:
    """ggml's mul_mat for a weight array, as every layout worth measuring."""

    def __init__(self, g, native: bool, amx_batched: bool):
        self.g, self.native, self.amx_batched = g, native, amx_batched

    def layouts(self, type_id, batch):
        if not self.native or self.g.dev is None:
            return [None]
        return [b for b in self.g.weight_bufts(type_id) if b != "AMX" or batch <= 1
                or self.amx_batched]

    @staticmethod
    def label(buft, threads):
        name = {None: "mul_mat", "CPU": "mul_mat", "CPU_REPACK": "mul_mat (CPU_REPACK)",
                "AMX": "mul_mat (AMX buffer)"}.get(buft, f"mul_mat ({buft})")
        return f"ggml {name}, {threads} thr"

    def make(self, w, type_id, threads, batch, buft):
        return self.g.matvec(w, threads, batch=batch, type_id=type_id, buft=buft)


def pair_rows(tab, work, ours_label, ours_fn, gb, make_w, type_id, threads, batch, x, nbytes,
              streamed=None):
    """Time numba_qk against every ggml layout (each race interleaved), add one row with
    ggml's best; returns numba_qk's best time.  ``make_w`` gives the weights (a list of
    distinct copies when ``streamed``)."""
    results = {}
    t_ours = float("inf")
    for buft in (gb.layouts(type_id, batch) if gb else []):
        try:
            if streamed:
                mvs = [gb.make(w_, type_id, threads, batch, buft) for w_ in make_w]
                fn = cycling([lambda m=m: m(x) for m in mvs])
            else:
                mv = gb.make(make_w, type_id, threads, batch, buft)
                fn = lambda: mv(x)  # noqa: E731
        except (MemoryError, KeyError):
            continue
        r = race({"ours": ours_fn, "ggml": fn})
        t_ours = min(t_ours, r["ours"])
        results[buft] = r["ggml"]
        mvs = mv = fn = None  # noqa: F841  (free ggml's copy before the next layout)
    if not results:
        t_ours = race({"ours": ours_fn})["ours"]
        tab.add(work, ours_label, t_ours, nbytes=nbytes)
        return t_ours
    buft = min(results, key=results.get)
    others = ", ".join(f"{k or 'plain'} {fmt_t(v)}" for k, v in results.items() if k != buft)
    base = GGMLBase.label(buft, threads) + (f" [{others}]" if others else "")
    plain = [v for k, v in results.items() if k != "AMX"]
    tab.add(work, ours_label, t_ours, base, results[buft], nbytes,
            t_plain=min(plain) if plain else None)
    return t_ours


def main(argv=None) -> int:
    global REPEAT, MIN_TIME
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, skip DRAM rows")
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None,
                    help="folder of a native ggml build (libggml-base.so, libggml-cpu.so); "
                         "default $NUMBA_QK_GGML_LIB, else the libggml-python wheel")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="results file")
    args = ap.parse_args(argv)
    if args.quick:
        REPEAT, MIN_TIME = 3, 0.05
    load_before = os.getloadavg()
    ncores = os.cpu_count() or 1
    tab = Table()
    notes: list[str] = ["ratio = numba_qk time / baseline time (below 1: numba_qk is faster). "
                        "Each numba_qk/ggml pair is timed interleaved in one process (alternating "
                        "batches, best batch of each); a ggml row names the fastest of its "
                        "layouts and lists the others in brackets."]
    native = False
    ggml = None
    if args.ggml_lib:
        ggml = ggml_ctypes.load(args.ggml_lib)
        native = ggml is not None
        if ggml is None:
            notes.append(f"could not load ggml from {args.ggml_lib}; falling back to "
                         "libggml-python.")
    if ggml is None:
        ggml = ggml_ctypes.load()
        if ggml is not None:
            notes.append(f"ggml baseline: {GGML_PY_LABEL} -- not what llama.cpp users run; pass "
                         "--ggml-lib (or NUMBA_QK_GGML_LIB) with a native build.")
    if ggml is None:
        notes.append("no ggml found (--ggml-lib / NUMBA_QK_GGML_LIB, or pip install "
                     "libggml-python): ggml rows skipped.")
    else:
        notes.append("threads=2 rows run numba_qk's pool with its adaptive thread count off "
                     "(ggml's OpenMP workers, timed interleaved in this process, spin after "
                     "their calls and would count as busy cores); the 'one core kept busy' rows "
                     "run the default adaptive count.")
        notes.append("ggml's Q8_K quantizer uses its own numerics (iscale = -128/max), so its "
                     "results differ from numba_qk's canonical ones; the times compare the work.")
    amx_batched = False
    if native and "AMX" in ggml.extra_bufts:
        amx_batched = amx_batches_work(args.ggml_lib)
        if not amx_batched:
            notes.append("ggml's AMX buffer type faults (SIGILL: AMX tile instructions are not "
                         "permitted in this VM) on batched mul_mat; it is measured for matvec "
                         "only (batch 1 takes its AVX512-VNNI path).")
    gb = GGMLBase(ggml, native, amx_batched) if ggml else None
    try:
        import gguf.quants as gq
        from gguf import GGMLQuantizationType
    except ImportError:
        gq = None
        notes.append("gguf (gguf-py) is not installed: its dequantize baseline is skipped.")

    # --- Q8_K quantize, 1M floats
    x = activations(4096)
    out = np.empty((4096, 292), np.uint8)
    if ggml:
        out2 = np.empty((4096, 292), np.uint8)
        r = race({"ours": lambda: qk.quantize(x, format=Q8, out=out),
                  "ggml": lambda: ggml.quantize_q8_k(x, out2)})
        tab.add("Q8_K quantize, 1M floats", "quantize", r["ours"], "ggml quantize_row_q8_K",
                r["ggml"], x.nbytes)
    else:
        tab.add("Q8_K quantize, 1M floats", "quantize",
                race({"o": lambda: qk.quantize(x, format=Q8, out=out)})["o"], nbytes=x.nbytes)

    # --- single dots
    for g in (16, 256):
        w = q4_k_weights(1, g)[0]
        xq = qk.quantize(activations(g), format=Q8)
        wf = qk.dequantize(w, Q4).ravel()
        xf = qk.dequantize(xq, Q8).ravel()
        cands = {"api": lambda: qk.quantized_dot(w, xq, lhs_format=Q4, rhs_format=Q8),
                 "ker": lambda: dot_q4_k_q8_k(w, xq), "np": lambda: np.dot(wf, xf)}
        if ggml:
            cands["ggml"] = lambda: ggml.vec_dot_q4_k_q8_k(w, xq)
        r = race(cands)
        tab.add(f"quantized_dot G={g}", "quantized_dot (API)", r["api"],
                "numpy f32 dot (dequantized)", r["np"], w.nbytes)
        if ggml:
            tab.add(f"quantized_dot G={g}", "kernel dot_q4_k_q8_k", r["ker"],
                    "ggml vec_dot_q4_K_q8_K (+ ctypes call)", r["ggml"], w.nbytes)

    # --- Q4_K matvec, hot and DRAM-streamed; threads
    # threads=N rows measure scaling: the adaptive count stays off there (ggml's OpenMP workers,
    # timed interleaved in this process, still spin after their calls and would count as busy
    # cores in /proc/loadavg); the contention rows below switch it on, as users get it.
    _threads.ADAPTIVE = False
    big = 4 * l3_bytes()
    bandwidth = None
    for rows, cols in [(4096, 4096), (14336, 4096), (4096, 14336)]:
        g = cols // 256
        w = q4_k_weights(rows, g)
        xv = activations(g).ravel()
        work = f"Q4_K matvec {rows}x{cols}, f32 x, hot"
        for thr in (1, ncores) if ncores > 1 else (1,):
            t = pair_rows(tab, work, f"matmul threads={thr}",
                          lambda: qk.matmul(w, xv, lhs_format=Q4, threads=thr), gb, w,
                          ggml_ctypes.GGML_TYPE_Q4_K, thr, 0, xv, w.nbytes)
            if thr == 1:
                t1 = t
        if ncores > 1:
            # numba_qk's own scaling, raced without ggml: ggml's OpenMP workers keep spinning
            # after each of its calls and would take the core from whichever call follows
            own = race({t_: (lambda t_=t_: qk.matmul(w, xv, lhs_format=Q4, threads=t_))
                        for t_ in (1, ncores)})
            tab.add(work + " (numba_qk alone)", f"matmul threads={ncores}", own[ncores],
                    "numba_qk matmul, 1 thread", own[1], w.nbytes)
        if Q4 in qk.REPACK_FORMATS:
            # numba_qk's 16-row repacked layout (qk.repack, opt-in), the counterpart of CPU_REPACK
            rp = qk.repack(w, Q4)
            pair_rows(tab, work, "repack + matmul threads=1",
                      lambda: qk.matmul(rp, xv, lhs_format=Q4, threads=1), gb, w,
                      ggml_ctypes.GGML_TYPE_Q4_K, 1, 0, xv, w.nbytes)
            if ncores > 1:
                own = race({t_: (lambda t_=t_: qk.matmul(rp, xv, lhs_format=Q4, threads=t_))
                            for t_ in (1, ncores)})
                tab.add(work + " (numba_qk alone)", f"repack + matmul threads={ncores}",
                        own[ncores], "repack + matmul, 1 thread", own[1], w.nbytes)
            rp = None
        if rows == 4096 and cols == 4096:
            ceiling = hot_read_ceiling(w)
            notes.append(f"hot read ceiling: a plain read of the Q4_K 4096x4096 weights "
                         f"({w.nbytes / 2**20:.1f} MiB, resident in L3; np.bitwise_or.reduce, "
                         f"1 thread) runs at {ceiling:.1f} GB/s, so no 1-thread hot matvec of "
                         f"them can take less than {fmt_t(w.nbytes / ceiling / 1e9)} here; "
                         f"numba_qk's takes {fmt_t(t1)} ({w.nbytes / t1 / 1e9 / ceiling:.0%} "
                         "of the ceiling).")
            if ncores > 1:
                qk_c = {f"qk{t}": (lambda t=t: qk.matmul(w, xv, lhs_format=Q4, threads=t))
                        for t in (1, 2)}
                _threads.ADAPTIVE = True     # the default, whose behaviour these rows measure
                try:
                    # numba_qk's two counts on their own (ggml's OpenMP workers, when timed in
                    # the same rounds, keep spinning after their calls and slow whichever call
                    # follows theirs), then ggml's against numba_qk's 1 thread
                    m = contention_means(qk_c, calls=600)
                    if gb:
                        lay = gb.layouts(ggml_ctypes.GGML_TYPE_Q4_K, 0)[0]
                        mv1 = gb.make(w, ggml_ctypes.GGML_TYPE_Q4_K, 1, 0, lay)
                        mv2 = gb.make(w, ggml_ctypes.GGML_TYPE_Q4_K, 2, 0, lay)
                        mg = contention_means({"qk1": qk_c["qk1"], "g1": lambda: mv1(xv),
                                               "g2": lambda: mv2(xv)})
                        m["g1"], m["g2"], m["qk1_g"] = mg["g1"], mg["g2"], mg["qk1"]
                finally:
                    _threads.ADAPTIVE = False
                cw = work + ", one core kept busy by another process (mean per call)"
                tab.add(cw, "matmul threads=2", m["qk2"], "numba_qk matmul, 1 thread", m["qk1"],
                        w.nbytes)
                tab.add(cw.replace("mean per call", "median per call"), "matmul threads=2",
                        m["qk2_median"], "numba_qk matmul, 1 thread", m["qk1_median"], w.nbytes)
                if gb:
                    tab.add(cw, "matmul threads=1", m["qk1_g"],
                            GGMLBase.label(lay, 1), m["g1"], w.nbytes)
                    tab.add(cw, f"ggml {GGMLBase.label(lay, 2)}", m["g2"],
                            GGMLBase.label(lay, 1), m["g1"], w.nbytes)
                    mv1 = mv2 = None
            wd = qk.dequantize(w.reshape(-1, 144), Q4).reshape(rows, -1)
            r = race({"ours": lambda: qk.matmul(w, xv, lhs_format=Q4, threads=1),
                      "np": lambda: wd @ xv})
            tab.add(work, "matmul threads=1", r["ours"], "numpy f32 matvec (dequantized)",
                    r["np"], w.nbytes)
            del wd
        if not args.quick and cols == 4096:
            copies = -(-big // w.nbytes)
            ws = [w.copy() for _ in range(copies)]
            work_d = (f"Q4_K matvec {rows}x{cols}, DRAM-streamed ({copies} distinct copies, "
                      f"{copies * w.nbytes / 1e9:.2f} GB)")
            for thr in (1, ncores) if ncores > 1 else (1,):
                pair_rows(tab, work_d, f"matmul threads={thr}",
                          cycling([lambda w_=w_: qk.matmul(w_, xv, lhs_format=Q4, threads=thr)
                                   for w_ in ws]),
                          gb, ws, ggml_ctypes.GGML_TYPE_Q4_K, thr, 0, xv, w.nbytes,
                          streamed=True)
            t_str = {}
            if ncores > 1:      # numba_qk's own scaling, raced without ggml (see above)
                t_str = race({t_: cycling([lambda w_=w_, t_=t_: qk.matmul(w_, xv, lhs_format=Q4,
                                                                        threads=t_)
                                           for w_ in ws]) for t_ in (1, ncores)})
                tab.add(work_d + " (numba_qk alone)", f"matmul threads={ncores}",
                        t_str[ncores], "numba_qk matmul, 1 thread", t_str[1], w.nbytes)
            if Q4 in qk.REPACK_FORMATS:
                rps = [qk.repack(w_, Q4) for w_ in ws]
                pair_rows(tab, work_d, "repack + matmul threads=1",
                          cycling([lambda r_=r_: qk.matmul(r_, xv, lhs_format=Q4, threads=1)
                                   for r_ in rps]),
                          gb, ws, ggml_ctypes.GGML_TYPE_Q4_K, 1, 0, xv, w.nbytes, streamed=True)
                del rps
            if bandwidth is None:
                bandwidth = read_bandwidth(ws, ncores)
                notes.append(f"plain read bandwidth over {copies} x {w.nbytes / 2**20:.0f} MiB "
                             f"(a vectorized int64 sum, 1 / {ncores} threads): "
                             + " / ".join(f"{v:.1f}" for v in bandwidth) + " GB/s; L3 "
                             f"{l3_bytes() / 2**20:.0f} MiB, DRAM working sets >= 4x L3.")
            if rows == 4096 and len(t_str) > 1:
                gbs = {t: w.nbytes / v / 1e9 for t, v in t_str.items()}
                notes.append(
                    f"DRAM-streamed Q4_K {rows}x{cols} matvec: threads=1 {gbs[1]:.1f} GB/s "
                    f"({gbs[1] / bandwidth[0]:.0%} of the 1-thread read bandwidth), "
                    f"threads={ncores} {gbs[ncores]:.1f} GB/s ({gbs[ncores] / bandwidth[1]:.0%} "
                    f"of the {ncores}-thread read bandwidth): {t_str[1] / t_str[ncores]:.2f}x "
                    f"faster with {ncores} threads, where a plain read gains "
                    f"{bandwidth[1] / bandwidth[0]:.2f}x.")
            del ws

    # --- Q4_K matmul, f32 activations [batch, 4096]: gemm
    w = q4_k_weights(4096, 16)
    for batch in (8, 32, 128, 512):
        xb = np.stack([activations(16, seed=s).ravel() for s in range(batch)])
        pair_rows(tab, f"Q4_K matmul 4096x4096, f32 x [{batch}, 4096]", "matmul threads=1",
                  lambda: qk.matmul(w, xb, lhs_format=Q4, threads=1), gb, w,
                  ggml_ctypes.GGML_TYPE_Q4_K, 1, batch, xb, w.nbytes)
    xv = activations(16).ravel()
    xq1 = qk.quantize(xv.reshape(16, 256), format=Q8)
    xq8 = qk.quantize(np.stack([activations(16, seed=s) for s in range(8)]).reshape(-1, 256),
                      format=Q8).reshape(8, 16, 292)
    r = race({"gemm": lambda: qk.gemm(w, xq8, lhs_format=Q4, rhs_format=Q8),
              "gemv": lambda: qk.gemv(w, xq1, lhs_format=Q4, rhs_format=Q8)})
    tab.add("gemm batch 8, 4096x4096", "gemm (Q8_K x given)", r["gemm"], "8 x numba_qk gemv",
            8 * r["gemv"], w.nbytes)

    # --- ggml's legacy block formats: matvec 4096x4096 hot and streamed; codecs
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(4096).astype(np.float32)
    x1m = rng.standard_normal((32768, 32)).astype(np.float32)
    for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"):
        fmt = getattr(qk.quant, name)
        w = qk.quantize(rng.standard_normal((4096 * 128, 32)).astype(np.float32),
                        format=fmt).reshape(4096, 128, -1)
        pair_rows(tab, f"{fmt.name} matvec 4096x4096, f32 x, hot", "matmul threads=1",
                  lambda: qk.matmul(w, xv, lhs_format=fmt, threads=1), gb, w, fmt.ggml_type, 1,
                  0, xv, w.nbytes)
        if not args.quick:
            copies = -(-big // w.nbytes)
            ws = [w.copy() for _ in range(copies)]
            pair_rows(tab, f"{fmt.name} matvec 4096x4096, DRAM-streamed ({copies} copies, "
                      f"{copies * w.nbytes / 1e9:.2f} GB)", "matmul threads=1",
                      cycling([lambda w_=w_: qk.matmul(w_, xv, lhs_format=fmt, threads=1)
                               for w_ in ws]),
                      gb, ws, fmt.ggml_type, 1, 0, xv, w.nbytes, streamed=True)
            del ws
        if fmt in qk.REPACK_FORMATS:
            # the same weights in numba_qk's row-interleaved layout (qk.repack, opt-in), the
            # counterpart of ggml's CPU_REPACK
            rp = qk.repack(w, fmt)
            pair_rows(tab, f"{fmt.name} matvec 4096x4096, f32 x, hot", "repack + matmul threads=1",
                      lambda: qk.matmul(rp, xv, lhs_format=fmt, threads=1), gb, w,
                      fmt.ggml_type, 1, 0, xv, w.nbytes)
            if not args.quick:
                copies = -(-big // w.nbytes)
                rps = [qk.repack(w, fmt) for _ in range(copies)]
                pair_rows(tab, f"{fmt.name} matvec 4096x4096, DRAM-streamed ({copies} copies, "
                          f"{copies * w.nbytes / 1e9:.2f} GB)", "repack + matmul threads=1",
                          cycling([lambda r_=r_: qk.matmul(r_, xv, lhs_format=fmt, threads=1)
                                   for r_ in rps]),
                          gb, [w.copy() for _ in range(copies)], fmt.ggml_type, 1, 0, xv,
                          w.nbytes, streamed=True)
                del rps
            rp = None
        recs = qk.quantize(x1m, format=fmt)
        cands = {"q": lambda: qk.quantize(x1m, format=fmt), "d": lambda: qk.dequantize(recs, fmt)}
        if ggml:
            cands["gq"] = lambda: ggml.quantize_ref(fmt.ggml_type, x1m)
        r = race(cands)
        if gq is not None:
            gt = getattr(GGMLQuantizationType, fmt.name)
            r2 = race({"gq": lambda: gq.quantize(x1m, gt), "gd": lambda: gq.dequantize(recs, gt)},
                      repeat=2)
            tab.add(f"{fmt.name} quantize, 1M floats", "quantize", r["q"], "gguf-py quantize",
                    r2["gq"], x1m.nbytes)
            tab.add(f"{fmt.name} dequantize, 1M values", "dequantize", r["d"],
                    "gguf-py dequantize", r2["gd"], recs.nbytes)
        if ggml:
            tab.add(f"{fmt.name} quantize, 1M floats", "quantize", r["q"],
                    "ggml quantize_row_*_ref (+ ctypes)", r["gq"], x1m.nbytes)

    first = first_call_times()
    info = machine()
    load_after = os.getloadavg()
    info["load average (1 min) before / after"] = f"{load_before[0]:.2f} / {load_after[0]:.2f}"
    if ggml:
        info["ggml"] = ggml.version + (" (native build)" if native else "")
        info["ggml CPU features (ggml_cpu_has_*)"] = ", ".join(
            k for k, v in ggml.features.items() if v) or "none"
        if ggml.build_features:
            info["ggml build (ggml_backend_get_features)"] = ", ".join(
                k if v == "1" else f"{k}={v}" for k, v in ggml.build_features.items())
        if ggml.extra_bufts:
            info["ggml extra buffer types"] = ", ".join(ggml.extra_bufts)
    fc = ["| in a fresh process | cold cache (compiles) | warm cache |", "| --- | --- | --- |"]
    for key, label in (("import_s", "import numba_qk"), ("quantize_first_s", "first quantize"),
                       ("dot_first_s", "first quantized_dot (G=16)"),
                       ("dot_second_s", "second quantized_dot (G=16)"),
                       ("matmul_first_s", "first matmul (64x4096)")):
        fc.append(f"| {label} | {fmt_t(first['cold'][key])} | {fmt_t(first['warm'][key])} |")
    mach = "\n".join(f"- {k}: {v}" for k, v in info.items())
    cmd = "python bench/compare.py" + (" --quick" if args.quick else "") + (
        " --ggml-lib <native build>" if native else "")
    report = (f"# numba_qk benchmark results\n\nGenerated by `{cmd}`.\n\n## Machine\n{mach}\n\n"
              f"## Speed (single thread unless stated; interleaved best of repeats; GB/s of "
              f"quantized weight bytes or f32 input)\n{tab.markdown()}\n\n"
              "## Compile / first-call time\n"
              + "\n".join(fc) + "\n\n## Notes\n" + "\n".join(f"- {n}" for n in dict.fromkeys(notes)) + "\n")
    print(report)
    Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
