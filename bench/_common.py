"""Shared inputs for the benchmarks (deterministic, model-shaped): numba_qk.samples."""

from numba_qk.samples import activations, q4_k_weights  # noqa: F401
