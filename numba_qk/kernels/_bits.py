"""Bit-level helpers shared by the record kernels (all ``@njit``, callable from user code).

Loads are little-endian, byte by byte, so they work on any 1-D ``uint8`` view of a record --
read-only, unaligned or strided.  Integer widths are explicit: numba widens small integers to
64 bits by default, so every helper casts its result to the width it documents.

``f16_to_f32`` widens an IEEE binary16 bit pattern exactly (every f16 is an f32; subnormals
are normalised, inf stays inf, NaN keeps sign and payload, no flush-to-zero); it and the other
f16/bf16 conversions live in ``f16.py`` (a table of their NaN variants) and are re-exported
here.  The rounding helpers (``round_half_even``, ``saturate_i8``, ``f32_to_f16_bits``, ...)
live in ``_round.py`` and are re-exported here.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels._round import f32_to_f16_bits, round_half_even, saturate_i8  # noqa: F401 (re-exported)
from numba_qk.kernels.f16 import f16_bits_to_f32_bits, f16_to_f32  # noqa: F401 (re-exported)


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
def load_f16(rec, off):
    """Little-endian IEEE binary16 at byte ``off``, widened exactly to float32."""
    return f16_to_f32(load_u16(rec, off))
