"""Generate tests/golden/iq_grid_ggml.npz: ggml's dequantized values of the grid IQ formats
(IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M) on records ggml wrote and on random
bytes.

    python tests/golden/make_iq_grid_golden.py [LIBDIR]   # LIBDIR: a folder with
                                                          # libggml-base.so and libggml-cpu.so
                                                          # (default: libggml-python)

Per format ``<name>``: ``<name>_records`` (8 records from ggml's ``ggml_quantize_chunk`` of
normal rows, 1024 per row, with an importance matrix of U(0.1, 2) weights: IQ2_XXS, IQ2_XS and
IQ1_S need one), ``<name>_random`` (16 records of random bytes, seed 43: NaN/inf scales among
them) and ``<name>_records_values`` / ``<name>_random_values`` (ggml's ``dequantize_row_*``),
never from numba_qk; the library is named in the file.
"""

import ctypes as C
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

TYPES = (("iq2_xxs", 16, 66), ("iq2_xs", 17, 74), ("iq3_xxs", 18, 98), ("iq1_s", 19, 50),
         ("iq3_s", 21, 110), ("iq2_s", 22, 82), ("iq1_m", 29, 56))


def main(libdir=None):
    from numba_qk.testing import ggml as bridge
    g = bridge.load(libdir) if libdir else bridge.load()
    qc = g.base.ggml_quantize_chunk
    qc.restype = C.c_size_t
    qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_void_p]
    out = {"library": f"{g.version} ({g.libdir})"}
    for k, (name, tid, nbytes) in enumerate(TYPES):
        r = np.random.default_rng(100 + k)
        x = np.ascontiguousarray(r.standard_normal((2, 1024)), np.float32)
        imat = r.uniform(0.1, 2.0, 1024).astype(np.float32)
        rec = np.zeros((8, nbytes), np.uint8)
        qc(tid, x.ctypes.data, rec.ctypes.data, 0, 2, 1024, imat.ctypes.data)
        rnd = np.random.default_rng(43 + k).integers(0, 256, (16, nbytes), dtype=np.uint8)
        out.update({f"{name}_records": rec, f"{name}_records_values": g.dequantize(tid, rec),
                    f"{name}_random": rnd, f"{name}_random_values": g.dequantize(tid, rnd)})
        print(name, rec.shape, rnd.shape)
    np.savez_compressed(HERE / "iq_grid_ggml.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
