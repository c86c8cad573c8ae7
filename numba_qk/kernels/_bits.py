"""Bit-level helpers shared by the record kernels (all ``@njit``, callable from user code).

Loads are little-endian, byte by byte, so they work on any 1-D ``uint8`` view of a record --
read-only, unaligned or strided.  Integer widths are explicit: numba widens small integers to
64 bits by default, so every helper casts its result to the width it documents.

Rounding helpers are named after the spec's steps:

* ``f16_to_f32``     -- exact widening of an IEEE binary16 bit pattern (every f16 is an f32;
  subnormals are normalised, inf stays inf, NaN keeps sign and payload, no flush-to-zero).
* ``round_half_even`` -- round an f32 to the nearest integer, ties to even (``rint``).
* ``saturate_i8``    -- clamp an integral f32 to [-128, 127] and convert to int8.
"""

import numpy as np

from .._jit import kernel

# IEEE binary16: 1 sign bit | 5 exponent bits | 10 mantissa bits.
_F16_SIGN = np.uint32(0b1000_0000_0000_0000)
_F16_EXP_MASK = np.uint32(0b11111)
_F16_MANT_MASK = np.uint32(0b11_1111_1111)
_F16_IMPLICIT = np.uint32(0b100_0000_0000)  # the hidden leading 1 of a normal f16
_F32_EXP_ALL_ONES = np.uint32(0xFF << 23)   # f32 exponent field of inf/NaN
_EXP_REBIAS = np.uint32(127 - 15)           # f32 bias minus f16 bias
_SUBNORMAL_EXP = np.uint32(127 - 15 + 1)    # f32 biased exponent of 2**-14 (f16's smallest normal)


@kernel
def load_u16(rec, off):
    """Little-endian uint16 at byte ``off`` of a uint8 record."""
    return np.uint16(np.uint16(rec[off]) | (np.uint16(rec[off + 1]) << np.uint16(8)))


@kernel
def load_i16(rec, off):
    """Little-endian two's-complement int16 at byte ``off``."""
    return np.int16(load_u16(rec, off))


@kernel
def load_u32(rec, off):
    """Little-endian uint32 at byte ``off``."""
    return np.uint32(
        np.uint32(rec[off])
        | (np.uint32(rec[off + 1]) << np.uint32(8))
        | (np.uint32(rec[off + 2]) << np.uint32(16))
        | (np.uint32(rec[off + 3]) << np.uint32(24))
    )


@kernel
def f32_from_bits(bits):
    """Reinterpret a uint32 bit pattern as float32 (no conversion)."""
    return np.uint32(bits).view(np.float32)


@kernel
def load_f32(rec, off):
    """Little-endian IEEE binary32 at byte ``off`` (bits preserved, NaN payloads included)."""
    return f32_from_bits(load_u32(rec, off))


@kernel
def f16_bits_to_f32_bits(h):
    """Widen an IEEE binary16 bit pattern to the binary32 bit pattern of the same value."""
    h = np.uint32(h)
    sign = np.uint32((h & _F16_SIGN) << np.uint32(16))
    exp = np.uint32((h >> np.uint32(10)) & _F16_EXP_MASK)
    mant = np.uint32(h & _F16_MANT_MASK)
    if exp == _F16_EXP_MASK:  # inf or NaN: all-ones exponent, payload shifted up, sign kept
        return np.uint32(sign | _F32_EXP_ALL_ONES | (mant << np.uint32(13)))
    if exp != 0:  # normal
        return np.uint32(sign | ((exp + _EXP_REBIAS) << np.uint32(23)) | (mant << np.uint32(13)))
    if mant == 0:  # +-0
        return sign
    # subnormal: value = mant * 2**-24; normalise so the leading 1 becomes the implicit bit
    e = _SUBNORMAL_EXP
    while (mant & _F16_IMPLICIT) == 0:
        mant = np.uint32(mant << np.uint32(1))
        e = np.uint32(e - np.uint32(1))
    mant = np.uint32(mant & _F16_MANT_MASK)
    return np.uint32(sign | (e << np.uint32(23)) | (mant << np.uint32(13)))


@kernel
def f16_to_f32(h):
    """The float32 value of an IEEE binary16 bit pattern (exact)."""
    return f32_from_bits(f16_bits_to_f32_bits(h))


@kernel
def load_f16(rec, off):
    """Little-endian IEEE binary16 at byte ``off``, widened exactly to float32."""
    return f16_to_f32(load_u16(rec, off))


@kernel
def round_half_even(x):
    """Nearest integer to float32 ``x``, ties to even, as float32 (``-0.5 -> -0.0``)."""
    return np.float32(np.rint(np.float32(x)))


@kernel
def saturate_i8(r):
    """Clamp an integral float32 to [-128, 127] and convert to int8 (input must not be NaN)."""
    return np.int8(np.int32(min(max(np.float32(r), np.float32(-128.0)), np.float32(127.0))))


@kernel
def f32_to_f16_bits(x):
    """IEEE binary16 bits of float32 ``x``, rounded to nearest, ties to even (overflow -> inf,
    gradual underflow to subnormals, NaN -> a quiet NaN with the sign kept) -- the conversion of
    ggml's ``GGML_FP32_TO_FP16`` and numpy's ``astype(float16)`` for every non-NaN value."""
    bits = np.float32(x).view(np.uint32)
    sign = np.uint32((bits >> np.uint32(16)) & np.uint32(0x8000))
    exp = np.int32((bits >> np.uint32(23)) & np.uint32(0xFF))
    mant = np.uint32(bits & np.uint32(0x7FFFFF))
    if exp == 0xFF:  # inf or NaN
        if mant == 0:
            return np.uint16(sign | np.uint32(0x7C00))
        return np.uint16(sign | np.uint32(0x7E00) | (mant >> np.uint32(13)))
    e = np.int32(exp - 127 + 15)  # f16 biased exponent
    if e <= 0:  # f16 subnormal (or zero): value = m * 2**-24, rounded
        if e < -10:  # below half the smallest subnormal: rounds to zero
            return np.uint16(sign)
        m = np.uint32(mant | np.uint32(0x800000))  # implicit bit (f32 subnormals land above)
        shift = np.uint32(14 - e)
        r = np.uint32(m >> shift)
        rem = np.uint32(m & ((np.uint32(1) << shift) - np.uint32(1)))
        half = np.uint32(np.uint32(1) << (shift - np.uint32(1)))
        if rem > half or (rem == half and (r & np.uint32(1)) != 0):
            r += np.uint32(1)  # may become 0x400: the smallest normal, correctly encoded
        return np.uint16(sign | r)
    if e >= 31:
        return np.uint16(sign | np.uint32(0x7C00))
    val = np.uint32((np.uint32(e) << np.uint32(10)) | (mant >> np.uint32(13)))
    rem = np.uint32(mant & np.uint32(0x1FFF))
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (val & np.uint32(1)) != 0):
        val += np.uint32(1)  # a carry into the exponent is right; 0x7C00 is inf
    return np.uint16(sign | val)
