"""ggml's legacy 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.

Layouts (byte offsets within a record; f16 little-endian)::

    Q4_0 18 B: d[0,2)                    qs[2,18)   element j: qs[j] & 15, element j+16: qs[j] >> 4
    Q4_1 20 B: d[0,2)  m[2,4)            qs[4,20)
    Q5_0 22 B: d[0,2)          qh[2,6)   qs[6,22)   5th bit of element j: bit j of u32 qh
    Q5_1 24 B: d[0,2)  m[2,4)  qh[4,8)   qs[8,24)
    Q8_0 34 B: d[0,2)                    qs[2,34)   int8
    Q8_1 36 B: d[0,2)  s[2,4)            qs[4,36)   int8; s = d * sum(qs) (as stored)

Quantizers reproduce ggml's reference quantizers (``quantize_row_*_ref``) bit for bit, rounding
quirks included (per block ``v[0..31]``, all float steps in f32, ``fp16()`` = RNE conversion):

* Q4_0: ``max`` = the first value of largest magnitude; ``d = max / -8``; ``id = 1/d`` (0 if
  ``d == 0``); ``q = min(15, trunc(R32(v*id) + 8.5))``.  A zero block stores ``d = -0.0``.
* Q4_1: ``min``/``max`` of the block; ``d = (max - min) / 15``; ``q = min(15,
  trunc(R32(R32(v - min)*id) + 0.5))``; stores ``fp16(d)`` and ``fp16(min)``.
* Q5_0: as Q4_0 with ``d = max / -16``, ``q = min(31, trunc(R32(v*id) + 16.5))``.
* Q5_1: as Q4_1 with ``d = (max - min) / 31``, ``q = trunc(R32(R32(v - min)*id) + 0.5)``.
* Q8_0: ``d = amax / 127``; ``q = roundf(R32(v*id))`` (half away from zero).
* Q8_1: as Q8_0, plus ``s = fp16(R32(f32(sum(q)) * d))`` with the unrounded f32 ``d``.

The scale used for the quants is the f32 ``id``, not the stored f16 ``d`` (as in ggml).  When a
block's ``d`` is subnormal, ``id`` overflows to inf and the products become inf/NaN; ggml's casts
(x86 ``cvttss2si``) then give INT_MIN, whose low byte is 0 -- reproduced explicitly here.
Dequantizers are ggml's ``dequantize_row_*``: ``R32(f32(q - 8) * d)`` (Q4_0; ``q - 16`` for
Q5_0, ``q`` for Q8_0/Q8_1) and ``R32(R32(q * d) + m)`` (Q4_1, Q5_1).

Quantized dots (numba_qk's canonical numerics, in the spirit of spec 000), per block ``b``::

    S_b = sum_i w_b[i] * x_b[i]              exact int32; w = q-8 (Q4_0), q-16 (Q5_0), q (others)
    Q4_0/Q5_0/Q8_0 x Q8_0:  v_b = R32(dx_b * R32(dw_b * f32(S_b)))
    Q4_1/Q5_1 x Q8_1:       v_b = R32(R32(dx_b * R32(dw_b * f32(S_b))) + R32(mw_b * sx_b))
    result = ((v_0 + v_1) + v_2) + ...       left fold in block order, each + one f32 rounding

``sx`` is the Q8_1 record's stored ``s``, used as stored (like Q8_K's ``bsum``).  ``G = 0``
gives ``+0.0``.  |S_b| <= 32 * 128 * 128 = 524,288: exact in int32 and in f32.
"""

import functools

import numpy as np
from numba import literally
from numba.extending import overload

from numba_qk._jit import OVERLOAD_OPTIONS, inline_kernel, kernel
from numba_qk.formats import activation_format
from numba_qk.kernels._bits import f16_to_f32
from numba_qk.kernels._pool import band_arrays, band_product, next_band
from numba_qk.kernels._round import c_int8, roundf
from numba_qk.kernels.kquants.encode_lanes import f16_bits
from numba_qk.kernels.kquants.q8_k import order_key
from numba_qk.kernels.drive import dot as drive_dot, gemm as drive_gemm, gemv as drive_gemv, aligned_zeros, kernels_for, panel_start, quad_at, register, tile_loop_start, tile_loop_store
from numba_qk.kernels.simd.base import HAVE_AVX512, HAVE_VNNI, literal_int, prefetch_lines, prefetch_plan
from numba_qk.kernels.simd.legacy import U8_BIAS, legacy_accumulate_x8, legacy_block_value, legacy_rows_vnni, legacy_rows_vnni_inserts
from numba_qk.kernels.simd.legacy import LDEC_BYTES, LXT_BYTES, LXT_DX_AT, LXT_SX_AT, ROWS16_CODES, ROWS16_ROW_OF_LANE, X8_LAYOUT, legacy_microtile, legacy_panel_decode, legacy_rows16

from numba_qk.kernels.legacy.layout import CODES, FORMATS, Q4_0, Q5_0, Q5_1, Q8_0, Q8_1, WEIGHT_FORMATS, D_AT, M_AT, QH_AT, QS_AT, S_AT, X_D_AT, X_QS_AT, X_S_AT, ZERO

_MAGNITUDE = np.int32(0x7FFFFFFF)  # all bits but the sign
_EXP_ALL_ONES = np.int32(0x7F800000)  # f32 exponent of inf/NaN


@kernel
def f16(a, row, off):
    """Exact f32 of the f16 at bytes a[row, off:off+2]."""
    return f16_to_f32(np.uint16(np.uint16(a[row, off]) | (np.uint16(a[row, off + 1]) << np.uint16(8))))


@kernel
def _store_f16(out, row, off, x):
    h = f16_bits(np.float32(x))  # ggml's GGML_FP32_TO_FP16 (F16C where available)
    out[row, off] = np.uint8(h & np.uint16(0xFF))
    out[row, off + 1] = np.uint8(h >> np.uint16(8))


@kernel
def _u32(a, row, off):
    v = np.uint32(0)
    for k in range(4):
        v |= np.uint32(a[row, off + k]) << np.uint32(8 * k)
    return v


@kernel
def _all_finite(values, b):
    for j in range(values.shape[1]):
        x = np.float32(values[b, j])
        if (x - x) != np.float32(0.0):
            return False
    return True


@inline_kernel
def _signed_absmax(values, b):
    """ggml's loop: the first value of largest magnitude (``amax < |v|`` strictly), or +0.0.

    One branch-free pass (vectorizes without fast-math): the largest of the int64 keys
    ``magnitude bits << 6 | (63 - j)`` carries the largest magnitude and, among equal ones, the
    first index, which is what ggml's strict comparison keeps."""
    return first_absmax(values, b, 32, 6)


@inline_kernel
def first_absmax(values, b, n, bits):
    """The first of ``values[b, :n]`` of largest magnitude, or +0.0 where all are zeros
    (``n <= 2**bits``): the largest of the int64 keys ``magnitude bits << bits | (2**bits - 1 -
    j)``, one branch-free pass that vectorizes without fast-math."""
    top = np.int64((1 << bits) - 1)
    key = np.int64(0)
    for j in range(n):
        mag = np.int64(np.float32(values[b, j]).view(np.int32) & _MAGNITUDE)
        key = max(key, (mag << np.int64(bits)) | (top - j))
    if (key >> np.int64(bits)) == np.int64(0):
        return np.float32(0.0)
    return np.float32(values[b, top - (key & top)])


@kernel
def _first_zero(values, b):
    """The first zero of either sign in block b (the sign ggml's strict comparisons keep)."""
    for j in range(values.shape[1]):
        v = np.float32(values[b, j])
        if v == np.float32(0.0):
            return v
    return np.float32(0.0)


@inline_kernel
def _min_max(values, b):
    """ggml's ``if (v < min) min = v; if (v > max) max = v`` loop, on order-preserving integer
    keys (vectorizes); equal values have equal bits except +0/-0, where the first zero wins as
    in ggml."""
    kmin = np.int32(2147483647)
    kmax = np.int32(-2147483648)
    for j in range(values.shape[1]):
        key = order_key(np.float32(values[b, j]).view(np.int32))
        kmin = min(kmin, key)
        kmax = max(kmax, key)
    mn = np.int32(order_key(kmin)).view(np.float32)
    mx = np.int32(order_key(kmax)).view(np.float32)
    if mn == np.float32(0.0):
        mn = _first_zero(values, b)
    if mx == np.float32(0.0):
        mx = _first_zero(values, b)
    return mn, mx


@kernel
def _inverse(d):
    return np.float32(np.float32(1.0) / d) if d != np.float32(0.0) else np.float32(0.0)


@kernel
def _store_u32(out, row, off, v):
    """Little-endian u32 ``v`` at byte ``off`` of record ``row``."""
    for k in range(4):
        out[row, off + k] = np.uint8((v >> np.uint32(8 * k)) & np.uint32(0xFF))


@kernel
def _quantize_block(code, values, out):
    """Every block of ``values`` (f32 [G, 32]) into records ``out`` [G, bytes], as ggml's _ref
    does.  (The loop over blocks sits inside each format's branch: a call per block cost more
    than a Q4_1 block's arithmetic.  The per-element loops have fixed trip counts, selects
    instead of branches and no scratch array, so LLVM vectorizes them.)
    Quants are packed as ggml stores them: the low nibbles of elements j and j + 16 share
    byte j, the fifth bits go to bit j of the little-endian u32 ``qh`` (Q5_0/Q5_1)."""
    qs_at = QS_AT[code]
    qh_at = QH_AT[code]
    if code == Q8_0 or code == Q8_1:
        for b in range(values.shape[0]):
            m = np.int32(0)   # amax on the magnitude bits (finite input: the same order)
            for j in range(32):
                m = max(m, np.int32(np.float32(values[b, j]).view(np.int32) & _MAGNITUDE))
            amax = np.int32(m).view(np.float32)
            d = np.float32(amax / np.float32(127.0))
            inv = _inverse(d)
            _store_f16(out, b, D_AT[code], d)
            total = np.int32(0)
            for j in range(32):
                qj = c_int8(roundf(np.float32(np.float32(values[b, j]) * inv)))
                total += qj
                out[b, qs_at + j] = np.uint8(qj & 0xFF)
            if code == Q8_1:
                _store_f16(out, b, S_AT[code], np.float32(np.float32(total) * d))
        return
    if code == Q4_0 or code == Q5_0:
        five = code == Q5_0
        bias = np.float32(16.5 if five else 8.5)
        cap = 31 if five else 15
        for b in range(values.shape[0]):
            mx = _signed_absmax(values, b)
            d = np.float32(mx / np.float32(-16.0 if five else -8.0))
            inv = _inverse(d)
            _store_f16(out, b, D_AT[code], d)
            qh = np.uint32(0)
            for j in range(16):
                lo = min(cap, c_int8(np.float32(np.float32(np.float32(values[b, j]) * inv)
                                                + bias)))
                hi = min(cap, c_int8(np.float32(np.float32(np.float32(values[b, j + 16]) * inv)
                                                + bias)))
                out[b, qs_at + j] = np.uint8((lo & 15) | ((hi & 15) << 4))
                qh |= (np.uint32((lo >> 4) & 1) << np.uint32(j)) | \
                    (np.uint32((hi >> 4) & 1) << np.uint32(j + 16))
            if five:
                _store_u32(out, b, qh_at, qh)
        return
    # Q4_1, Q5_1
    five = code == Q5_1
    for b in range(values.shape[0]):
        mn, mx = _min_max(values, b)
        d = np.float32(np.float32(mx - mn) / np.float32(31.0 if five else 15.0))
        inv = _inverse(d)
        _store_f16(out, b, D_AT[code], d)
        _store_f16(out, b, M_AT[code], mn)
        qh = np.uint32(0)
        for j in range(16):
            tl = np.float32(np.float32(np.float32(np.float32(values[b, j]) - mn) * inv)
                            + np.float32(0.5))
            th = np.float32(np.float32(np.float32(np.float32(values[b, j + 16]) - mn) * inv)
                            + np.float32(0.5))
            # (uint8_t) for Q5_1, MIN(15, (int8_t)) for Q4_1
            lo = c_int8(tl) & 0xFF if five else min(15, c_int8(tl))
            hi = c_int8(th) & 0xFF if five else min(15, c_int8(th))
            out[b, qs_at + j] = np.uint8((lo & 15) | ((hi & 15) << 4))
            qh |= (np.uint32((lo >> 4) & 1) << np.uint32(j)) | \
                (np.uint32((hi >> 4) & 1) << np.uint32(j + 16))
        if five:
            _store_u32(out, b, qh_at, qh)


@kernel
def _quantize_blocks(code, values, out):
    literally(code)  # one specialization per format: the format branches fold away
    _quantize_block(code, values, out)


@kernel
def first_nonfinite_block(values):
    """-1, or the first block of ``values`` [G, n] holding a non-finite value."""
    nonfinite = np.int32(0)  # one branch-free pass over the exponent bits (vectorizes) ...
    for b in range(values.shape[0]):
        for j in range(values.shape[1]):
            e = np.int32(np.float32(values[b, j]).view(np.int32) & _EXP_ALL_ONES)
            nonfinite |= np.int32(e == _EXP_ALL_ONES)
    if nonfinite:  # ... and only then look for the first bad block
        for b in range(values.shape[0]):
            if not _all_finite(values, b):
                return b
    return -1


@kernel
def weight_quant(code, a, row, j):
    """The integer a dot multiplies for element j of a weight record: q-8 (Q4_0), q (Q4_1),
    q-16 (Q5_0), q (Q5_1), q (Q8_0/Q8_1, int8)."""
    if code == Q8_0 or code == Q8_1:
        return np.int32(np.int8(a[row, QS_AT[code] + j]))
    byte = np.int32(a[row, QS_AT[code] + (j % 16)])
    q = (byte & 15) if j < 16 else (byte >> 4)
    if QH_AT[code] >= 0:
        qh = _u32(a, row, QH_AT[code])
        q |= np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
    return np.int32(q - ZERO[code])


@kernel
def _decode(code, records, q):
    """Integer quants of every record into ``q`` ``[G, 32]``: the stored value (0..15, 0..31 or
    int8), without the -8/-16 offsets of Q4_0/Q5_0."""
    for b in range(records.shape[0]):
        for j in range(32):
            q[b, j] = weight_quant(code, records, b, j) + ZERO[code]


@kernel
def _dequantize(code, records, out):
    """ggml's dequantize_row_*: R32(f32(q') * d) or R32(R32(q * d) + m)."""
    for b in range(records.shape[0]):
        d = f16(records, b, D_AT[code])
        has_min = M_AT[code] >= 0
        m = f16(records, b, M_AT[code]) if has_min else np.float32(0.0)
        for j in range(32):
            y = np.float32(np.float32(weight_quant(code, records, b, j)) * d)
            out[b, j] = np.float32(y + m) if has_min else y


@kernel
def block_sum(wcode, w, bw, x, bx):
    """S_b: exact int32 sum of weight quants times Q8_0/Q8_1 activation quants."""
    x_at = X_QS_AT[wcode]
    s = np.int32(0)
    for j in range(32):
        s += weight_quant(wcode, w, bw, j) * np.int32(np.int8(x[bx, x_at + j]))
    return s


@kernel
def block_value(wcode, w, bw, x, bx):
    """v_b of the canonical legacy dot (see the module docstring)."""
    s_b = block_sum(wcode, w, bw, x, bx)
    dw = f16(w, bw, D_AT[wcode])
    dx = f16(x, bx, X_D_AT[wcode])
    v = np.float32(dx * np.float32(dw * np.float32(s_b)))
    if M_AT[wcode] >= 0:  # the min formats (paired with Q8_1): + R32(mw * sx)
        v = np.float32(v + np.float32(f16(w, bw, M_AT[wcode]) * f16(x, bx, X_S_AT[wcode])))
    return v


@kernel
def _dot_loop(wcode, w, x):
    acc = block_value(wcode, w, 0, x, 0)
    for b in range(1, w.shape[0]):
        acc = np.float32(acc + block_value(wcode, w, b, x, b))
    return acc


@kernel
def gemv_loop(wcode, w, x, out):
    for r in range(w.shape[0]):
        out[r] = _dot_loop(wcode, w[r], x)


# ---- fast path (AVX2): explicit SIMD for the exact block sums, float steps lane by lane in
# spec order (_simd.py); records addressed by byte offsets.  ``wcode`` is made a compile-time
# literal (one specialization per format).

@kernel
def simd_dot_at(wcode, w, w_base, w_step, x, x_step, g):
    literally(wcode)
    acc = legacy_block_value(wcode, w, w_base, x, 0)
    for b in range(1, g):
        acc = np.float32(acc + legacy_block_value(wcode, w, w_base + b * w_step, x, b * x_step))
    return acc


# gemv (8-row pmaddwd tiles with prefetch), gemm (8-activation tiles over blocks of
# _RECORD_BLOCK records) and the dot's fold run in the shared driver (kernels/drive.py), over the
# per-format pieces of ``_drive_pieces``; the VNNI gemv and gemm below are loops of their own
# (gemv: a trip of records per intrinsic call and a tail of records per tile; gemm: the
# activations in tiles of 16 lanes, a weight record against one or two tiles per call).
_RECORD_BLOCK = 32  # blocks per pass in gemm: 8 activations x 32 x <= 36 B stay in L1


def _drive_pieces(code):
    """Register legacy weight format ``code``'s pieces with the driver under its GGML type
    id; returns that id.  The pieces are closures over the int code (a literal inside)."""

    @inline_kernel
    def value(w, w_off, x, x_off):
        return legacy_block_value(code, w, w_off, x, x_off)

    @inline_kernel
    def rows_x8(w, w_off, x, x_off, step, acc, at, first):
        legacy_accumulate_x8(code, True, w, w_off, x, x_off, step, acc, at, first)

    @inline_kernel
    def acts_x8(w, w_off, x, x_off, step, acc, at, first):
        legacy_accumulate_x8(code, False, w, w_off, x, x_off, step, acc, at, first)

    @kernel
    def loop_dot(w, x):
        return _dot_loop(code, w, x)

    dcode = FORMATS[code].ggml_type
    register(dcode, loop_dot=loop_dot, value=value, rows_x8=rows_x8, acts_x8=acts_x8,
             record_block=_RECORD_BLOCK)
    return dcode


# legacy code -> (dot, gemv, gemm) of the driver alone (the pmaddwd tiles, no VNNI loop: tests, bench)
_DRIVE_CODES = tuple(_drive_pieces(c) if FORMATS[c] in WEIGHT_FORMATS else -1
                     for c in range(len(FORMATS)))
DRIVEN = {c: kernels_for(d) for c, d in enumerate(_DRIVE_CODES) if d >= 0}


# AVX-512 VNNI gemv: 8 rows x _VNNI_TRIP records per intrinsic call (see _simd_legacy.py);
# leftover records of a tile go one at a time through the pmaddwd tile, leftover rows through
# the single-row fold.  Same folds, same bits.
_VNNI_TRIP = 4
HAVE_LEGACY_VNNI = HAVE_VNNI and HAVE_AVX512
# the scale gather addresses a tile's records by i32 offsets from its first row: 8 row strides
# and a trip of records must stay far below 2**31
GATHER_STEP_MAX = 1 << 27
_W_BYTES = tuple(f.block_bytes for f in FORMATS)   # record strides of contiguous records
_X_BYTES = tuple(activation_format(f).block_bytes if f in WEIGHT_FORMATS else 0
                 for f in FORMATS)


@kernel
def _vnni_gemv_trip(wcode, w, x, out, trip, gather):
    literally(wcode)
    literally(trip)
    literally(gather)
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    acc, ahead, per = tile_loop_start(w)
    r = 0
    while rows - r >= 8:
        nxt = r * ws0 + ahead
        b = 0
        while g - b >= trip:
            # shares b .. b+trip-1 of a tile ~64 KiB ahead (as in kernels/drive.py)
            prefetch_lines(w, nxt + b * per * 64, per * trip, rows * ws0)
            if gather:
                legacy_rows_vnni(wcode, trip, w, r * ws0 + b * ws1, _W_BYTES[wcode], x,
                                 b * xs0, _X_BYTES[wcode], ws0, acc, b == 0)
            else:
                legacy_rows_vnni_inserts(wcode, trip, w, r * ws0 + b * ws1, _W_BYTES[wcode], x,
                                         b * xs0, _X_BYTES[wcode], ws0, acc, b == 0)
            b += trip
        while b < g:
            prefetch_lines(w, nxt + b * per * 64, per, rows * ws0)
            legacy_accumulate_x8(wcode, True, w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0,
                                 b == 0)
            b += 1
        r = tile_loop_store(out, r, acc)
    for rr in range(r, rows):
        out[rr] = simd_dot_at(wcode, w, rr * ws0, ws1, x, xs0, g)


@kernel
def _vnni_gemv(wcode, dcode, w, x, out):
    """The VNNI gemv for contiguous records (the record strides are compile-time constants in
    the intrinsic); other layouts take the driver's pmaddwd tile loop (driver code ``dcode``)."""
    literally(wcode)
    literally(dcode)
    if (w.shape[1] != 0 and w.strides[2] == 1 and x.strides[1] == 1
            and w.strides[1] == _W_BYTES[wcode] and x.strides[0] == _X_BYTES[wcode]
            and abs(w.strides[0]) < GATHER_STEP_MAX):
        _vnni_gemv_trip(wcode, w, x, out, _VNNI_TRIP, True)
    else:
        drive_gemv(dcode, w, x, out)


# AVX-512 VNNI gemm (simd/legacy.py; docs/decisions/040): up to ROWS16_MAX_BATCH activations of
# Q4_0/Q4_1/Q8_0, 16 weight rows in the lanes with the records read in place (rows16_gemm);
# otherwise from PANEL_MIN_BATCH activations the panel gemm (_panel_gemm: records decoded once
# per call, 8 rows x 16 activations per microtile), and batch 2 of the others the gemv per
# activation (the decode is not paid back there).  Same folds, same bits as the portable dot.
_LANES = 16
PANEL_MIN_BATCH = 3
ROWS16_MAX_BATCH = 16  # two groups of 8: at 16 the panel is about as fast, beyond it faster
# by code, IQ4_NL's small-batch code (X8_IQ4_NL) included
_U8_BIAS_T = tuple(U8_BIAS.get(c, 0) for c in range(len(X8_LAYOUT)))
_RX_QS_AT, _RX_D_AT, _RX_S_AT = (tuple(t[X8_LAYOUT[c]] for c in range(len(X8_LAYOUT)))
                                 for t in (X_QS_AT, X_D_AT, X_S_AT))


@kernel
def _vnni_gemm(wcode, dcode, w, x, out):
    """The VNNI gemm (where the target has AVX-512 VNNI) for records with contiguous bytes and a
    batch of two or more; otherwise the driver's gemm (driver code ``dcode``)."""
    literally(wcode)
    literally(dcode)
    if HAVE_LEGACY_VNNI:   # a constant: the branch is pruned before typing elsewhere
        if (w.shape[1] != 0 and x.shape[0] >= 2 and w.strides[2] == 1
                and x.strides[2] == 1):
            if (x.shape[0] <= ROWS16_MAX_BATCH and abs(w.strides[0]) < GATHER_STEP_MAX
                    and _small_batch_gemm(wcode, dcode, w, x, out)):
                return
            if x.shape[0] >= PANEL_MIN_BATCH:
                _panel_gemm(wcode, w, x, out)
            else:                       # batch 2 of Q5_0/Q5_1: the VNNI gemv per activation
                for a in range(x.shape[0]):
                    _vnni_gemv(wcode, dcode, w, x[a], out[a])
            return
    drive_gemm(dcode, w, x, out)


@kernel
def x_tiles16(wcode, x, xt, base):
    """Activation records ``x`` ``[batch, G, bytes]`` (paired with legacy weight format
    ``wcode``) into tiles of 16 at byte ``base`` (a multiple of 4) of the zeroed uint8 ``xt``,
    ``LXT_BYTES`` per tile and record (simd/legacy.py): the quants plus 128 as u8, dx, sx."""
    batch, g = x.shape[0], x.shape[1]
    xf = xt.view(np.float32)
    xw = xt.view(np.uint32)   # a quad of quants is one dword of the tile (4-byte aligned)
    x_at, d_at, s_at = _RX_QS_AT[wcode], _RX_D_AT[wcode], _RX_S_AT[wcode]
    for a in range(batch):
        tile, lane = a // _LANES, a % _LANES
        xa = x[a]
        for b in range(g):
            at = base + (tile * g + b) * LXT_BYTES
            for k in range(8):
                xw[(at + 64 * k) // 4 + lane] = (quad_at(x, a, b, x_at + 4 * k)
                                                 ^ np.uint32(0x80808080))
            xf[(at + LXT_DX_AT) // 4 + lane] = f16(xa, b, d_at)
            if s_at >= 0:
                xf[(at + LXT_SX_AT) // 4 + lane] = f16(xa, b, s_at)


def panel_gemm_over(decode):
    """The gemm by decoded records over the record decoder ``decode(wcode, w, w_off, dec,
    d_off)`` (an intrinsic writing simd/legacy.py's LDEC layout): the weight records decoded
    once per call a panel of bands of 8 rows at a time, the activations (paired with weight
    format ``wcode``) laid out once in tiles of 16, then per (tile, band) one microtile folds
    every record of the band's rows in order.  ``legacy_panel_decode`` for the legacy formats;
    IQ4_NL (kernels/iq/iq4.py) decodes its own records into the same layout and runs as Q4_0
    (same activations, same float steps)."""
    @kernel
    def panel_gemm(wcode, w, x, out):
        literally(wcode)
        batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
        if rows == 0:                                    # an empty result (and no panel)
            return
        tiles = (batch + _LANES - 1) // _LANES
        xt, xb = aligned_zeros(tiles * g * LXT_BYTES)
        x_tiles16(wcode, x, xt, xb)
        band_bytes = 8 * g * LDEC_BYTES
        bands, panel, dec, db, ahead, lines = panel_start(w, band_bytes)
        acc = np.empty(8 * _LANES, np.float32)
        ws0, ws1 = w.strides[0], w.strides[1]
        for p0 in range(0, bands, panel):
            p1 = min(bands, p0 + panel)
            for r in range(8 * p0, min(rows, 8 * p1)):
                prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                at = db + ((r - 8 * p0) // 8) * band_bytes + (r % 8) * LDEC_BYTES
                for b in range(g):
                    decode(wcode, w, r * ws0 + b * ws1, dec, at + 8 * b * LDEC_BYTES)
            for tile in range(tiles):
                na = min(_LANES, batch - _LANES * tile)
                for band in range(p0, p1):
                    legacy_microtile(wcode, dec, db + (band - p0) * band_bytes, xt,
                                     xb + tile * g * LXT_BYTES, g, acc)
                    for t in range(min(8, rows - 8 * band)):
                        for k in range(na):
                            out[_LANES * tile + k, 8 * band + t] = acc[_LANES * t + k]
    return panel_gemm


_panel_gemm = panel_gemm_over(legacy_panel_decode)


@functools.lru_cache(maxsize=None)
def legacy_band_job(wcode):
    """The helpers' job (``_pool``'s signature) of legacy weight format ``wcode``'s panel gemm by
    claimed bands (``_pool.band_caller_of``, decision 052): ``x_at`` addresses the product's
    description (``_pool.BAND_ARGS``), ``d0`` is the number of regions, ``r0`` the region the
    call starts with; each band is ``panel_gemm_over``'s step."""
    decode = legacy_panel_decode

    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        table, wb, x, outs, regions = band_product(x_at, d0)
        T, G = x.shape[0], x.shape[1]
        tiles = (T + _LANES - 1) // _LANES
        xt, xb = aligned_zeros(tiles * G * LXT_BYTES)
        x_tiles16(wcode, x, xt, xb)
        dec, db = aligned_zeros(8 * G * LDEC_BYTES)
        acc = np.empty(8 * _LANES, np.float32)
        ws0 = G * wb
        ahead, lines = prefetch_plan(ws0, 1)
        tried = np.zeros(1, np.int64)
        while True:
            i, rows_before, lb = next_band(table, regions, r0, tried)
            if i < 0:
                break
            w, out = band_arrays(table, outs, x, wb, i, rows_before)
            rows = w.shape[0]
            r1b = min(rows, 8 * lb + 8)
            for r in range(8 * lb, r1b):
                prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                at = db + (r % 8) * LDEC_BYTES
                for rec in range(G):
                    decode(wcode, w, r * ws0 + rec * wb, dec, at + 8 * rec * LDEC_BYTES)
            for tile in range(tiles):
                na = min(_LANES, T - _LANES * tile)
                legacy_microtile(wcode, dec, db, xt, xb + tile * G * LXT_BYTES, G, acc)
                for row in range(r1b - 8 * lb):
                    for lane in range(na):
                        out[_LANES * tile + lane, 8 * lb + row] = acc[_LANES * row + lane]
    return kernel(job)


def _small_batch_gemm(wcode, dcode, w, x, out):
    """True once ``rows16_gemm`` computed ``out`` (formats of ``ROWS16_CODES``), else False
    (nothing done): resolved per literal code at compile time."""


@overload(_small_batch_gemm, **OVERLOAD_OPTIONS)
def _small_batch_gemm_overload(wcode, dcode, w, x, out):
    c = literal_int(wcode)
    if c is None:
        return None
    if c in ROWS16_CODES:
        def rows16(wcode, dcode, w, x, out):
            rows16_gemm(wcode, dcode, w, x, out)
            return True
        return rows16

    def other(wcode, dcode, w, x, out):
        return False
    return other


@kernel
def x_corrections(wcode, x):
    """float32 ``[batch, G, 4]`` of activation records ``x`` (paired with legacy weight format
    ``wcode``): per record the i32 z * sum(x) (its bits; z the u8 bias of the weight format's
    quants), f32 dx and f32 sx (Q8_1), as ``legacy_rows16`` reads them."""
    batch, g = x.shape[0], x.shape[1]
    xc = np.zeros((batch, g, 4), np.float32)
    xi = xc.view(np.int32)
    x_at, d_at, s_at = _RX_QS_AT[wcode], _RX_D_AT[wcode], _RX_S_AT[wcode]
    z = np.int32(_U8_BIAS_T[wcode])
    for a in range(batch):
        xa = x[a]
        for b in range(g):
            t = np.int32(0)
            for j in range(32):
                t += np.int32(np.int8(xa[b, x_at + j]))
            xi[a, b, 0] = z * t
            xc[a, b, 1] = f16(xa, b, d_at)
            if s_at >= 0:
                xc[a, b, 2] = f16(xa, b, s_at)
    return xc


@kernel
def _rows16_group(wcode, na, w, r0, x, a0, xc, acc, out, pf_off, pf_lines):
    literally(wcode)
    literally(na)
    g = w.shape[1]
    legacy_rows16(wcode, na, w, r0 * w.strides[0], w.strides[0], w.strides[1], x,
                  a0 * x.strides[0], x.strides[0], x.strides[1], xc, a0 * 4 * g, 4 * g, g, acc,
                  pf_off, pf_lines)
    for a in range(na):
        for lane in range(16):
            out[a0 + a, r0 + ROWS16_ROW_OF_LANE[lane]] = acc[16 * a + lane]


@kernel
def rows16_gemm(wcode, dcode, w, x, out):
    """The small-batch gemm (simd/legacy.py ``legacy_rows16``): per band of 16 weight rows,
    groups of up to 8 activations, the records read in place; rows past the last band by the
    driver's gemm."""
    literally(wcode)
    literally(dcode)
    batch, rows = x.shape[0], w.shape[0]
    xc = x_corrections(wcode, x)
    acc = np.empty(8 * _LANES, np.float32)
    ws0, g = w.strides[0], w.shape[1]
    # the band ~64 KiB ahead, an equal share of its lines per record step of the band's first
    # group (as the driver's gemv tiles: one linear stream; 16 row streams defeat the hardware
    # prefetcher)
    ahead, per = prefetch_plan(16 * ws0, g)
    prefetch_lines(w, 0, ahead // 64, rows * ws0)
    body = rows - rows % 16
    for r0 in range(0, body, 16):
        pf = r0 * ws0 + ahead
        per_band = per if pf < rows * ws0 else 0
        a0 = 0
        while batch - a0 >= 8:
            _rows16_group(wcode, 8, w, r0, x, a0, xc, acc, out, pf, per_band if a0 == 0 else 0)
            a0 += 8
        if batch - a0 >= 4:
            _rows16_group(wcode, 4, w, r0, x, a0, xc, acc, out, pf, per_band if a0 == 0 else 0)
            a0 += 4
        if batch - a0 >= 2:
            _rows16_group(wcode, 2, w, r0, x, a0, xc, acc, out, pf, per_band if a0 == 0 else 0)
            a0 += 2
        if batch - a0 >= 1:
            _rows16_group(wcode, 1, w, r0, x, a0, xc, acc, out, pf, per_band if a0 == 0 else 0)
    if body < rows:
        drive_gemm(dcode, w[body:], x, out[:, body:])


# ---- per-format entry points.  ``bind(fmt)`` builds them as closures over the format's int
# code: inside, the code is a compile-time constant (a literal), so each entry point is one
# specialization with the format branches folded away, and a call from Python never goes
# through numba's literal-dispatch slow path.  Closures over an int stay in numba's on-disk
# cache (the cache key includes the pickled closure values).

class Entry:
    """The ``@njit`` entry points of one legacy format (weights also get dot/gemv/gemm)."""

    __slots__ = ("format", "code", "quantize", "dequantize", "decode", "dot", "gemv", "gemm")


def bind(fmt) -> Entry:
    code = CODES[fmt]
    dcode = _DRIVE_CODES[code]

    @kernel
    def quantize(values, out):
        """Quantize f32 ``[G, 32]`` into records ``out`` ``[G, bytes]``: -1, or the first
        block holding a non-finite value (nothing written then)."""
        bad = first_nonfinite_block(values)
        if bad < 0:
            _quantize_blocks(code, values, out)
        return bad

    @kernel
    def dequantize(records, out):
        _dequantize(code, records, out)

    @kernel
    def decode(records, q):
        _decode(code, records, q)

    @kernel
    def dot(w, x):
        """Left fold of v_b over the G blocks of weight records ``w`` and activation records
        ``x``."""
        return drive_dot(dcode, w, x)

    @kernel
    def gemv(w, x, out):
        """``out[r] = dot(w[r], x)`` for weights ``[rows, G, bytes]``."""
        if HAVE_LEGACY_VNNI:
            _vnni_gemv(code, dcode, w, x, out)
        else:
            drive_gemv(dcode, w, x, out)

    @kernel
    def gemm(w, x, out):
        """``out[a, r] = dot(w[r], x[a])`` for activations ``[batch, G, bytes]``."""
        _vnni_gemm(code, dcode, w, x, out)

    entry = Entry()
    if fmt in WEIGHT_FORMATS and HAVE_LEGACY_VNNI:   # the same gemm by claimed bands
        gemm.band_job = legacy_band_job(code)
    entry.format, entry.code = fmt, code
    entry.quantize, entry.dequantize, entry.decode = quantize, dequantize, decode
    weight = fmt in WEIGHT_FORMATS
    entry.dot = dot if weight else None
    entry.gemv = gemv if weight else None
    entry.gemm = gemm if weight else None
    return entry


ENTRIES = {fmt: bind(fmt) for fmt in FORMATS}


# ---- the registry's declaration of this module's formats (numba_qk/kernels/traits.py) ---------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = tuple(
    Traits(
        format=fmt,
        dequantize=ENTRIES[fmt].dequantize,
        decode=ENTRIES[fmt].decode,
        decoded=Decoded("BlockFields", ("d", "q", "m", "s"),
                        (("q", "i1" if fmt.field("qs").signed else "u1"),),
                        "Decoded fields of ``G`` records of a legacy 32-element format."),
        quantize=ENTRIES[fmt].quantize,
        domain="finite",
        quantizer=f"ggml quantize_row_{fmt.name.lower()}_ref",
        find_invalid=None,
        dot=ENTRIES[fmt].dot,       # None for Q8_1 (activations only)
        gemv=ENTRIES[fmt].gemv,
        gemm=ENTRIES[fmt].gemm,
        oracle="numba_qk.testing.reference.core",
    )
    for fmt in FORMATS)
