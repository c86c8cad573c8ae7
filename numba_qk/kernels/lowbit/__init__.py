"""ggml's 1- and 2-bit scale-only formats Q1_0 and Q2_0 (``lowbit``)."""
