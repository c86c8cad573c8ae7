"""Shared inputs for the benchmarks (deterministic, model-shaped)."""

import numpy as np


def q4_k_weights(rows: int, groups: int, seed: int = 0) -> np.ndarray:
    """Random Q4_K records u8 [rows, groups, 144] with weight-like f16 d/dmin."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, size=(rows, groups, 144), dtype=np.uint8)
    d = (np.abs(rng.standard_normal((rows, groups))) * 0.01 + 1e-4).astype("<f2")
    dmin = (np.abs(rng.standard_normal((rows, groups))) * 0.005).astype("<f2")
    w[:, :, 0:2] = d.view(np.uint8).reshape(rows, groups, 2)
    w[:, :, 2:4] = dmin.view(np.uint8).reshape(rows, groups, 2)
    return w


def activations(groups: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((groups, 256)).astype(np.float32)
