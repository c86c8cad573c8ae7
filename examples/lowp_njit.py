"""Low-precision types from your own @njit code: a bf16 x e4m3 dot with numba_qk's codecs.

numba cannot type ml_dtypes arrays, so hold the codes as uint16/uint8 arrays (a Tensor's
``.storage``) and decode them with ``numba_qk.kernels.decode_<type>``.
"""

import numpy as np
from numba import njit

import numba_qk as qk
from numba_qk.kernels import decode_bf16, decode_e4m3, encode_e4m3


@njit(cache=True)
def mixed_dot(a_bf16, b_e4m3):
    acc = 0.0
    for i in range(a_bf16.shape[0]):
        acc += np.float64(decode_bf16(a_bf16[i])) * np.float64(decode_e4m3(b_e4m3[i]))
    return acc


@njit(cache=True)
def requantize_e4m3(values, out):
    for i in range(values.shape[0]):
        out[i] = encode_e4m3(values[i])


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1024).astype(np.float32)
    y = rng.standard_normal(1024).astype(np.float32)
    a = qk.astype(x, qk.bf16)            # Tensor: .storage is uint16 codes
    b = qk.astype(y, qk.e4m3)            # Tensor: .storage is uint8 codes
    got = mixed_dot(a.storage, b.storage)
    want = float(qk.astype(a, qk.f32).astype(np.float64) @ qk.astype(b, qk.f32).astype(np.float64))
    assert abs(got - want) <= 1e-9 * max(1.0, abs(want)), (got, want)
    codes = np.empty(1024, np.uint8)
    requantize_e4m3(y, codes)
    assert np.array_equal(codes, b.storage)   # the njit encoder is astype's encoder
    print(f"bf16 . e4m3 dot = {got:.6f}; njit e4m3 encoder == astype: True")


if __name__ == "__main__":
    main()
