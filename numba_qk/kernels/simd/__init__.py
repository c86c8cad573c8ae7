"""The arch tier: explicit-SIMD building blocks (numba intrinsics emitting LLVM IR) and
the per-format SIMD tiles.  Optional: every format's portable loops are complete
without them; each tile gives the portable loop's bits.  Also here, as what ggml's x86 tier
computes rather than an intrinsic: ``ggml_cpu.py``, the activation quantizers llama.cpp runs
(``ggml-cpu/arch/x86/quants.c``), portable ``@njit`` code with their numerics."""
