"""Compose a Q4_K x Q8_K GEMV in your own @njit code from numba_qk's record kernels.

The activation is quantized once (shared preparation) and reused for every weight row; each
output equals numba_qk.quantized_dot(w[r], xq) bit for bit.

    python examples/njit_gemv.py
"""

import numpy as np
from numba import njit

import numba_qk as qk
from numba_qk.kernels import dot_q4_k_q8_k, quantize_q8_k


@njit(nogil=True, cache=True)
def my_matvec(w, x, xq, out):
    """w: Q4_K u8 [rows, G, 144]; x: f32 [G, 256] -> out f32 [rows]. Returns False if x is
    out of quantize's domain."""
    if quantize_q8_k(x, xq) >= 0:   # quantize the activation once ...
        return False
    for r in range(w.shape[0]):      # ... and share it across every row
        out[r] = dot_q4_k_q8_k(w[r], xq)
    return True


def main():
    rng = np.random.default_rng(0)
    rows, g = 8, 4
    w = rng.integers(0, 256, size=(rows, g, 144), dtype=np.uint8)
    w[:, :, 0:2] = np.array([0.01], "<f2").view(np.uint8)      # d
    w[:, :, 2:4] = np.array([0.002], "<f2").view(np.uint8)      # dmin
    x = rng.standard_normal((g, 256)).astype(np.float32)
    xq = np.empty((g, 292), np.uint8)
    out = np.empty(rows, np.float32)
    assert my_matvec(w, x, xq, out)
    for r in range(rows):
        want = qk.quantized_dot(w[r], xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
        assert out[r].view(np.uint32) == want.view(np.uint32), r
    print("matvec:", np.array2string(out, precision=5))
    print(f"all {rows} rows bit-identical to numba_qk.quantized_dot")


if __name__ == "__main__":
    main()
