"""A/B of a format's panel decode (``simd/iq_grid.py`` ``_decode_into``): the unit-by-unit
decode (``old``; IQ3_S's units from the VBMI nibble tables since session 20, scalar entry
loads before) against the format's 512-bit decoder (``new``, ``_DECODE_WIDE``: IQ4_XS, IQ3_S
with AVX-512 VBMI), interleaved in one process, ns per record over a matrix of random records
(finite d) decoded row by row into a ~384 KiB buffer as ``drive.panel_gemm`` does; the decoded
bytes of both are compared first.  ``--rows 256 --repeat 16`` keeps the records in L2 (the
decode's own cost).

    python bench/experiments/grid_decode_ab.py [iq3_s] [--rounds 15] [--rows 4096] [--repeat 1]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from numba import njit

import numba_qk as qk
from numba_qk.kernels.simd import iq_grid as S


def _decoder(name, wide):
    dec = S.decode_intrinsic(lambda b, wb, db: S._decode_into(b, S.FORMATS[name], wb, db, wide))

    @njit(nogil=True)
    def run(w, buf):
        rows, g = w.shape[0], w.shape[1]
        per = buf.shape[0] // (g * S.DEC_BYTES)
        for r in range(rows):
            at = (r % per) * g * S.DEC_BYTES
            for b in range(g):
                dec(w, r * w.strides[0] + b * w.strides[1], buf, at + b * S.DEC_BYTES)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format", nargs="?", default="iq3_s")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=1, help="passes over the matrix per timing")
    args = ap.parse_args(argv)
    if args.format not in S._DECODE_WIDE:
        print(f"{args.format}: no 512-bit decoder on this target")
        return 1
    fmt = getattr(qk.quant, args.format)
    rng = np.random.default_rng(1)
    g = 16
    w = rng.integers(0, 256, (args.rows, g, fmt.block_bytes), dtype=np.uint8)
    w[:, :, 0:2] = np.array([0.5], np.float16).view(np.uint8)   # finite d
    cands = {"old": _decoder(args.format, False), "new": _decoder(args.format, True)}
    bufs = {k: np.zeros(64 * g * S.DEC_BYTES, np.uint8) for k in cands}
    for k, f in cands.items():
        f(w[:64], bufs[k])
    assert (bufs["old"] == bufs["new"]).all(), "decoded bytes differ"
    print(f"{args.format} decode {args.rows}x{g * 256} (x{args.repeat}), "
          f"load {os.getloadavg()[0]:.2f}")
    times = {k: [] for k in cands}
    for _ in range(args.rounds):
        for k, f in cands.items():
            t = time.perf_counter()
            for _ in range(args.repeat):
                f(w, bufs[k])
            times[k].append(time.perf_counter() - t)
    n = args.rows * g * args.repeat
    for k, v in times.items():
        v = np.array(v) / n * 1e9
        print(f"{k}: best {v.min():.2f} ns/record, median {np.median(v):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
