"""A/B timing of the encoders: this checkout vs a git revision vs ggml's ``_ref``, in ONE process.

The baseline revision's ``numba_qk`` is exported (``git archive``) into a temporary folder as the
package ``numba_qk_base`` and imported beside the working tree's ``numba_qk``; the candidates are
called in alternation (round robin), best of ``--rounds``, so a loaded machine slows them alike.
Times are the calling thread's CPU time (``time.thread_time``: every candidate, ggml through ctypes
included, runs single-threaded in this thread), which time slices lost to other processes do not
inflate; on a quiet machine it equals the wall time.
Every candidate's bytes are compared with the working tree's (and ggml's, when loaded).

    python bench/experiments/encode_ab.py --base main --formats q4_k,q6_k --rounds 7
    NUMBA_QK_GGML_LIB=/path/to/native/lib python bench/experiments/encode_ab.py

K-quants: 4096 blocks of N(0,1) (1M floats), as ``bench/compare_kquants.py``; legacy formats:
1M floats, as ``bench/compare.py``.  Ratios: ``ggml / ours`` and ``base / ours`` (> 1: ours faster).
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
KQ = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def import_base(rev: str, into: Path):
    """``numba_qk`` at git revision ``rev`` as the package ``numba_qk_base``."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "numba_qk"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    for f in (into / "numba_qk").rglob("*.py"):   # its imports are absolute: rename them
        f.write_text(re.sub(r"\bnumba_qk\b", "numba_qk_base", f.read_text()))
    (into / "numba_qk").rename(into / "numba_qk_base")
    sys.path.insert(0, str(into))
    return importlib.import_module("numba_qk_base")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git revision of the baseline (default main)")
    ap.add_argument("--formats", default=",".join(KQ + LEGACY))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--blocks", type=int, default=4096, help="K-quant blocks (default 4096)")
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB"))
    ap.add_argument("--clock", choices=("thread", "wall"), default="thread",
                    help="thread CPU time (default) or wall time (perf_counter)")
    a = ap.parse_args(argv)
    clock = time.thread_time if a.clock == "thread" else time.perf_counter

    import numba_qk as qk
    from numba_qk.testing import ggml as ggml_bridge

    tmp = tempfile.TemporaryDirectory()
    base = import_base(a.base, Path(tmp.name)) if a.base else None
    g = ggml_bridge.load(a.ggml_lib) if a.ggml_lib else ggml_bridge.load()
    print(f"base: {a.base}; ggml: {g.version if g else 'not loaded'}; clock: {a.clock}; "
          f"load average {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    print("| format | ours ms | base ms | ggml ms | base/ours | ggml/ours | bytes equal |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in a.formats.split(","):
        fmt = getattr(qk.quant, name)
        n = a.blocks * 256 if name in KQ else 1 << 20
        x = rng.standard_normal((n // fmt.block_size, fmt.block_size)).astype(np.float32)
        cands = {"ours": lambda: qk.quantize(x, format=fmt)}
        if base is not None:
            bfmt = getattr(base.quant, name)
            cands["base"] = lambda: base.quantize(x, format=bfmt)
        if g is not None:
            cands["ggml"] = lambda: g.quantize_ref(fmt.ggml_type, x)
        outs = {k: f() for k, f in cands.items()}  # warm-up (compiles) and bytes
        best = {k: float("inf") for k in cands}
        for _ in range(a.rounds):
            for k, f in cands.items():
                t = clock()
                f()
                best[k] = min(best[k], clock() - t)
        same = all(np.array_equal(outs["ours"], v) for v in outs.values())
        ms = {k: v * 1e3 for k, v in best.items()}
        cell = lambda k: f"{ms[k]:.2f}" if k in ms else "-"
        ratio = lambda k: f"{ms[k] / ms['ours']:.2f}" if k in ms else "-"
        print(f"| {fmt.name} | {cell('ours')} | {cell('base')} | {cell('ggml')} | "
              f"{ratio('base')} | {ratio('ggml')} | {'yes' if same else 'NO'} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
