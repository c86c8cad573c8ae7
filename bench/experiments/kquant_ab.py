"""A/B of the K-quant kernels against an older revision, interleaved in one process.

    python bench/experiments/kquant_ab.py --old-rev 468834f                  # Q2_K, Q3_K, Q5_K, Q6_K
    python bench/experiments/kquant_ab.py --old-rev HEAD~3 --formats q6_k --quick

The old revision's ``numba_qk`` package is extracted with ``git archive`` into a temporary
folder and imported as ``numba_qk_old`` (every ``numba_qk`` name in its sources renamed so), next to the working tree's
``numba_qk``.  Per format, old and new calls alternate and the best single call of each is kept,
so a loaded machine slows both alike: gemv 4096x4096 hot (one matrix) and DRAM-streamed (distinct
copies totalling ``--stream-mb``, called round robin), and dequantize of 65,536 records.  Both
outputs are compared bit for bit first.  Ratios > 1 mean the working tree is faster.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numba_qk as qk  # noqa: E402


def old_kernel_module(name: str):
    """Kernel module ``name`` (``dot``, ``q6_k`` ...) of the extracted old revision: under
    ``kernels/kquants/`` since the family layout, directly under ``kernels/`` before it."""
    try:
        return importlib.import_module(f"numba_qk_old.kernels.kquants.{name}")
    except ModuleNotFoundError:
        return importlib.import_module(f"numba_qk_old.kernels.{name}")


def extract_old(rev: str) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="numba_qk_old_"))
    atexit.register(shutil.rmtree, tmp, True)
    archive = tmp / "old.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "numba_qk"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp)
    for f in (tmp / "numba_qk").rglob("*.py"):   # its imports are absolute: rename them
        f.write_text(re.sub(r"\bnumba_qk\b", "numba_qk_old", f.read_text()))
    (tmp / "numba_qk").rename(tmp / "numba_qk_old")
    return tmp


def best_interleaved(fns, calls, rounds):
    """fns: name -> callable(i); the best seconds per call of each, alternating names."""
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for i in range(calls):
                f(i)
            best[k] = min(best[k], (time.perf_counter() - t0) / calls)
    return best


def same_bits(a, b):
    return (np.asarray(a, np.float32).view(np.uint32) == np.asarray(b, np.float32).view(np.uint32)).all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", required=True)
    ap.add_argument("--formats", default="q6_k,q5_k,q3_k,q2_k")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--stream-mb", type=float, default=1229.0)
    ap.add_argument("--rounds", type=int, default=200, help="hot: best of this many single calls")
    ap.add_argument("--quick", action="store_true", help="1024x1024, 64 MB streamed, 20 rounds")
    args = ap.parse_args()
    if args.quick:
        args.rows = args.cols = 1024
        args.stream_mb, args.rounds = 64.0, 20
    sys.path.insert(0, str(extract_old(args.old_rev)))
    rng = np.random.default_rng(0)
    g = args.cols // 256
    x = qk.quantize(rng.standard_normal((g, 256)).astype(np.float32), format=qk.quant.q8_k)
    print(f"old = {args.old_rev}, new = working tree; {args.rows}x{args.cols}, 1 thread; "
          f"ms per call, best interleaved; ratio = old / new")
    print("| format | gemv hot old | new | ratio | gemv streamed old | new | ratio "
          "| dequantize old | new | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for t in args.formats.split(","):
        fmt = getattr(qk.quant, t)
        new = importlib.import_module(f"numba_qk.kernels.kquants.{t}")
        old = old_kernel_module(t)
        w = qk.quantize(rng.standard_normal((args.rows * g, 256)).astype(np.float32),
                        format=fmt).reshape(args.rows, g, fmt.block_bytes)
        gemv = {"old": getattr(old, f"gemv_{t}_q8_k"), "new": getattr(new, f"gemv_{t}_q8_k")}
        outs = {k: np.empty(args.rows, np.float32) for k in gemv}
        for k, f in gemv.items():
            f(w, x, outs[k])
        assert same_bits(outs["old"], outs["new"]), f"{t}: gemv bits differ"
        hot = best_interleaved({k: (lambda i, f=f, o=outs[k]: f(w, x, o)) for k, f in gemv.items()},
                               1, args.rounds)
        n = int(args.stream_mb * 1e6 / w.nbytes) + 1
        ws = [w.copy() for _ in range(n)]
        streamed = best_interleaved({k: (lambda i, f=f, o=outs[k]: f(ws[i], x, o))
                                     for k, f in gemv.items()}, n, 3)
        del ws
        recs = w.reshape(-1, fmt.block_bytes)
        deq = {"old": getattr(old, f"dequantize_{t}"), "new": getattr(new, f"dequantize_{t}")}
        douts = {k: np.empty((recs.shape[0], 256), np.float32) for k in deq}
        for k, f in deq.items():
            f(recs, douts[k])
        assert same_bits(douts["old"], douts["new"]), f"{t}: dequantize bits differ"
        dq = best_interleaved({k: (lambda i, f=f, o=douts[k]: f(recs, o)) for k, f in deq.items()},
                              1, max(5, args.rounds // 20))
        cells = []
        for r in (hot, streamed, dq):
            cells += [f"{r['old'] * 1e3:.3f}", f"{r['new'] * 1e3:.3f}", f"{r['old'] / r['new']:.2f}"]
        print(f"| {t.upper()} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
