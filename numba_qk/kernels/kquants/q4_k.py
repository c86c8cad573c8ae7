"""Q4_K record decoders (spec 000, section 2).  All ``@njit``; callable from user ``@njit`` code.

Byte layout of one 144-byte record ``a`` (256 logical elements, 8 sub-blocks of 32)::

    [0, 2)     d     IEEE f16, little-endian     scale of the sub-block scales
    [2, 4)     dmin  IEEE f16, little-endian     scale of the sub-block mins
    [4, 16)    sc[8], m[8]  unsigned 6-bit, packed together (below)
    [16, 144)  q[256]       unsigned 4-bit, two per byte (below)

Scales and mins (``r = 0`` for ``sc``, ``r = 1`` for ``m``)::

    field_r[i]   = a[4 + 4r + i] & 0b111111                                  (0 <= i < 4)
    field_r[4+t] = ((a[12 + t] >> 4r) & 0b1111) | ((a[4 + 4r + t] >> 6) << 4)  (0 <= t < 4)

i.e. bytes 4..11 hold the low 6 bits of sc[0..3] and m[0..3] with the top two bits of
sc[4..7] / m[4..7] above them; bytes 12..15 hold the low nibbles of sc[4..7] (low half) and
m[4..7] (high half).

Quants: element ``i`` lives in byte ``16 + 32*(i // 64) + (i % 32)``, in the low nibble when
``i % 64 < 32`` and in the high nibble otherwise.  So each 32-byte chunk ``j`` (0..3) holds
sub-block ``2j`` in its low nibbles and sub-block ``2j + 1`` in its high nibbles.

Every bit pattern is a legal Q4_K record: decoding is total.  ``d``/``dmin`` are widened exactly
(inf, NaN, subnormal and -0 kept).
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats import quant
from numba_qk.kernels._bits import load_f16
from numba_qk.kernels.kquants.common import records_decoder

Q4_K_RECORD_BYTES = quant.q4_k.block_bytes
Q4_K_BLOCK = quant.q4_k.block_size
_LOW6 = np.uint8(0b0011_1111)   # low 6 bits of a scale byte
_LOW4 = np.uint8(0b0000_1111)   # one nibble
_D_AT = quant.q4_k.field("d").start          # byte offsets, from the schema
_DMIN_AT = quant.q4_k.field("dmin").start
_SCALES_AT = quant.q4_k.field("sc").start    # the packed sc/m field (shared with m)
_QS_AT = quant.q4_k.field("q").start         # the 4-bit quants


@kernel
def q4_k_d(rec):
    """Field ``d`` of a Q4_K record, as float32 (exact)."""
    return load_f16(rec, _D_AT)


@kernel
def q4_k_dmin(rec):
    """Field ``dmin`` of a Q4_K record, as float32 (exact)."""
    return load_f16(rec, _DMIN_AT)


@kernel
def q4_k_scale_min(rec, s):
    """``(sc[s], m[s])`` of a Q4_K record as int32, for sub-block ``0 <= s < 8``."""
    if s < 4:
        sc = rec[_SCALES_AT + s] & _LOW6
        m = rec[_SCALES_AT + 4 + s] & _LOW6
    else:
        t = s - 4
        packed = rec[_SCALES_AT + 8 + t]
        sc = (packed & _LOW4) | ((rec[_SCALES_AT + t] >> np.uint8(6)) << np.uint8(4))
        m = (packed >> np.uint8(4)) | ((rec[_SCALES_AT + 4 + t] >> np.uint8(6)) << np.uint8(4))
    return np.int32(sc), np.int32(m)


@kernel
def q4_k_quant(rec, i):
    """4-bit quant ``q[i]`` (0 <= i < 256) of a Q4_K record, as int32 in [0, 15]."""
    byte = rec[_QS_AT + 32 * (i // 64) + (i % 32)]
    if i % 64 < 32:
        return np.int32(byte & _LOW4)
    return np.int32(byte >> np.uint8(4))


@kernel
def q4_k_decode_into(rec, sc, m, q):
    """Unpack one record's integer fields into ``sc`` (8), ``m`` (8) and ``q`` (256) arrays."""
    for s in range(8):
        a, b = q4_k_scale_min(rec, s)
        sc[s] = a
        m[s] = b
    for j in range(4):
        base = _QS_AT + 32 * j
        for k in range(32):
            byte = rec[base + k]
            q[64 * j + k] = byte & _LOW4
            q[64 * j + 32 + k] = byte >> np.uint8(4)


q4_k_decode_records = records_decoder(
    q4_k_decode_into,
    """``q4_k_decode_into`` for every record of a ``[G, 144]`` array.""")


@kernel
def q4_k_dequantize_records(records, out):
    """Dequantize ``[G, 144]`` records into f32 ``out`` ``[G, 256]``.

    Evaluation order (the same as gguf-py's numpy codec and ggml's ``dequantize_row_q4_K``
    compiled without FMA contraction), per sub-block ``s`` and element ``i``::

        d_s = R32(d * sc[s]);  m_s = R32(dmin * m[s]);  y[32s+i] = R32(R32(d_s * q[32s+i]) - m_s)
    """
    for b in range(records.shape[0]):
        rec = records[b]
        d = q4_k_d(rec)
        dmin = q4_k_dmin(rec)
        row = out[b]
        for j in range(4):
            sc_lo, m_lo = q4_k_scale_min(rec, 2 * j)
            sc_hi, m_hi = q4_k_scale_min(rec, 2 * j + 1)
            d_lo = np.float32(d * np.float32(sc_lo))
            d_hi = np.float32(d * np.float32(sc_hi))
            mn_lo = np.float32(dmin * np.float32(m_lo))
            mn_hi = np.float32(dmin * np.float32(m_hi))
            base = _QS_AT + 32 * j
            for k in range(32):
                byte = rec[base + k]
                row[64 * j + k] = np.float32(np.float32(d_lo * np.float32(byte & _LOW4)) - mn_lo)
                row[64 * j + 32 + k] = np.float32(
                    np.float32(d_hi * np.float32(byte >> np.uint8(4))) - mn_hi)
