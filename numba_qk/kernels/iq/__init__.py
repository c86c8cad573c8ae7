"""ggml's IQ record formats (IQ4_NL, IQ4_XS): portable kernels."""
