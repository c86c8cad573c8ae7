"""A slow, readable oracle for ggml's ternary formats TQ1_0 and TQ2_0, written from ggml's C
(``block_tq1_0`` / ``block_tq2_0`` in ggml-common.h; ``dequantize_row_tq*_0`` and
``quantize_row_tq*_0_ref`` in ggml-quants.c; ``ggml_vec_dot_tq*_0_q8_K_generic`` in ggml-cpu
for the element order of the dot) and docs/numerics.md ("Ternary formats") for the record
value.  Shares no code with the kernels: Python ints for the integer steps, numpy float32
scalars for every float step.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from .core import fold_records, F32, R32, decode_q8_k, f16_value

__all__ = ["RECORD_BYTES", "ternaries", "dequantize", "record_value", "quantized_dot",
           "quantize_block"]

RECORD_BYTES = {"TQ1_0": 54, "TQ2_0": 66}
_POW3 = (1, 3, 9, 27, 81, 243)


def _digit(byte: int, n: int) -> int:
    q = (byte * _POW3[n]) & 0xFF          # uint8_t q = qs[j] * pow3[n]
    return (q * 3) >> 8                   # ((uint16_t) q * 3) >> 8


def ternaries(name: str, a) -> tuple:
    """``(d, t)``: the f16 scale (as f32) and the 256 element values t (ints) in ggml's order."""
    a = bytes(a)
    assert len(a) == RECORD_BYTES[name]
    t = []
    if name == "TQ1_0":
        qs, qh = a[0:48], a[48:52]
        for n in range(5):                      # bytes 0..31, 32 at a time
            t += [_digit(qs[m], n) - 1 for m in range(32)]
        for n in range(5):                      # bytes 32..47, 16 at a time
            t += [_digit(qs[32 + m], n) - 1 for m in range(16)]
        for n in range(4):                      # qh, 4 digits each
            t += [_digit(qh[j], n) - 1 for j in range(4)]
        d = f16_value(a[52] | (a[53] << 8))
    else:
        qs = a[0:64]
        for j in (0, 32):
            for l in range(4):
                t += [((qs[j + m] >> (2 * l)) & 3) - 1 for m in range(32)]
        d = f16_value(a[64] | (a[65] << 8))
    return d, t


def dequantize(name: str, a) -> list:
    """``y = R32(f32(t) * d)`` per element (``(float)(xi - 1) * d``)."""
    d, t = ternaries(name, a)
    with np.errstate(all="ignore"):
        return [R32(F32(v) * d) for v in t]


def record_value(name: str, w, x) -> np.float32:
    """``v = R32(ds * R32(f32(d) * f32(S)))``, ``S = sum t_i * xq_i`` exact."""
    d, t = ternaries(name, w)
    X = decode_q8_k(bytes(x))
    S = sum(ti * qi for ti, qi in zip(t, X["q"]))
    with np.errstate(all="ignore"):
        return R32(X["ds"] * R32(d * R32(S)))


def quantized_dot(name: str, w_records, x_records) -> np.float32:
    """Left fold of the record values, seeded with v_0; +0.0 for G = 0."""
    return fold_records(partial(record_value, name), w_records, x_records)


def _lroundf(p: np.float32) -> int:
    """glibc ``lroundf`` on x86-64 narrowed to int: halves away from zero; NaN/inf give
    ``(int)LONG_MIN == 0``."""
    if not math.isfinite(float(p)):
        return 0
    v = math.floor(abs(float(p)) + 0.5)
    return -v if p < 0 else v


def quantize_block(name: str, values) -> bytes:
    """``quantize_row_tq1_0_ref`` / ``quantize_row_tq2_0_ref`` of one block of 256 finite f32."""
    x = [F32(v) for v in np.asarray(values, np.float32).reshape(256)]
    amax = F32(0.0)
    for v in x:
        a = F32(abs(v))
        amax = amax if amax > a else a
    with np.errstate(all="ignore"):
        iscale = R32(F32(1.0) / amax) if amax != 0 else F32(0.0)

        def code(v):
            return _lroundf(R32(v * iscale)) + 1
    with np.errstate(all="ignore"):
        d = np.array([amax], np.float32).astype(np.float16).tobytes()
    out = bytearray()
    if name == "TQ1_0":
        for base, width in ((0, 32), (160, 16)):
            for m in range(width):
                q = 0
                for n in range(5):
                    q = (q * 3 + code(x[base + m + width * n])) & 0xFF
                out.append(((q * 256 + 242) // 243) & 0xFF)
        for j in range(4):
            q = 0
            for m in range(4):
                q = (q * 3 + code(x[240 + j + 4 * m])) & 0xFF
            q = (q * 3) & 0xFF
            out.append(((q * 256 + 242) // 243) & 0xFF)
    else:
        for c in range(2):
            for m in range(32):
                q = 0
                for n in range(4):
                    q += (code(x[128 * c + m + 32 * n]) & 3) << (2 * n)
                out.append(q & 0xFF)
    return bytes(out) + d
