"""numba_qk in a dozen lines: quantize activations to Q8_K, dot them with Q4_K weights.

    python examples/quickstart.py
"""

import numpy as np

import numba_qk as qk

rng = np.random.default_rng(1)
G = 4                                             # records of 256 elements each
x = rng.standard_normal((G, 256)).astype(np.float32)
xq = qk.quantize(x, format=qk.quant.q8_k)         # u8 [G, 292]

w = rng.integers(0, 256, size=(G, 144), dtype=np.uint8)   # Q4_K weights (random bytes)
w[:, 0:2] = np.array([0.02], "<f2").view(np.uint8)      # d
w[:, 2:4] = np.array([0.01], "<f2").view(np.uint8)      # dmin

r = qk.quantized_dot(w, xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k,
                     acc_dtype=qk.f32)            # 0-d float32 array
print("quantized_dot:", float(r), f"(bits 0x{int(r.view(np.uint32)):08x})")

fields = qk.decode(xq, qk.quant.q8_k)
print("Q8_K ds:", fields.ds, " first q:", fields.q[0, :8])
print("Q4_K storage for 4096 elements:", qk.quant.q4_k.storage_bytes(4096), "bytes")
# The explicit (and different) route: dequantize both, then an ordinary f32 dot.
approx = np.dot(qk.dequantize(w, qk.quant.q4_k).ravel(), qk.dequantize(xq, qk.quant.q8_k).ravel())
print("dequantize + f32 dot (not canonical):", approx)
