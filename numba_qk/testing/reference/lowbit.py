"""A slow, readable oracle for ggml's 1- and 2-bit scale-only formats Q1_0 and Q2_0, written
from ggml's C (``block_q1_0`` / ``block_q2_0`` in ggml-common.h; ``dequantize_row_q*_0`` and
``quantize_row_q*_0_ref`` in ggml-quants.c; ``ggml_vec_dot_q*_0_q8_0_generic`` in ggml-cpu's
quants.c for the structure of the dot) and docs/numerics.md ("Q1_0 and Q2_0").  Shares no code
with the kernels: Python ints for the integer steps, numpy float32 scalars for every float
step.
"""

from __future__ import annotations

import math

import numpy as np

from .core import F32, R32, f16_bits, f16_value, left_fold

__all__ = ["BLOCK", "SPAN", "multipliers", "dequantize", "record_value", "quantized_dot",
           "quantize_block"]

BLOCK = {"Q1_0": 128, "Q2_0": 64}
SPAN = {"Q1_0": 4, "Q2_0": 2}          # Q8_0 records per weight record
RECORD_BYTES = 18


def multipliers(name: str, a) -> tuple:
    """``(d, t)``: the f16 scale (as f32) and the element multipliers t (ints) in order."""
    a = bytes(a)
    assert len(a) == RECORD_BYTES
    d = f16_value(a[0] | (a[1] << 8))
    qs = a[2:18]
    if name == "Q1_0":
        t = [1 if (qs[j // 8] >> (j % 8)) & 1 else -1 for j in range(128)]
    else:
        t = [((qs[j // 4] >> (2 * (j % 4))) & 3) - 1 for j in range(64)]
    return d, t


def dequantize(name: str, a) -> list:
    """Q1_0: ``bit ? d : -d``; Q2_0: ``R32(f32(q - 1) * d)``."""
    d, t = multipliers(name, a)
    with np.errstate(all="ignore"):
        if name == "Q1_0":
            return [d if v > 0 else F32(-d) for v in t]
        return [R32(F32(v) * d) for v in t]


def _q8_0(x: bytes) -> tuple:
    d = f16_value(x[0] | (x[1] << 8))
    return d, [b - 256 if b >= 128 else b for b in x[2:34]]


def record_value(name: str, w, xs) -> np.float32:
    """``v = R32(d * T)``, ``T = R32(...R32(R32(0 + p_0) + p_1)...)``,
    ``p_k = R32(d_k * f32(S_k))``, ``S_k = sum t_{32k+i} * q_k[i]`` exact."""
    d, t = multipliers(name, w)
    T = F32(0.0)
    with np.errstate(all="ignore"):
        for k, x in enumerate(xs):
            dk, q = _q8_0(bytes(x))
            S = sum(t[32 * k + i] * q[i] for i in range(32))
            T = R32(T + R32(dk * R32(S)))
        return R32(d * T)


def quantized_dot(name: str, w_records, x_records) -> np.float32:
    """Left fold of the record values, seeded with v_0; +0.0 for G = 0."""
    w_records, x_records = np.asarray(w_records), np.asarray(x_records)
    s = SPAN[name]
    assert x_records.shape[0] == s * w_records.shape[0]
    return left_fold(record_value(name, w_records[b].tobytes(),
                                  [x_records[s * b + k].tobytes() for k in range(s)])
                     for b in range(w_records.shape[0]))


def _c_int_roundf(p: np.float32) -> int:
    """``(int) roundf(p)`` as x86 gives it: halves away from zero; NaN/inf give INT_MIN."""
    if not math.isfinite(float(p)):
        return -2**31
    v = math.floor(abs(float(p)) + 0.5)
    return -v if p < 0 else v


def quantize_block(name: str, values) -> bytes:
    """``quantize_row_q1_0_ref`` / ``quantize_row_q2_0_ref`` of one block of finite f32."""
    n = BLOCK[name]
    x = [F32(v) for v in np.asarray(values, np.float32).reshape(n)]
    qs = bytearray(16)
    with np.errstate(all="ignore"):
        if name == "Q1_0":
            s = F32(0.0)
            for v in x:
                s = R32(s + F32(abs(v)))
            d = R32(s / F32(128.0))
            for j, v in enumerate(x):
                if v >= 0:
                    qs[j // 8] |= 1 << (j % 8)
        else:
            d = F32(0.0)
            for v in x:
                a = F32(abs(v))
                if a > d:
                    d = a
            iscale = R32(F32(1.0) / d) if d > 0 else F32(0.0)
            for j, v in enumerate(x):
                q = min(3, max(0, _c_int_roundf(R32(v * iscale)) + 1))
                qs[j // 4] |= q << (2 * (j % 4))
    return f16_bits(d).to_bytes(2, "little") + bytes(qs)
