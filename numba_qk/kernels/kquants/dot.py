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

from numba_qk._jit import kernel
from numba_qk.formats import quant
from numba_qk.kernels.kquants.common import X_BSUM_AT, X_DS_AT, X_Q_AT, f16_at, f32_at, x_bsum
from numba_qk.kernels.drive import kernels_for, no_records, register, tile_loop_start, tile_loop_store
from numba_qk.kernels.simd.base import HAVE_AVX2, HAVE_AVX512, HAVE_VNNI, load_f16_fpext, load_f32_raw, prefetch_lines
from numba_qk.kernels.simd.q4_k import R16_BYTES, R16_ROWS, accumulate_acts_x8, accumulate_rows16_vnni, accumulate_rows16_vnni_b2, accumulate_rows_x8, accumulate_rows_x8_vnni, array_address, q4_k_decode_rows16, q4_k_q8_k_sums
from numba_qk.kernels.simd.amx_q4_k import ACT_BHI_AT, ACT_BLO_AT, ACT_DS_AT, AMX_ACT_BYTES, AMX_ACTS, AMX_CONFIG, AMX_DEC_BYTES, AMX_ROWS, HAVE_AMX, accumulate_amx, amx_begin, amx_end, q4_k_decode_amx
from numba_qk.kernels.kquants.q4_k import q4_k_scale_min

_LOW4 = np.uint8(0b0000_1111)
_W_D_AT = quant.q4_k.field("d").start         # byte offsets, from the schemas
_W_DMIN_AT = quant.q4_k.field("dmin").start
_W_QS_AT = quant.q4_k.field("q").start        # Q4_K: 4-bit quants

# Record-level building blocks take 2-D record arrays and record indices -- w[bw] is the Q4_K
# record, x[bx] the Q8_K record -- and never build sub-array views in the hot loop (a view costs
# two reference-count updates in numba).


@kernel
def record_sums_loop(w, bw, x, bx):
    """``(S_b, T_b)`` as int32 for records ``w[bw]`` (Q4_K) and ``x[bx]`` (Q8_K).

    The readable, portable definition (any strides); the SIMD path must equal it.
    """
    s_total = np.int32(0)
    t_total = np.int32(0)
    for j in range(4):  # 32-byte chunk j holds sub-blocks 2j (low nibbles) and 2j+1 (high)
        lo = np.int32(0)
        hi = np.int32(0)
        wb = _W_QS_AT + 32 * j
        xb = X_Q_AT + 64 * j
        for k in range(32):
            byte = w[bw, wb + k]
            lo += np.int32(byte & _LOW4) * np.int32(np.int8(x[bx, xb + k]))
            hi += np.int32(byte >> np.uint8(4)) * np.int32(np.int8(x[bx, xb + 32 + k]))
        sc_lo, m_lo = q4_k_scale_min(w[bw], 2 * j)
        sc_hi, m_hi = q4_k_scale_min(w[bw], 2 * j + 1)
        s_total += sc_lo * lo + sc_hi * hi
        # bsum[4j .. 4j+3] cover sub-blocks 2j and 2j+1
        t_total += m_lo * (x_bsum(x, bx, 4 * j) + x_bsum(x, bx, 4 * j + 1))
        t_total += m_hi * (x_bsum(x, bx, 4 * j + 2) + x_bsum(x, bx, 4 * j + 3))
    return np.int32(s_total), np.int32(t_total)


@kernel
def record_value_from_terms(s_b, t_b, d, dmin, ds):
    """The float steps of one record, in spec order: four separate f32 roundings."""
    p = np.float32(d * np.float32(s_b))       # p_b = R32(f32(d) * f32(S_b))
    n = np.float32(dmin * np.float32(t_b))    # n_b = R32(f32(dmin) * f32(T_b))
    diff = np.float32(p - n)                  # R32(p_b - n_b)
    return np.float32(ds * diff)              # v_b = R32(ds * (p_b - n_b))


@kernel
def record_value_loop(w, bw, x, bx):
    """``v_b`` for records ``w[bw]`` (Q4_K) and ``x[bx]`` (Q8_K): the portable definition."""
    s_b, t_b = record_sums_loop(w, bw, x, bx)
    return record_value_from_terms(s_b, t_b, f16_at(w, bw, _W_D_AT), f16_at(w, bw, _W_DMIN_AT),
                                   f32_at(x, bx, X_DS_AT))


@kernel
def dot_loop(w, x):
    acc = record_value_loop(w, 0, x, 0)
    for b in range(1, w.shape[0]):
        acc = np.float32(acc + record_value_loop(w, b, x, b))
    return acc


@kernel
def _gemv_loop(w, x, out):
    for r in range(w.shape[0]):
        out[r] = dot_loop(w[r], x)


# ---- fast path (AVX2 + F16C): records addressed by byte offsets into the arrays' data, no
# sub-array views (a view costs two atomic reference-count updates), explicit SIMD for the
# exact integer work (_simd.py), single unaligned loads for d, dmin and ds.

@kernel
def _simd_record_value(w, wo, x, xo):
    s_b, t_b = q4_k_q8_k_sums(w, wo, x, xo)
    return record_value_from_terms(s_b, t_b, load_f16_fpext(w, wo + _W_D_AT),
                                   load_f16_fpext(w, wo + _W_DMIN_AT), load_f32_raw(x, xo + X_DS_AT))


@kernel
def _gemm_loop(w, x, out):
    for a in range(x.shape[0]):
        for r in range(w.shape[0]):
            out[a, r] = dot_loop(w[r], x[a])


# The AVX2 tiles (pmaddubsw) and the AVX-512 VNNI gemv tile (``accumulate_rows_x8_vnni``: the
# stored nibbles go straight into vpdpbusd against the activation put in their order) run in the
# shared driver (kernels/drive.py: 8-row gemv tiles with prefetch, leftover rows folded one
# record at a time, 8-activation gemm tiles over blocks of 8 records).  The VNNI gemv keeps its
# own copy of that loop (see _vnni_gemv); the row-lane and AMX gemm kernels below are loops
# of their own (weights decoded once per call into 16-row groups, activation tiles of 8/4/2/1 or
# repacked 16-activation blocks), not the driver's tile shapes.
_Q4_K = quant.q4_k.ggml_type
register(_Q4_K, loop_dot=dot_loop, value=_simd_record_value, rows_x8=accumulate_rows_x8,
         acts_x8=accumulate_acts_x8)
_simd_dot, _simd_gemv, _simd_gemm = kernels_for(_Q4_K)


@kernel
def _vnni_gemv(w, x, out):
    """The driver's gemv (kernels/drive.py) with the AVX-512 VNNI tile
    (``accumulate_rows_x8_vnni``: the stored nibbles go straight into vpdpbusd against the
    activation put in their order), as its own loop: through the driver this tile loop measured
    3-5% slower (0.95-1.02 across processes, not found why).  Same tiles, prefetch, leftover
    rows and bits."""
    if w.strides[2] != 1 or x.strides[1] != 1:
        _gemv_loop(w, x, out)
        return
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    acc, ahead, per = tile_loop_start(w)
    r = 0
    while rows - r >= 8:
        for b in range(g):   # prefetch as in _simd_gemv
            prefetch_lines(w, r * ws0 + ahead + b * per * 64, per, rows * ws0)
            accumulate_rows_x8_vnni(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
        r = tile_loop_store(out, r, acc)
    for rr in range(r, rows):
        out[rr] = _simd_dot(w[rr], x)


# ---- GEMM with AVX-512 VNNI: the row-lane kernel (16 rows x 8 activations per tile step) ----

@kernel
def _bsum2(x, a, b, j):
    lo = np.int32(x[a, b, X_BSUM_AT + 2 * j])
    hi = np.int32(x[a, b, X_BSUM_AT + 2 * j + 1])
    return np.int32(np.int16(np.uint16(lo | (hi << np.int32(8)))))


@kernel
def _pair_bsums(x, b2):
    """bsum[2s] + bsum[2s+1] (s = 0..7) of every activation record, as int16 at byte
    ``(b*batch + a)*16 + 2s`` of ``b2``; returns whether all of them fit an int16 (they do for
    any Q8_K record a quantizer writes: |bsum| <= 16 * 128)."""
    batch, g = x.shape[0], x.shape[1]
    fits = True
    for a in range(batch):
        for b in range(g):
            at = (b * batch + a) * 16
            for s in range(8):
                v = _bsum2(x, a, b, 2 * s) + _bsum2(x, a, b, 2 * s + 1)
                if v < -32768 or v > 32767:
                    fits = False
                u = np.uint16(np.int16(v))   # only used where every sum fits
                b2[at + 2 * s] = np.uint8(u & np.uint16(0xFF))
                b2[at + 2 * s + 1] = np.uint8(u >> np.uint16(8))
    return fits


@kernel
def _rows16_decode(w, gi, b, dec, at, pad):
    """Decode record ``b`` of the 16-row group ``gi`` of ``w`` into ``dec`` at byte ``at`` (a
    partial last group through ``pad``: its missing rows stay zero records)."""
    nr = min(R16_ROWS, w.shape[0] - R16_ROWS * gi)
    if nr == R16_ROWS:
        q4_k_decode_rows16(w, R16_ROWS * gi * w.strides[0] + b * w.strides[1], w.strides[0],
                           dec, at)
    else:
        for r in range(nr):
            for e in range(144):
                pad[r, e] = w[R16_ROWS * gi + r, b, e]
        q4_k_decode_rows16(pad, 0, 144, dec, at)


@kernel
def _rows16_pass(dec, d_base, g, ng, x, a0, na, xs0, xs1, b2, batch, pair_sums, acc, b0, b1):
    """Records b0 .. b1-1 of ``ng`` decoded 16-row groups against activations a0 .. a0+na-1
    (na in 8, 4, 2, 1): accumulators of group gi at acc[gi * 128 ...].  ``pair_sums``: T from
    the int16 pair sums in ``b2`` (one vpdpwssd per two sub-blocks), else from the stored
    bsum."""
    for gi in range(ng):
        for b in range(b0, b1):
            d_off = d_base + (gi * g + b) * R16_BYTES
            x_off = a0 * xs0 + b * xs1
            b_off = (b * batch + a0) * 16
            at = 128 * gi
            if pair_sums:
                if na == 8:
                    accumulate_rows16_vnni_b2(dec, d_off, x, x_off, xs0, b2, b_off, acc, at,
                                              b == 0, 8)
                elif na == 4:
                    accumulate_rows16_vnni_b2(dec, d_off, x, x_off, xs0, b2, b_off, acc, at,
                                              b == 0, 4)
                elif na == 2:
                    accumulate_rows16_vnni_b2(dec, d_off, x, x_off, xs0, b2, b_off, acc, at,
                                              b == 0, 2)
                else:
                    accumulate_rows16_vnni_b2(dec, d_off, x, x_off, xs0, b2, b_off, acc, at,
                                              b == 0, 1)
            elif na == 8:
                accumulate_rows16_vnni(dec, d_off, x, x_off, xs0, b2, b_off, acc, at, b == 0, 8)
            elif na == 4:
                accumulate_rows16_vnni(dec, d_off, x, x_off, xs0, b2, b_off, acc, at, b == 0, 4)
            elif na == 2:
                accumulate_rows16_vnni(dec, d_off, x, x_off, xs0, b2, b_off, acc, at, b == 0, 2)
            else:
                accumulate_rows16_vnni(dec, d_off, x, x_off, xs0, b2, b_off, acc, at, b == 0, 1)


@kernel
def _rows16_core(w, x, out, row_bytes, record_block, pair_sums_ok):
    """``_rows16_gemm_blocked`` once the record bytes of ``w`` and ``x`` are contiguous."""
    batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
    if rows == 0 or batch == 0:   # nothing to write (and no row block to size)
        return
    xs0, xs1 = x.strides[0], x.strides[1]
    ngroups = (rows + R16_ROWS - 1) // R16_ROWS
    block = min(ngroups, max(1, row_bytes // max(1, g * R16_BYTES)))
    dec = np.empty(block * g * R16_BYTES + 64, np.uint8)
    d_base = (64 - array_address(dec) % 64) % 64
    acc = np.empty(block * 128, np.float32)
    pad = np.zeros((R16_ROWS, 144), np.uint8)   # the last group's missing rows: zero records
    b2 = np.empty(batch * g * 16, np.uint8)
    pair_sums = _pair_bsums(x, b2) and pair_sums_ok
    for g0 in range(0, ngroups, block):
        g1 = min(ngroups, g0 + block)
        # (Decoding each record just before the first tile uses it measured 1-2% slower.)
        for gi in range(g0, g1):
            for b in range(g):
                _rows16_decode(w, gi, b, dec, d_base + ((gi - g0) * g + b) * R16_BYTES, pad)
        a0 = 0
        while a0 < batch:
            left = batch - a0
            na = 8 if left >= 8 else 4 if left >= 4 else 2 if left >= 2 else 1
            for b0 in range(0, g, record_block):
                _rows16_pass(dec, d_base, g, g1 - g0, x, a0, na, xs0, xs1, b2, batch, pair_sums,
                             acc, b0, min(g, b0 + record_block))
            for gi in range(g0, g1):
                nr = min(R16_ROWS, rows - R16_ROWS * gi)
                for k in range(na):
                    for r in range(nr):
                        out[a0 + k, R16_ROWS * gi + r] = acc[128 * (gi - g0) + 16 * k + r]
            a0 += na


@kernel
def _rows16_gemm_blocked(w, x, out, row_bytes, record_block, pair_sums_ok=True):
    """Q4_K x Q8_K gemm, row-lane VNNI kernel (``accumulate_rows16_vnni``): weights decoded once
    per call in groups of 16 rows (about ``row_bytes`` decoded bytes per row block, kept in L2
    while every activation tile passes), activations read as stored (copied first if their
    record bytes are strided) in tiles of 8, then 4, 2, 1 for the rest; records in blocks of
    ``record_block`` (the tile's activation records stay in L1 while the row block passes);
    one lane per row, each lane its own in-order fold over records.  T comes from the int16
    pair sums of bsum where every one of the call fits (``_pair_bsums``) and
    ``pair_sums_ok``, else from the stored bsum."""
    if w.strides[2] != 1:
        _gemm_loop(w, x, out)
        return
    if x.strides[2] != 1:
        _rows16_core(w, np.ascontiguousarray(x), out, row_bytes, record_block, pair_sums_ok)
    else:
        _rows16_core(w, x, out, row_bytes, record_block, pair_sums_ok)


_R16_ROW_BYTES = 1 << 19   # decoded weight bytes per row block (kept in L2); 256 KiB .. 2 MiB
_R16_RECORD_BLOCK = 8      # and record blocks 4 .. 16 measured within 2% of it (batch 128)


@kernel
def _vnni_gemm(w, x, out):
    """The VNNI gemm: the row-lane kernel (16 rows x 8 activations per tile step, weights
    decoded once per call) for batch >= 2, the gemv kernel for batch 1 (no per-call decode).
    (It replaced a per-pair kernel with repacked activation tiles and a lane-per-activation
    kernel, both slower at every batch >= 2 on AMD Zen 4; docs/decisions/028.)"""
    if x.shape[0] == 1:
        _vnni_gemv(w, x[0], out[0])
    else:
        _rows16_gemm_blocked(w, x, out, _R16_ROW_BYTES, _R16_RECORD_BLOCK)


# ---- GEMM on AMX-INT8: 16 rows x 16 activations per tile step (see _amx_q4_k.py) ------------

_AMX_ROW_BYTES = 1 << 20   # decoded weight bytes per row block (kept in L2 while tiles pass)
_AMX_ACT_BYTES = 1 << 19   # repacked activation bytes per pass over a row block (in L2 too)


@kernel
def _repack_acts_amx(x, t, t_base):
    """Activations ``x`` [batch, G, 292] (any strides) into AMX activation blocks in ``t``
    (zero-filled by the caller) at byte ``t_base``: group ``i`` of 16, record ``b`` at
    ``t_base + (i*G + b) * AMX_ACT_BYTES``."""
    batch, g = x.shape[0], x.shape[1]
    for a in range(batch):
        i, n = a // AMX_ACTS, a % AMX_ACTS
        for b in range(g):
            at = t_base + (i * g + b) * AMX_ACT_BYTES + 4 * n
            for e in range(256):
                t[at + 64 * (e >> 2) + (e & 3)] = x[a, b, X_Q_AT + e]
            for j in range(16):
                o = at + 64 * (j >> 2) + (j & 3)
                t[o + ACT_BLO_AT] = x[a, b, X_BSUM_AT + 2 * j]
                t[o + ACT_BHI_AT] = x[a, b, X_BSUM_AT + 2 * j + 1]
            for e in range(4):
                t[at + ACT_DS_AT + e] = x[a, b, X_DS_AT + e]


@kernel
def _amx_gemm_blocked(w, x, out, row_bytes, act_bytes):
    """Q4_K x Q8_K gemm on AMX-INT8.  For each 16 x 16 block of (rows, activations) the records
    are taken in order, one ``accumulate_amx`` each, so every pair folds in record order.
    The weights of each row block (about ``row_bytes`` decoded bytes) are decoded once per
    call; activations are taken in chunks of about ``act_bytes`` repacked bytes, so that a
    chunk and the row block stay in L2 while every 16-row group passes over the chunk.
    (Tried and dropped, no gain or slower: decoding each 16-row block just before its steps,
    two row groups sharing each activation tile, a software-pipelined epilogue.)"""
    if w.strides[2] != 1:
        _gemm_loop(w, x, out)
        return
    batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
    if rows == 0 or batch == 0:   # nothing to write (and no row block to size)
        return
    ws0, ws1 = w.strides[0], w.strides[1]
    nact = (batch + AMX_ACTS - 1) // AMX_ACTS
    t = np.zeros(nact * g * AMX_ACT_BYTES + 64, np.uint8)
    t_base = (64 - array_address(t) % 64) % 64
    _repack_acts_amx(x, t, t_base)
    ngroups = (rows + AMX_ROWS - 1) // AMX_ROWS
    ichunk = min(nact, max(1, act_bytes // max(1, g * AMX_ACT_BYTES)))
    block = min(ngroups, max(1, row_bytes // max(1, g * AMX_DEC_BYTES)))
    dec = np.empty(block * g * AMX_DEC_BYTES + 64, np.uint8)
    d_base = (64 - array_address(dec) % 64) % 64
    scr = np.empty(4096 + 64, np.uint8)
    s_base = (64 - array_address(scr) % 64) % 64
    acc = np.empty(ichunk * AMX_ROWS * AMX_ACTS, np.float32)
    amx_begin(AMX_CONFIG)
    for g0 in range(0, ngroups, block):
        g1 = min(ngroups, g0 + block)
        for gi in range(g0, g1):
            for m in range(min(AMX_ROWS, rows - AMX_ROWS * gi)):
                r = AMX_ROWS * gi + m
                for b in range(g):
                    q4_k_decode_amx(w, r * ws0 + b * ws1, dec,
                                    d_base + ((gi - g0) * g + b) * AMX_DEC_BYTES, m)
        for i0 in range(0, nact, ichunk):
            i1 = min(nact, i0 + ichunk)
            for gi in range(g0, g1):
                for b in range(g):
                    d_off = d_base + ((gi - g0) * g + b) * AMX_DEC_BYTES
                    for i in range(i0, i1):
                        accumulate_amx(dec, d_off, t, t_base + (i * g + b) * AMX_ACT_BYTES, scr,
                                       s_base, acc, AMX_ROWS * AMX_ACTS * (i - i0), b == 0)
                for i in range(i0, i1):
                    for m in range(min(AMX_ROWS, rows - AMX_ROWS * gi)):
                        for n in range(min(AMX_ACTS, batch - AMX_ACTS * i)):
                            out[AMX_ACTS * i + n, AMX_ROWS * gi + m] = acc[
                                AMX_ROWS * AMX_ACTS * (i - i0) + AMX_ACTS * m + n]
    amx_end()


_gemv_impl = _vnni_gemv if HAVE_VNNI and HAVE_AVX512 else _simd_gemv
_gemm_small = _vnni_gemm if HAVE_VNNI and HAVE_AVX512 else _simd_gemm
_AMX_MIN_BATCH = 9  # batch <= 8 (one VNNI tile): the VNNI pairs kernel, no per-call decode


@kernel
def _amx_gemm(w, x, out):
    """AMX-INT8 gemm for batch >= _AMX_MIN_BATCH, the VNNI / AVX kernels below."""
    if x.shape[0] >= _AMX_MIN_BATCH:
        _amx_gemm_blocked(w, x, out, _AMX_ROW_BYTES, _AMX_ACT_BYTES)
    else:
        _gemm_small(w, x, out)


_gemm_impl = _amx_gemm if HAVE_AMX else _gemm_small


@kernel
def record_sums_q4_k_q8_k(w, bw, x, bx):
    """``(S_b, T_b)`` as int32 for records ``w[bw]`` (Q4_K ``[G, 144]``) and ``x[bx]``
    (Q8_K ``[G, 292]``)."""
    return record_sums_loop(w, bw, x, bx)


@kernel
def record_value_q4_k_q8_k(w, bw, x, bx):
    """``v_b`` for records ``w[bw]`` (Q4_K ``[G, 144]``) and ``x[bx]`` (Q8_K ``[G, 292]``)."""
    if HAVE_AVX2 and w.strides[1] == 1 and x.strides[1] == 1:
        return _simd_record_value(w, bw * w.strides[0], x, bx * x.strides[0])
    return record_value_loop(w, bw, x, bx)


@kernel
def dot_q4_k_q8_k(w, x):
    """Canonical quantized dot of Q4_K records ``w`` ``[G, 144]`` and Q8_K records ``x`` ``[G, 292]``.

    Returns a float32 scalar.  ``w`` and ``x`` must have the same ``G`` (not checked here).
    """
    return _simd_dot(w, x)


@kernel
def gemv_q4_k_q8_k(w, x, out):
    """``out[r] = dot_q4_k_q8_k(w[r], x)`` for Q4_K weights ``[rows, G, 144]`` and one Q8_K
    activation ``[G, 292]`` (quantized once, shared by every row)."""
    if no_records(w.shape[1], out):
        return
    _gemv_impl(w, x, out)


@kernel
def gemm_q4_k_q8_k(w, x, out):
    """``out[a, r] = dot_q4_k_q8_k(w[r], x[a])`` for Q4_K weights ``[rows, G, 144]`` and Q8_K
    activations ``[batch, G, 292]``; each weight record is decoded once per tile of activations
    (with AVX-512 VNNI: once per call into 16-row groups, 16 rows x 8 activations per tile
    step, see ``_vnni_gemm``; with AMX-INT8 and batch >= 9: 16 x 16 tiles on the tile unit, see
    ``_amx_gemm_blocked``)."""
    if no_records(w.shape[1], out):
        return
    _gemm_impl(w, x, out)



# ---- the registry's declaration of this module's format (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402
from numba_qk.kernels.kquants.q4_k import q4_k_decode_records, q4_k_dequantize_records  # noqa: E402
from numba_qk.kernels.kquants.q4_k_encode import quantize_q4_k  # noqa: E402

TRAITS = Traits(
    format=quant.q4_k,
    dequantize=q4_k_dequantize_records,
    decode=q4_k_decode_records,
    decoded=Decoded("Q4KFields", ("d", "dmin", "sc", "m", "q"),
                    (("sc", "u1"), ("m", "u1"), ("q", "u1")),
                    "Decoded Q4_K fields of ``G`` records."),
    quantize=quantize_q4_k,
    domain="finite",
    quantizer="ggml quantize_row_q4_K_ref",
    find_invalid=None,
    dot=dot_q4_k_q8_k,
    gemv=gemv_q4_k_q8_k,
    gemm=gemm_q4_k_q8_k,
    oracle="numba_qk.testing.reference.core",
)
