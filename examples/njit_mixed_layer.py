"""A mixed-format MLP layer in one @njit function, from numba_qk's per-format building blocks.

    out = W_down @ (silu(W_gate @ x) * (W_up @ x))

with W_gate in Q4_0 and W_up in Q8_0 (both take Q8_0 activations: x is quantized once and
shared) and W_down in Q6_K (its activation, the hidden vector, is quantized again, to Q8_K).
The building blocks follow one pattern (``numba_qk.kernels.__all__``): ``quantize_<f>``,
``gemv_<f>_<a>``, ``dot_<f>_<a>``, ``dequantize_<f>``.  The output is checked against the same
composition through the public operations (``numba_qk.quantize`` / ``numba_qk.gemv``), bit for
bit.

    python examples/njit_mixed_layer.py
"""

import numpy as np
from numba import njit

import numba_qk as qk
from numba_qk.kernels import gemv_q4_0_q8_0, gemv_q6_k_q8_k, gemv_q8_0_q8_0, quantize_q8_0, \
    quantize_q8_k

Q8_0_BYTES = qk.quant.q8_0.block_bytes   # 34 bytes per 32 values
Q8_K_BYTES = qk.quant.q8_k.block_bytes   # 292 bytes per 256 values


@njit(nogil=True, cache=True)
def silu_mul(g, u, h):
    """h = silu(g) * u, elementwise in float32 (shared by both paths, so they agree bitwise)."""
    for i in range(g.shape[0]):
        gi = np.float32(g[i])
        h[i] = np.float32(gi / (np.float32(1.0) + np.exp(-gi))) * u[i]


@njit(nogil=True, cache=True)
def mlp(x, w_gate, w_up, w_down, out):
    """x f32 [d] (d a multiple of 256); w_gate Q4_0 [ffn, d/32, 18], w_up Q8_0 [ffn, d/32, 34],
    w_down Q6_K [d, ffn/256, 210] -> out f32 [d].  Returns False if an activation is out of
    quantize's domain (a non-finite value)."""
    xq = np.empty((x.shape[0] // 32, Q8_0_BYTES), np.uint8)
    if quantize_q8_0(x, xq) >= 0:          # quantize the input once ...
        return False
    ffn = w_gate.shape[0]
    g = np.empty(ffn, np.float32)
    u = np.empty(ffn, np.float32)
    gemv_q4_0_q8_0(w_gate, xq, g)          # ... and share it between two weight formats
    gemv_q8_0_q8_0(w_up, xq, u)
    h = np.empty(ffn, np.float32)
    silu_mul(g, u, h)
    hq = np.empty((ffn // 256, Q8_K_BYTES), np.uint8)
    if quantize_q8_k(h.reshape(ffn // 256, 256), hq) >= 0:   # quantize_q8_k takes [G, 256]
        return False
    gemv_q6_k_q8_k(w_down, hq, out)
    return True


def reference(x, w_gate, w_up, w_down):
    """The same layer through the public operations."""
    q = qk.quant
    xq = qk.quantize(x.reshape(-1, 32), q.q8_0)
    g = qk.gemv(w_gate, xq, lhs_format=q.q4_0, rhs_format=q.q8_0)
    u = qk.gemv(w_up, xq, lhs_format=q.q8_0, rhs_format=q.q8_0)
    h = np.empty_like(g)
    silu_mul(g, u, h)
    hq = qk.quantize(h.reshape(-1, 256), q.q8_k)
    return qk.gemv(w_down, hq, lhs_format=q.q6_k, rhs_format=q.q8_k)


def quantized_weights(rng, rows, cols, fmt):
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    return qk.quantize(w.reshape(-1, fmt.block_size), fmt).reshape(rows, cols // fmt.block_size,
                                                                   fmt.block_bytes)


def main():
    rng = np.random.default_rng(0)
    d, ffn = 512, 1024
    w_gate = quantized_weights(rng, ffn, d, qk.quant.q4_0)
    w_up = quantized_weights(rng, ffn, d, qk.quant.q8_0)
    w_down = quantized_weights(rng, d, ffn, qk.quant.q6_k)
    x = rng.standard_normal(d).astype(np.float32)

    out = np.empty(d, np.float32)
    assert mlp(x, w_gate, w_up, w_down, out)
    want = reference(x, w_gate, w_up, w_down)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), "not bit-identical"

    bad = x.copy()
    bad[7] = np.nan
    assert not mlp(bad, w_gate, w_up, w_down, out)   # out of quantize's domain: reported

    print("out[:4]:", np.array2string(out[:4], precision=5))
    print(f"mixed Q4_0/Q8_0/Q6_K layer ({d} -> {ffn} -> {d}) bit-identical to the public ops: OK")


if __name__ == "__main__":
    main()
