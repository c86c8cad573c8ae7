"""Deterministic, model-shaped sample data (the CLI's embedded default, benchmarks, examples).

Q4_K weights are random record bytes with weight-like f16 ``d``/``dmin`` (every quant and
6-bit scale pattern occurs, which ``quantize(..., format=quant.q4_k)`` output would not);
activations are standard normal float32.
"""

import numpy as np


def q4_k_weights(rows: int, groups: int, seed: int = 0) -> np.ndarray:
    """Q4_K records u8 ``[rows, groups, 144]``: random quants and scales, ``d`` around 0.01."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, size=(rows, groups, 144), dtype=np.uint8)
    d = (np.abs(rng.standard_normal((rows, groups))) * 0.01 + 1e-4).astype("<f2")
    dmin = (np.abs(rng.standard_normal((rows, groups))) * 0.005).astype("<f2")
    w[:, :, 0:2] = d.view(np.uint8).reshape(rows, groups, 2)
    w[:, :, 2:4] = dmin.view(np.uint8).reshape(rows, groups, 2)
    return w


def activations(groups: int, seed: int = 1) -> np.ndarray:
    """float32 ``[groups, 256]``, standard normal."""
    return np.random.default_rng(seed).standard_normal((groups, 256)).astype(np.float32)
