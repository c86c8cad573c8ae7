"""The arch tier: explicit-SIMD building blocks (numba intrinsics emitting LLVM IR) and
the per-format SIMD tiles.  Optional: every format's portable loops are complete
without them; each tile gives the portable loop's bits."""
