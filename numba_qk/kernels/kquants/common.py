"""Helpers shared by the K-quant kernel modules (``q2_k.py``, ``q3_k.py``, ``q5_k.py``,
``q6_k.py``).  All ``@njit``; callable from user ``@njit`` code.

Record-level building blocks take 2-D record arrays and record indices (``a[row]`` is the
record) and never build sub-array views in the hot loop, like ``kernels/kquants/dot.py``.  Loads go
byte by byte, so read-only, unaligned and strided carriers all work.

Q8_K offsets are read from its schema (``numba_qk.formats.quant.q8_k``), not retyped.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats import quant as _quant
from numba_qk.kernels._bits import f16_to_f32, f32_from_bits, f32_to_f16_bits

X_DS_AT = _quant.q8_k.field("ds").start      # Q8_K: f32 block scale
X_Q_AT = _quant.q8_k.field("q").start        # Q8_K: int8 quants
X_BSUM_AT = _quant.q8_k.field("bsum").start  # Q8_K: int16 sums of 16 quants


@kernel
def f16_at(a, row, off):
    """Exact f16 -> f32 of bytes ``a[row, off:off+2]`` (little-endian)."""
    return f16_to_f32(np.uint16(np.uint16(a[row, off]) | (np.uint16(a[row, off + 1]) << np.uint16(8))))


@kernel
def f32_at(a, row, off):
    """f32 of bytes ``a[row, off:off+4]`` (little-endian, bits kept)."""
    bits = np.uint32(0)
    for k in range(4):
        bits |= np.uint32(a[row, off + k]) << np.uint32(8 * k)
    return f32_from_bits(bits)


@kernel
def store_f16(out, row, off, x):
    """Write ``fp16(x)`` (round to nearest even, ggml's ``GGML_FP32_TO_FP16``) little-endian at
    ``out[row, off:off+2]``; returns the stored value widened back to f32 (exact)."""
    h = f32_to_f16_bits(np.float32(x))
    out[row, off] = np.uint8(h & np.uint16(0xFF))
    out[row, off + 1] = np.uint8(h >> np.uint16(8))
    return f16_to_f32(h)


@kernel
def x_q(x, bx, i):
    """Q8_K quant ``q[i]`` of record ``x[bx]`` as int32."""
    return np.int32(np.int8(x[bx, X_Q_AT + i]))


@kernel
def x_bsum(x, bx, j):
    """Q8_K stored ``bsum[j]`` of record ``x[bx]`` as int32 (used exactly as stored)."""
    lo = np.int32(x[bx, X_BSUM_AT + 2 * j])
    hi = np.int32(x[bx, X_BSUM_AT + 2 * j + 1])
    return np.int32(np.int16(np.uint16(lo | (hi << np.int32(8)))))


@kernel
def x_ds(x, bx):
    """Q8_K ``ds`` of record ``x[bx]`` (f32, bits kept)."""
    return f32_at(x, bx, X_DS_AT)


@kernel
def first_nonfinite_block(values):
    """The first block (row) of f32 ``values`` holding inf or NaN, or -1."""
    for b in range(values.shape[0]):
        for i in range(values.shape[1]):
            v = np.float32(values[b, i])
            if (v - v) != np.float32(0.0):
                return b
    return -1


@kernel
def k4_scale_min(a, row, at, s):
    """``(sc[s], m[s])`` (int32, 0..63) of the 12-byte 6-bit scale/min packing that Q4_K and
    Q5_K share (ggml's ``get_scale_min_k4``), stored at ``a[row, at:at+12]``, ``0 <= s < 8``::

        s < 4:  sc = a[at+s] & 63,                 m = a[at+4+s] & 63
        s >= 4: sc = (a[at+s+4] & 15) | (a[at+s-4] >> 6) << 4
                m  = (a[at+s+4] >> 4) | (a[at+s]   >> 6) << 4
    """
    if s < 4:
        sc = a[row, at + s] & np.uint8(63)
        m = a[row, at + s + 4] & np.uint8(63)
    else:
        sc = (a[row, at + s + 4] & np.uint8(15)) | ((a[row, at + s - 4] >> np.uint8(6)) << np.uint8(4))
        m = (a[row, at + s + 4] >> np.uint8(4)) | ((a[row, at + s] >> np.uint8(6)) << np.uint8(4))
    return np.int32(sc), np.int32(m)


@kernel
def k4_pack_scale_min(out, row, at, s, ls, lm):
    """Store 6-bit ``ls``/``lm`` as sub-block ``s`` of the Q4_K/Q5_K packing (the bytes at
    ``out[row, at:at+12]`` must start zeroed), exactly as ggml's quantize_row_q{4,5}_K_ref."""
    if s < 4:
        out[row, at + s] = np.uint8(ls)
        out[row, at + s + 4] = np.uint8(lm)
    else:
        out[row, at + s + 4] = np.uint8((ls & 0xF) | ((lm & 0xF) << 4))
        out[row, at + s - 4] |= np.uint8((ls >> 4) << 6)
        out[row, at + s] |= np.uint8((lm >> 4) << 6)
