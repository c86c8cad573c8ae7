"""Agreement counts of numba_qk's MXFP4 / NVFP4 record codecs with ggml (and gguf-py).

    python bench/agreement_mxrec.py [--ggml-lib DIR] [--blocks N]

Quantize: ``qk.quantize`` vs ggml's ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref``
(through ctypes; ``--ggml-lib`` / NUMBA_QK_GGML_LIB for a native build, else libggml-python) and,
for MXFP4, gguf-py's numpy encoder, on N blocks per input family (default 100,000 blocks in all
per format): scaled normal (10^U(-40, 38)), Cauchy, tie-heavy quarter-integers times powers of
two, tiny (amax < 2^-120, f32 subnormals), amax 0..7 ulps below a power of two, and all-equal
blocks.  Dequantize: random record bytes vs ggml's ``dequantize_row_*`` and gguf-py's.
Counts are blocks (records) compared / equal; equality is bitwise (NaN == NaN).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_bridge  # noqa: E402


def families(n: int, per: int, seed: int) -> dict:
    r = np.random.default_rng(seed)
    f = np.float32
    out = {}
    with np.errstate(over="ignore"):
        out["scaled normal"] = r.standard_normal((per, n)) * 10.0 ** r.uniform(-40, 38, (per, 1))
        out["cauchy"] = r.standard_cauchy((per, n))
        out["ties"] = r.integers(-48, 49, (per, n)) / 4 * 2.0 ** r.integers(-130, 125, (per, 1))
        out["tiny"] = r.uniform(-1, 1, (per, n)) * 2.0 ** r.uniform(-150, -120, (per, 1))
        top = (np.ldexp(f(1), r.integers(-140, 128, per)).astype(f).view(np.uint32)
               - r.integers(0, 8, per).astype(np.uint32)).view(f)
        x = r.uniform(-1, 1, (per, n)) * top[:, None]
        x[np.arange(per), r.integers(0, n, per)] = top
        out["near 2^k"] = x
        out["all equal"] = np.repeat(r.standard_normal((per, 1)) * 10.0 ** r.uniform(-40, 38, (per, 1)), n, 1)
    return {k: np.where(np.isfinite(v), v, 0).astype(f) for k, v in out.items()}


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return ((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all(axis=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB"))
    ap.add_argument("--blocks", type=int, default=100_000)
    args = ap.parse_args()
    g = ggml_bridge.load(args.ggml_lib) if args.ggml_lib else ggml_bridge.load()
    if g is None:
        raise SystemExit("no ggml library found")
    try:
        import gguf
        from gguf import quants as gq
    except ImportError:
        gguf = None
    print(f"ggml: {g.version}; gguf-py: {getattr(gguf, '__version__', None) or 'installed' if gguf else 'absent'}")
    t0 = time.time()
    for fmt, tid in ((qk.quant.mxfp4, 39), (qk.quant.nvfp4, 40)):
        fams = families(fmt.block_size, -(-args.blocks // 6), 1000 + tid)
        total = equal = 0
        for name, x in fams.items():
            ours = qk.quantize(x, fmt)
            eq = (ours == g.quantize_ref(tid, x)).all(axis=1)
            total += len(eq)
            equal += int(eq.sum())
            line = f"  {fmt.name} quantize vs ggml  {name:14s} {int(eq.sum()):7d} / {len(eq)}"
            if fmt is qk.quant.mxfp4 and gguf is not None:
                with np.errstate(all="ignore"):
                    gp = gq.quantize(x, gguf.GGMLQuantizationType.MXFP4).reshape(ours.shape)
                line += f"   vs gguf-py {int((gp == ours).all(axis=1).sum()):7d} / {len(eq)}"
            print(line)
        print(f"{fmt.name} quantize vs ggml: {equal} / {total} blocks equal")
        raw = np.random.default_rng(7 + tid).integers(0, 256, (args.blocks, fmt.block_bytes),
                                                      dtype=np.uint8)
        ours = qk.dequantize(raw, fmt)
        eq = same_bits(ours, g.dequantize(tid, raw))
        line = f"{fmt.name} dequantize vs ggml: {int(eq.sum())} / {len(eq)} records equal"
        if gguf is not None:
            with np.errstate(all="ignore"):
                gp = gq.dequantize(raw, gguf.GGMLQuantizationType(tid)).reshape(ours.shape)
            line += f"; vs gguf-py: {int(same_bits(ours, gp).sum())} / {len(eq)}"
        print(line)
    print(f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
