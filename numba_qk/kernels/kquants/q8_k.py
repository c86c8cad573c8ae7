"""Q8_K record decoders and the Q8_K quantizer (spec 000, sections 2 and 4).  All ``@njit``.

Byte layout of one 292-byte record (256 logical elements)::

    [0, 4)      ds        IEEE f32, little-endian       block scale
    [4, 260)    q[256]    two's-complement int8
    [260, 292)  bsum[16]  little-endian int16           bsum[j] = sum(q[16j : 16j + 16])

``bsum`` is a data contract of legal records: the dot kernels use it exactly as stored and never
re-derive it (see ``numba_qk.find_invalid_records`` for an explicit check).

Quantization of one block of 256 finite float32 ``values`` (section 4), in this order:

1. ``mx = max(values)``, ``mn = min(values)``; ``extreme = mx if |mx| > |mn| else mn``
   (equal magnitudes pick the minimum).
2. All-zero block (``mx == mn == 0``, either sign): ``ds = +0.0``, every ``q = 0``, every
   ``bsum = 0``.
3. ``inverse = R32(-127.0 / extreme)``  -- one f32 division.
4. ``ds = R32(1.0 / inverse)``          -- one f32 division.
5. ``q[i] = saturate_i8(round_half_even(R32(values[i] * inverse)))`` -- one f32 product, then
   round to nearest with ties to even, then clamp to [-128, 127] (not truncation).
6. ``bsum[j] = sum(q[16j : 16j + 16])`` exactly (|bsum| <= 2048, fits int16).

Domain: a block with any non-finite value, or whose ``inverse`` is not finite (|extreme| too
small, e.g. below about 3.7e-37), is out of domain.  The kernels report it (return value) and
write nothing for it; raising is the public API's job.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats import quant
from numba_qk.kernels._bits import load_f32, load_i16
from numba_qk.kernels._round import round_half_even, saturate_i8

Q8_K_RECORD_BYTES = quant.q8_k.block_bytes
Q8_K_BLOCK = quant.q8_k.block_size
_DS_AT = quant.q8_k.field("ds").start      # byte offsets, from the schema
_Q_AT = quant.q8_k.field("q").start
_BSUM_AT = quant.q8_k.field("bsum").start


@kernel
def q8_k_ds(rec):
    """Field ``ds`` of a Q8_K record (float32, bits preserved)."""
    return load_f32(rec, _DS_AT)


@kernel
def q8_k_quant(rec, i):
    """Quant ``q[i]`` of a Q8_K record, as int8."""
    return np.int8(rec[_Q_AT + i])


@kernel
def q8_k_bsum(rec, j):
    """Stored group sum ``bsum[j]`` (0 <= j < 16) of a Q8_K record, as int16."""
    return load_i16(rec, _BSUM_AT + 2 * j)


_EXP_ALL_ONES = np.int32(0x7F800000)  # f32 exponent field of inf/NaN
_MAGNITUDE = np.int32(0x7FFFFFFF)      # all bits but the sign


@kernel
def order_key(bits):
    """Map f32 bits to an int32 whose signed order is the float order (finite values)."""
    return np.int32(bits ^ np.int32((bits >> np.int32(31)) & _MAGNITUDE))


@kernel
def q8_k_block_inverse(values, b):
    """Steps 1-3 for block ``values[b]`` (of a ``[G, 256]`` f32 array): ``(status, inverse)``.

    status is 0 for a normal block, 1 for an all-zero block (inverse 0), -1 out of domain
    (a non-finite value, or a non-finite inverse).  Max and min are found on order-preserving
    integer keys of the bits, which vectorizes without fast-math; the keys of -0.0 and +0.0
    differ, which cannot change the outcome (a block whose max and min are both zeros of
    either sign is the zero block, and a zero never wins the magnitude comparison otherwise).
    """
    nonfinite = np.int32(0)
    kmax = np.int32(-2147483648)
    kmin = np.int32(2147483647)
    for i in range(values.shape[1]):
        bits = np.float32(values[b, i]).view(np.int32)
        nonfinite |= np.int32((bits & _EXP_ALL_ONES) == _EXP_ALL_ONES)
        key = order_key(bits)
        kmax = max(kmax, key)
        kmin = min(kmin, key)
    if nonfinite != 0:
        return -1, np.float32(0.0)
    mx = np.int32(order_key(kmax)).view(np.float32)  # the key map is its own inverse
    mn = np.int32(order_key(kmin)).view(np.float32)
    if mx == np.float32(0.0) and mn == np.float32(0.0):
        return 1, np.float32(0.0)
    extreme = mx if abs(mx) > abs(mn) else mn  # equal magnitudes: the minimum
    inverse = np.float32(np.float32(-127.0) / extreme)
    if (inverse - inverse) != np.float32(0.0):  # inf - inf is NaN
        return -1, inverse
    return 0, inverse


@kernel
def q8_k_write_block(values, b, inverse, out, bo):
    """Steps 4-6: write record ``out[bo]`` for block ``values[b]`` with this ``inverse``.

    ``inverse == 0`` writes the all-zero record.
    """
    if inverse == np.float32(0.0):
        for k in range(Q8_K_RECORD_BYTES):
            out[bo, k] = 0
        return
    ds = np.float32(np.float32(1.0) / inverse)
    bits = ds.view(np.uint32)
    for k in range(4):  # ds, little-endian
        out[bo, _DS_AT + k] = np.uint8((bits >> np.uint32(8 * k)) & np.uint32(0xFF))
    for i in range(Q8_K_BLOCK):
        r = round_half_even(np.float32(np.float32(values[b, i]) * inverse))
        out[bo, _Q_AT + i] = np.uint8(np.int32(saturate_i8(r)) & np.int32(0xFF))
    for j in range(16):  # exact group sums of the stored q, |bsum| <= 2048
        group = np.int32(0)
        for k in range(16):
            group = np.int32(group + np.int32(np.int8(out[bo, _Q_AT + 16 * j + k])))
        out[bo, _BSUM_AT + 2 * j] = np.uint8(group & np.int32(0xFF))
        out[bo, _BSUM_AT + 2 * j + 1] = np.uint8((group >> np.int32(8)) & np.int32(0xFF))


@kernel
def quantize_block_q8_k(values, b, out, bo):
    """Quantize block ``values[b]`` (f32 ``[G, 256]``) into record ``out[bo]`` (u8 ``[G', 292]``).

    Returns True on success; False for an out-of-domain block, in which case nothing is written.
    """
    status, inverse = q8_k_block_inverse(values, b)
    if status < 0:
        return False
    q8_k_write_block(values, b, inverse, out, bo)
    return True


@kernel
def quantize_q8_k(values, out):
    """Quantize ``values`` f32 ``[G, 256]`` into ``out`` u8 ``[G, 292]``.

    Returns -1 on success, or the index of the first out-of-domain block -- in which case
    nothing at all has been written to ``out`` (every block is checked before any is written).
    """
    g = values.shape[0]
    inverses = np.empty(g, dtype=np.float32)
    for b in range(g):
        status, inverse = q8_k_block_inverse(values, b)
        if status < 0:
            return b
        inverses[b] = inverse
    for b in range(g):
        q8_k_write_block(values, b, inverses[b], out, b)
    return -1


@kernel
def q8_k_decode_records(records, ds, q, bsum):
    """Unpack ``[G, 292]`` records into ``ds`` f32 ``[G]``, ``q`` i8 ``[G, 256]``, ``bsum`` i16 ``[G, 16]``."""
    for b in range(records.shape[0]):
        rec = records[b]
        ds[b] = q8_k_ds(rec)
        for i in range(Q8_K_BLOCK):
            q[b, i] = q8_k_quant(rec, i)
        for j in range(16):
            bsum[b, j] = q8_k_bsum(rec, j)


@kernel
def q8_k_invalid_records(records, bad):
    """Write indices of records whose stored bsum differs from the sum of q; return the count."""
    n = 0
    for b in range(records.shape[0]):
        rec = records[b]
        ok = True
        for j in range(16):
            s = np.int32(0)
            for k in range(16):
                s += np.int32(q8_k_quant(rec, 16 * j + k))
            if s != np.int32(q8_k_bsum(rec, j)):
                ok = False
        if not ok:
            bad[n] = b
            n += 1
    return n


@kernel
def q8_k_dequantize_records(records, out):
    """Dequantize ``[G, 292]`` records into f32 ``out`` ``[G, 256]``: ``y[i] = R32(ds * q[i])``."""
    for b in range(records.shape[0]):
        rec = records[b]
        ds = q8_k_ds(rec)
        for i in range(Q8_K_BLOCK):
            out[b, i] = np.float32(ds * np.float32(q8_k_quant(rec, i)))


# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = Traits(
    format=quant.q8_k,
    dequantize=q8_k_dequantize_records,
    decode=q8_k_decode_records,
    decoded=Decoded("Q8KFields", ("ds", "q", "bsum"), (("ds", "f4"), ("q", "i1"), ("bsum", "i2")),
                    "Decoded Q8_K fields of ``G`` records."),
    quantize=quantize_q8_k,
    domain="q8_k",
    quantizer="spec 000 section 4 (canonical)",
    find_invalid=q8_k_invalid_records,
    dot=None,
    gemv=None,
    gemm=None,
    oracle="numba_qk.testing.reference.core",
)
