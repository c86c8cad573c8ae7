"""Generate tests/golden/mxfp4_ggml.npz and tests/golden/nvfp4_ggml.npz: inputs, and ggml's
own records and dequantized values for them.

    python tests/golden/make_mxrec_golden.py [LIBDIR]   # LIBDIR: a folder with libggml-base.so
                                                        # and libggml-cpu.so (default:
                                                        # libggml-python)

Records come from ggml's ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref`` and values
from ``dequantize_row_*`` (``ggml_get_type_traits(type)->from_float_ref`` / ``to_float``), never
from numba_qk; the library is named in each file.  Inputs (float32; fixed seeds; blocks of 32
for MXFP4, 64 for NVFP4; ``inputs(block)`` below):
  normal      40  normal * 10**U(-30, 30) per block
  heavy       40  standard Cauchy
  tiny        40  amax from 2^-150 to 2^-120 (f32 subnormals; MXFP4's wrapped scale bytes)
  huge        16  amax near f32 max (MXFP4 scale 252/253, k*d overflow; NVFP4 scale 0x7E)
  pow2        64  amax 0..3 ulps below and at a power of two 2^-140..2^127 (log2f rounding)
  equal       13  every value one constant (0.3, -2, 1e-3, 7, 1e-20, -6e4, 6, -0.5, 448/6, 1e30,
                  2^-126, 3e38, f32 max)
  zero         4  +0.0, -0.0, alternating, -0.0 with one tiny negative
  ties        64  values exactly halfway between neighbouring table entries after scaling, both
                  signs, plus NVFP4 ue4m3 rounding ties (amax / 6 halfway between codes)
and 256 records of random bytes per format (seed 31) with ggml's dequantization.
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

MIDS = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0])  # halfway between doubled e2m1 entries


def inputs(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    f = np.float32
    rows = []
    with np.errstate(over="ignore"):
        rows += list((r.standard_normal((40, n)) * 10.0 ** r.uniform(-30, 30, (40, 1))).astype(f))
        rows += list(r.standard_cauchy((40, n)).astype(f))
        amax = 2.0 ** r.uniform(-150, -120, 40)
        rows += list((r.uniform(-1, 1, (40, n)) * amax[:, None]).astype(f))
        big = np.finfo(f).max
        rows += list((r.uniform(-1, 1, (16, n)) * big).astype(f))
    for k in range(64):
        e = int(r.integers(-140, 128))
        ulps = k % 4
        top = np.array(np.ldexp(1.0, e), f).view(np.uint32) - np.uint32(ulps)
        a = np.array(top, np.uint32).view(f)
        row = (r.uniform(-1, 1, n) * a).astype(f)
        row[r.integers(0, n)] = a if k % 2 else -a
        rows.append(row)
    for v in (0.3, -2.0, 1e-3, 7.0, 1e-20, -6e4, 6.0, -0.5, 448 / 6, 1e30, 2.0 ** -126, 3e38,
              float(np.finfo(f).max)):
        rows.append(np.full(n, v, f))
    rows.append(np.zeros(n, f))
    rows.append(np.full(n, -0.0, f))
    alt = np.zeros(n, f)
    alt[1::2] = -0.0
    rows.append(alt)
    z = np.full(n, -0.0, f)
    z[3] = -1e-30
    rows.append(z)
    for k in range(64):
        if n == 32:  # MXFP4: amax in [8d, 16d) fixes e; d = 2^(e - 128)
            d = 2.0 ** int(r.integers(-120, 120))
            row = r.choice(MIDS, n) * d * r.choice([-1.0, 1.0], n)
            row[0] = (8.0 + (k % 8)) * d
        else:  # NVFP4: amax = 6 s with s an exact (or halfway) ue4m3 value; d = s / 2
            man = int(r.integers(0, 8))
            ex = int(r.integers(-6, 8))
            s = (1 + man / 8) * 2.0 ** ex
            if k % 4 == 3:  # amax / 6 halfway between two ue4m3 codes (round half up)
                s = (1 + (man + 0.5) / 8) * 2.0 ** ex
            d = s / 2
            row = r.choice(MIDS, n) * d * r.choice([-1.0, 1.0], n)
            for sub in range(4):
                row[16 * sub + int(r.integers(0, 16))] = 6 * s * (1 if k % 2 else -1)
        rows.append(row.astype(f))
    return np.stack(rows).astype(f)


def main(argv):
    from numba_qk.testing import ggml as ggml_bridge

    g = ggml_bridge.load(argv[0] if argv else None)
    if g is None:
        raise SystemExit("ggml not found (pip install libggml-python, or pass a library folder)")
    for name, tid, n, nbytes, seed in (("mxfp4", 39, 32, 17, 29), ("nvfp4", 40, 64, 36, 30)):
        x = inputs(n, seed)
        assert np.isfinite(x).all()
        rec = g.quantize_ref(tid, x)
        raw = np.random.default_rng(31).integers(0, 256, (256, nbytes), dtype=np.uint8)
        raw[0] = 0
        raw[1] = 0xFF
        y = g.dequantize(tid, raw)
        np.savez_compressed(HERE / f"{name}_ggml.npz", x=x, records=rec, r_random=raw,
                            y_random=y, ggml=np.array(g.version))
        print(name, x.shape, rec.shape, g.version)


if __name__ == "__main__":
    main(sys.argv[1:])
