"""The Q4_K x Q8_K quantized dot (spec 000, section 3).  All ``@njit``; callable from user code.

For record pair ``b`` (weights ``w`` Q4_K, activations ``x`` Q8_K), in this order::

    S_b = sum_{s=0..7} sc_b[s] * sum_{i=0..31} wq_b[32s+i] * xq_b[32s+i]   exact, int32
    T_b = sum_{s=0..7} m_b[s] * (bsum_b[2s] + bsum_b[2s+1])                exact, int32
    p_b = R32(f32(d_b)    * f32(S_b))      f32(.) of an integer: one nearest-even rounding
    n_b = R32(f32(dmin_b) * f32(T_b))
    v_b = R32(ds_b * R32(p_b - n_b))       four separate f32 roundings, never fused
    result = ((v_0 + v_1) + v_2) + ...     left fold in record order, each + one f32 rounding

Integer widths: every product of a 4-bit quant (0..15) and an int8 is at most 1920 in magnitude,
a 32-element sub-block sum at most 61440, times a 6-bit scale at most 3,870,720, and ``|S_b|``
at most 30,965,760 -- all exact in int32.  ``T_b`` uses the stored int16 ``bsum`` whatever it
holds: at most 8 * 63 * 65,536 = 33,030,144 in magnitude, still exact in int32.
``|S_b|`` may exceed 2**24, so ``f32(S_b)`` is a real rounding step (nearest even).

Fold: seeded with ``v_0`` (no ``+0.0`` seed), so ``G = 1`` returns ``v_0`` bit for bit, ``-0.0``
included; ``G = 0`` returns ``+0.0`` and reads nothing.  Special values (inf/NaN/subnormal in
``d``, ``dmin``, ``ds``) follow IEEE rules: no error, no flush-to-zero.  The kernels are compiled
without fast-math, so LLVM may not contract ``d * S - dmin * T`` into an FMA.
"""

import numpy as np

from .._jit import kernel
from ._bits import load_f16, load_f32, load_i16
from .q4_k import q4_k_scale_min

_LOW4 = np.uint8(0b0000_1111)
_W_QS_AT = 16      # Q4_K: 4-bit quants
_X_Q_AT = 4        # Q8_K: int8 quants
_X_BSUM_AT = 260   # Q8_K: int16 group sums


@kernel
def record_sums_q4_k_q8_k(w, x):
    """The exact integer statistics ``(S_b, T_b)`` of one record pair, as int32."""
    s_total = np.int32(0)
    t_total = np.int32(0)
    for j in range(4):  # 32-byte chunk j holds sub-blocks 2j (low nibbles) and 2j+1 (high)
        lo = np.int32(0)
        hi = np.int32(0)
        wb = _W_QS_AT + 32 * j
        xb = _X_Q_AT + 64 * j
        for k in range(32):
            byte = w[wb + k]
            lo += np.int32(byte & _LOW4) * np.int32(np.int8(x[xb + k]))
            hi += np.int32(byte >> np.uint8(4)) * np.int32(np.int8(x[xb + 32 + k]))
        sc_lo, m_lo = q4_k_scale_min(w, 2 * j)
        sc_hi, m_hi = q4_k_scale_min(w, 2 * j + 1)
        s_total += sc_lo * lo + sc_hi * hi
        g = _X_BSUM_AT + 8 * j  # bsum[4j .. 4j+3] cover sub-blocks 2j and 2j+1
        t_total += m_lo * (np.int32(load_i16(x, g)) + np.int32(load_i16(x, g + 2)))
        t_total += m_hi * (np.int32(load_i16(x, g + 4)) + np.int32(load_i16(x, g + 6)))
    return np.int32(s_total), np.int32(t_total)


@kernel
def record_value_q4_k_q8_k(w, x):
    """``v_b`` for one Q4_K record ``w`` (144 u8) and one Q8_K record ``x`` (292 u8)."""
    s_b, t_b = record_sums_q4_k_q8_k(w, x)
    d = load_f16(w, 0)
    dmin = load_f16(w, 2)
    ds = load_f32(x, 0)
    p = np.float32(d * np.float32(s_b))
    n = np.float32(dmin * np.float32(t_b))
    diff = np.float32(p - n)
    return np.float32(ds * diff)


@kernel
def dot_q4_k_q8_k(w, x):
    """Canonical quantized dot of Q4_K records ``w`` ``[G, 144]`` and Q8_K records ``x`` ``[G, 292]``.

    Returns a float32 scalar.  ``w`` and ``x`` must have the same ``G`` (not checked here).
    """
    g = w.shape[0]
    if g == 0:
        return np.float32(0.0)
    acc = record_value_q4_k_q8_k(w[0], x[0])
    for b in range(1, g):
        acc = np.float32(acc + record_value_q4_k_q8_k(w[b], x[b]))
    return acc


@kernel
def gemv_q4_k_q8_k(w, x, out):
    """``out[r] = dot_q4_k_q8_k(w[r], x)`` for Q4_K weights ``[rows, G, 144]`` and one Q8_K
    activation ``[G, 292]`` (quantized once, shared by every row)."""
    for r in range(w.shape[0]):
        out[r] = dot_q4_k_q8_k(w[r], x)
