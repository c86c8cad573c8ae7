"""Low-precision element types (spec 004): encode/decode kernels."""
