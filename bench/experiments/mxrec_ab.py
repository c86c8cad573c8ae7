"""A/B of the MXFP4 / NVFP4 x Q8_0 matvec kernels: this checkout vs a git revision vs ggml, in ONE
process, interleaved (round robin, best of ``--rounds``), so machine load slows every candidate
alike.

* ``ours`` / ``base``: ``numba_qk.matmul(threads=1)`` (f32 vector quantized to Q8_0 inside the
  call) of this checkout and of the revision ``--base`` (exported with ``git archive`` as the
  package ``numba_qk_base``, see ``bench/experiments/encode_ab.py``);
* ``ggml``: ggml's mul_mat, 1 thread (``--ggml-lib`` or NUMBA_QK_GGML_LIB; libggml-python's
  wheel otherwise).

Hot: one 4096x4096 matrix (also ``matmul`` of ``--batch`` vectors: the gemm tiles, ours vs base); streamed: ``--stream-mb`` of distinct copies called in turn (DRAM).
Times are the calling thread's CPU time (``time.thread_time``; every candidate runs in this
thread).  The outputs of ours and base are compared bit for bit.

    NUMBA_QK_GGML_LIB=/path/to/native/lib python bench/experiments/mxrec_ab.py [--base HEAD] [--rounds 7]

Ratios > 1: ours faster.  Take final figures on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

from encode_ab import import_base  # noqa: E402


def rr(cands, rounds, calls):
    """Best-of-``rounds`` ms per call of each candidate, called in alternation."""
    clock = time.thread_time
    best = {k: float("inf") for k in cands}
    for f in cands.values():
        f()
    for _ in range(rounds):
        for k, f in cands.items():
            t0 = clock()
            for _ in range(calls):
                f()
            best[k] = min(best[k], (clock() - t0) * 1e3 / calls)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="git revision of the baseline ('' for none)")
    ap.add_argument("--formats", default="mxfp4,nvfp4")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20, help="hot calls per timing")
    ap.add_argument("--stream-mb", type=float, default=400.0)
    ap.add_argument("--batch", type=int, nargs="*", default=[8, 64],
                    help="gemm batch sizes (hot, matmul of [batch, cols] f32)")
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB"))
    a = ap.parse_args(argv)

    import numba_qk as qk
    from numba_qk.testing import ggml as ggml_bridge

    tmp = tempfile.TemporaryDirectory()
    base = import_base(a.base, Path(tmp.name)) if a.base else None
    g = ggml_bridge.load_dir(a.ggml_lib) if a.ggml_lib else ggml_bridge.load()
    print(f"base: {a.base or '-'}; ggml: {g.version if g else 'not loaded'}; "
          f"{a.rows}x{a.cols}, 1 thread, thread CPU time; load {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(a.cols).astype(np.float32)
    print("| format | case | ours ms | base ms | ggml ms | base/ours | ggml/ours | equal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in a.formats.split(","):
        fmt = getattr(qk.quant, name)
        vals = rng.standard_normal((a.rows * a.cols // fmt.block_size, fmt.block_size))
        w = qk.quantize(vals.astype(np.float32), format=fmt).reshape(
            a.rows, a.cols // fmt.block_size, fmt.block_bytes)
        n_stream = max(2, int(np.ceil(a.stream_mb * 1e6 / w.nbytes)))
        ws = [w] + [w.copy() for _ in range(n_stream - 1)]
        for case in ("hot", "streamed"):
            mats = ws[:1] if case == "hot" else ws
            calls = a.calls if case == "hot" else 1
            it = {"i": 0}

            def nxt():
                it["i"] = (it["i"] + 1) % len(mats)
                return mats[it["i"]]
            cands = {"ours": lambda: qk.matmul(nxt(), x, lhs_format=fmt, threads=1)}
            same = "-"
            if base is not None:
                bfmt = getattr(base.quant, name)
                cands["base"] = lambda: base.matmul(nxt(), x, lhs_format=bfmt, threads=1)
                same = str(np.array_equal(cands["ours"]().view(np.uint32),
                                          cands["base"]().view(np.uint32)))
            if g is not None:
                mvs = [g.matvec(m, threads=1, type_id=fmt.ggml_type) for m in mats]
                gi = {"i": 0}

                def gcall():
                    gi["i"] = (gi["i"] + 1) % len(mvs)
                    return mvs[gi["i"]](x)
                cands["ggml"] = gcall
            if case == "streamed":  # each candidate sweeps all copies per timing
                cands = {k: (lambda f=f: [f() for _ in mats]) for k, f in cands.items()}
            t = rr(cands, a.rounds, calls)
            if case == "streamed":
                t = {k: v / len(mats) for k, v in t.items()}
            tb, tg = t.get("base", np.nan), t.get("ggml", np.nan)
            print(f"| {name} | {case} | {t['ours']:.3f} | {tb:.3f} | {tg:.3f} | "
                  f"{tb / t['ours']:.2f} | {tg / t['ours']:.2f} | {same} |")
            if g is not None:
                del mvs
        for nb in a.batch:
            xb = rng.standard_normal((nb, a.cols)).astype(np.float32)
            cands = {"ours": lambda: qk.matmul(w, xb, lhs_format=fmt, threads=1)}
            same = "-"
            if base is not None:
                bfmt = getattr(base.quant, name)
                cands["base"] = lambda: base.matmul(w, xb, lhs_format=bfmt, threads=1)
                same = str(np.array_equal(cands["ours"]().view(np.uint32),
                                          cands["base"]().view(np.uint32)))
            t = rr(cands, a.rounds, max(1, a.calls // 4))
            tb = t.get("base", np.nan)
            print(f"| {name} | gemm batch {nb} | {t['ours']:.3f} | {tb:.3f} | - | "
                  f"{tb / t['ours']:.2f} | - | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
