"""Exact scalar values and one-rounding encodes of the element types, in plain Python.

What ``numba_qk.bf16(1.5)`` (:func:`encode`) and ``Scalar.value()`` (:func:`decode`) run: no
numba, no numpy, read from the type's declaration (``t.spec``, an
:class:`~numba_qk.formats.scalars.ElementSpec` row) alone.  Integer arithmetic on the exact value
(a Python int, float or ``fractions.Fraction``), so there is exactly one rounding whatever the
source -- a huge int is never converted to a float first.  The astype policy (DESIGN.md §8):

- floats round to nearest, ties to even, on the exact value (subnormals included);
  a magnitude that rounds past the largest finite code encodes to the row's
  ``overflow_code`` (infinity where the type has one, else the largest finite value:
  saturation), as does +-inf; NaN encodes to ``nan_code``, with the sign bit where
  ``nan_signed``; zero keeps its sign (a negative value that rounds to zero is -0);
- e8m0 (powers of two, no zero, no sign) takes the nearest power of two, ties upward,
  saturating at 2^-127 and 2^127; zero, negatives, -inf and NaN give NaN (0xFF), +inf 0xFE;
- integers round to nearest, ties to even, and saturate (+-inf to the ends, NaN to 0);
  codes are two's complement in the type's bits (i4: 0..15).

One exception, kept bit for bit from the first implementation: ``f32(-0.0)`` is +0 (code 0),
though a negative f32 that rounds to zero is -0 and astype keeps the sign of -0.0.

:mod:`numba_qk.testing.reference.lowp` is the independent oracle these are tested against, code
by code and over a dense set of adversarial values (``tests/lowp/test_lowp_types.py``).
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["decode", "encode"]


def decode(t, code: int):
    """The exact value of ``code`` (an int code of ``t``; packed types: the nibble / bit): a
    Python float for float types (every value here is exactly a float64; +-inf, and NaN as a
    quiet NaN of the code's sign), an int for integer types."""
    s = t.spec
    code = int(code)
    if s.kind in ("int", "uint"):
        if s.kind == "int" and code >= 1 << (s.bits - 1):
            return code - (1 << s.bits)
        return code
    if s.kind == "e8m0":
        return math.nan if code == s.nan_code else math.ldexp(1.0, code - s.bias)
    m_bits = s.mantissa_bits
    magnitude_bits = s.exponent_bits + m_bits
    sign = -1.0 if (code >> magnitude_bits) & 1 else 1.0
    mag = code & ((1 << magnitude_bits) - 1)
    if mag > s.max_code:                          # past the largest finite code: inf or NaN
        if s.has_inf and mag == s.overflow_code:
            return sign * math.inf
        return math.copysign(math.nan, sign)
    e, m = mag >> m_bits, mag & ((1 << m_bits) - 1)
    if e == 0:                                    # subnormal: 0.m * 2^(1 - bias)
        return sign * math.ldexp(m, 1 - s.bias - m_bits)
    return sign * math.ldexp((1 << m_bits) | m, e - s.bias - m_bits)


def _round_half_even(num: int, den: int) -> int:
    """num / den (den > 0) rounded to the nearest integer, ties to even."""
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q & 1):
        q += 1
    return q


def _floor_log2(a: Fraction) -> int:
    """k with 2^k <= a < 2^(k + 1), for a > 0."""
    n, d = a.numerator, a.denominator
    k = n.bit_length() - d.bit_length()
    if (n << max(-k, 0)) < (d << max(k, 0)):
        k -= 1
    return k


def encode(t, value) -> int:
    """The code of ``t`` nearest ``value`` (a Python int, float or Fraction) under the astype
    policy: an int (packed types give the nibble / bit, i4 in two's complement 0..15)."""
    s = t.spec
    special = isinstance(value, float) and not math.isfinite(value)
    if s.kind in ("int", "uint"):
        lo = -(1 << (s.bits - 1)) if s.kind == "int" else 0
        if special:
            n = s.nan_code if math.isnan(value) else (s.overflow_code if value > 0 else lo)
        else:
            v = Fraction(value)
            n = min(s.overflow_code, max(lo, _round_half_even(v.numerator, v.denominator)))
        return n & ((1 << s.bits) - 1)
    if s.kind == "e8m0":
        if special:
            return s.overflow_code if value == math.inf else s.nan_code
        v = Fraction(value)
        if v <= 0:
            return s.nan_code
        k = _floor_log2(v)
        if v >= Fraction(3, 2) * Fraction(2) ** k:       # nearest power of two, ties upward
            k += 1
        return min(max(k + s.bias, 0), s.max_code)
    sign_bit = 1 << (s.exponent_bits + s.mantissa_bits)
    if special:
        if math.isnan(value):
            negative = s.nan_signed and math.copysign(1.0, value) < 0
            return s.nan_code | (sign_bit if negative else 0)
        return s.overflow_code | (sign_bit if value < 0 else 0)
    v = Fraction(value)
    if v == 0:
        signed_zero = isinstance(value, float) and math.copysign(1.0, value) < 0
        return sign_bit if signed_zero and s.attr != "f32" else 0   # f32(-0.0): +0, see above
    sign = sign_bit if v < 0 else 0
    a = abs(v)
    m_bits = s.mantissa_bits
    k = max(_floor_log2(a), 1 - s.bias)          # the binade's exponent (subnormals: the least)
    q = k - m_bits                               # exponent of one unit in the last place
    n, d = a.numerator, a.denominator
    n = _round_half_even(n << max(-q, 0), d << max(q, 0))    # a / 2^q, rounded
    # the codes are monotone in the value: (biased exponent - 1) << m_bits, plus the
    # significand with its leading one (a carry into the next binade lands on its code)
    mag = ((k + s.bias - 1) << m_bits) + n
    if mag > s.max_code:
        mag = s.overflow_code
    return sign | mag
