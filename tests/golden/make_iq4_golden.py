"""Generate tests/golden/iq4_nl_ggml.npz and tests/golden/iq4_xs_ggml.npz: inputs, and ggml's
own records and dequantized values for them.

    python tests/golden/make_iq4_golden.py [LIBDIR]   # LIBDIR: a folder with libggml-base.so
                                                      # and libggml-cpu.so (default:
                                                      # libggml-python)

Records come from ggml's ``ggml_quantize_chunk`` (``quantize_iq4_nl`` / ``quantize_iq4_xs``,
``ntry = 7``, no importance matrix) and values from ``dequantize_row_iq4_*``
(``ggml_get_type_traits(type)->to_float``), never from numba_qk; the library is named in each
file.  Inputs (float32, fixed seeds, one block per row: 32 values for IQ4_NL, 256 for IQ4_XS):
  normal  24  normal * 10**U(-30, 30) per row
  heavy   12  Student t (2 degrees of freedom)
  tiny     6  amax about 1e-16 (below GROUP_MAX_EPS in some sub-blocks)
  huge     4  amax near 1e20 and f32 max (x*x overflows: NaN scales inside ggml's search)
  equal    6  every value one constant (3.5, -2, 1e-3, 0.3, 1e30, -0.0)
  zero     2  +0.0; half zeros, half normal
and 64 records of random bytes per format (seed 41; NaN/inf scales included) with ggml's
dequantization.
"""

import ctypes as C
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))


def inputs(n: int, seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    f = np.float32
    rows = []
    with np.errstate(over="ignore"):
        rows += list((r.standard_normal((24, n)) * 10.0 ** r.uniform(-30, 30, (24, 1))).astype(f))
        rows += list(r.standard_t(2, (12, n)).astype(f))
        rows += list((r.standard_normal((6, n)) * 1e-16).astype(f))
        rows += list((r.uniform(-1, 1, (2, n)) * 1e20).astype(f))
        rows += list((r.uniform(-1, 1, (2, n)) * float(np.finfo(f).max)).astype(f))
    for v in (3.5, -2.0, 1e-3, 0.3, 1e30, -0.0):
        rows.append(np.full(n, v, f))
    rows.append(np.zeros(n, f))
    half = r.standard_normal(n).astype(f)
    half[: n // 2] = 0
    rows.append(half)
    return np.stack(rows)


def main(libdir=None):
    from numba_qk.testing import ggml as bridge
    g = bridge.load(libdir) if libdir else bridge.load()
    qc = g.base.ggml_quantize_chunk
    qc.restype = C.c_size_t
    qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_void_p]
    for name, tid, block, nbytes, seed in (("iq4_nl", 20, 32, 18, 11), ("iq4_xs", 23, 256, 136, 13)):
        x = np.ascontiguousarray(inputs(block, seed))
        rec = np.zeros((x.shape[0], nbytes), np.uint8)
        qc(tid, x.ctypes.data, rec.ctypes.data, 0, x.shape[0], block, None)
        rnd = np.random.default_rng(41).integers(0, 256, (64, nbytes), dtype=np.uint8)
        np.savez_compressed(HERE / f"{name}_ggml.npz", inputs=x, records=rec,
                            values=g.dequantize(tid, rec), random_records=rnd,
                            random_values=g.dequantize(tid, rnd), library=f"{g.version} ({g.libdir})")
        print(name, x.shape, "->", rec.shape)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
