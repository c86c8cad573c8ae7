"""A slow, readable oracle for the canonical operations, written straight from spec 000.

It shares no code with the kernels: Python integers for every integer step, numpy float32
scalars for every float step (numpy rounds each float32 operation to nearest-even, without
FMA), fields decoded from the spec's byte formulas, f16 decoded from its bit fields by hand.
It exists to check the fast paths bit for bit (tests, ``python -m numba_qk``); it is far too
slow for real work.  Also holds ggml's legacy 32-element formats (``legacy_*``, below).

Home: ``numba_qk.testing.reference.core``; ``numba_qk.reference`` is the same module (the
documented path, kept).  Per-format access for every record format: ``numba_qk.testing.reference``.
"""

from __future__ import annotations

import math
import struct

import numpy as np

__all__ = [
    "f16_value", "decode_q4_k", "decode_q8_k", "record_value", "quantized_dot", "left_fold",
    "fold_records",
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


def dequantize_q8_k(a: bytes) -> list:
    """The 256 values of one Q8_K record: ``R32(ds * q)``."""
    f = decode_q8_k(a)
    with np.errstate(all="ignore"):
        return [F32(f["ds"]) * F32(q) for q in f["q"]]


def dequantize_q4_k(a: bytes) -> list:
    """The 256 values of one Q4_K record, in gguf-py's order:
    ``R32(R32(R32(d*sc)*q) - R32(dmin*m))``."""
    f = decode_q4_k(a)
    with np.errstate(all="ignore"):  # every step below is one f32 operation (one rounding)
        d, dmin = F32(f["d"]), F32(f["dmin"])
        return [((d * F32(f["sc"][i // 32])) * F32(f["q"][i]))
                - (dmin * F32(f["m"][i // 32])) for i in range(256)]


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


def left_fold(values) -> np.float32:
    """The left fold ``((v_0 + v_1) + v_2) + ...`` of the f32 ``values`` in order, seeded with
    v_0, one f32 rounding per add; +0.0 for none.  Every oracle's dot ends here."""
    acc = None
    with np.errstate(all="ignore"):
        for v in values:
            acc = v if acc is None else R32(acc + v)
    return F32(0.0) if acc is None else acc


def fold_records(record_value, w_records, x_records) -> np.float32:
    """:func:`left_fold` of ``record_value(w_b, x_b)`` (record bytes) over the record pairs."""
    w_records, x_records = np.asarray(w_records), np.asarray(x_records)
    assert w_records.shape[0] == x_records.shape[0]
    return left_fold(record_value(w_records[b].tobytes(), x_records[b].tobytes())
                     for b in range(w_records.shape[0]))


def quantized_dot(w_records, x_records) -> np.float32:
    """Left fold of v_b in record order, seeded with v_0; +0.0 for G = 0."""
    return fold_records(record_value, w_records, x_records)


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


# ----------------------------------------------------------------------------------------------
# ggml's legacy 32-element formats.  Quantizers transcribe ggml's quantize_row_*_ref (C float
# semantics: every float operation rounded to f32; (int8_t)/(uint8_t) casts truncate toward
# zero; roundf rounds halves away from zero); dequantizers dequantize_row_*; the dots follow
# numba_qk's canonical legacy numerics (docs/numerics.md).

LEGACY_LAYOUT = {  # name: (bytes, offset of d, m, s, qh, qs; None where absent)
    "Q4_0": (18, 0, None, None, None, 2),
    "Q4_1": (20, 0, 2, None, None, 4),
    "Q5_0": (22, 0, None, None, 2, 6),
    "Q5_1": (24, 0, 2, None, 4, 8),
    "Q8_0": (34, 0, None, None, None, 2),
    "Q8_1": (36, 0, None, 2, None, 4),
}


def f16_bits(x) -> int:
    """RNE f32 -> f16 bits, computed with exact rationals (independent of numpy's cast)."""
    from fractions import Fraction

    x = float(F32(x))
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign | 0x7E00
    if math.isinf(x):
        return sign | 0x7C00
    a = Fraction(abs(x))
    if a == 0:
        return sign
    # scaled = a / 2**(e-10) for the f16 exponent e (clamped at the subnormal range)
    e = max(a.numerator.bit_length() - a.denominator.bit_length(), -14)
    while Fraction(2) ** e > a and e > -14:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    step = Fraction(2) ** (e - 10)
    q, r = divmod(a, step)
    q = int(q)
    if r > step / 2 or (r == step / 2 and q % 2 == 1):
        q += 1
    if e == -14 and q < 1024:  # subnormal
        return sign | q
    if q == 2048:
        q, e = 1024, e + 1
    if e > 15:
        return sign | 0x7C00
    return sign | ((e + 15) << 10) | (q - 1024)


def _c_int8(x) -> int:
    """(int8_t) of a float as x86 C compilers emit it: truncate to int32 (NaN and out-of-range
    give INT_MIN), keep the low byte, signed."""
    x = float(x)
    i = int(math.trunc(x)) if -2.0**31 <= x < 2.0**31 else -2**31
    low = i & 0xFF
    return low - 256 if low >= 128 else low


def _roundf(x) -> float:
    x = float(x)
    return math.copysign(math.floor(abs(x) + 0.5), x) if math.isfinite(x) else x


def legacy_quantize_block(name: str, values) -> bytes:
    """One record of ggml's quantize_row_<name>_ref for 32 finite float32 values."""
    v = [F32(t) for t in values]
    assert len(v) == 32 and all(math.isfinite(t) for t in v)
    nbytes, d_at, m_at, s_at, qh_at, qs_at = LEGACY_LAYOUT[name]
    rec = bytearray(nbytes)

    def put_f16(off, x):
        rec[off:off + 2] = f16_bits(x).to_bytes(2, "little")

    with np.errstate(all="ignore"):
        if name in ("Q8_0", "Q8_1"):
            amax = F32(0.0)
            for t in v:
                amax = max(amax, abs(t))
            d = F32(amax / F32(127.0))
            inv = F32(F32(1.0) / d) if d != 0 else F32(0.0)
            put_f16(d_at, d)
            q = [_c_int8(_roundf(F32(t * inv))) for t in v]
            rec[qs_at:qs_at + 32] = struct.pack("<32b", *q)
            if name == "Q8_1":
                put_f16(s_at, F32(F32(sum(q)) * d))
            return bytes(rec)
        if name in ("Q4_0", "Q5_0"):
            amax, mx = F32(0.0), F32(0.0)
            for t in v:
                if amax < abs(t):
                    amax, mx = abs(t), t
            d = F32(mx / F32(-16.0 if name == "Q5_0" else -8.0))
            inv = F32(F32(1.0) / d) if d != 0 else F32(0.0)
            put_f16(d_at, d)
            bias, cap = (F32(16.5), 31) if name == "Q5_0" else (F32(8.5), 15)
            q = [min(cap, _c_int8(F32(F32(t * inv) + bias))) for t in v]
        else:  # Q4_1, Q5_1
            mn, mx = F32(3.4028234663852886e38), F32(-3.4028234663852886e38)
            for t in v:
                mn = t if t < mn else mn
                mx = t if t > mx else mx
            d = F32(F32(mx - mn) / F32(31.0 if name == "Q5_1" else 15.0))
            inv = F32(F32(1.0) / d) if d != 0 else F32(0.0)
            put_f16(d_at, d)
            put_f16(m_at, mn)
            q = [_c_int8(F32(F32(F32(t - mn) * inv) + F32(0.5))) for t in v]
            q = [min(15, t) for t in q] if name == "Q4_1" else [t & 0xFF for t in q]
    for j in range(16):
        rec[qs_at + j] = (q[j] & 15) | ((q[j + 16] & 15) << 4)
    if qh_at is not None:
        qh = sum(((q[j] >> 4) & 1) << j for j in range(32))
        rec[qh_at:qh_at + 4] = qh.to_bytes(4, "little")
    return bytes(rec)


def legacy_decode(name: str, a: bytes) -> dict:
    """Fields of one legacy record; ``w`` are the integers a dot multiplies (q-8 for Q4_0,
    q-16 for Q5_0, the stored q otherwise)."""
    nbytes, d_at, m_at, s_at, qh_at, qs_at = LEGACY_LAYOUT[name]
    assert len(a) == nbytes
    out = {"d": f16_value(a[d_at] | (a[d_at + 1] << 8))}
    if m_at is not None:
        out["m"] = f16_value(a[m_at] | (a[m_at + 1] << 8))
    if s_at is not None:
        out["s"] = f16_value(a[s_at] | (a[s_at + 1] << 8))
    if name in ("Q8_0", "Q8_1"):
        q = [b - 256 if b >= 128 else b for b in a[qs_at:qs_at + 32]]
        out["q"], out["w"] = q, q
        return out
    q = [(a[qs_at + j] & 15) for j in range(16)] + [(a[qs_at + j] >> 4) for j in range(16)]
    if qh_at is not None:
        qh = int.from_bytes(bytes(a[qh_at:qh_at + 4]), "little")
        q = [q[j] | (((qh >> j) & 1) << 4) for j in range(32)]
    out["q"] = q
    offset = 8 if name == "Q4_0" else 16 if name == "Q5_0" else 0
    out["w"] = [t - offset for t in q]
    return out


def legacy_dequantize(name: str, a: bytes) -> list:
    f = legacy_decode(name, a)
    with np.errstate(all="ignore"):
        if "m" in f:
            return [R32(R32(F32(t) * f["d"]) + f["m"]) for t in f["w"]]
        return [R32(F32(t) * f["d"]) for t in f["w"]]


def legacy_block_value(wname: str, w: bytes, xname: str, x: bytes) -> np.float32:
    W, X = legacy_decode(wname, w), legacy_decode(xname, x)
    S = sum(a * b for a, b in zip(W["w"], X["w"]))
    with np.errstate(all="ignore"):
        v = R32(X["d"] * R32(W["d"] * R32(S)))
        if "m" in W:
            v = R32(v + R32(W["m"] * X["s"]))
    return v


def legacy_dot(wname: str, w_records, xname: str, x_records) -> np.float32:
    w_records, x_records = np.asarray(w_records), np.asarray(x_records)
    return left_fold(legacy_block_value(wname, w_records[b].tobytes(), xname, x_records[b].tobytes())
                     for b in range(w_records.shape[0]))
