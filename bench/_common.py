"""Shared pieces of the benchmarks: deterministic, model-shaped inputs (numba_qk.samples), the
timing helpers (best of repeats; interleaved rounds) and the products' speed table against ggml
that the per-family scripts (iq_grid_vs_ggml.py, ternary_vs_ggml.py) print with ``--speed``."""

from __future__ import annotations

import os
import time

import numpy as np

from numba_qk.samples import activations, q4_k_weights  # noqa: F401


def best(fn, repeats):
    """Best seconds of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def interleaved(cands, rounds, clock=time.perf_counter, warm=False):
    """Best seconds per call of each callable of ``cands``, one call of each in turn per round
    (after one warm-up call each), measured by ``clock`` (wall time; ``time.process_time``:
    the process's CPU time, which leaves out the time other processes held the core -- on a
    loaded machine the longer calls are preempted more often, so best wall times of calls of
    tens of ms are not comparable with those of short ones).  ``warm``: each timed call right
    after an untimed one of the same callable (its data back in cache after the others ran)."""
    for fn in cands.values():
        fn()
    best_t = {k: float("inf") for k in cands}
    for _ in range(rounds):
        for k, fn in cands.items():
            if warm:
                fn()
            t = clock()
            fn()
            best_t[k] = min(best_t[k], clock() - t)
    return best_t


def cycling(fns):
    """One callable that calls ``fns`` round robin, one per call."""
    state = [0]

    def run():
        fns[state[0] % len(fns)]()
        state[0] += 1
    return run


def load_ggml():
    """``(ggml, label)``: the native build named by ``NUMBA_QK_GGML_LIB=<dir>`` (libggml-base.so
    + libggml-cpu.so), else the libggml-python wheel; ``(None, "")`` when neither loads."""
    from numba_qk.testing import ggml as ggml_bridge

    libdir = os.environ.get("NUMBA_QK_GGML_LIB")
    g = ggml_bridge.load_dir(libdir) if libdir else ggml_bridge.load()
    if g is None:
        return None, ""
    feats = ", ".join(k for k, v in g.features.items() if v) or "none"
    dropped = "".join(f"; {name} buffers left out: {why}" for name, why in g.dropped_bufts.items())
    return g, (f"{'native ggml from ' + libdir if libdir else 'libggml-python'} {g.version} "
               f"({feats}){dropped}")


def _ours(times):
    """(numba_qk's best time, " r" when it was the repacked layout's), taken out of ``times``."""
    plain, packed = times.pop("ours"), times.pop("ours r", float("inf"))
    return (packed, " r") if packed < plain else (plain, "")


def speed_table(g, formats, weights, shape="4096x4096", rounds=7, stream_mb=256.0,
                clock=time.perf_counter):
    """Print the products' speed table: per format of ``formats`` (``weights(fmt, rows, cols)``
    gives its records ``[rows, cols / 256, bytes]``), each numba_qk / ggml pair timed
    interleaved (best of ``rounds``), ggml in each weight layout it offers for the type (plain
    CPU buffer, CPU_REPACK where it converts the type; the fastest counts, among those whose
    result agrees with numba_qk's, its activations quantized canonically or as ggml's CPU
    quantizer does, to 1e-4 of the largest value): the matvec hot (one matrix),
    DRAM-streamed (distinct copies totalling ``stream_mb``, called round robin) and the
    batch-32 ``matmul`` (f32 activations [32, cols]), all on 1 thread; times by ``clock``
    (``interleaved``; the hot matvec times each call right after one of the same candidate).  numba_qk likewise counts its fastest layout: the plain records, or
    ``qk.repack``'s tiles for the formats it repacks (a cell marked ``r``)."""
    import numba_qk as qk

    rows, cols = (int(v) for v in shape.split("x"))
    layouts = (lambda t: g.weight_bufts(t) or [None]) if g.dev is not None else (lambda t: [None])
    print("| format | matvec hot ours ms | ggml ms | ours/ggml | streamed ours ms | ggml ms | "
          "ours/ggml | batch-32 ours ms | ggml ms | ours/ggml |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    xv = np.random.default_rng(6).standard_normal(cols).astype(np.float32)
    xb = np.random.default_rng(7).standard_normal((32, cols)).astype(np.float32)
    for fmt in formats:
        t = fmt.ggml_type
        wm = weights(fmt, rows, cols)
        res = {}
        for kind, batch, x in (("hot", 0, xv), ("b32", 32, xb)):
            ref = np.asarray(qk.matmul(wm, x, lhs_format=fmt, threads=1), np.float64)
            # ggml's batched product quantizes the activations with its SIMD quantizer
            # (``numerics="ggml_cpu"``), whose rounding ties may differ from the canonical one
            refs = (ref, np.asarray(qk.matmul_many([wm], x, lhs_formats=fmt, threads=1,
                                                   numerics="ggml_cpu")[0], np.float64))
            cands = {"ours": lambda x=x: qk.matmul(wm, x, lhs_format=fmt, threads=1)}
            if fmt in qk.REPACK_FORMATS:
                rp = qk.repack(wm, fmt)
                cands["ours r"] = lambda x=x, rp=rp: qk.matmul(rp, x, lhs_format=fmt, threads=1)
            for buft in layouts(t):
                mv = g.matvec(wm, threads=1, batch=batch, type_id=t, buft=buft)
                y = np.asarray(mv(x), np.float64).reshape(ref.shape)
                if any(np.max(np.abs(y - r)) <= 1e-4 * np.max(np.abs(r)) for r in refs):
                    cands[buft or "plain"] = lambda mv=mv, x=x: mv(x)
            # hot: each timed call right after an untimed one of the same candidate (the
            # candidates' matrices together would not fit the L3)
            r = interleaved(cands, rounds, clock, warm=kind == "hot")
            res[kind] = (_ours(r), min(r.values()) if r else float("nan"))
        n = max(2, int(np.ceil(stream_mb * 1e6 / wm.nbytes)))
        ws = [wm.copy() for _ in range(n)]
        cands = {"ours": cycling([lambda w=w: qk.matmul(w, xv, lhs_format=fmt, threads=1)
                                  for w in ws])}
        if fmt in qk.REPACK_FORMATS:
            rps = [qk.repack(w, fmt) for w in ws]
            cands["ours r"] = cycling([lambda w=w: qk.matmul(w, xv, lhs_format=fmt, threads=1)
                                       for w in rps])
        mvs = {}
        for buft in layouts(t):
            mvs[buft] = [g.matvec(wm, threads=1, type_id=t, buft=buft) for _ in range(n)]
            cands[buft or "plain"] = cycling([lambda m=m: m(xv) for m in mvs[buft]])
        r = interleaved(cands, rounds * n, clock)
        res["stream"] = (_ours(r), min(r.values()))
        del ws, mvs
        cells = " | ".join(f"{o[0] * 1e3:.2f}{o[1]} | {gg * 1e3:.2f} | {o[0] / gg:.2f}"
                           for o, gg in (res["hot"], res["stream"], res["b32"]))
        print(f"| {fmt.name} | {cells} |", flush=True)
