"""Ternary record formats (ggml TQ1_0, TQ2_0)."""
