"""Row-interleaved weights: ``qk.repack`` once, then the same ``matmul`` -- same bits, faster
matvec (one weight row per vector lane, no horizontal sums; the idea of ggml's CPU_REPACK).

    python examples/repack_matvec.py
"""

import time

import numpy as np

import numba_qk as qk

rng = np.random.default_rng(3)
rows, cols = 4096, 4096
weights = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
x = rng.standard_normal(cols).astype(np.float32)


def best_of(fn, n=20):
    fn()                                   # compile / warm up outside the timing
    t = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


for fmt in qk.REPACK_FORMATS:              # Q4_0, Q4_K, IQ4_NL
    records = qk.quantize(weights.reshape(-1, fmt.block_size), format=fmt)
    w = records.reshape(rows, cols // fmt.block_size, -1)
    rp = qk.repack(w, fmt)                 # a one-time copy; keep it with the model layer
    y_plain = qk.matmul(w, x, lhs_format=fmt)
    y_rep = qk.matmul(rp, x, lhs_format=fmt)
    assert (y_plain.view(np.uint32) == y_rep.view(np.uint32)).all()   # bit for bit
    assert (rp.unpack() == w).all()                                   # the records come back
    t_plain = best_of(lambda: qk.matmul(w, x, lhs_format=fmt))
    t_rep = best_of(lambda: qk.matmul(rp, x, lhs_format=fmt))
    print(f"{fmt.name}: matvec {rows}x{cols} plain {t_plain * 1e6:7.1f} us, repacked "
          f"{t_rep * 1e6:7.1f} us ({t_plain / t_rep:.1f}x), identical bits")
