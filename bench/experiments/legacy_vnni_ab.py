"""A/B of the legacy gemv: the pmaddwd tile loop (one record per call, the driver's ``legacy.DRIVEN[code][1]``)
against the AVX-512 VNNI loop (``legacy._vnni_gemv_trip``, 8 rows x ``trip`` records per call),
interleaved in one process (alternating batches, best batch of each), weights hot and
DRAM-streamed (distinct copies totalling >= 4x L3).  Results are checked bit-equal first.

    python bench/experiments/legacy_vnni_ab.py [--rows 4096] [--cols 4096] [--trips 2 4 8] [q4_0 q8_0 ...]
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


def _variants(code, trips):
    """The old loop and the VNNI loop per trip, with the format code a compile-time constant."""
    fns = {"pmaddwd": legacy.DRIVEN[code][1]}   # the driver's pmaddwd tile loop
    for t in trips:
        def make(t=t):
            @kernel
            def new_fn(w, x, out):
                legacy._vnni_gemv_trip(code, w, x, out, t, True)

            @kernel
            def ins_fn(w, x, out):
                legacy._vnni_gemv_trip(code, w, x, out, t, False)
            return new_fn, ins_fn
        fns[f"vnni x{t}"], fns[f"vnni-ins x{t}"] = make()
    return fns


def ab(name, rows, cols, trips, repeat):
    fmt = getattr(qk.quant, name)
    act = qk.activation_format(fmt)
    rng = np.random.default_rng(0)
    g = cols // 32
    w = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32),
                    format=fmt).reshape(rows, g, -1)
    xq = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
    fns = _variants(_LL.FORMATS.index(fmt), trips)
    outs = {k: np.empty(rows, np.float32) for k in fns}
    for k, fn in fns.items():
        fn(w, xq, outs[k])
    ref = outs["pmaddwd"].view(np.uint32).tolist()
    assert all(o.view(np.uint32).tolist() == ref for o in outs.values()), "bits differ"
    copies = -(-4 * l3_bytes() // w.nbytes)
    ws = [w.copy() for _ in range(copies)]
    for label, ws_ in (("hot", [w]), (f"DRAM x{copies}", ws)):
        r = race({k: cycling([lambda v=v, fn=fn, o=outs[k]: fn(v, xq, o) for v in ws_])
                  for k, fn in fns.items()}, repeat=repeat)
        base = r["pmaddwd"]
        cells = "  ".join(f"{k} {t * 1e3:.3f} ms ({w.nbytes / t / 1e9:.1f} GB/s, "
                          f"{t / base:.2f}x)" for k, t in r.items())
        print(f"{fmt.name} {label} {rows}x{cols}: {cells}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("formats", nargs="*", default=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--trips", type=int, nargs="*", default=[2, 4, 8])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    for name in a.formats:
        ab(name, a.rows, a.cols, a.trips, a.repeat)


if __name__ == "__main__":
    main()
