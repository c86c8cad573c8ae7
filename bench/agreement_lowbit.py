"""Agreement counts of numba_qk's Q1_0 / Q2_0 codecs and dots with ggml.

    python bench/agreement_lowbit.py [--ggml-lib DIR] [--blocks N] [--seed S] [--speed]

Quantize: ``qk.quantize`` vs ggml's ``ggml_quantize_chunk`` (``quantize_q*_0``), without and
with an importance matrix (ggml ignores it), on N blocks of scaled normal values
(10^U(-40, 38), non-finite rows dropped) plus zeros, -0.0, amax below 1/FLT_MAX and roundf ties;
the oracle (``numba_qk.testing.reference.lowbit``) on every 10th block.  Dequantize: N random
records (inf/NaN/signalling-NaN/subnormal scales first) vs ``dequantize_row_q*_0``, NaN
payloads compared.  Dots: N/3 three-record dots (random and ggml-quantized weight records,
ggml-quantized Q8_0 activations) vs ggml's ``ggml_vec_dot_q*_0_q8_0_generic`` (Q2_0's x86
``vec_dot`` is the generic one) and vs ggml's CPU ``vec_dot`` (Q1_0: its AVX2 kernel, lane-wise
FMAs).  ``--ggml-lib`` / NUMBA_QK_GGML_LIB: a native build's folder; else libggml-python.
``--speed [--rounds 7] [--stream-mb 256] [--cpu-time]``: only the products' table of
``bench/_common.speed_table`` (4096x4096, 1 thread: matvec hot and DRAM-streamed, batch-32
``matmul``; numba_qk's ``matmul``, activations quantized to Q8_0 inside, against ggml's
``ggml_mul_mat`` graph, each pair interleaved, best of ``--rounds``, wall clock or with
``--cpu-time`` the process's CPU time, for loaded machines).
"""

import argparse
import ctypes as C
import time
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numba_qk as qk  # noqa: E402
from numba_qk.testing import ggml as ggml_bridge  # noqa: E402
from numba_qk.testing import reference as R  # noqa: E402


def bits_equal(a, b):
    a, b = np.float32(a), np.float32(b)
    return bool(a.view(np.uint32) == b.view(np.uint32) or (np.isnan(a) and np.isnan(b)))


def weights(fmt, rows, cols):
    """The speed table's weights: N(0, 1) rows through ``qk.quantize``."""
    x = np.random.default_rng(0).standard_normal((rows * cols // fmt.block_size, fmt.block_size))
    return qk.quantize(x.astype(np.float32), fmt).reshape(rows, -1, fmt.block_bytes)


def speed(g, label, rounds, stream_mb, cpu_time) -> int:
    from numba_qk.kernels.simd import base as _simd

    from _common import speed_table

    print(f"{label}; numba_qk SIMD: {_simd.HAVE_AVX2=} {_simd.HAVE_AVX512=} {_simd.HAVE_VNNI=}; "
          f"1 thread; {'CPU' if cpu_time else 'wall'} time; load average {os.getloadavg()[0]:.2f}")
    speed_table(g, (qk.quant.q1_0, qk.quant.q2_0), weights, "4096x4096", rounds, stream_mb,
                time.process_time if cpu_time else time.perf_counter)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ggml-lib", default=os.environ.get("NUMBA_QK_GGML_LIB"))
    ap.add_argument("--blocks", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stream-mb", type=float, default=256.0)
    ap.add_argument("--cpu-time", action="store_true",
                    help="--speed: best CPU time of the process instead of wall time")
    a = ap.parse_args()
    g = ggml_bridge.load(a.ggml_lib) if a.ggml_lib else ggml_bridge.load()
    if g is None:
        print("no ggml library")
        return 1
    if a.speed:
        return speed(g, f"ggml: {a.ggml_lib or 'libggml-python'} {g.version}", a.rounds,
                     a.stream_mb, a.cpu_time)
    cpu = C.CDLL(str(Path(a.ggml_lib) / "libggml-cpu.so")) if a.ggml_lib else g.cpu
    print(f"ggml: {a.ggml_lib or 'libggml-python'}; {a.blocks} blocks per format, seed {a.seed}")
    rng = np.random.default_rng(a.seed)
    n_blocks = a.blocks
    for f, tid in ((qk.quant.q1_0, 41), (qk.quant.q2_0, 42)):
        n, span = f.block_size, f.block_size // 32
        gen = getattr(cpu, "ggml_vec_dot_q1_0_q8_0_generic" if tid == 41
                      else "ggml_vec_dot_q2_0_q8_0")
        gen.argtypes = [C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                        C.c_void_p, C.c_size_t, C.c_int]
        with np.errstate(all="ignore"):
            x = (rng.standard_normal((n_blocks, n))
                 * 10.0 ** rng.uniform(-40, 38, (n_blocks, 1))).astype(np.float32)
        x[0], x[1] = 0.0, -0.0
        x[2, ::2] = -0.0
        x[3] = (rng.uniform(-1, 1, n) * 2.0 ** -135).astype(np.float32)
        x[3, 0] = 2.0 ** -130
        x[4] = rng.choice([-1, -.5, 0, .5, 1], n).astype(np.float32)
        x[4, 0] = 1
        x = x[np.isfinite(x).all(1)]
        want = g.quantize_chunk(tid, x)
        got = qk.quantize(x, f)
        print(f"{f.name} quantize: {int((want == got).all(1).sum())} / {len(x)} records equal")
        w_im = g.quantize_chunk(tid, x, imatrix=rng.uniform(0, 2, n).astype(np.float32))
        print(f"{f.name} quantize, ggml given an importance matrix: "
              f"{int((w_im == got).all(1).sum())} / {len(x)}")
        rows = range(0, len(x), 10)
        ok = sum(R.quantize(f, x[i]) == want[i].tobytes() for i in rows)
        print(f"{f.name} oracle quantize: {ok} / {len(rows)}")
        rec = rng.integers(0, 256, (n_blocks, 18), dtype=np.uint8)
        rec[:8, :2] = np.array([0x7C00, 0xFC00, 0x7E01, 0x7C01, 0xFE00, 0x8000, 0, 0x0001],
                               "<u2").view(np.uint8).reshape(8, 2)
        same = (g.dequantize(tid, rec).view(np.uint32) == qk.dequantize(rec, f).view(np.uint32))
        print(f"{f.name} dequantize: {int(same.all(1).sum())} / {n_blocks} records bit-equal")
        for src, recs in (("random", rec[8:]), ("ggml-quantized", want)):
            m = len(recs) // 3
            xs = g.quantize_chunk(8, rng.standard_normal((m * 3 * span, 32)).astype(np.float32))
            xs = xs.reshape(m, 3 * span, 34)
            ws = np.ascontiguousarray(recs[:3 * m].reshape(m, 3, 18))
            eq_gen = zero_sign = eq_cpu = 0
            for i in range(m):
                ours = np.float32(qk.quantized_dot(ws[i], xs[i], lhs_format=f,
                                                   rhs_format=qk.quant.q8_0))
                s = C.c_float()
                gen(3 * n, C.byref(s), 0, ws[i].ctypes.data, 0, xs[i].ctypes.data, 0, 1)
                gv = np.float32(s.value)
                if bits_equal(ours, gv):
                    eq_gen += 1
                elif ours == gv == 0:
                    zero_sign += 1
                eq_cpu += bits_equal(ours, np.float32(g.vec_dot(tid, ws[i], xs[i])))
            print(f"{f.name} dot ({src} weights): {eq_gen} / {m} bit-equal to ggml's generic "
                  f"vec_dot, {zero_sign} more differ only in the sign of zero; {eq_cpu} / {m} "
                  f"bit-equal to ggml's CPU vec_dot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
