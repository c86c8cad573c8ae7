"""A/B of the legacy VNNI gemv variants (records per intrinsic call ``trip``; scales by
``vpgatherdd`` or by inserts), interleaved in one process, hot and DRAM-streamed.

    python bench/experiments/legacy_trip_ab.py [--formats q4_0 q8_0] [--rows 4096] [--cols 4096]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

import numba_qk as qk  # noqa: E402
from numba_qk._jit import kernel  # noqa: E402
from numba_qk.kernels.legacy import layout as _LL
from numba_qk.kernels.legacy import kernels as legacy  # noqa: E402

from compare import cycling, l3_bytes, race  # noqa: E402

VARIANTS = [(2, True), (4, True), (8, True), (2, False), (4, False), (8, False)]


def _variant(code, trip, gather):
    @kernel
    def fn(w, x, out):
        legacy._vnni_gemv_trip(code, w, x, out, trip, gather)
    return fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", nargs="*", default=["q4_0", "q8_0"])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for name in a.formats:
        fmt = getattr(qk.quant, name)
        act = qk.activation_format(fmt)
        g = a.cols // 32
        w = qk.quantize(rng.standard_normal((a.rows * g, 32)).astype(np.float32),
                        format=fmt).reshape(a.rows, g, -1)
        xq = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
        code = _LL.FORMATS.index(fmt)
        fns = {f"t{t}{'g' if gth else 'i'}": _variant(code, t, gth) for t, gth in VARIANTS}
        outs = {k: np.empty(a.rows, np.float32) for k in fns}
        for k, f in fns.items():
            f(w, xq, outs[k])
        ref = outs["t4g"].view(np.uint32).tolist()
        assert all(o.view(np.uint32).tolist() == ref for o in outs.values())
        r = race({k: (lambda f=f, k=k: f(w, xq, outs[k])) for k, f in fns.items()},
                 repeat=a.repeat)
        print(f"{name} hot  " + "  ".join(f"{k} {v * 1e6:.0f}us" for k, v in r.items()),
              flush=True)
        copies = -(-4 * l3_bytes() // w.nbytes)
        ws = [w.copy() for _ in range(copies)]
        r = race({k: cycling([lambda v=v, f=f, k=k: f(v, xq, outs[k]) for v in ws])
                  for k, f in fns.items()}, repeat=a.repeat)
        print(f"{name} DRAM " + "  ".join(f"{k} {v * 1e6:.0f}us" for k, v in r.items()),
              flush=True)


if __name__ == "__main__":
    main()
