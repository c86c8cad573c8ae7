"""A/B of the Q4_K x Q8_K gemm kernels, interleaved in one process (alternating batches, best
batch of each), so machine load affects every candidate alike:

* ``old``: the pmaddubsw/pmaddwd tile kernel (``dot._simd_gemm``, what runs without VNNI),
* ``new``: the default ``gemm_q4_k_q8_k`` (AMX-INT8 tiles for batch >= 9 where the CPU has
  AMX, else the VNNI kernels where it has AVX512-VNNI),
* ``vnni``: the AVX512-VNNI kernels alone (``dot._vnni_gemm``: the row-lane kernel for batch >= 2),
* ``matmul``: the public ``qk.matmul`` with f32 activations (quantize + gemm), 1 thread,
* ``quantize``: the Q8_K quantization of the activations alone (its share of ``matmul``),
* ``ggml``: ggml's mul_mat (plain CPU buffer) when ``--ggml-lib`` (or NUMBA_QK_GGML_LIB) names a
  native build, and ``ggml_<BUFT>`` with the weights in each extra buffer type that converts
  Q4_K (CPU_REPACK, AMX); matmul/ggml is against the fastest of them.

    python bench/experiments/gemm_ab.py [--rows 4096] [--cols 4096] [--batch 8 32 128 512] [--ggml-lib DIR]

Prints ms per call and the ratios new/old, new/vnni, matmul/ggml.  Take final figures on a
quiet machine.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_ctypes  # noqa: E402
from numba_qk.kernels.simd import base as _simd
from numba_qk.kernels.kquants import dot  # noqa: E402
from numba_qk.kernels.kquants.dot import _simd_gemm, _vnni_gemm, gemm_q4_k_q8_k  # noqa: E402

from _common import q4_k_weights  # noqa: E402
import compare  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB") or None)
    args = ap.parse_args(argv)
    g = args.cols // 256
    w = q4_k_weights(args.rows, g)
    ggml = ggml_ctypes.load(args.ggml_lib) if args.ggml_lib else None
    print(f"Q4_K gemm {args.rows}x{args.cols}; VNNI kernel: {_simd.HAVE_VNNI}; "
          f"AMX: {dot.HAVE_AMX}; "
          f"ggml: {'native build' if ggml else 'not measured'}; load {os.getloadavg()[0]:.2f}")
    for batch in args.batch:
        x = np.random.default_rng(batch).standard_normal((batch, args.cols)).astype(np.float32)
        xq = qk.quantize(x.reshape(-1, 256), format=qk.quant.q8_k).reshape(batch, g, 292)
        out_old = np.empty((batch, args.rows), np.float32)
        out_new = np.empty((batch, args.rows), np.float32)
        out_vnni = np.empty((batch, args.rows), np.float32)
        blocks = np.empty((batch * g, 292), np.uint8)
        cands = {
            "old": lambda: _simd_gemm(w, xq, out_old),
            "new": lambda: gemm_q4_k_q8_k(w, xq, out_new),
            "vnni": lambda: _vnni_gemm(w, xq, out_vnni),
            "matmul": lambda: qk.matmul(w, x, lhs_format=qk.quant.q4_k, threads=1),
            "quantize": lambda: qk.quantize(x.reshape(-1, 256), format=qk.quant.q8_k,
                                            out=blocks),
        }
        if ggml is not None:
            mv = ggml.matvec(w, 1, batch=batch, type_id=ggml_ctypes.GGML_TYPE_Q4_K, buft="CPU")
            cands["ggml"] = lambda: mv(x)
            for buft in ggml.weight_bufts(ggml_ctypes.GGML_TYPE_Q4_K):
                if buft not in ("CPU", "AMX"):   # AMX: batched mul_mat may be refused in a VM
                    mvb = ggml.matvec(w, 1, batch=batch, type_id=ggml_ctypes.GGML_TYPE_Q4_K,
                                      buft=buft)
                    cands[f"ggml_{buft}"] = lambda mvb=mvb: mvb(x)
        cands["old"]()
        cands["new"]()
        assert (out_old.view(np.uint32) == out_new.view(np.uint32)).all(), "old != new"
        if _simd.HAVE_VNNI and _simd.HAVE_AVX512:
            cands["vnni"]()
            assert (out_vnni.view(np.uint32) == out_new.view(np.uint32)).all(), "vnni != new"
        else:
            del cands["vnni"]
        r = compare.race(cands, min_time=args.min_time, repeat=args.repeat)
        pairs = batch * args.rows * g
        line = " ".join(f"{k} {v * 1e3:8.3f} ms" for k, v in r.items())
        ratio = f"new/old {r['new'] / r['old']:.2f}"
        if "vnni" in r:
            ratio += f", new/vnni {r['new'] / r['vnni']:.2f}"
        if "ggml" in r:
            best = min((k for k in r if k.startswith("ggml")), key=r.get)
            ratio += f", matmul/ggml {r['matmul'] / r[best]:.2f} ({best})"
        print(f"batch {batch:4d}: {line}  ({r['new'] / pairs * 1e9:.2f} ns/record pair; {ratio};"
              f" quantize {r['quantize'] / r['matmul'] * 100:.1f}% of matmul)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
