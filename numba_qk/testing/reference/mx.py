"""Slow, readable oracle for the block-scaled formats (DESIGN.md §9, OCP MX v1.0, NVFP4).

Written from the rules alone, with exact rational arithmetic (``fractions.Fraction``); it shares
no code with the kernels (nor with :mod:`numba_qk.testing.reference.lowp`).  For tests only.

OCP MX v1.0 (§6.3, "Conversion from FP32"), per block of 32 values ``v``::

    X       = floor(log2(max |v|)) - emax_elem        (exact; clamped to [-127, 127])
    scale   = e8m0 code X + 127                       (a zero block: X = -127, code 0x00)
    P_i     = RNE(v_i / 2^X) to the element type, saturating to +-max, sign kept
    MXINT8  : P_i = RNE(v_i / 2^X * 64) saturated to +-127; value P_i * 2^X / 64

NVFP4 (block 16, e2m1 elements, ue4m3 block scales, an f32 tensor scale)::

    ts   = R32(amax_tensor / 2688)          (1 when that is 0)
    s_b  = ue4m3(RNE(R32(R32(amax_b / 6) / ts)))   saturating to 448
    d_b  = R32(s_b * ts);  P_i = e2m1(RNE(R32(v_i / d_b)))   (signed zeros where d_b is 0)
    value = R32(R32(P_i * s_b) * ts)

``R32`` is one IEEE round-to-nearest-even to float32 (overflow to infinity).
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np

# name: (exponent bits, mantissa bits, bias, largest finite magnitude code)
_FLOATS = {"e2m1": (2, 1, 1, 0x7), "e2m3": (2, 3, 1, 0x1F), "e3m2": (3, 2, 3, 0x1F),
           "e4m3": (4, 3, 7, 0x7E), "e5m2": (5, 2, 15, 0x7B)}
# OCP MX Table 1: emax of each element type (exponent of its largest normal number)
EMAX = {"e2m1": 2, "e2m3": 2, "e3m2": 4, "e4m3": 8, "e5m2": 15, "i8": 0}


def floor_log2(x: Fraction) -> int:
    """Exact floor(log2(x)) of a positive rational."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    if Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def round_to_grid(x: Fraction, ebits: int, mbits: int, bias: int, max_value, saturate: bool):
    """Round ``x`` (>= 0) to the nearest value of a binary float format, ties to even.

    Returns a Fraction, or ``math.inf`` when a non-saturating format overflows.
    """
    assert x >= 0
    if x == 0:
        return Fraction(0)
    e = max(floor_log2(x), 1 - bias)             # subnormals share the exponent 1 - bias
    quantum = Fraction(2) ** (e - mbits)
    n = x / quantum
    k = math.floor(n)
    rest = n - k
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and k % 2 == 1):
        k += 1
    r = k * quantum
    if r > max_value:
        if saturate:
            return Fraction(max_value)
        # IEEE: overflow to inf only from max + half an ulp upward, which RNE gives exactly here
        return math.inf
    return r


def _float_value(code: int, ebits: int, mbits: int, bias: int) -> Fraction:
    sign = -1 if code >> (ebits + mbits) & 1 else 1
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if e == 0:
        mag = Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    else:
        mag = (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)
    return sign * mag


def element_value(name: str, code: int) -> Fraction:
    """Exact value of an element code (finite codes only; e4m3 0x7F/0xFF are NaN)."""
    if name == "i8":
        return Fraction(code - 256 if code >= 128 else code)
    ebits, mbits, bias, _ = _FLOATS[name]
    return _float_value(code, ebits, mbits, bias)


def element_max(name: str) -> Fraction:
    ebits, mbits, bias, maxcode = _FLOATS[name]
    return _float_value(maxcode, ebits, mbits, bias)


def encode_element(name: str, x: Fraction, negative: bool) -> int:
    """Code of ``x`` (its magnitude rounded RNE, saturating) with the sign bit ``negative``."""
    ebits, mbits, bias, maxcode = _FLOATS[name]
    r = round_to_grid(abs(x), ebits, mbits, bias, element_max(name), saturate=True)
    if name not in _CODE_OF:                      # magnitude -> code, by value
        _CODE_OF[name] = {_float_value(c, ebits, mbits, bias): c for c in range(maxcode + 1)}
    return _CODE_OF[name][r] | (int(negative) << (ebits + mbits))


_CODE_OF = {}


def r32(x):
    """One IEEE RNE rounding of a rational to float32 (as a Fraction, or +-inf)."""
    if x == math.inf or x == -math.inf:
        return x
    neg = x < 0
    r = round_to_grid(abs(Fraction(x)), 8, 23, 127, Fraction(2) ** 127 * (2 - Fraction(2) ** -23),
                      saturate=False)
    return -r if neg else r


def f32_of(x) -> np.float32:
    """The float32 of a value that r32 returned (exactly representable)."""
    if x == math.inf or x == -math.inf:
        return np.float32(x)
    return np.float32(float(x))                    # exact: x is a float32 value


def exact(v) -> Fraction:
    """Exact value of a finite float32 (read from its bits)."""
    bits = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    sign = -1 if bits >> 31 else 1
    e = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    assert e != 0xFF, "non-finite input"
    if e == 0:
        return sign * Fraction(m) * Fraction(2) ** -149
    return sign * Fraction(m | 1 << 23) * Fraction(2) ** (e - 150)


def is_negative(v) -> bool:
    return bool(np.signbit(np.float32(v)))


# --------------------------------------------------------------------------- MX

def encode_mx_block(values, element: str):
    """(scale code, element codes) of one MX block of float32 values."""
    vals = [exact(v) for v in values]
    amax = max(abs(v) for v in vals)
    if amax == 0:
        x = -127                                      # a zero block: scale code 0x00
    else:
        x = min(max(floor_log2(amax) - EMAX[element], -127), 127)
    scale = Fraction(2) ** x
    codes = []
    for v, raw in zip(vals, values):
        if element == "i8":
            q = v / scale * 64
            k = math.floor(q)
            rest = q - k
            if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and k % 2 == 1):
                k += 1
            k = max(-127, min(127, k))
            codes.append(k & 0xFF)
        else:
            codes.append(encode_element(element, v / scale, is_negative(raw)))
    return x + 127, codes


def decode_mx_block(scale_code: int, codes, element: str):
    """float32 values of one MX block (R32 of the exact value; scale 0xFF is NaN)."""
    if scale_code == 0xFF:
        return [np.float32(np.nan)] * len(codes)
    scale = Fraction(2) ** (scale_code - 127)
    out = []
    for c in codes:
        nan = np.float32(-np.nan if c & 0x80 else np.nan)     # NaN codes keep their sign
        if element == "e4m3" and c & 0x7F == 0x7F:
            out.append(nan)
            continue
        if element == "e5m2" and (c & 0x7C) == 0x7C:  # e5m2 inf/NaN codes (never encoded)
            out.append(np.float32(-np.inf if c & 0x80 else np.inf) if c & 3 == 0 else nan)
            continue
        val = element_value(element, c) * scale
        if element == "i8":
            val = val / 64
        out.append(f32_of(r32(val)))           # sign of a zero: fixed by the caller
    return out


def _signed_zero_fix(value: np.float32, code: int, sign_bit: int) -> np.float32:
    if value == 0 and code >> sign_bit & 1:
        return np.float32(-0.0)
    return value


def encode_mx(x: np.ndarray, element: str, block: int = 32):
    """(scales uint8 [..., n/32], codes uint8 [..., n]) of a float32 array, block by block."""
    x = np.asarray(x, np.float32)
    rows = x.reshape(-1, x.shape[-1])
    nb = x.shape[-1] // block
    scales = np.zeros((rows.shape[0], nb), np.uint8)
    codes = np.zeros(rows.shape, np.uint8)
    for r in range(rows.shape[0]):
        for b in range(nb):
            s, c = encode_mx_block(rows[r, b * block:(b + 1) * block], element)
            scales[r, b] = s
            codes[r, b * block:(b + 1) * block] = c
    return scales.reshape(x.shape[:-1] + (nb,)), codes.reshape(x.shape)


SIGN_BIT = {"e2m1": 3, "e2m3": 5, "e3m2": 5, "e4m3": 7, "e5m2": 7, "i8": 99}


def _flat_decode_views(scales: np.ndarray, codes: np.ndarray):
    """``(out, codes, scales, out)``: a zero float32 output shaped as ``codes`` and the three
    as 2-D row views (rows of codes, of scales, of outputs)."""
    out = np.zeros(codes.shape, np.float32)
    return (out, codes.reshape(-1, codes.shape[-1]), scales.reshape(-1, scales.shape[-1]),
            out.reshape(-1, codes.shape[-1]))


def decode_mx(scales: np.ndarray, codes: np.ndarray, element: str, block: int = 32):
    """float32 values of MX codes (one code per element) and scale codes."""
    out, flat_c, flat_s, flat_o = _flat_decode_views(scales, codes)
    for r in range(flat_c.shape[0]):
        for b in range(flat_s.shape[1]):
            cs = [int(c) for c in flat_c[r, b * block:(b + 1) * block]]
            vals = decode_mx_block(int(flat_s[r, b]), cs, element)
            for j, (v, c) in enumerate(zip(vals, cs)):
                flat_o[r, b * block + j] = _signed_zero_fix(v, c, SIGN_BIT[element])
    return out


# --------------------------------------------------------------------------- NVFP4

def nvfp4_tensor_scale(x: np.ndarray) -> np.float32:
    amax = max((abs(exact(v)) for v in np.asarray(x, np.float32).ravel()), default=Fraction(0))
    ts = r32(amax / 2688)
    return np.float32(1.0) if ts == 0 else f32_of(ts)


def encode_nvfp4(x: np.ndarray, tensor_scale=None):
    """(scales uint8 [..., n/16] ue4m3, codes uint8 [..., n] e2m1 one per element, ts)."""
    x = np.asarray(x, np.float32)
    ts = nvfp4_tensor_scale(x) if tensor_scale is None else np.float32(tensor_scale)
    tsx = exact(ts)
    rows = x.reshape(-1, x.shape[-1])
    nb = x.shape[-1] // 16
    scales = np.zeros((rows.shape[0], nb), np.uint8)
    codes = np.zeros(rows.shape, np.uint8)
    for r in range(rows.shape[0]):
        for b in range(nb):
            blk = rows[r, b * 16:(b + 1) * 16]
            amax = max(abs(exact(v)) for v in blk)
            s = r32(r32(amax / 6) / tsx)                        # may be inf: saturates below
            s_code = encode_element("e4m3", Fraction(448) if s == math.inf else s, False)
            scales[r, b] = s_code
            d = r32(element_value("e4m3", s_code) * tsx)
            for j, v in enumerate(blk):
                if d == 0:
                    codes[r, b * 16 + j] = 8 if is_negative(v) else 0
                    continue
                q = r32(exact(v) / d)
                if q in (math.inf, -math.inf):
                    q = Fraction(6) if q > 0 else Fraction(-6)
                codes[r, b * 16 + j] = encode_element("e2m1", q, is_negative(v))
    return scales.reshape(x.shape[:-1] + (nb,)), codes.reshape(x.shape), ts


def decode_nvfp4(scales: np.ndarray, codes: np.ndarray, tensor_scale) -> np.ndarray:
    tsx = exact(np.float32(tensor_scale))
    out, flat_c, flat_s, flat_o = _flat_decode_views(scales, codes)
    for r in range(flat_c.shape[0]):
        for b in range(flat_s.shape[1]):
            sc = int(flat_s[r, b])
            s_val = None if sc & 0x7F == 0x7F else element_value("e4m3", sc)
            for j in range(16):
                c = int(flat_c[r, b * 16 + j])
                if s_val is None:                 # a NaN scale code: NaN of its sign
                    flat_o[r, b * 16 + j] = np.float32(-np.nan if sc & 0x80 else np.nan)
                    continue
                v = r32(r32(element_value("e2m1", c) * s_val) * tsx)
                # IEEE: a zero product's sign is the XOR of the factors' signs (ts > 0)
                negative = (c >> 3 & 1) ^ (sc >> 7 & 1)
                flat_o[r, b * 16 + j] = _signed_zero_fix(f32_of(v), negative, 0)
    return out
