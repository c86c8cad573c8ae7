"""Bit-level helpers shared by the record kernels (all ``@njit``, callable from user code).

Loads are little-endian, byte by byte, so they work on any 1-D ``uint8`` view of a record --
read-only, unaligned or strided.  Integer widths are explicit: numba widens small integers to
64 bits by default, so every helper casts its result to the width it documents.

``f16_to_f32`` widens an IEEE binary16 bit pattern exactly (every f16 is an f32; subnormals
are normalised, inf stays inf, NaN keeps sign and payload, no flush-to-zero).  The rounding
helpers (``round_half_even``, ``saturate_i8``, ``f32_to_f16_bits``, ...) live in ``_round.py``
and are re-exported here.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels._round import f32_to_f16_bits, round_half_even, saturate_i8  # noqa: F401 (re-exported)

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
