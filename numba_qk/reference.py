"""A slow, readable oracle for the canonical operations, written straight from spec 000.

It shares no code with the kernels: Python integers for every integer step, numpy float32
scalars for every float step (numpy rounds each float32 operation to nearest-even, without
FMA), fields decoded from the spec's byte formulas, f16 decoded from its bit fields by hand.
It exists to check the fast paths bit for bit (tests, ``python -m numba_qk``); it is far too
slow for real work.
"""

from __future__ import annotations

import math
import struct

import numpy as np

__all__ = [
    "f16_value", "decode_q4_k", "decode_q8_k", "record_value", "quantized_dot",
    "quantize_block", "quantize", "ReferenceDomainError",
]

F32 = np.float32


class ReferenceDomainError(ValueError):
    def __init__(self, block):
        self.block = block
        super().__init__(f"block {block} is out of quantize's domain")


def f16_value(bits: int) -> np.float32:
    """The value of an IEEE binary16 bit pattern as float32 (exact: every f16 is an f32)."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exponent = (bits >> 10) & 0x1F
    mantissa = bits & 0x3FF
    if exponent == 0x1F:
        return F32(sign * math.inf) if mantissa == 0 else F32(math.nan)
    if exponent == 0:  # zero or subnormal: mantissa * 2**-24
        return F32(sign * math.ldexp(mantissa, -24))
    return F32(sign * math.ldexp(1024 + mantissa, exponent - 25))


def R32(x) -> np.float32:
    """One round-to-nearest-even to float32.  Python ints below 2**53 pass through float
    exactly, so an integer is rounded once."""
    if isinstance(x, int):
        assert abs(x) < 2**53
        return F32(float(x))
    return F32(x)


def decode_q4_k(a: bytes) -> dict:
    """Fields of one 144-byte Q4_K record (spec section 2)."""
    assert len(a) == 144
    d = f16_value(a[0] | (a[1] << 8))
    dmin = f16_value(a[2] | (a[3] << 8))
    fields = []
    for r in (0, 1):  # r = 0: sc, r = 1: m
        f = [0] * 8
        for i in range(4):
            f[i] = a[4 + 4 * r + i] & 63
        for t in range(4):
            f[4 + t] = ((a[12 + t] >> (4 * r)) & 15) | ((a[4 + 4 * r + t] >> 6) << 4)
        fields.append(f)
    q = []
    for i in range(256):
        packed = a[16 + 32 * (i // 64) + (i % 32)]
        q.append((packed >> (0 if i % 64 < 32 else 4)) & 15)
    return {"d": d, "dmin": dmin, "sc": fields[0], "m": fields[1], "q": q}


def decode_q8_k(a: bytes) -> dict:
    """Fields of one 292-byte Q8_K record (spec section 2)."""
    assert len(a) == 292
    ds = F32(struct.unpack("<f", bytes(a[0:4]))[0])
    if math.isnan(ds):  # keep the exact stored NaN bits
        ds = np.frombuffer(bytes(a[0:4]), dtype="<f4")[0]
    q = [b - 256 if b >= 128 else b for b in a[4:260]]
    bsum = [struct.unpack("<h", bytes(a[260 + 2 * j: 262 + 2 * j]))[0] for j in range(16)]
    return {"ds": ds, "q": q, "bsum": bsum}


def record_sums(w: bytes, x: bytes) -> tuple[int, int]:
    """Exact integers S_b and T_b of spec section 3."""
    W, X = decode_q4_k(w), decode_q8_k(x)
    S = sum(W["sc"][s] * sum(W["q"][32 * s + i] * X["q"][32 * s + i] for i in range(32))
            for s in range(8))
    T = sum(W["m"][s] * (X["bsum"][2 * s] + X["bsum"][2 * s + 1]) for s in range(8))
    return S, T


def record_value(w: bytes, x: bytes) -> np.float32:
    """v_b of spec section 3, one f32 rounding per named step."""
    W, X = decode_q4_k(w), decode_q8_k(x)
    S, T = record_sums(w, x)
    with np.errstate(all="ignore"):
        p = R32(W["d"] * R32(S))
        n = R32(W["dmin"] * R32(T))
        return R32(X["ds"] * R32(p - n))


def quantized_dot(w_records, x_records) -> np.float32:
    """Left fold of v_b in record order, seeded with v_0; +0.0 for G = 0."""
    w_records = np.asarray(w_records)
    x_records = np.asarray(x_records)
    assert w_records.shape[0] == x_records.shape[0]
    acc = None
    with np.errstate(all="ignore"):
        for b in range(w_records.shape[0]):
            v = record_value(w_records[b].tobytes(), x_records[b].tobytes())
            acc = v if acc is None else R32(acc + v)
    return F32(0.0) if acc is None else acc


def quantize_block(values) -> bytes:
    """One 292-byte Q8_K record from 256 float32 values (spec section 4)."""
    values = [F32(v) for v in values]
    assert len(values) == 256
    if not all(math.isfinite(v) for v in values):
        raise ReferenceDomainError(None)
    mx, mn = max(values), min(values)
    if mx == 0 and mn == 0:
        return bytes(292)
    extreme = mx if abs(mx) > abs(mn) else mn  # ties pick the minimum
    with np.errstate(all="ignore"):
        inverse = R32(F32(-127.0) / extreme)
        if not math.isfinite(inverse):
            raise ReferenceDomainError(None)
        ds = R32(F32(1.0) / inverse)
        q = []
        for v in values:
            scaled = R32(v * inverse)
            assert math.isfinite(scaled)
            r = round(float(scaled))  # Python's round(): nearest, ties to even
            q.append(max(-128, min(127, r)))
    bsum = [sum(q[16 * j: 16 * j + 16]) for j in range(16)]
    return (struct.pack("<f", ds) + struct.pack("<256b", *q) + struct.pack("<16h", *bsum))


def quantize(values) -> np.ndarray:
    """Quantize f32 [G, 256] to u8 [G, 292]; raises ReferenceDomainError naming the block."""
    values = np.asarray(values, dtype=np.float32)
    out = np.empty((values.shape[0], 292), dtype=np.uint8)
    for b in range(values.shape[0]):
        try:
            out[b] = np.frombuffer(quantize_block(values[b]), dtype=np.uint8)
        except ReferenceDomainError:
            raise ReferenceDomainError(b) from None
    return out
