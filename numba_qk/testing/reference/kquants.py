"""A slow, readable oracle for the other K-quants (Q2_K, Q3_K, Q5_K, Q6_K): field decoding,
dequantization and the exact record dot against Q8_K, written from DESIGN.md section 7 and
ggml's ``block_q*_K`` layouts / ``dequantize_row_q*_K`` loops.

It shares no code with the kernels: Python integers for every integer step, numpy float32
scalars for every float step (one round-to-nearest-even per operation, no FMA), bit planes read
out of one big little-endian integer per field, f16 decoded by ``core.f16_value``
(the spec-000 oracle, itself kernel-free).  Far too slow for real work.

Each ``decode_<t>`` returns ``{"d", ["dmin"], "scale": [...] per sub-block, ["min": [...]],
"q": [256 signed/unsigned quant values as used in the products], "sub": sub-block size}``.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .core import fold_records, R32, F32, decode_q8_k, f16_value

__all__ = ["DECODERS", "decode", "dequantize", "record_value", "quantized_dot", "RECORD_BYTES"]

RECORD_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q5_K": 176, "Q6_K": 210}


def _f16(a, off):
    return f16_value(a[off] | (a[off + 1] << 8))


def _bits(a, start, stop):
    """Bytes a[start:stop] as one little-endian integer (bit k of byte t is bit 8t + k)."""
    return int.from_bytes(bytes(a[start:stop]), "little")


def _get(plane, byte, shift, width):
    return (plane >> (8 * byte + shift)) & ((1 << width) - 1)


def decode_q6_k(a) -> dict:
    """ql [0,128), qh [128,192), scales int8 [192,208), d f16 [208,210)."""
    assert len(a) == 210
    ql, qh = _bits(a, 0, 128), _bits(a, 128, 192)
    q = [0] * 256
    # ggml's loop: for each 128-chunk n, lane l: four outputs at l, l+32, l+64, l+96
    for n in range(2):
        for l in range(32):
            q[128 * n + l + 0] = _get(ql, 64 * n + l, 0, 4) | (_get(qh, 32 * n + l, 0, 2) << 4)
            q[128 * n + l + 32] = _get(ql, 64 * n + l + 32, 0, 4) | (_get(qh, 32 * n + l, 2, 2) << 4)
            q[128 * n + l + 64] = _get(ql, 64 * n + l, 4, 4) | (_get(qh, 32 * n + l, 4, 2) << 4)
            q[128 * n + l + 96] = _get(ql, 64 * n + l + 32, 4, 4) | (_get(qh, 32 * n + l, 6, 2) << 4)
    scale = [b - 256 if b >= 128 else b for b in a[192:208]]
    return {"d": _f16(a, 208), "scale": scale, "q": [v - 32 for v in q], "sub": 16}


def decode_q5_k(a) -> dict:
    """d, dmin f16; 12 bytes of 6-bit scales/mins (Q4_K packing); qh [16,48); qs [48,176)."""
    assert len(a) == 176
    s = a[4:16]
    sc, mn = [], []
    for j in range(8):  # ggml's get_scale_min_k4
        if j < 4:
            sc.append(s[j] & 63)
            mn.append(s[j + 4] & 63)
        else:
            sc.append((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4))
            mn.append((s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    qh, qs = _bits(a, 16, 48), _bits(a, 48, 176)
    q = []
    for p in range(4):  # pairs of sub-blocks; u1 = bit 2p, u2 = bit 2p+1
        q += [_get(qs, 32 * p + l, 0, 4) + 16 * _get(qh, l, 2 * p, 1) for l in range(32)]
        q += [_get(qs, 32 * p + l, 4, 4) + 16 * _get(qh, l, 2 * p + 1, 1) for l in range(32)]
    return {"d": _f16(a, 0), "dmin": _f16(a, 2), "scale": sc, "min": mn, "q": q, "sub": 32}


def decode_q3_k(a) -> dict:
    """hmask [0,32), qs [32,96), 12 bytes of 6-bit scales [96,108), d f16 [108,110)."""
    assert len(a) == 110
    hm, qs, sb = _bits(a, 0, 32), _bits(a, 32, 96), a[96:108]
    scale = []
    for j in range(16):
        low = (sb[j % 8] >> (4 * (j // 8))) & 0xF
        high = (sb[8 + j % 4] >> (2 * (j // 4))) & 3
        scale.append((low | (high << 4)) - 32)
    q = []
    m = 0  # hmask bit index
    for n in range(2):
        for shift in range(0, 8, 2):
            for half in range(2):
                for l in range(16 * half, 16 * half + 16):
                    low = _get(qs, 32 * n + l, shift, 2)
                    q.append(low - (0 if _get(hm, l, m, 1) else 4))
            m += 1
    return {"d": _f16(a, 108), "scale": scale, "q": q, "sub": 16}


def decode_q2_k(a) -> dict:
    """scales/mins nibbles [0,16), qs [16,80), d f16 [80,82), dmin f16 [82,84)."""
    assert len(a) == 84
    qs = _bits(a, 16, 80)
    q = []
    for n in range(2):
        for shift in range(0, 8, 2):
            for half in range(2):
                q += [_get(qs, 32 * n + l, shift, 2) for l in range(16 * half, 16 * half + 16)]
    return {"d": _f16(a, 80), "dmin": _f16(a, 82), "scale": [b & 0xF for b in a[0:16]],
            "min": [b >> 4 for b in a[0:16]], "q": q, "sub": 16}


DECODERS = {"Q2_K": decode_q2_k, "Q3_K": decode_q3_k, "Q5_K": decode_q5_k, "Q6_K": decode_q6_k}


def decode(name: str, a) -> dict:
    return DECODERS[name](bytes(a))


def dequantize(name: str, a) -> list:
    """ggml's dequantize_row_<t> for one record: ``R32(R32(d*scale)*q)`` (minus
    ``R32(dmin*min)`` for the formats with mins), one rounding per operation."""
    f = decode(name, a)
    out = []
    with np.errstate(all="ignore"):
        for i, q in enumerate(f["q"]):
            j = i // f["sub"]
            dl = R32(f["d"] * F32(f["scale"][j]))
            v = R32(dl * F32(q))
            if "min" in f:
                v = R32(v - R32(f["dmin"] * F32(f["min"][j])))
            out.append(v)
    return out


def record_terms(name: str, w, x) -> tuple:
    """The exact integers ``(S, T)`` of DESIGN.md section 7 (``T`` is None without mins)."""
    W, X = decode(name, w), decode_q8_k(bytes(x))
    n = W["sub"]
    S = sum(W["scale"][j] * sum(W["q"][n * j + i] * X["q"][n * j + i] for i in range(n))
            for j in range(256 // n))
    if "min" not in W:
        return S, None
    per = n // 16  # bsum groups of 16 per sub-block
    T = sum(W["min"][j] * sum(X["bsum"][per * j + k] for k in range(per)) for j in range(256 // n))
    return S, T


def record_value(name: str, w, x) -> np.float32:
    """``v`` of DESIGN.md section 7, one f32 rounding per named step."""
    W, X = decode(name, w), decode_q8_k(bytes(x))
    S, T = record_terms(name, w, x)
    with np.errstate(all="ignore"):
        p = R32(W["d"] * R32(S))
        if T is None:
            return R32(X["ds"] * p)
        return R32(X["ds"] * R32(p - R32(W["dmin"] * R32(T))))


def quantized_dot(name: str, w_records, x_records) -> np.float32:
    """Left fold of the record values, seeded with v_0; +0.0 for G = 0."""
    return fold_records(partial(record_value, name), w_records, x_records)
