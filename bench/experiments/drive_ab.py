"""A/B of the record formats' dot / gemv / gemm against an older revision, interleaved in one
process: is the shared driver (``kernels/drive.py``) as fast as the loops it replaced?

    python bench/experiments/drive_ab.py --old-rev ea9663e --quick
    python bench/experiments/drive_ab.py --old-rev ea9663e --formats q4_0,mxfp4 --rounds 40

The old revision's ``numba_qk`` is extracted with ``git archive`` into
``$TMPDIR/numba_qk_ab_<rev>/numba_qk_old`` (kept, so its numba cache serves later runs) with
every ``numba_qk`` name in its sources renamed ``numba_qk_old`` (its imports are absolute), and
imported next to the working tree's ``numba_qk``.  Per format, old and new calls alternate and
the best of ``--rounds`` is kept, so a loaded machine slows both alike: gemv hot (one matrix)
and DRAM-streamed (distinct copies totalling ``--stream-mb``, called round robin), gemm of
``--batch`` activations (hot; 11 = one 8-activation tile and 3 leftovers) and the dot of one
row.  Every output is compared bit for bit first.  Ratio = old / new: > 1 means the working
tree is faster.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
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

KQ = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
FP4 = ("mxfp4", "nvfp4")


def import_old(rev: str):
    """``numba_qk`` at ``rev`` as the package ``numba_qk_old`` (extracted once per revision)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    into = Path(tempfile.gettempdir()) / f"numba_qk_ab_{sha}"
    pkg = into / "numba_qk_old"
    if not pkg.exists():
        data = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "numba_qk"],
                              check=True, capture_output=True).stdout
        tmp = into / "x"
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        for f in (tmp / "numba_qk").rglob("*.py"):
            f.write_text(re.sub(r"\bnumba_qk\b", "numba_qk_old", f.read_text()))
        (tmp / "numba_qk").rename(pkg)
        tmp.rmdir()
    sys.path.insert(0, str(into))
    return importlib.import_module("numba_qk_old")


def kernels(pkg, name: str):
    """(dot, gemv, gemm) of format ``name`` in package ``pkg`` (numba_qk or numba_qk_old)."""
    if name in KQ:
        mod = importlib.import_module(f"{pkg.__name__}.kernels.kquants."
                                      + ("dot" if name == "q4_k" else name))
        return tuple(getattr(mod, f"{op}_{name}_q8_k") for op in ("dot", "gemv", "gemm"))
    if name in LEGACY:
        mod = importlib.import_module(f"{pkg.__name__}.kernels.legacy.kernels")
        e = next(e for f, e in mod.ENTRIES.items() if f.name.lower() == name)
        return e.dot, e.gemv, e.gemm
    if name not in ("mxfp4", "nvfp4"):   # IQ, ternary: the @njit building blocks
        act = pkg.activation_format(getattr(pkg.quant, name)).name.lower()
        mods = [importlib.import_module(f"{pkg.__name__}.kernels.{m}")
                for m in ("iq.grid", "iq.iq4", "ternary.tq")]
        return tuple(next(getattr(m, f"{op}_{name}_{act}") for m in mods
                          if hasattr(m, f"{op}_{name}_{act}")) for op in ("dot", "gemv", "gemm"))
    mod = importlib.import_module(f"{pkg.__name__}.kernels.fp4.mxrec")
    dot = mod.dot_mxfp4_q8_0_fast if name == "mxfp4" else mod.dot_nvfp4_q8_0
    return dot, getattr(mod, f"gemv_{name}_q8_0"), getattr(mod, f"gemm_{name}_q8_0")


def best_interleaved(fns, calls, rounds):
    """fns: name -> callable(i); the best seconds per call of each, alternating names (and
    their order, round by round)."""
    best = {k: float("inf") for k in fns}
    for n in range(rounds):
        for k, f in (list(fns.items()) if n % 2 == 0 else list(fns.items())[::-1]):
            t0 = time.perf_counter()
            for i in range(calls):
                f(i)
            best[k] = min(best[k], (time.perf_counter() - t0) / calls)
    return best


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)).all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-rev", required=True)
    ap.add_argument("--formats", default=",".join(KQ + LEGACY + FP4))
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=11)
    ap.add_argument("--stream-mb", type=float, default=1229.0)
    ap.add_argument("--rounds", type=int, default=100, help="hot: best of this many calls")
    ap.add_argument("--stream-rounds", type=int, default=5, help="streamed: best of this many")
    ap.add_argument("--quick", action="store_true", help="1024x1024, 64 MB streamed, 20 rounds")
    args = ap.parse_args()
    if args.quick:
        args.rows = args.cols = 1024
        args.stream_mb, args.rounds = 64.0, 20
    old_pkg = import_old(args.old_rev)
    rng = np.random.default_rng(0)
    print(f"old = {args.old_rev}, new = working tree; {args.rows}x{args.cols}, gemm batch "
          f"{args.batch}, 1 thread; ms per call, best interleaved; ratio = old / new; "
          f"load {os.getloadavg()[0]:.2f}")
    print("| format | gemv hot old | new | ratio | gemv streamed old | new | ratio "
          "| gemm old | new | ratio | dot old | new | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.formats.split(","):
        fmt = getattr(qk.quant, name)
        act = qk.formats.activation_format(fmt)
        nx = fmt.block_size // act.block_size if name in FP4 else 1   # Q8_0 records per record
        g = args.cols // fmt.block_size
        w = qk.quantize(rng.standard_normal((args.rows * g, fmt.block_size)).astype(np.float32),
                        format=fmt).reshape(args.rows, g, fmt.block_bytes)
        xs = qk.quantize(rng.standard_normal((args.batch * g * nx, act.block_size))
                         .astype(np.float32), format=act).reshape(args.batch, g * nx, -1)
        x = xs[0]
        k = {"old": kernels(old_pkg, name), "new": kernels(qk, name)}
        outs = {s: np.empty(args.rows, np.float32) for s in k}
        mouts = {s: np.empty((args.batch, args.rows), np.float32) for s in k}
        for s, (dot, gemv, gemm) in k.items():
            gemv(w, x, outs[s])
            gemm(w, xs, mouts[s])
        assert same_bits(outs["old"], outs["new"]), f"{name}: gemv bits differ"
        assert same_bits(mouts["old"], mouts["new"]), f"{name}: gemm bits differ"
        assert same_bits(k["old"][0](w[5], x), k["new"][0](w[5], x)), f"{name}: dot bits differ"
        hot = best_interleaved({s: (lambda i, f=f[1], o=outs[s]: f(w, x, o))
                                for s, f in k.items()}, 1, args.rounds)
        n = int(args.stream_mb * 1e6 / w.nbytes) + 1
        ws = [w.copy() for _ in range(n)]
        streamed = best_interleaved({s: (lambda i, f=f[1], o=outs[s]: f(ws[i], x, o))
                                     for s, f in k.items()}, n, args.stream_rounds)
        del ws
        mm = best_interleaved({s: (lambda i, f=f[2], o=mouts[s]: f(w, xs, o))
                               for s, f in k.items()}, 1, max(5, args.rounds // 4))
        w1 = w[7]
        dt = best_interleaved({s: (lambda i, f=f[0]: f(w1, x)) for s, f in k.items()},
                              100, args.rounds)
        cells = []
        for r in (hot, streamed, mm, dt):
            cells += [f"{r['old'] * 1e3:.4f}", f"{r['new'] * 1e3:.4f}",
                      f"{r['old'] / r['new']:.2f}"]
        print(f"| {name.upper()} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
