"""Slow, exact oracle for the low-precision element types (DESIGN.md §8), from the text.

Shares no code with the kernels: values are ``fractions.Fraction``; encoding enumerates the
representable magnitudes of the target and picks the nearest one (ties to the even code), so
there is exactly one rounding from the exact source value whatever the source (f64, f32, int).

``decode(t, code)`` gives the exact value: a Python float for float types (every value of every
type here is exactly a float64; inf/NaN as floats, a NaN with its code's sign), an int for
integer types.
``encode(t, value)`` takes a Python int, float or Fraction and returns the code (an int; packed
types give the nibble / bit, i4 in two's complement 0..15).
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from functools import lru_cache

__all__ = ["decode", "encode", "exact"]


def _facts(t):
    return t._facts


def decode(t, code: int):
    f = _facts(t)
    code = int(code)
    if f["kind"] in ("int", "uint"):
        bits = f["bits"]
        if f["kind"] == "int" and code >= 1 << (bits - 1):
            return code - (1 << bits)
        return code
    if f["kind"] == "e8m0":
        return math.nan if code == 0xFF else math.ldexp(1.0, code - 127)
    ebits, mbits, bias = f["exponent_bits"], f["mantissa_bits"], f["bias"]
    sign = -1.0 if (code >> (ebits + mbits)) & 1 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if e == (1 << ebits) - 1:
        if f["has_inf"]:                            # NaN: the quiet NaN of the code's sign
            return sign * math.inf if m == 0 else math.copysign(math.nan, sign)
        if f["has_nan"] and m == (1 << mbits) - 1:  # e4m3: S.1111.111
            return math.copysign(math.nan, sign)
    if e == 0:  # subnormal: 0.m * 2^(1 - bias)
        return sign * math.ldexp(m, 1 - bias - mbits)
    return sign * math.ldexp((1 << mbits) + m, e - bias - mbits)


def exact(value) -> Fraction | float:
    """A finite Python int/float/Fraction as a Fraction; inf/NaN are returned as floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return value
    return Fraction(value)


@lru_cache(maxsize=None)
def _magnitudes(t):
    """Sorted (value, code) of every finite non-negative value of a float type."""
    f = _facts(t)
    out = []
    for code in range(1 << (f["exponent_bits"] + f["mantissa_bits"])):
        v = decode(t, code)
        if math.isfinite(v):
            out.append((Fraction(v), code))
    out.sort()
    return [v for v, _ in out], [c for _, c in out]


def _nan_code(t):
    f = _facts(t)
    if t.name in ("E2M3", "E3M2", "E2M1"):
        return 0                       # no NaN: NaN -> +0
    ebits, mbits = f["exponent_bits"], f["mantissa_bits"]
    if f["has_inf"]:
        return (((1 << ebits) - 1) << mbits) | (1 << (mbits - 1))   # canonical quiet NaN
    return (1 << (ebits + mbits)) - 1                              # e4m3: S.1111.111


def _round_half_even(v: Fraction) -> int:
    fl = math.floor(v)
    d = v - fl
    if d > Fraction(1, 2) or (d == Fraction(1, 2) and fl % 2 == 1):
        return fl + 1
    return fl


def encode(t, value) -> int:
    f = _facts(t)
    kind = f["kind"]
    v = exact(value)
    if kind in ("int", "uint"):
        lo, hi = f["min"], f["max"]
        if isinstance(v, float):
            if math.isnan(v):
                return 0
            n = hi if v > 0 else lo
        else:
            n = min(hi, max(lo, _round_half_even(v)))
        return n & ((1 << f["bits"]) - 1)
    if t.name == "F32" and not isinstance(v, float):
        return _encode_float_formula(t, v)
    if kind == "e8m0":
        if isinstance(v, float):
            return 0xFE if v == math.inf else 0xFF
        if v <= 0:
            return 0xFF
        if v < Fraction(1, 2 ** 127):
            return 0
        k = v.numerator.bit_length() - v.denominator.bit_length()
        if Fraction(2) ** k > v:
            k -= 1                                   # now 2^k <= v < 2^(k+1)
        if v >= Fraction(3, 2) * Fraction(2) ** k:  # nearest power of two, ties upward
            k += 1
        return min(k, 127) + 127
    ebits, mbits = f["exponent_bits"], f["mantissa_bits"]
    sign_bit = 1 << (ebits + mbits)
    if isinstance(v, float) and math.isnan(v):
        code = _nan_code(t)
        if code and math.copysign(1.0, v) < 0:
            code |= sign_bit
        return code
    negative = (v < 0) if not isinstance(v, float) else v < 0
    sign = sign_bit if negative or (isinstance(value, float) and math.copysign(1.0, value) < 0) else 0
    if isinstance(v, float):                            # +-inf
        mag = (((1 << ebits) - 1) << mbits) if f["has_inf"] else f["max_code"]
        return sign | mag
    a = abs(v)
    values, codes = _magnitudes(t)
    vmax = values[-1]
    if a > vmax:
        half_ulp = Fraction(2) ** ((f["max_code"] >> mbits) - f["bias"] - mbits) / 2
        if f["has_inf"] and a >= vmax + half_ulp:
            return sign | (((1 << ebits) - 1) << mbits)
        return sign | f["max_code"]
    i = bisect.bisect_left(values, a)
    if values[i] == a:
        return sign | codes[i]
    lo, hi = i - 1, i
    dlo, dhi = a - values[lo], values[hi] - a
    if dlo < dhi or (dlo == dhi and codes[lo] % 2 == 0):
        return sign | codes[lo]
    return sign | codes[hi]


def _encode_float_formula(t, v: Fraction) -> int:
    """f32 targets (too many values to enumerate): the RNE definition on the exact value."""
    import struct

    if v == 0:
        return 0
    sign = 1 << 31 if v < 0 else 0
    a = abs(v)
    k = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** k > a:
        k -= 1
    q_exp = max(k, -126) - 23                         # exponent of one ulp at a
    n = _round_half_even(a / Fraction(2) ** q_exp)
    value = Fraction(n) * Fraction(2) ** q_exp
    if value >= Fraction(2) ** 128:
        return sign | 0x7F800000
    return sign | struct.unpack("<I", struct.pack("<f", float(value)))[0]
