"""Agreement counts of numba_qk.astype (f32 sources) with ml_dtypes and numkong.

    python bench/agreement_lowp.py

For each type: every rounding boundary +-1 f32 ulp (the tests' inputs) and 10^6 random f32 bit
patterns; codes equal (NaN == NaN of the same sign), and whether every ml_dtypes difference lies
in a deliberate DESIGN.md §8 row; numkong differences split by NaN / inf / finite input.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numba_qk as qk  # noqa: E402
from test_lowp_codecs import (FLOATS, boundary_inputs, codes_of, ml_codes,  # noqa: E402
                              policy_mask, same_value_bits)

try:
    import numkong as nk
except ImportError:  # pragma: no cover
    nk = None

NK = {qk.bf16: "bfloat16", qk.f16: "float16", qk.e4m3: "e4m3", qk.e5m2: "e5m2",
      qk.e2m3: "e2m3", qk.e3m2: "e3m2"}


def nk_codes(x, t):
    b = np.frombuffer(bytes(memoryview(nk.astype(x, NK[t]))), np.uint8)
    return (b.view(np.uint16) if t.block_bytes == 2 else b).astype(np.int64)


def main():
    rng = np.random.default_rng(123)
    rand = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for t in FLOATS:
        for label, x in (("boundaries", boundary_inputs(t)), ("random 1e6", rand)):
            if t is qk.e8m0:
                x = np.abs(x)
            ours = codes_of(qk.astype(x, t))
            eq = same_value_bits(ours, ml_codes(x, t), t)
            pol = policy_mask(x, t) | ((x <= 0) if t is qk.e8m0 else False)
            line = (f"{t.name:5s} {label:11s} n={x.size:8d} ml_dtypes equal={eq.sum():8d} "
                    f"differ={(~eq).sum():7d} (all in §8 rows: {bool(pol[~eq].all())})")
            if nk is not None and t in NK:
                with np.errstate(all="ignore"):
                    k = nk_codes(x, t)
                d = ~same_value_bits(ours, k, t)
                xs = x[d]
                line += (f" | numkong equal={(~d).sum():8d} differ={d.sum():7d} (NaN "
                         f"{int(np.isnan(xs).sum())}, inf {int(np.isinf(xs).sum())}, finite "
                         f"{int(np.isfinite(xs).sum())})")
            print(line)


if __name__ == "__main__":
    main()
