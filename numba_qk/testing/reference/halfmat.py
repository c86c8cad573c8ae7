"""Oracle for F16/BF16 weight matrices (docs/halfmat.md), written from that text, slow and
plain: python ints for the bit conversions, numpy float32 scalars for each ``R32`` step.

``convert(t, x)`` -> the codes of f32 activations ``x`` (``t`` "f16" or "bf16");
``value(t, code)`` -> the exact f32 value of one code;
``dot(t, w_codes, x_codes)`` -> np.float32, the canonical dot (32 lanes, fixed tree, NaN ->
0x7FC00000)."""

from __future__ import annotations

import numpy as np

from .core import f16_bits, f16_value

__all__ = ["LANES", "convert", "value", "dot"]

LANES = 32
F32 = np.float32


def _f32_bits(v) -> int:
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def bf16_bits(v) -> int:
    """ggml_compute_fp32_to_bf16 of one f32 value."""
    u = _f32_bits(v)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 64
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


def convert(t: str, x) -> list:
    """Codes of the activation values (step 1)."""
    conv = f16_bits if t == "f16" else bf16_bits
    return [conv(F32(v)) for v in np.asarray(x, dtype=np.float32).ravel()]


def value(t: str, code: int) -> np.float32:
    if t == "f16":
        return f16_value(int(code))
    return np.array(int(code) << 16, dtype=np.uint32).view(np.float32)[()]


def dot(t: str, w_codes, x_codes) -> np.float32:
    """Steps 2-5 of docs/halfmat.md for one row of weight codes and activation codes."""
    w_codes, x_codes = list(w_codes), list(x_codes)
    assert len(w_codes) == len(x_codes)
    acc = [F32(0.0)] * LANES
    with np.errstate(all="ignore"):
        for i, (a, b) in enumerate(zip(w_codes, x_codes)):
            p = F32(value(t, a) * value(t, b))
            acc[i % LANES] = F32(acc[i % LANES] + p)
        h = LANES // 2
        while h:
            for j in range(h):
                acc[j] = F32(acc[j] + acc[j + h])
            h //= 2
    s = acc[0]
    if np.isnan(s):
        return np.array(0x7FC00000, dtype=np.uint32).view(np.float32)[()]
    return s
