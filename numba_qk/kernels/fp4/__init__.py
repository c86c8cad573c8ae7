"""ggml's FP4 records MXFP4 (type 39) and NVFP4 (type 40): layout and kernels."""
