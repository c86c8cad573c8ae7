"""Generate tests/golden/q1_0_ggml.npz and tests/golden/q2_0_ggml.npz: inputs, and ggml's own
records, dequantized values and dots for them.

    python tests/golden/make_lowbit_golden.py [LIBDIR]   # default: libggml-python

Records come from ggml's ``ggml_quantize_chunk`` (``quantize_q*_0``: ``quantize_row_q*_0_ref``,
an importance matrix ignored), values from ``dequantize_row_q*_0`` (``to_float``) and dots
from ``ggml_vec_dot_q*_0_q8_0_generic`` (Q2_0's ``vec_dot`` is the generic one on x86), never
from numba_qk; the library is named in each file.  Inputs (``inputs()``): normal *
10**U(-38, 38) (48), Cauchy (16), exact halves of amax (8; Q2_0's roundf ties), amax below
1/FLT_MAX (8; Q2_0's ``1/amax`` overflows), constants, zeros and -0.0 (8); and 128 records of
random bytes per format (inf/NaN/signalling-NaN/subnormal scales in the first eight) with
ggml's dequantization, and dots of 3 records against ggml-quantized Q8_0 activations.
"""

import ctypes as C
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

SCALES = (0x7C00, 0xFC00, 0x7E01, 0x7C01, 0xFD00, 0x0001, 0x8000, 0x0000)


def inputs(n: int, seed: int = 24) -> np.ndarray:
    r = np.random.default_rng(seed)
    f = np.float32
    rows = []
    with np.errstate(over="ignore"):
        rows += list((r.standard_normal((48, n)) * 10.0 ** r.uniform(-38, 38, (48, 1))).astype(f))
    rows += list(r.standard_cauchy((16, n)).astype(f))
    for k in range(8):
        a = f(2.0 ** int(r.integers(-20, 20)))
        row = (r.choice([-1.0, -0.5, 0.0, 0.5, 1.0], n) * a).astype(f)
        row[k] = a
        rows.append(row)
    for k in range(8):
        row = (r.uniform(-1, 1, n) * 2.0 ** -130).astype(f)
        row[k] = f(2.0 ** -129)
        rows.append(row)
    for v in (0.0, -0.0, 1.0, -3.0, 65504.0, 70000.0, 1e-8, 3e38):
        rows.append(np.full(n, v, f))
    x = np.stack(rows).astype(f)
    x[-8, ::2] = -0.0
    return x


def records(seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    rec = r.integers(0, 256, (128, 18), dtype=np.uint8)
    rec[:8, :2] = np.array(SCALES, "<u2").view(np.uint8).reshape(8, 2)
    rec[8:, :2] = (r.standard_normal(120) * 0.05).astype("<f2").view(np.uint8).reshape(120, 2)
    return rec


def generic_dot(libdir, tid):
    """ggml's ``ggml_vec_dot_q*_0_q8_0_generic`` (Q2_0: its ``vec_dot``, the generic one)."""
    lib = C.CDLL(str(Path(libdir) / "libggml-cpu.so"))
    fn = getattr(lib, "ggml_vec_dot_q1_0_q8_0_generic" if tid == 41
                 else "ggml_vec_dot_q2_0_q8_0")
    fn.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                   C.c_void_p, C.c_size_t, C.c_int]

    def dot(n, w, x):
        s = C.c_float()
        w, x = np.ascontiguousarray(w), np.ascontiguousarray(x)
        fn(n, C.byref(s), 0, w.ctypes.data, 0, x.ctypes.data, 0, 1)
        return np.float32(s.value)
    return dot


def main(libdir=None):
    from numba_qk.testing import ggml as bridge
    if libdir is None:
        import libggml
        libdir = next(Path(libggml.__file__).resolve().parent.rglob("libggml-cpu.so")).parent
    g = bridge.load(libdir)
    for name, tid, n in (("q1_0", 41, 128), ("q2_0", 42, 64)):
        x = inputs(n)
        rec = records(31 + tid)
        span = n // 32
        act = np.random.default_rng(7).standard_normal((128 * span, 32)).astype(np.float32)
        xq = g.quantize_chunk(8, act)
        dot = generic_dot(libdir, tid)
        dots = np.array([dot(3 * n, rec[8 + 3 * k: 11 + 3 * k],
                             xq[span * (8 + 3 * k): span * (11 + 3 * k)]) for k in range(40)],
                        np.float32)
        np.savez_compressed(HERE / f"{name}_ggml.npz", ggml=str(libdir), inputs=x,
                            quantized=g.quantize_chunk(tid, x), records=rec,
                            dequantized=g.dequantize(tid, rec), q8_0=xq, vec_dot=dots)
        print(name, "written")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
