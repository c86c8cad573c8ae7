"""``python -m numba_qk`` -- the demo / self-check on an embedded default input.

It builds a deterministic sample (Q4_K weights, f32 activations), quantizes the activations to
Q8_K, runs ``quantized_dot`` and a composed GEMV, checks every result bit for bit against the
slow reference oracle, and prints the results and the throughput.  Exit status 0 means every
check passed.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _sample(rows: int, groups: int, seed: int):
    """Deterministic Q4_K weight records [rows, G, 144] and f32 activations [G, 256]."""
    from numba_qk.samples import activations, q4_k_weights

    return q4_k_weights(rows, groups, seed), activations(groups, seed + 1)


def _best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _hex(v) -> str:
    return f"0x{int(np.asarray(v, np.float32).view(np.uint32)):08x}"


def demo(rows: int, groups: int, seed: int, check_rows: int) -> int:
    import numba_qk as qk
    from numba_qk import reference as ref
    import os

    Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
    w, x = _sample(rows, groups, seed)
    print(f"numba_qk {qk.__version__}: sample of {rows} Q4_K rows x {groups} records "
          f"({groups * 256} elements per row, {w.nbytes / 2**20:.2f} MiB of weights), seed {seed}")

    t0 = time.perf_counter()
    xq = qk.quantize(x, format=Q8)
    dot0 = qk.quantized_dot(w[0], xq, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)
    out = np.empty(rows, np.float32)
    out = qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8)
    out_mt = qk.matmul(w, x.ravel(), lhs_format=Q4, threads=None)
    first = time.perf_counter() - t0
    print(f"first calls (compile, or load from numba's on-disk cache): {first:.2f} s")

    failures = 0
    want_q = ref.quantize(x)
    same = int((want_q == xq).all(axis=1).sum())
    print(f"quantize -> Q8_K: {same}/{groups} records bit-identical to the reference")
    failures += groups - same

    want0 = ref.quantized_dot(w[0], xq)
    ok = _hex(want0) == _hex(dot0)
    print(f"quantized_dot(row 0) = {float(dot0):.9g} ({_hex(dot0)}); reference "
          f"{float(want0):.9g} ({_hex(want0)}): {'bit-identical' if ok else 'MISMATCH'}")
    failures += not ok

    n = min(rows, check_rows)
    bad = [r for r in range(n) if _hex(ref.quantized_dot(w[r], xq)) != _hex(out[r])]
    bad += [r for r in range(rows) if _hex(out_mt[r]) != _hex(out[r])]
    print(f"gemv: {n - len(bad)}/{n} checked rows bit-identical to the reference; "
          f"multi-threaded matmul identical on all {rows} rows: {'yes' if not bad else 'NO'}"
          + (f"; first bad row {bad[0]}" if bad else ""))
    failures += len(bad)
    print(f"gemv out[:4] = {np.array2string(out[:4], precision=6)}")

    t_q = _best_time(lambda: qk.quantize(x, format=Q8), 20)
    t_d = _best_time(lambda: qk.quantized_dot(w[0], xq, lhs_format=Q4, rhs_format=Q8), 50)
    t_g = _best_time(lambda: qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8, out=out), 10)
    t_m = _best_time(lambda: qk.matmul(w, x.ravel(), lhs_format=Q4, threads=None), 10)
    print("throughput (single thread, best of repeats):")
    print(f"  quantize      {x.nbytes / t_q / 1e9:7.2f} GB/s of f32 input   "
          f"({t_q * 1e6:9.1f} us for {groups} blocks)")
    print(f"  quantized_dot {w[0].nbytes / t_d / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_d * 1e6:9.1f} us for G={groups}, incl. API checks)")
    print(f"  gemv          {w.nbytes / t_g / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_g * 1e3:9.3f} ms, {t_g / w.shape[0] / groups * 1e9:.1f} ns per record)")
    print(f"  matmul, {os.cpu_count()} thr {w.nbytes / t_m / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_m * 1e3:9.3f} ms, f32 x quantized inside)")
    if failures:
        print(f"FAILED: {failures} mismatches against the reference", file=sys.stderr)
        return 1
    print("all checks bit-exact: OK")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m numba_qk",
        description="numba_qk demo: quantize, quantized_dot and a GEMV on an embedded sample, "
                    "checked bit for bit against the reference oracle.")
    parser.add_argument("--rows", type=int, default=512, help="weight rows (default 512)")
    parser.add_argument("--groups", type=int, default=16,
                        help="records per row, 256 elements each (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    parser.add_argument("--check-rows", type=int, default=32,
                        help="GEMV rows checked against the slow reference (default 32)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.groups < 1 or args.check_rows < 0:
        parser.error("--rows and --groups must be >= 1, --check-rows >= 0")
    return demo(args.rows, args.groups, args.seed, args.check_rows)


if __name__ == "__main__":
    sys.exit(main())
