"""The K-quants (Q2_K..Q6_K, Q8_K) and their dots against Q8_K: per format one module
with its decoders, ggml's dequantizer and quantizer and the portable record dot."""
