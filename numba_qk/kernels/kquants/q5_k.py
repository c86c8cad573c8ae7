"""Q5_K records: field decoders, ggml's dequantizer and reference quantizer, and the exact
record dot against Q8_K (DESIGN.md section 7).  All ``@njit``; callable from user ``@njit`` code.

Byte layout of one 176-byte record ``a`` (256 elements, 8 sub-blocks of 32; offsets from the
schema ``numba_qk.quant.q5_k``)::

    [0, 2)     d      IEEE f16        scale of the sub-block scales
    [2, 4)     dmin   IEEE f16        scale of the sub-block mins
    [4, 16)    sc[8], m[8]  6-bit, packed exactly as Q4_K (``_kquant_common.k4_scale_min``)
    [16, 48)   qh     bit 4 of q[i]: byte 16 + (i % 32), bit i // 32
    [48, 176)  ql     low 4 bits of q[i]: byte 48 + 32*(i // 64) + (i % 32), low nibble when
                      i % 64 < 32, high nibble otherwise
    q[i] = ql | qh << 4  (0..31), sub-block s = i // 32

Dequantize (ggml ``dequantize_row_q5_K``; gguf-py computes the same)::

    d_s = R32(f32(d) * sc[s]);  m_s = R32(f32(dmin) * m[s]);  y[i] = R32(R32(d_s * q[i]) - m_s)

Record dot with Q8_K record ``x``::

    S = sum_s sc[s] * sum_{i in s} q[i] * xq[i]          exact int32
    T = sum_s m[s] * (bsum[2s] + bsum[2s+1])              exact int32, bsum as stored
    v = R32(ds * R32(R32(f32(d) * f32(S)) - R32(f32(dmin) * f32(T))))
    dot = ((v_0 + v_1) + v_2) + ...                       left fold; G = 0 -> +0.0

Integer widths: |q * xq| <= 31 * 128 = 3968, a sub-block sum <= 126,976, times sc <= 63 ->
7,999,488, |S| <= 63,995,904; |T| <= 8 * 63 * 65,536 = 33,030,144: exact in int32.

Quantize (ggml ``quantize_row_q5_K_ref``, no importance matrix): the Q4_K recipe
(``kernels/kquants/q4_k_encode.py``) with 31 levels and a different search:

1. Per sub-block ``s`` of 32: ``av_x = sqrtf(sum(x^2) / 32)``, ``w_i = av_x + |x_i|``,
   ``make_qkx2_quants(n=32, nmax=31, rmin=-0.5, rdelta=0.1, nstep=15)`` -> ``scale_s``,
   ``min_s`` (imported from ``q4_k_encode``, not copied).
2. ``inv = 63 / max_scale`` (0 when ``max_scale <= 0``); ``ls = min(63, (uint8)
   nearest_int(inv * scale_s))``; mins likewise; packed as Q4_K.
3. ``d = fp16(max_scale / 63)``, ``dmin = fp16(max_min / 63)`` (overflow/underflow kept).
4. Requantize: ``q = clamp(nearest_int((x + f32(dmin)*m) / (f32(d)*sc)), 0, 31)`` where
   ``f32(d)*sc != 0``; the quants of step 1 stay otherwise.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.drive import kernels_for, panel_gemm, register
from numba_qk.kernels.simd.iq_grid import HAVE_GEMM_TILES, microtile_sub32_mins
from numba_qk.kernels.simd.kquants import q5_k_acts_x8, q5_k_decode, q5_k_q8_k_value, q5_k_rows_x8
from numba_qk.formats.kquants import q5_k as _FMT
from numba_qk.kernels._bits import f16_to_f32, load_u16
from numba_qk.kernels.kquants.common import fields_decoder, records_decoder, X_Q_AT, f16_at, portable_dot_for, quantizer_for, k4_scale_min, q5_pack_quants, record_value_d_dmin, x_bsum, x_q
from numba_qk.kernels.kquants.q4_k_encode import k4_block, k4_scratch

Q5_K_RECORD_BYTES = _FMT.block_bytes
Q5_K_BLOCK = _FMT.block_size
_D_AT = _FMT.field("d").start
_DMIN_AT = _FMT.field("dmin").start
_SC_AT = _FMT.field("sc").start   # 12 bytes of packed 6-bit sc/m
_QH_AT = _FMT.field("qh").start   # 32 bytes: bit 4 of each quant
_QL_AT = _FMT.field("ql").start   # 128 bytes: low nibbles
_LOW4 = np.uint8(0b0000_1111)


# ---- field decoders (1-D record, like kernels/kquants/q4_k.py) ------------------------------------------

@kernel
def q5_k_d(rec):
    """Field ``d`` of a Q5_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _D_AT))


@kernel
def q5_k_dmin(rec):
    """Field ``dmin`` of a Q5_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _DMIN_AT))


@kernel
def q5_k_scale_min(rec, s):
    """``(sc[s], m[s])`` of a Q5_K record as int32 (0..63), ``0 <= s < 8``."""
    if s < 4:
        sc = rec[_SC_AT + s] & np.uint8(63)
        m = rec[_SC_AT + s + 4] & np.uint8(63)
    else:
        sc = (rec[_SC_AT + s + 4] & _LOW4) | ((rec[_SC_AT + s - 4] >> np.uint8(6)) << np.uint8(4))
        m = (rec[_SC_AT + s + 4] >> np.uint8(4)) | ((rec[_SC_AT + s] >> np.uint8(6)) << np.uint8(4))
    return np.int32(sc), np.int32(m)


@kernel
def q5_k_quant(rec, i):
    """5-bit quant ``q[i]`` (0 <= i < 256) of a Q5_K record as int32 in [0, 31]."""
    byte = rec[_QL_AT + 32 * (i // 64) + (i % 32)]
    low = (byte & _LOW4) if i % 64 < 32 else (byte >> np.uint8(4))
    high = (rec[_QH_AT + i % 32] >> np.uint8(i // 32)) & np.uint8(1)
    return np.int32(low | (high << np.uint8(4)))


q5_k_decode_into = fields_decoder(
    q5_k_scale_min, q5_k_quant, 8,
    """Unpack one record's integer fields into ``sc`` (8), ``m`` (8) and ``q`` (256).""")
q5_k_decode_records = records_decoder(
    q5_k_decode_into,
    """``q5_k_decode_into`` for every record of a ``[G, 176]`` array.""")


# ---- dequantize -----------------------------------------------------------------------------

@kernel
def dequantize_q5_k(records, out):
    """ggml's ``dequantize_row_q5_K``: ``[G, 176]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, _D_AT)
        dmin = f16_at(records, b, _DMIN_AT)
        for p in range(4):  # pairs of sub-blocks 2p (low nibbles, qh bit 2p), 2p+1 (high, 2p+1)
            sc1, m1 = k4_scale_min(records, b, _SC_AT, 2 * p)
            sc2, m2 = k4_scale_min(records, b, _SC_AT, 2 * p + 1)
            d1 = np.float32(d * np.float32(sc1))
            mn1 = np.float32(dmin * np.float32(m1))
            d2 = np.float32(d * np.float32(sc2))
            mn2 = np.float32(dmin * np.float32(m2))
            for l in range(32):
                byte = records[b, _QL_AT + 32 * p + l]
                h = records[b, _QH_AT + l]
                q1 = np.int32(byte & _LOW4) + (16 if (h >> np.uint8(2 * p)) & np.uint8(1) else 0)
                q2 = np.int32(byte >> np.uint8(4)) + (16 if (h >> np.uint8(2 * p + 1)) & np.uint8(1) else 0)
                out[b, 64 * p + l] = np.float32(np.float32(d1 * np.float32(q1)) - mn1)
                out[b, 64 * p + 32 + l] = np.float32(np.float32(d2 * np.float32(q2)) - mn2)


# ---- quantize (ggml quantize_row_q5_K_ref) --------------------------------------------------

@kernel
def quantize_block_q5_k(values, b, out, work):
    """One finite block ``values[b]`` into record ``out[b]`` (``work = k4_scratch()``)."""
    L = k4_block(values, b, out, work, _SC_AT, _D_AT, _DMIN_AT, 31, np.float32(-0.5), 15)
    q5_pack_quants(out, b, _QL_AT, _QH_AT, L)


quantize_q5_k = quantizer_for(_FMT, block=quantize_block_q5_k, scratch=k4_scratch)


# ---- record dot against Q8_K ----------------------------------------------------------------

@kernel
def record_sums_q5_k_q8_k(w, bw, x, bx):
    """``(S, T)`` (int32) for records ``w[bw]`` (Q5_K ``[G, 176]``) and ``x[bx]`` (Q8_K)."""
    s_total = np.int32(0)
    t_total = np.int32(0)
    for p in range(4):  # 32-byte chunk p of ql holds sub-blocks 2p (low) and 2p+1 (high)
        lo = np.int32(0)
        hi = np.int32(0)
        for l in range(32):
            byte = w[bw, _QL_AT + 32 * p + l]
            h = w[bw, _QH_AT + l]
            q1 = np.int32((byte & _LOW4) | (((h >> np.uint8(2 * p)) & np.uint8(1)) << np.uint8(4)))
            q2 = np.int32((byte >> np.uint8(4)) | (((h >> np.uint8(2 * p + 1)) & np.uint8(1)) << np.uint8(4)))
            lo += q1 * x_q(x, bx, 64 * p + l)
            hi += q2 * x_q(x, bx, 64 * p + 32 + l)
        sc1, m1 = k4_scale_min(w, bw, _SC_AT, 2 * p)
        sc2, m2 = k4_scale_min(w, bw, _SC_AT, 2 * p + 1)
        s_total += sc1 * lo + sc2 * hi
        # bsum[4p .. 4p+3] cover sub-blocks 2p and 2p+1
        t_total += m1 * (x_bsum(x, bx, 4 * p) + x_bsum(x, bx, 4 * p + 1))
        t_total += m2 * (x_bsum(x, bx, 4 * p + 2) + x_bsum(x, bx, 4 * p + 3))
    return np.int32(s_total), np.int32(t_total)


@kernel
def record_value_q5_k_q8_k(w, bw, x, bx):
    """``v`` for records ``w[bw]`` (Q5_K) and ``x[bx]`` (Q8_K): the portable definition."""
    s_b, t_b = record_sums_q5_k_q8_k(w, bw, x, bx)
    return record_value_d_dmin(w, bw, _D_AT, _DMIN_AT, s_b, t_b, x, bx)


# ---- fast path: unpack a record's 256 quants once, then integer dots (as kernels/kquants/q6_k.py) ----
# S and T are exact int32 sums (order-free) and the float steps are record_value_q5_k_q8_k's,
# so results equal the portable definition bit for bit (tests/kquants/test_kquants_fast.py).

@kernel
def q5_k_unpack(w, bw, qbuf):
    """``qbuf[i] = q_i`` (0..31, int8) for the 256 elements of record ``w[bw]``."""
    for p in range(4):
        for l in range(32):
            byte = w[bw, _QL_AT + 32 * p + l]
            h = w[bw, _QH_AT + l]
            qbuf[64 * p + l] = np.int8((byte & _LOW4)
                                       | (((h >> np.uint8(2 * p)) & np.uint8(1)) << np.uint8(4)))
            qbuf[64 * p + 32 + l] = np.int8((byte >> np.uint8(4))
                                            | (((h >> np.uint8(2 * p + 1)) & np.uint8(1))
                                               << np.uint8(4)))


@kernel
def q5_k_unpacked_sums(w, bw, qbuf, x, bx):
    """``(S, T)`` of record ``w[bw]`` (quants unpacked in ``qbuf``) and Q8_K record ``x[bx]``."""
    s_total = np.int32(0)
    t_total = np.int32(0)
    for s in range(8):
        acc = np.int32(0)
        for k in range(32):
            acc += np.int32(qbuf[32 * s + k]) * np.int32(np.int8(x[bx, X_Q_AT + 32 * s + k]))
        sc, m = k4_scale_min(w, bw, _SC_AT, s)
        s_total += sc * acc
        t_total += m * (x_bsum(x, bx, 2 * s) + x_bsum(x, bx, 2 * s + 1))
    return s_total, t_total


@kernel
def _dot_buf(w, x, qbuf):  # unpack-once loop
    acc = np.float32(0.0)
    for b in range(w.shape[0]):
        q5_k_unpack(w, b, qbuf)
        s_b, t_b = q5_k_unpacked_sums(w, b, qbuf, x, b)
        v = record_value_d_dmin(w, b, _D_AT, _DMIN_AT, s_b, t_b, x, b)
        acc = v if b == 0 else np.float32(acc + v)
    return acc


dot_q5_k_q8_k_portable = portable_dot_for(_FMT, value=record_value_q5_k_q8_k)


@kernel
def _dot_loop(w, x):
    return _dot_buf(w, x, np.empty(256, np.int8))


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) over the SIMD
# record values and 8-lane tiles of kernels/simd/kquants.py; results equal
# dot_q5_k_q8_k_portable bit for bit (tests/kquants/test_kquants_fast.py).  _dot_loop is the fallback
# for strided records.

register(_FMT.ggml_type, value=q5_k_q8_k_value, rows_x8=q5_k_rows_x8, acts_x8=q5_k_acts_x8,
         loop_dot=_dot_loop)
dot_q5_k_q8_k, gemv_q5_k_q8_k, gemm_q5_k_q8_k = kernels_for(_FMT.ggml_type)
if HAVE_GEMM_TILES:   # batches of 3 or more: records decoded once per call, 8 x 16 microtiles
    gemm_q5_k_q8_k = panel_gemm(q5_k_decode, microtile_sub32_mins, gemm_q5_k_q8_k)


# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = Traits(
    format=_FMT,
    dequantize=dequantize_q5_k,
    decode=q5_k_decode_records,
    decoded=Decoded("Q5KFields", ("d", "dmin", "sc", "m", "q"),
                    (("sc", "u1"), ("m", "u1"), ("q", "u1")),
                    "Decoded Q5_K fields of ``G`` records "
                    "(``x = d*sc[s]*q - dmin*m[s]``, ``s = i // 32``)."),
    quantize=quantize_q5_k,
    domain="finite",
    quantizer="ggml quantize_row_q5_K_ref",
    find_invalid=None,
    dot=dot_q5_k_q8_k,
    gemv=gemv_q5_k_q8_k,
    gemm=gemm_q5_k_q8_k,
    oracle="numba_qk.testing.reference.kquants",
)
