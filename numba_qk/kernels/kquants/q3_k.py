"""Q3_K records: field decoders, ggml's dequantizer and reference quantizer, and the exact
record dot against Q8_K (DESIGN.md section 7).  All ``@njit``; callable from user ``@njit`` code.

Byte layout of one 110-byte record ``a`` (256 elements, 16 sub-blocks of 16; offsets from the
schema ``numba_qk.quant.q3_k``).  Element ``i = 128c + 32g + l`` (chunk ``c`` 0..1,
group ``g`` 0..3, lane ``l`` 0..31), sub-block ``j = i // 16``::

    [0, 32)     hmask  byte i % 32, bit i // 32: SET -> q = low; CLEAR -> q = low - 4
    [32, 96)    ql     low 2 bits of q: byte 32 + 32c + l, bits [2g, 2g + 2)
    [96, 108)   sc     16 x 6-bit, stored +32: low nibble in byte 96 + (j % 8) (nibble j // 8),
                       top 2 bits in byte 104 + (j % 4), bits [2*(j // 4), +2)
    [108, 110)  d      IEEE f16
    q[i] in -4..3; sub-block scale sc[j] - 32 in -32..31

Dequantize (ggml ``dequantize_row_q3_K``; gguf-py computes the same)::

    y[i] = R32(R32(f32(d) * f32(sc[j] - 32)) * f32(q[i]))

Record dot with Q8_K record ``x`` (``bsum`` is not read)::

    S = sum_j (sc[j] - 32) * sum_{i in j} q[i] * xq[i]       exact int32
    v = R32(ds * R32(f32(d) * f32(S)))
    dot = ((v_0 + v_1) + v_2) + ...                           left fold; G = 0 -> +0.0

Integer widths: |q * xq| <= 4 * 128 = 512, a sub-block sum <= 8192, times |sc - 32| <= 32 ->
262,144, |S| <= 4,194,304 < 2**24: ``f32(S)`` is exact for every record.

Quantize (ggml ``quantize_row_q3_K_ref``, no importance matrix), every float step an explicit
f32 rounding in C order:

1. Per sub-block ``j``: ``scale_j = make_q3_quants(n=16, nmax=4, do_rmse=true)`` (below),
   leaving ``L = l + 4`` -- or ``L = 0`` for a sub-block whose max |x| < 1e-15 (ggml's quirk:
   q = -4 there; the elements still decode to +-0 because that sub-block's scale is 0).
2. ``max_scale`` = the ``scale_j`` of largest magnitude (first on ties).  If it is 0: every
   scale byte 0 and ``d = fp16(0)``.  Otherwise ``iscale = -32f / max_scale``,
   ``l = (int8_t)nearest_int(iscale * scale_j)``, ``sc_j = clamp(l, -32, 31) + 32`` packed
   as above, ``d = fp16(1f / iscale)`` (overflow/underflow kept).
3. Requantize: ``dj = f32(d) * (sc_j - 32)``; when ``dj != 0`` ``q = clamp(nearest_int(x /
   dj), -4, 3) + 4``; else step 1's quants stay.  Then ``L > 3`` sets the hmask bit and
   subtracts 4.

``make_q3_quants`` (weights ``w = x*x``): ``max`` = value of largest magnitude; ``iscale =
-nmax / max``; ``l = clamp(nearest_int(iscale*x), -nmax, nmax-1)``; ``sumlx += (w*x)*l``,
``suml2 += (w*l)*l``; then up to 5 passes of coordinate descent: for each ``i`` with ``slx =
sumlx - (w*x)*L_i > 0``: ``sl2 = suml2 - (w*L_i)*L_i``, ``new = clamp(nearest_int((x*sl2)/slx))``;
if ``new != L_i``: ``slx += (w*x)*new``, ``sl2 += (w*new)*new`` and accept when ``sl2 > 0 and
(slx*slx)*suml2 > (sumlx*sumlx)*sl2``; stop after a pass with no change.  Returns
``sumlx/suml2`` (0 when ``suml2 <= 0``).
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.drive import kernels_for, panel_gemm, register
from numba_qk.kernels.simd.iq_grid import HAVE_GEMM_TILES, microtile_sub16
from numba_qk.kernels.simd.kquants import q3_k_acts_x8, q3_k_decode, q3_k_q8_k_value, q3_k_rows_x8
from numba_qk.formats.kquants import q3_k as _FMT
from numba_qk.kernels._bits import f16_to_f32, load_u16
from numba_qk.kernels.kquants.common import f16_at, pack_2bit, q3_split_hmask, portable_dot_for, quantizer_for, qx_sums, record_value_d, signed_absmax, store_f16, transpose_in, transpose_out, x_q
from numba_qk.kernels.kquants.q4_k_encode import nearest_int
from numba_qk.kernels.kquants.encode_lanes import ENCODE_LANES, Q3_SCR_ROWS, q3_lanes, requant_lanes

Q3_K_RECORD_BYTES = _FMT.block_bytes
Q3_K_BLOCK = _FMT.block_size
_HM_AT = _FMT.field("hmask").start  # 32 bytes of high-bit masks
_QL_AT = _FMT.field("ql").start     # 64 bytes of 2-bit low parts
_SC_AT = _FMT.field("sc").start     # 12 bytes of packed 6-bit scales
_D_AT = _FMT.field("d").start       # f16 super-block scale
_LOW2 = np.uint8(0b0000_0011)
_LOW4 = np.uint8(0b0000_1111)
_GROUP_MAX_EPS = np.float32(1e-15)  # ggml's GROUP_MAX_EPS
_SC_OFF = 32                        # stored scale = scale + 32


@kernel
def _scale_at(a, row, j):
    """Stored 6-bit scale (0..63) of sub-block ``j`` of record ``a[row]``."""
    low = (a[row, _SC_AT + j % 8] >> np.uint8(4 * (j // 8))) & _LOW4
    high = (a[row, _SC_AT + 8 + j % 4] >> np.uint8(2 * (j // 4))) & _LOW2
    return np.int32(low | (high << np.uint8(4)))


@kernel
def _quant_at(a, row, i):
    """Quant ``q[i]`` (-4..3) of record ``a[row]``."""
    c = i // 128
    g = (i % 128) // 32
    l = i % 32
    low = np.int32((a[row, _QL_AT + 32 * c + l] >> np.uint8(2 * g)) & _LOW2)
    if (a[row, _HM_AT + l] >> np.uint8(i // 32)) & np.uint8(1):
        return low
    return low - 4


# ---- field decoders (1-D record, like kernels/kquants/q4_k.py) ----------------------------------------

@kernel
def q3_k_d(rec):
    """Field ``d`` of a Q3_K record, as float32 (exact)."""
    return f16_to_f32(load_u16(rec, _D_AT))


@kernel
def q3_k_scale(rec, j):
    """Stored 6-bit scale of sub-block ``j`` (0 <= j < 16) as int32 in [0, 63] (used - 32)."""
    low = (rec[_SC_AT + j % 8] >> np.uint8(4 * (j // 8))) & _LOW4
    high = (rec[_SC_AT + 8 + j % 4] >> np.uint8(2 * (j // 4))) & _LOW2
    return np.int32(low | (high << np.uint8(4)))


@kernel
def q3_k_quant(rec, i):
    """Quant ``q[i]`` (0 <= i < 256) of a Q3_K record as int32 in [-4, 3]."""
    l = i % 32
    low = np.int32((rec[_QL_AT + 32 * (i // 128) + l] >> np.uint8(2 * ((i % 128) // 32))) & _LOW2)
    if (rec[_HM_AT + l] >> np.uint8(i // 32)) & np.uint8(1):
        return low
    return low - 4


@kernel
def q3_k_decode_into(rec, sc, q):
    """Unpack one record into stored scales ``sc`` (16, 0..63) and quants ``q`` (256, -4..3)."""
    for j in range(16):
        sc[j] = q3_k_scale(rec, j)
    for i in range(256):
        q[i] = q3_k_quant(rec, i)


@kernel
def q3_k_decode_records(records, sc, q):
    """``q3_k_decode_into`` for every record of a ``[G, 110]`` array."""
    for b in range(records.shape[0]):
        q3_k_decode_into(records[b], sc[b], q[b])


# ---- dequantize -----------------------------------------------------------------------------

@kernel
def dequantize_q3_k(records, out):
    """ggml's ``dequantize_row_q3_K``: ``[G, 110]`` records into f32 ``out`` ``[G, 256]``:
    ``R32(R32(d * (sc[j] - 32)) * q)`` per element, in ggml's element order."""
    # One loop of 32 lanes per (c, g), the two sub-blocks' scales selected per lane (vectorised).
    for b in range(records.shape[0]):
        d_all = f16_at(records, b, _D_AT)
        for c in range(2):
            for g in range(4):
                shift = np.uint8(2 * g)
                hbit = np.uint8(4 * c + g)  # hmask bit of elements 128c + 32g + l
                j = 8 * c + 2 * g
                dl0 = np.float32(d_all * np.float32(_scale_at(records, b, j) - _SC_OFF))
                dl1 = np.float32(d_all * np.float32(_scale_at(records, b, j + 1) - _SC_OFF))
                base = 128 * c + 32 * g
                for l in range(32):
                    low = np.int32((records[b, _QL_AT + 32 * c + l] >> shift) & _LOW2)
                    hi = np.int32((records[b, _HM_AT + l] >> hbit) & np.uint8(1))
                    dl = dl1 if l >= 16 else dl0
                    out[b, base + l] = np.float32(dl * np.float32(low - 4 + 4 * hi))


# ---- quantize (ggml quantize_row_q3_K_ref) --------------------------------------------------

@kernel
def make_q3_quants_rmse(x, off, n, nmax, L, loff):
    """ggml's ``make_q3_quants(n, nmax, x + off, L + loff, do_rmse=true)``: writes ``l + nmax``
    (or 0 for an all-zero group) into ``L[loff:loff+n]`` and returns the scale (f32)."""
    amax, mx = signed_absmax(x, off, n)
    if amax < _GROUP_MAX_EPS:  # all zero
        for i in range(n):
            L[loff + i] = 0
        return np.float32(0.0)
    iscale = np.float32(np.float32(-np.float32(nmax)) / mx)   # -nmax / max
    sumlx, suml2 = qx_sums(x, off, n, nmax, iscale, L, loff, 0, True)
    for itry in range(5):
        n_changed = 0
        for i in range(n):
            xi = np.float32(x[off + i])
            w = np.float32(xi * xi)
            li = np.float32(L[loff + i])
            slx = np.float32(sumlx - np.float32(np.float32(w * xi) * li))
            if slx > np.float32(0.0):
                sl2 = np.float32(suml2 - np.float32(np.float32(w * li) * li))
                new_l = nearest_int(np.float32(np.float32(xi * sl2) / slx))  # x[i]*sl2/slx
                new_l = max(-nmax, min(nmax - 1, new_l))
                if new_l != L[loff + i]:
                    fn = np.float32(new_l)
                    slx = np.float32(slx + np.float32(np.float32(w * xi) * fn))
                    sl2 = np.float32(sl2 + np.float32(np.float32(w * fn) * fn))
                    if sl2 > np.float32(0.0) and (
                            np.float32(np.float32(slx * slx) * suml2)
                            > np.float32(np.float32(sumlx * sumlx) * sl2)):
                        L[loff + i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[loff + i] += nmax
    return np.float32(sumlx / suml2) if suml2 > np.float32(0.0) else np.float32(0.0)


@kernel
def q3_k_scratch():
    """Scratch of ``quantize_block_q3_k``: ``L`` int32 [256], ``scales`` f32 [16] and the lanes'
    ``(xt, Lt, scr, dd)``."""
    return (np.zeros(256, np.int32), np.empty(16, np.float32),
            (np.zeros((16, 16), np.float32), np.zeros((16, 16), np.int32),
             np.zeros((Q3_SCR_ROWS, 16), np.float32), np.zeros((2, 16), np.float32)))


@kernel
def quantize_block_q3_k(values, b, out, work):
    """One finite block ``values[b]`` into record ``out[b]`` (``work = q3_k_scratch()``)."""
    L, scales, lanes = work
    x = values[b]
    xt, Lt, scr, dd = lanes
    transpose_in(x, xt, 16, 16)
    if ENCODE_LANES:  # the 16 sub-blocks' searches side by side (same bits)
        q3_lanes(xt, 16, 16, 4, Lt, scales, scr)
    else:
        for j in range(16):
            scales[j] = make_q3_quants_rmse(x, 16 * j, 16, 4, L, 16 * j)
        transpose_in(L, Lt, 16, 16)
    amax, max_scale = signed_absmax(scales, 0, 16)
    for k in range(12):
        out[b, _SC_AT + k] = 0
    if max_scale != np.float32(0.0):
        iscale = np.float32(np.float32(-32.0) / max_scale)
        for j in range(16):
            l = np.int32(np.int8(nearest_int(np.float32(iscale * scales[j])) & 0xFF))  # int8_t l
            l = max(-32, min(31, l)) + 32
            if j < 8:
                out[b, _SC_AT + j] = np.uint8(l & 0xF)
            else:
                out[b, _SC_AT + j - 8] |= np.uint8((l & 0xF) << 4)
            out[b, _SC_AT + 8 + j % 4] |= np.uint8((l >> 4) << (2 * (j // 4)))
        d_all = store_f16(out, b, _D_AT, np.float32(np.float32(1.0) / iscale))
    else:
        d_all = store_f16(out, b, _D_AT, np.float32(0.0))
    for j in range(16):  # the stored scales; ggml's `l = nearest_int(x/d)` for d != 0
        dd[1, j] = np.float32(d_all * np.float32(_scale_at(out, b, j) - _SC_OFF))
        dd[0, j] = np.float32(-0.0)  # x + -0.0 == x: plain x / d
    requant_lanes(xt, dd[0], dd[1], -4, 3, 4, Lt, 16, 16)
    transpose_out(Lt, L, 16, 16)
    q3_split_hmask(out, b, _HM_AT, L)
    pack_2bit(out, b, _QL_AT, L)


quantize_q3_k = quantizer_for(_FMT, block=quantize_block_q3_k, scratch=q3_k_scratch)


# ---- record dot against Q8_K ----------------------------------------------------------------

@kernel
def record_sums_q3_k_q8_k(w, bw, x, bx):
    """``S`` (int32) for records ``w[bw]`` (Q3_K ``[G, 110]``) and ``x[bx]`` (Q8_K)."""
    s_total = np.int32(0)
    for j in range(16):
        acc = np.int32(0)
        for k in range(16):
            i = 16 * j + k
            acc += _quant_at(w, bw, i) * x_q(x, bx, i)
        s_total += (_scale_at(w, bw, j) - _SC_OFF) * acc
    return np.int32(s_total)


@kernel
def record_value_q3_k_q8_k(w, bw, x, bx):
    """``v`` for records ``w[bw]`` (Q3_K) and ``x[bx]`` (Q8_K): the portable definition."""
    return record_value_d(w, bw, _D_AT, record_sums_q3_k_q8_k(w, bw, x, bx), x, bx)


dot_q3_k_q8_k_portable = portable_dot_for(_FMT, value=record_value_q3_k_q8_k)


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) over the SIMD
# record values and 8-lane tiles of kernels/simd/kquants.py; results equal
# dot_q3_k_q8_k_portable bit for bit (tests/kquants/test_kquants_fast.py), the fallback for
# strided records.

register(_FMT.ggml_type, value=q3_k_q8_k_value, rows_x8=q3_k_rows_x8, acts_x8=q3_k_acts_x8,
         loop_dot=dot_q3_k_q8_k_portable)
dot_q3_k_q8_k, gemv_q3_k_q8_k, gemm_q3_k_q8_k = kernels_for(_FMT.ggml_type)
if HAVE_GEMM_TILES:   # batches of 3 or more: records decoded once per call, 8 x 16 microtiles
    gemm_q3_k_q8_k = panel_gemm(q3_k_decode, microtile_sub16, gemm_q3_k_q8_k)


# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = Traits(
    format=_FMT,
    dequantize=dequantize_q3_k,
    decode=q3_k_decode_records,
    decoded=Decoded("Q3KFields", ("d", "sc", "q"),
                    (("sc", "u1"), ("q", "i1")),
                    "Decoded Q3_K fields of ``G`` records "
                    "(``x = d*(sc[j] - 32)*q``, ``j = i // 16``)."),
    quantize=quantize_q3_k,
    domain="finite",
    quantizer="ggml quantize_row_q3_K_ref",
    find_invalid=None,
    dot=dot_q3_k_q8_k,
    gemv=gemv_q3_k_q8_k,
    gemm=gemm_q3_k_q8_k,
    oracle="numba_qk.testing.reference.kquants",
)
