"""Block-scaled formats (OCP MX, NVFP4): encode/decode kernels."""
