"""Q6_K records: field decoders, ggml's dequantizer and reference quantizer, and the exact
record dot against Q8_K (DESIGN.md section 7).  All ``@njit``; callable from user ``@njit`` code.

Byte layout of one 210-byte record ``a`` (256 elements, 16 sub-blocks of 16; offsets come
from the schema ``numba_qk.quant.q6_k``).  Element ``i = 128c + 32g + l``
(chunk ``c`` 0..1, group ``g`` 0..3, lane ``l`` 0..31)::

    [0, 128)    ql   low 4 bits of q[i]: byte 64c + l + 32*(g & 1); low nibble if g < 2
    [128, 192)  qh   high 2 bits of q[i]: byte 128 + 32c + l, bits [2g, 2g + 2)
    [192, 208)  sc   16 x int8, sub-block j = i // 16
    [208, 210)  d    IEEE f16
    q[i] = ql | qh << 4   (0..63), used as q[i] - 32 (-32..31)

Dequantize (ggml ``dequantize_row_q6_K``; gguf-py computes the same)::

    y[i] = R32(R32(f32(d) * f32(sc[j])) * f32(q[i] - 32))

Record dot with Q8_K record ``x`` (``ds``, ``q``; ``bsum`` is not read)::

    S = sum_j sc[j] * sum_{i in j} (q[i] - 32) * xq[i]       exact int32
    v = R32(ds * R32(f32(d) * f32(S)))                        two separate f32 roundings
    dot = ((v_0 + v_1) + v_2) + ...                           spec 000's left fold; G = 0 -> +0.0

Integer widths: |(q - 32) * xq| <= 32 * 128 = 4096, a sub-block sum <= 65,536, times
|sc| <= 128 -> 8,388,608, and |S| <= 16 * 8,388,608 = 134,217,728 < 2**31: exact in int32.
``|S|`` may exceed 2**24, so ``f32(S)`` is a real round-to-nearest-even step.

Quantize (ggml ``quantize_row_q6_K_ref``, no importance matrix), per block, every float step
an explicit f32 rounding in C evaluation order:

1. Per sub-block ``j``: ``scale_j = make_qx_quants(n=16, nmax=32, rmse_type=1)`` (below),
   which also leaves ``L`` = ``l + 32``.
2. ``max_scale`` = the ``scale_j`` of largest ``|scale_j|`` (first one on ties).  If that
   magnitude is below ``GROUP_MAX_EPS = 1e-15f``: the record is all zero bytes.
3. ``iscale = -128f / max_scale``; ``d = fp16(1f / iscale)`` (may overflow to inf or
   underflow to a subnormal / zero -- reproduced); ``sc_j = min(127, nearest_int(iscale *
   scale_j))`` stored as int8.
4. Requantize with the stored values: ``dj = f32(d) * sc_j``; when ``dj != 0`` (NaN counts as
   non-zero, as C's ``!d``) ``q = clamp(nearest_int(x / dj), -32, 31) + 32``; otherwise the
   quants of step 1 stay.

``make_qx_quants`` (rmse_type = 1, weights ``w = x*x``): ``max`` = the value of largest
magnitude (first on ties); ``iscale = -nmax / max``; ``l = clamp(nearest_int(iscale*x),
-nmax, nmax-1)``; ``sumlx += (w*x)*l``, ``suml2 += (w*l)*l``; ``scale = sumlx/suml2`` (0 when
``suml2 == 0``), ``best = scale*sumlx``; then for ``is`` in -9..9 (not 0) the same with
``iscale = -(nmax + 0.1f*is) / max``, taking a candidate when ``suml2 > 0`` and
``sumlx*sumlx > best*suml2``.  ``nearest_int`` is ggml's magic-number rounding
(``kernels/kquants/q4_k_encode.py``).

Non-finite inputs are outside the quantizer's domain: ``quantize_q6_k`` reports the first such
block and writes nothing.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats.kquants import q6_k as _FMT
from numba_qk.kernels._bits import f16_to_f32, load_u16
from numba_qk.kernels.kquants.common import GROUP_MAX_EPS, X_Q_AT, f16_at, make_qx_quants, portable_dot_for, quantizer_for, record_value_d, signed_absmax, store_f16, transpose_in, transpose_out, x_q
from numba_qk.kernels.drive import kernels_for, panel_gemm, register
from numba_qk.kernels.simd.iq_grid import HAVE_GEMM_TILES, microtile_sub16
from numba_qk.kernels.simd.kquants import q6_k_acts_x8, q6_k_decode, q6_k_q8_k_value, q6_k_rows_x8
from numba_qk.kernels.kquants.q4_k_encode import nearest_int
from numba_qk.kernels.kquants.encode_lanes import ENCODE_LANES, QX_SCR_ROWS, qx_lanes, requant_lanes

Q6_K_RECORD_BYTES = _FMT.block_bytes
Q6_K_BLOCK = _FMT.block_size
_QL_AT = _FMT.field("ql").start   # 128 bytes of low nibbles
_QH_AT = _FMT.field("qh").start   # 64 bytes of 2-bit high parts
_SC_AT = _FMT.field("sc").start   # 16 int8 scales
_D_AT = _FMT.field("d").start     # f16 super-block scale
_LOW4 = np.uint8(0b0000_1111)
_LOW2 = np.uint8(0b0000_0011)
_QOFF = 32                          # stored q is q_signed + 32


# ---- field decoders (1-D record) -------------------------------------------------------------

@kernel
def q6_k_d(rec):
    """Field ``d`` of a Q6_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _D_AT))


@kernel
def q6_k_scale(rec, j):
    """Sub-block scale ``sc[j]`` (0 <= j < 16) as int32 in [-128, 127]."""
    return np.int32(np.int8(rec[_SC_AT + j]))


@kernel
def q6_k_quant(rec, i):
    """Stored 6-bit quant ``q[i]`` (0 <= i < 256) as int32 in [0, 63] (the value is q - 32)."""
    c = i // 128
    g = (i % 128) // 32
    l = i % 32
    byte = rec[_QL_AT + 64 * c + l + 32 * (g & 1)]
    low = (byte & _LOW4) if g < 2 else (byte >> np.uint8(4))
    high = (rec[_QH_AT + 32 * c + l] >> np.uint8(2 * g)) & _LOW2
    return np.int32(low | (high << np.uint8(4)))


@kernel
def q6_k_decode_into(rec, sc, q):
    """Unpack one record's integer fields into ``sc`` (16) and stored quants ``q`` (256)."""
    for j in range(16):
        sc[j] = np.int8(rec[_SC_AT + j])
    for c in range(2):
        for l in range(32):
            b0 = rec[_QL_AT + 64 * c + l]
            b1 = rec[_QL_AT + 64 * c + 32 + l]
            h = rec[_QH_AT + 32 * c + l]
            base = 128 * c + l
            q[base] = (b0 & _LOW4) | ((h & _LOW2) << np.uint8(4))
            q[base + 32] = (b1 & _LOW4) | (((h >> np.uint8(2)) & _LOW2) << np.uint8(4))
            q[base + 64] = (b0 >> np.uint8(4)) | (((h >> np.uint8(4)) & _LOW2) << np.uint8(4))
            q[base + 96] = (b1 >> np.uint8(4)) | ((h >> np.uint8(6)) << np.uint8(4))


@kernel
def q6_k_decode_records(records, sc, q):
    """``q6_k_decode_into`` for every record of a ``[G, 210]`` array."""
    for b in range(records.shape[0]):
        q6_k_decode_into(records[b], sc[b], q[b])


# ---- dequantize -----------------------------------------------------------------------------

@kernel
def dequantize_q6_k(records, out):
    """ggml's ``dequantize_row_q6_K``: ``[G, 210]`` records into f32 ``out`` ``[G, 256]``.

    Walks each group of 32 outputs contiguously (ggml interleaves four groups per lane); the
    values are the same: ``R32(R32(d * sc[j]) * (q - 32))`` per element."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, _D_AT)
        for c in range(2):
            for g in range(4):
                ql_at = _QL_AT + 64 * c + 32 * (g & 1)
                ql_shift = np.uint8(0 if g < 2 else 4)
                qh_at = _QH_AT + 32 * c
                qh_shift = np.uint8(2 * g)
                j = 8 * c + 2 * g
                dl0 = np.float32(d * np.float32(np.int8(records[b, _SC_AT + j])))
                dl1 = np.float32(d * np.float32(np.int8(records[b, _SC_AT + j + 1])))
                base = 128 * c + 32 * g
                # 32 lanes, the two sub-blocks' scales selected per lane: LLVM vectorises this
                # loop (16-lane loops per sub-block stayed scalar); same value per element.
                for l in range(32):
                    low = (records[b, ql_at + l] >> ql_shift) & _LOW4
                    high = (records[b, qh_at + l] >> qh_shift) & _LOW2
                    q = np.int32(low | (high << np.uint8(4))) - _QOFF
                    dl = dl1 if l >= 16 else dl0
                    out[b, base + l] = np.float32(dl * np.float32(q))


# ---- quantize (ggml quantize_row_q6_K_ref) --------------------------------------------------

# ggml's make_qx_quants(n, nmax, x + off, L + loff, rmse_type=1, qw=NULL): the weights x*x
make_qx_quants_rmse1 = make_qx_quants


@kernel
def q6_k_scratch():
    """Scratch of ``quantize_block_q6_k``: ``L`` int32 [256], ``scales`` f32 [16] and the lanes'
    ``(xt, Lt, scr, dd)``."""
    return (np.zeros(256, np.int32), np.empty(16, np.float32),
            (np.zeros((16, 16), np.float32), np.zeros((16, 16), np.int32),
             np.zeros((QX_SCR_ROWS, 16), np.float32), np.zeros((2, 16), np.float32)))


@kernel
def quantize_block_q6_k(values, b, out, work):
    """One block ``values[b]`` into record ``out[b]`` (``work = q6_k_scratch()``).  The block
    must be finite."""
    L, scales, lanes = work
    x = values[b]
    xt, Lt, scr, dd = lanes
    transpose_in(x, xt, 16, 16)
    if ENCODE_LANES:  # the 16 sub-blocks' searches side by side (same bits)
        qx_lanes(xt, 16, 16, 32, Lt, scales, scr)
    else:
        for ib in range(16):
            scales[ib] = make_qx_quants(x, 16 * ib, 16, 32, L, 16 * ib)
        transpose_in(L, Lt, 16, 16)
    max_abs_scale, max_scale = signed_absmax(scales, 0, 16)
    if max_abs_scale < GROUP_MAX_EPS:  # memset(0) and d = fp16(0.0f): all zero bytes
        for k in range(Q6_K_RECORD_BYTES):
            out[b, k] = 0
        return
    iscale = np.float32(np.float32(-128.0) / max_scale)
    d_all = store_f16(out, b, _D_AT, np.float32(np.float32(1.0) / iscale))
    for ib in range(16):
        sc = min(127, nearest_int(np.float32(iscale * scales[ib])))
        out[b, _SC_AT + ib] = np.uint8(sc & 0xFF)  # int8_t store
    for j in range(16):  # the stored scales; ggml's `l = nearest_int(x/d)` for d != 0
        dd[1, j] = np.float32(d_all * np.float32(np.int8(out[b, _SC_AT + j])))
        dd[0, j] = np.float32(-0.0)  # x + -0.0 == x: plain x / d
    requant_lanes(xt, dd[0], dd[1], -32, 31, 32, Lt, 16, 16)
    transpose_out(Lt, L, 16, 16)
    for c in range(2):
        for l in range(32):
            i = 128 * c + l
            out[b, _QL_AT + 64 * c + l] = np.uint8((L[i] & 0xF) | ((L[i + 64] & 0xF) << 4))
            out[b, _QL_AT + 64 * c + 32 + l] = np.uint8((L[i + 32] & 0xF) | ((L[i + 96] & 0xF) << 4))
            out[b, _QH_AT + 32 * c + l] = np.uint8(((L[i] >> 4) & 3) | (((L[i + 32] >> 4) & 3) << 2)
                                                   | (((L[i + 64] >> 4) & 3) << 4)
                                                   | (((L[i + 96] >> 4) & 3) << 6))


quantize_q6_k = quantizer_for(_FMT, block=quantize_block_q6_k, scratch=q6_k_scratch)


# ---- record dot against Q8_K ----------------------------------------------------------------

@kernel
def record_sums_q6_k_q8_k(w, bw, x, bx):
    """``S`` (int32) for records ``w[bw]`` (Q6_K ``[G, 210]``) and ``x[bx]`` (Q8_K)."""
    s_total = np.int32(0)
    for c in range(2):
        for g in range(4):
            for half in range(2):  # sub-block j = 8c + 2g + half: lanes 16*half .. +16
                j = 8 * c + 2 * g + half
                acc = np.int32(0)
                for k in range(16):
                    l = 16 * half + k
                    byte = w[bw, _QL_AT + 64 * c + l + 32 * (g & 1)]
                    low = (byte & _LOW4) if g < 2 else (byte >> np.uint8(4))
                    high = (w[bw, _QH_AT + 32 * c + l] >> np.uint8(2 * g)) & _LOW2
                    q = np.int32(low | (high << np.uint8(4))) - _QOFF
                    acc += q * x_q(x, bx, 128 * c + 32 * g + l)
                s_total += np.int32(np.int8(w[bw, _SC_AT + j])) * acc
    return np.int32(s_total)


@kernel
def record_value_q6_k_q8_k(w, bw, x, bx):
    """``v`` for records ``w[bw]`` (Q6_K) and ``x[bx]`` (Q8_K): the portable definition."""
    return record_value_d(w, bw, _D_AT, record_sums_q6_k_q8_k(w, bw, x, bx), x, bx)


# ---- fast path: unpack a record's 256 signed quants once, then integer dots -----------------
# The integer sums are exact in int32 (any order gives the same S), and the float steps are the
# ones of record_value_q6_k_q8_k, so every result equals the portable definition bit for bit
# (tests/kquants/test_kquants_fast.py); the unpack and the 16-lane products are plain loops over
# contiguous bytes that LLVM vectorises.

@kernel
def q6_k_unpack_signed(w, bw, qbuf):
    """``qbuf[i] = q_i - 32`` (int8) for the 256 elements of record ``w[bw]``."""
    for c in range(2):
        for l in range(32):
            b0 = w[bw, _QL_AT + 64 * c + l]
            b1 = w[bw, _QL_AT + 64 * c + 32 + l]
            h = w[bw, _QH_AT + 32 * c + l]
            qbuf[128 * c + l] = np.int8((b0 & _LOW4) | ((h & _LOW2) << np.uint8(4))) - np.int8(32)
            qbuf[128 * c + 32 + l] = (np.int8((b1 & _LOW4) | (((h >> np.uint8(2)) & _LOW2)
                                                              << np.uint8(4))) - np.int8(32))
            qbuf[128 * c + 64 + l] = (np.int8((b0 >> np.uint8(4)) | (((h >> np.uint8(4)) & _LOW2)
                                                                     << np.uint8(4)))
                                      - np.int8(32))
            qbuf[128 * c + 96 + l] = (np.int8((b1 >> np.uint8(4)) | ((h >> np.uint8(6))
                                                                     << np.uint8(4)))
                                      - np.int8(32))


@kernel
def q6_k_unpacked_sums(w, bw, qbuf, x, bx):
    """``S`` of record ``w[bw]`` (its quants unpacked in ``qbuf``) and Q8_K record ``x[bx]``."""
    s_total = np.int32(0)
    for j in range(16):
        acc = np.int32(0)
        for k in range(16):
            acc += np.int32(qbuf[16 * j + k]) * np.int32(np.int8(x[bx, X_Q_AT + 16 * j + k]))
        s_total += np.int32(np.int8(w[bw, _SC_AT + j])) * acc
    return s_total


@kernel
def _sums_unpacked(w, bw, qbuf, x, bx):
    q6_k_unpack_signed(w, bw, qbuf)
    return q6_k_unpacked_sums(w, bw, qbuf, x, bx)


@kernel
def _dot_buf(w, x, qbuf):
    acc = np.float32(0.0)
    for b in range(w.shape[0]):
        v = record_value_d(w, b, _D_AT, _sums_unpacked(w, b, qbuf, x, b), x, b)
        acc = v if b == 0 else np.float32(acc + v)
    return acc


dot_q6_k_q8_k_portable = portable_dot_for(_FMT, value=record_value_q6_k_q8_k)


@kernel
def _dot_loop(w, x):
    """The unpack-once dot of one row (any strides): the drivers' fallback."""
    return _dot_buf(w, x, np.empty(256, np.int8))


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) over the SIMD
# record values and 8-lane tiles of kernels/simd/kquants.py; results equal
# dot_q6_k_q8_k_portable bit for bit (tests/kquants/test_kquants_fast.py).

register(_FMT.ggml_type, value=q6_k_q8_k_value, rows_x8=q6_k_rows_x8, acts_x8=q6_k_acts_x8,
         loop_dot=_dot_loop)
dot_q6_k_q8_k, gemv_q6_k_q8_k, gemm_q6_k_q8_k = kernels_for(_FMT.ggml_type)
if HAVE_GEMM_TILES:   # batches of 3 or more: records decoded once per call, 8 x 16 microtiles
    gemm_q6_k_q8_k = panel_gemm(q6_k_decode, microtile_sub16, gemm_q6_k_q8_k)


# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = Traits(
    format=_FMT,
    dequantize=dequantize_q6_k,
    decode=q6_k_decode_records,
    decoded=Decoded("Q6KFields", ("d", "sc", "q"),
                    (("sc", "i1"), ("q", "u1")),
                    "Decoded Q6_K fields of ``G`` records "
                    "(``x = d*sc[j]*(q - 32)``, ``j = i // 16``)."),
    quantize=quantize_q6_k,
    domain="finite",
    quantizer="ggml quantize_row_q6_K_ref",
    find_invalid=None,
    dot=dot_q6_k_q8_k,
    gemv=gemv_q6_k_q8_k,
    gemm=gemm_q6_k_q8_k,
    oracle="numba_qk.testing.reference.kquants",
)
