"""Generate tests/golden/tq1_0_ggml.npz and tests/golden/tq2_0_ggml.npz: inputs, and ggml's own
records and dequantized values for them.

    python tests/golden/make_ternary_golden.py [LIBDIR]   # default: libggml-python

Records come from ggml's ``quantize_row_tq*_0_ref`` (``from_float_ref``, what
``ggml_quantize_chunk`` calls for these types) and values from ``dequantize_row_tq*_0``
(``to_float``), never from numba_qk; the library is named in each file.  Inputs (float32 blocks
of 256, fixed seed; ``inputs()`` below): normal * 10**U(-30, 30) (40), Cauchy (16), ties at
+-amax/2 (8), amax below 1/FLT_MAX so that ``1/amax`` overflows (8), constants and zeros (8);
and 128 records of random bytes per format (NaN/inf/subnormal scales in the first four) with
ggml's dequantization, and ``vec_dot`` against ggml-quantized Q8_K activations.
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))


def inputs(seed: int = 24) -> np.ndarray:
    r = np.random.default_rng(seed)
    f = np.float32
    rows = []
    with np.errstate(over="ignore"):
        rows += list((r.standard_normal((40, 256)) * 10.0 ** r.uniform(-30, 30, (40, 1))).astype(f))
    rows += list(r.standard_cauchy((16, 256)).astype(f))
    for k in range(8):              # exact halves of amax: lroundf's ties (away from zero)
        a = f(2.0 ** int(r.integers(-20, 20)))
        row = (r.choice([-1.0, -0.5, 0.0, 0.5, 1.0], 256) * a).astype(f)
        row[k] = a
        rows.append(row)
    for k in range(8):              # amax < 1/FLT_MAX: id = 1/amax is inf
        row = (r.uniform(-1, 1, 256) * 2.0 ** -130).astype(f)
        row[0] = f(2.0 ** -129)
        rows.append(row)
    for v in (0.0, -0.0, 1.0, -3.0, 65504.0, 70000.0, 1e-8, 3e38):
        rows.append(np.full(256, v, f))
    return np.stack(rows).astype(f)


def records(nbytes: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    rec = r.integers(0, 256, (128, nbytes), dtype=np.uint8)
    scales = np.array([0x7C00, 0xFC00, 0x7E01, 0x0001], "<u2").view(np.uint8).reshape(4, 2)
    rec[:4, -2:] = scales
    rec[4:, -2:] = (r.standard_normal(124) * 0.01).astype("<f2").view(np.uint8).reshape(124, 2)
    return rec


def main(libdir=None):
    from numba_qk.testing import ggml as bridge
    g = bridge.load(libdir) if libdir else bridge.load()
    x = inputs()
    for name, tid, nbytes in (("tq1_0", 34, 54), ("tq2_0", 35, 66)):
        rec = records(nbytes, 31 + tid)
        act = np.random.default_rng(7).standard_normal((128, 256)).astype(np.float32)
        xq = np.zeros((128, 292), np.uint8)
        g.quantize_q8_k(act, xq)
        dots = np.array([g.vec_dot(tid, rec[4 + 4 * k: 8 + 4 * k], xq[4 + 4 * k: 8 + 4 * k])
                         for k in range(31)], np.float32)
        np.savez_compressed(HERE / f"{name}_ggml.npz", ggml=str(g), inputs=x,
                            quantized=g.quantize_ref(tid, x), records=rec,
                            dequantized=g.dequantize(tid, rec), q8_k=xq, vec_dot=dots)
        print(name, "written")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
