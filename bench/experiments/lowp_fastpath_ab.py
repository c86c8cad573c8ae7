"""A/B of the lowp cast fast paths in ONE process (interleaved, best of N), for a loaded machine.

    python bench/experiments/lowp_fastpath_ab.py [--n 16777216] [--repeat 15] [--types bf16,f16,...]

For each f32 <-> T cast (kernel calls with preallocated outputs, one per variant):
  portable  the converter compiled with the explicit-vector paths off, plain stores (the code
            before the speed work),
  port+nt   the same, streaming its output (the shipped widening path before its vector run),
  fast      the shipped kernel with plain stores,
  fast+nt   the shipped kernel streaming its output (non-temporal stores),
  numkong   numkong.astype(out=).
astype ships ``fast`` for narrowing casts and ``fast+nt`` for widening ones (outputs of at least
numba_qk.kernels.simd.stream.STREAM_MIN_BYTES).  Every variant's bits are checked equal.  Ratios are
times (lower is faster).  Timing figures for bench/RESULTS*.md come from compare_lowp.py on a
quiet machine; this script is for A/B ratios under load.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import numba_qk as qk
from numba_qk.kernels.lowp import codecs as L

try:
    import numkong as nk
except ImportError:  # pragma: no cover
    nk = None

KIND = {"bf16": L.K_BF16, "f16": L.K_F16, "e4m3": L.K_E4M3, "e5m2": L.K_E5M2,
        "e2m3": L.K_E2M3, "e3m2": L.K_E3M2}
NK = {"bf16": "bfloat16", "f16": "float16"}


def portable(S, D):
    saved = L._PERM_KINDS, L._VEC_ENC
    L._PERM_KINDS, L._VEC_ENC = (), False
    try:
        return L._make_converter(S, D, 1, 1)
    finally:
        L._PERM_KINDS, L._VEC_ENC = saved


def interleaved(fns, repeat):
    for f in fns.values():
        f()
    ts = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return {k: min(v) * 1e3 for k, v in ts.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--types", default=",".join(KIND))
    a = ap.parse_args(argv)
    x = (np.random.default_rng(0).standard_normal(a.n) * 3).astype(np.float32)
    xs = x.view(np.uint32).reshape(1, 1, -1)
    T = L._T_E8M0
    print(f"| cast | portable ms | port+nt ms | fast ms | fast+nt ms | numkong ms | "
          f"shipped/old shipped | shipped/numkong |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.types.split(","):
        t, K, kname = qk.from_name(name), KIND[name], NK.get(name, name)
        codes = qk.astype(x, t)
        store = codes.storage if isinstance(codes, qk.Tensor) else codes
        cs = store.reshape(-1).view(f"u{store.dtype.itemsize}")
        k_out = nk.astype(x, kname) if nk else None
        for S, D, src, dt, label in ((L.K_F32, K, xs, cs.dtype, f"f32 -> {name}"),
                                     (K, L.K_F32, cs.reshape(1, 1, -1), np.uint32,
                                      f"{name} -> f32")):
            old, new = portable(S, D), L.converter(S, D, 1, 1)
            outs = [np.empty(a.n, dt) for _ in range(4)]
            fns = {"portable": lambda: old(src, outs[0], T, 0, False),
                   "port+nt": lambda: old(src, outs[3], T, 0, True),
                   "fast": lambda: new(src, outs[1], T, 0, False),
                   "fast+nt": lambda: new(src, outs[2], T, 0, True)}
            if nk is not None:
                f4 = np.empty(a.n, np.float32)
                fns["numkong"] = (lambda: nk.astype(x, kname, out=k_out)) if S == L.K_F32 else \
                    (lambda: nk.astype(k_out, "float32", out=f4))
            r = interleaved(fns, a.repeat)
            assert all((o == outs[0]).all() for o in outs[1:]), label
            shipped = r["fast+nt"] if D == L.K_F32 else r["fast"]
            before = r["port+nt"] if D == L.K_F32 else r["portable"]
            kn = r.get("numkong")
            print(f"| {label} | {r['portable']:.2f} | {r['port+nt']:.2f} | {r['fast']:.2f} | "
                  f"{r['fast+nt']:.2f} | "
                  f"{kn if kn is None else f'{kn:.2f}'} | {shipped / before:.2f} | "
                  f"{'--' if kn is None else f'{shipped / kn:.2f}'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
