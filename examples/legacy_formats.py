"""ggml's legacy block formats: quantize f32 weights exactly as ggml does, run a quantized
matvec, and compare with the f32 result.

    python examples/legacy_formats.py
"""

import numpy as np

import numba_qk as qk

rng = np.random.default_rng(2)
rows, cols = 256, 1024
weights = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
x = rng.standard_normal(cols).astype(np.float32)
exact = weights.astype(np.float64) @ x.astype(np.float64)

for fmt in (qk.quant.q4_0, qk.quant.q4_1, qk.quant.q5_0, qk.quant.q5_1, qk.quant.q8_0):
    blocks = weights.reshape(-1, fmt.block_size)
    records = qk.quantize(blocks, format=fmt).reshape(rows, cols // fmt.block_size, -1)
    y = qk.matmul(records, x, lhs_format=fmt, threads=None)  # x quantized once to its pair
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    size = fmt.storage_bytes(weights.size)
    print(f"{fmt.name}: {size / 1024:6.1f} KiB ({fmt.bits_per_element:.2f} bits/weight), "
          f"activations as {qk.activation_format(fmt).name}, relative error {rel:.2e}")
