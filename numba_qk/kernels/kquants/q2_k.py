"""Q2_K records: field decoders, ggml's dequantizer and reference quantizer, and the exact
record dot against Q8_K (DESIGN.md section 7).  All ``@njit``; callable from user ``@njit`` code.

Byte layout of one 84-byte record ``a`` (256 elements, 16 sub-blocks of 16; offsets from the
schema ``numba_qk.quant.q2_k``).  Element ``i = 128c + 32g + l`` (chunk ``c`` 0..1,
group ``g`` 0..3, lane ``l`` 0..31), sub-block ``j = i // 16``::

    [0, 16)    sc/m  byte j: sc[j] = low nibble, m[j] = high nibble (both 0..15)
    [16, 80)   q     2-bit quants: byte 16 + 32c + l, bits [2g, 2g + 2)   (0..3)
    [80, 82)   d     IEEE f16   scale of the scales
    [82, 84)   dmin  IEEE f16   scale of the mins

Dequantize (ggml ``dequantize_row_q2_K``; gguf-py computes the same)::

    dl = R32(f32(d) * sc[j]);  ml = R32(f32(dmin) * m[j]);  y[i] = R32(R32(dl * q[i]) - ml)

Record dot with Q8_K record ``x``::

    S = sum_j sc[j] * sum_{i in j} q[i] * xq[i]           exact int32
    T = sum_j m[j] * bsum[j]                               exact int32, bsum as stored
    v = R32(ds * R32(R32(f32(d) * f32(S)) - R32(f32(dmin) * f32(T))))
    dot = ((v_0 + v_1) + v_2) + ...                        left fold; G = 0 -> +0.0

Integer widths: |S| <= 16 * 15 * 16 * 3 * 128 = 1,474,560 and |T| <= 16 * 15 * 32,768 =
7,864,320, both below 2**24: ``f32(S)``, ``f32(T)`` are exact for every record.

Quantize (ggml ``quantize_row_q2_K_ref``, no importance matrix), every float step an explicit
f32 rounding in C order:

1. Per sub-block ``j`` of 16: weights ``w_i = |x_i|``; ``make_qkx2_quants(n=16, nmax=3,
   rmin=-0.5, rdelta=0.1, nstep=15, use_mad=true)`` -> ``scale_j``, ``min_j`` (imported from
   ``q4_k_encode``; ``use_mad`` sums weighted absolute instead of squared errors).
2. ``max_scale > 0``: ``iscale = 15 / max_scale``, scale byte ``j`` = ``(uint8_t)
   nearest_int(iscale * scale_j)`` (a negative ``scale_j`` wraps, as in C, and spills into
   the min nibble), ``d = fp16(max_scale / 15)``; else scale bytes 0 and ``d = fp16(0)``.
   ``max_min > 0``: byte ``j |= nearest_int((15 / max_min) * min_j) << 4``, ``dmin =
   fp16(max_min / 15)``; else ``dmin = fp16(0)``.  (f16 overflow/underflow kept.)
3. Requantize: ``dj = f32(d) * sc[j]``; when ``dj != 0``: ``q = clamp(nearest_int((x +
   f32(dmin) * m[j]) / dj), 0, 3)``; otherwise step 1's quants stay.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.drive import kernels_for, panel_gemm, register
from numba_qk.kernels.simd.iq_grid import HAVE_GEMM_TILES, microtile_prescaled_mins
from numba_qk.kernels.simd.kquants import q2_k_acts_x8, q2_k_decode_prescaled, q2_k_q8_k_value, q2_k_rows_x8
from numba_qk.formats.kquants import q2_k as _FMT
from numba_qk.kernels._bits import f16_to_f32, load_u16
from numba_qk.kernels.kquants.common import f16_at, fields_decoder, records_decoder, max_scale_min, portable_dot_for, quantizer_for, pack_2bit, record_value_d_dmin, store_f16, transpose_out, x_bsum, x_q
from numba_qk.kernels.kquants.q4_k_encode import nearest_int, qkx2_block, qkx2_scratch_of, requant_lanes

Q2_K_RECORD_BYTES = _FMT.block_bytes
Q2_K_BLOCK = _FMT.block_size
_SC_AT = _FMT.field("sc").start     # 16 bytes: scale (low nibble) | min (high nibble)
_Q_AT = _FMT.field("q").start       # 64 bytes of 2-bit quants
_D_AT = _FMT.field("d").start
_DMIN_AT = _FMT.field("dmin").start
_LOW2 = np.uint8(0b0000_0011)
_LOW4 = np.uint8(0b0000_1111)


@kernel
def _quant_at(a, row, i):
    """Quant ``q[i]`` (0..3) of record ``a[row]``."""
    byte = a[row, _Q_AT + 32 * (i // 128) + i % 32]
    return np.int32((byte >> np.uint8(2 * ((i % 128) // 32))) & _LOW2)


# ---- field decoders (1-D record, like kernels/kquants/q4_k.py) ----------------------------------------

@kernel
def q2_k_d(rec):
    """Field ``d`` of a Q2_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _D_AT))


@kernel
def q2_k_dmin(rec):
    """Field ``dmin`` of a Q2_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _DMIN_AT))


@kernel
def q2_k_scale_min(rec, j):
    """``(sc[j], m[j])`` (0 <= j < 16) as int32 in [0, 15]."""
    byte = rec[_SC_AT + j]
    return np.int32(byte & _LOW4), np.int32(byte >> np.uint8(4))


@kernel
def q2_k_quant(rec, i):
    """2-bit quant ``q[i]`` (0 <= i < 256) as int32 in [0, 3]."""
    byte = rec[_Q_AT + 32 * (i // 128) + i % 32]
    return np.int32((byte >> np.uint8(2 * ((i % 128) // 32))) & _LOW2)


q2_k_decode_into = fields_decoder(
    q2_k_scale_min, q2_k_quant, 16,
    """Unpack one record into ``sc`` (16), ``m`` (16) and ``q`` (256).""")
q2_k_decode_records = records_decoder(
    q2_k_decode_into,
    """``q2_k_decode_into`` for every record of a ``[G, 84]`` array.""")


# ---- dequantize -----------------------------------------------------------------------------

@kernel
def dequantize_q2_k(records, out):
    """ggml's ``dequantize_row_q2_K``: ``[G, 84]`` records into f32 ``out`` ``[G, 256]``:
    ``R32(R32(dl * q) - ml)`` with ``dl = R32(d * sc[j])``, ``ml = R32(dmin * m[j])``."""
    # One loop of 32 lanes per (c, g) with the two sub-blocks' scales selected per lane: LLVM
    # vectorises it (16-lane loops per sub-block stayed scalar); same values per element.
    for b in range(records.shape[0]):
        d = f16_at(records, b, _D_AT)
        dmin = f16_at(records, b, _DMIN_AT)
        for c in range(2):
            for g in range(4):
                shift = np.uint8(2 * g)
                j = 8 * c + 2 * g
                s0 = records[b, _SC_AT + j]
                s1 = records[b, _SC_AT + j + 1]
                dl0 = np.float32(d * np.float32(s0 & _LOW4))
                ml0 = np.float32(dmin * np.float32(s0 >> np.uint8(4)))
                dl1 = np.float32(d * np.float32(s1 & _LOW4))
                ml1 = np.float32(dmin * np.float32(s1 >> np.uint8(4)))
                base = 128 * c + 32 * g
                for l in range(32):
                    q = np.float32(np.int32((records[b, _Q_AT + 32 * c + l] >> shift) & _LOW2))
                    dl = dl1 if l >= 16 else dl0
                    ml = ml1 if l >= 16 else ml0
                    out[b, base + l] = np.float32(np.float32(dl * q) - ml)


# ---- quantize (ggml quantize_row_q2_K_ref) --------------------------------------------------

#: Scratch of ``quantize_block_q2_k`` (16 sub-blocks of 16).
q2_k_scratch = qkx2_scratch_of(16, 16)


@kernel
def quantize_block_q2_k(values, b, out, work):
    """One finite block ``values[b]`` into record ``out[b]`` (``work = q2_k_scratch()``)."""
    L, scales, mins, xt, Lt, dd = qkx2_block(values, b, work, 16, 16, False, 3, np.float32(-0.5),
                                             15, True)
    q4scale = np.float32(15.0)
    max_scale, max_min = max_scale_min(scales, mins, 16)
    if max_scale > np.float32(0.0):
        iscale = np.float32(q4scale / max_scale)
        for j in range(16):
            out[b, _SC_AT + j] = np.uint8(nearest_int(np.float32(iscale * scales[j])) & 0xFF)
        d_all = store_f16(out, b, _D_AT, np.float32(max_scale / q4scale))
    else:
        for j in range(16):
            out[b, _SC_AT + j] = 0
        d_all = store_f16(out, b, _D_AT, np.float32(0.0))
    if max_min > np.float32(0.0):
        iscale = np.float32(q4scale / max_min)
        for j in range(16):
            l = nearest_int(np.float32(iscale * mins[j]))
            out[b, _SC_AT + j] |= np.uint8((l << 4) & 0xFF)
        dmin_all = store_f16(out, b, _DMIN_AT, np.float32(max_min / q4scale))
    else:
        dmin_all = store_f16(out, b, _DMIN_AT, np.float32(0.0))
    for j in range(16):
        byte = out[b, _SC_AT + j]
        dd[1, j] = np.float32(d_all * np.float32(byte & _LOW4))  # C: if (!d) continue;
        dd[0, j] = np.float32(dmin_all * np.float32(byte >> np.uint8(4)))
    requant_lanes(xt, dd[0], dd[1], 0, 3, 0, Lt, 16, 16)  # nearest_int((x + dm)/d), 0..3
    transpose_out(Lt, L, 16, 16)
    pack_2bit(out, b, _Q_AT, L)


quantize_q2_k = quantizer_for(_FMT, block=quantize_block_q2_k, scratch=q2_k_scratch)


# ---- record dot against Q8_K ----------------------------------------------------------------

@kernel
def record_sums_q2_k_q8_k(w, bw, x, bx):
    """``(S, T)`` (int32) for records ``w[bw]`` (Q2_K ``[G, 84]``) and ``x[bx]`` (Q8_K)."""
    s_total = np.int32(0)
    t_total = np.int32(0)
    for j in range(16):
        acc = np.int32(0)
        for k in range(16):
            i = 16 * j + k
            acc += _quant_at(w, bw, i) * x_q(x, bx, i)
        byte = w[bw, _SC_AT + j]
        s_total += np.int32(byte & _LOW4) * acc
        t_total += np.int32(byte >> np.uint8(4)) * x_bsum(x, bx, j)
    return np.int32(s_total), np.int32(t_total)


@kernel
def record_value_q2_k_q8_k(w, bw, x, bx):
    """``v`` for records ``w[bw]`` (Q2_K) and ``x[bx]`` (Q8_K): the portable definition."""
    s_b, t_b = record_sums_q2_k_q8_k(w, bw, x, bx)
    return record_value_d_dmin(w, bw, _D_AT, _DMIN_AT, s_b, t_b, x, bx)


dot_q2_k_q8_k_portable = portable_dot_for(_FMT, value=record_value_q2_k_q8_k)


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) over the SIMD
# record values and 8-lane tiles of kernels/simd/kquants.py; results equal
# dot_q2_k_q8_k_portable bit for bit (tests/kquants/test_kquants_fast.py), the fallback for
# strided records.

register(_FMT.ggml_type, value=q2_k_q8_k_value, rows_x8=q2_k_rows_x8, acts_x8=q2_k_acts_x8,
         loop_dot=dot_q2_k_q8_k_portable)
dot_q2_k_q8_k, gemv_q2_k_q8_k, gemm_q2_k_q8_k = kernels_for(_FMT.ggml_type)
if HAVE_GEMM_TILES:   # batches of 3 or more: records decoded once per call, 8 x 16 microtiles
    # the quants decoded times their scales (<= 45: int8), no scale product per sub-block
    gemm_q2_k_q8_k = panel_gemm(q2_k_decode_prescaled, microtile_prescaled_mins, gemm_q2_k_q8_k)


# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = Traits(
    format=_FMT,
    dequantize=dequantize_q2_k,
    decode=q2_k_decode_records,
    decoded=Decoded("Q2KFields", ("d", "dmin", "sc", "m", "q"),
                    (("sc", "u1"), ("m", "u1"), ("q", "u1")),
                    "Decoded Q2_K fields of ``G`` records "
                    "(``x = d*sc[j]*q - dmin*m[j]``, ``j = i // 16``)."),
    quantize=quantize_q2_k,
    domain="finite",
    quantizer="ggml quantize_row_q2_K_ref",
    find_invalid=None,
    dot=dot_q2_k_q8_k,
    gemv=gemv_q2_k_q8_k,
    gemm=gemm_q2_k_q8_k,
    oracle="numba_qk.testing.reference.kquants",
)
