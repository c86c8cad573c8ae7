"""Q4_K quantizer reproducing ggml's reference quantizer ``quantize_row_q4_K_ref`` (no
importance matrix) bit for bit.

Per 256-element block ``x`` (all float steps in float32, in ggml's C evaluation order; C's
``a*b*c`` is ``(a*b)*c``; no FMA contraction):

1. For each sub-block ``j`` of 32: ``av_x = sqrtf(sum(x^2) / 32)``, weights
   ``w_i = av_x + |x_i|``, and ``make_qkx2_quants(n=32, nmax=15, rmin=-1, rdelta=0.1,
   nstep=20)`` -> ``scale_j``, ``min_j`` (a weighted least-squares search over 21 candidate
   inverse scales, keeping the candidate with the smallest weighted squared error).
2. ``max_scale``, ``max_min`` over the sub-blocks; ``ls_j = min(63, nearest_int(63/max_scale *
   scale_j))``, ``lm_j`` likewise; packed 6-bit into the 12 scale bytes.
3. ``d = fp16(max_scale / 63)``, ``dmin = fp16(max_min / 63)``.
4. Requantize with the stored values: ``q = clamp(nearest_int((x + f32(dmin)*lm) /
   (f32(d)*ls)), 0, 15)`` (sub-blocks whose ``f32(d)*ls == 0`` keep the quants from step 1).

``nearest_int(f)`` is ggml's magic-number rounding: the low 23 bits of ``R32(f + 12582912)``
minus 2**22 -- round half to even for |f| < 2**22, ggml's own garbage beyond (reproduced).
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels._bits import f16_to_f32
from numba_qk.formats import quant
from numba_qk.kernels.kquants.encode_lanes import ENCODE_LANES, lane_scratch, qkx2_lanes, requant_lanes
from numba_qk.kernels._round import f32_to_f16_bits, nearest_int

# Byte offsets of the Q4_K fields, from the schema.
_D_AT = quant.q4_k.field("d").start
_DMIN_AT = quant.q4_k.field("dmin").start
_SC_AT = quant.q4_k.field("sc").start   # 12 bytes of packed 6-bit sc and m
_QS_AT = quant.q4_k.field("q").start


@kernel
def make_qkx2_quants(x, off, n, nmax, weights, L, Laux, rmin, rdelta, nstep):
    """ggml's make_qkx2_quants (use_mad = false) on x[off:off+n]; returns (scale, the_min)."""
    return make_qkx2_quants_mad(x, off, n, nmax, weights, L, Laux, rmin, rdelta, nstep, False)


@kernel
def _qkx2_err(diff, use_mad):
    """ggml: ``diff = use_mad ? fabsf(diff) : diff * diff``."""
    if use_mad:
        return abs(diff)
    return np.float32(diff * diff)


@kernel
def make_qkx2_quants_mad(x, off, n, nmax, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """ggml's make_qkx2_quants on x[off:off+n] with its ``use_mad`` flag (Q2_K passes true:
    absolute instead of squared errors); returns (scale, the_min)."""
    mn = np.float32(x[off])
    mx = np.float32(x[off])
    sum_w = np.float32(weights[0])
    sum_x = np.float32(sum_w * np.float32(x[off]))
    for i in range(1, n):
        xi = np.float32(x[off + i])
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        w = np.float32(weights[i])
        sum_w = np.float32(sum_w + w)
        sum_x = np.float32(sum_x + np.float32(w * xi))
    if mn > np.float32(0.0):
        mn = np.float32(0.0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return np.float32(0.0), np.float32(-mn)
    iscale = np.float32(np.float32(nmax) / np.float32(mx - mn))
    scale = np.float32(np.float32(1.0) / iscale)
    best_error = np.float32(0.0)
    for i in range(n):
        xi = np.float32(x[off + i])
        l = nearest_int(np.float32(iscale * np.float32(xi - mn)))
        l = max(0, min(nmax, l))
        L[i] = l
        diff = np.float32(np.float32(np.float32(scale * np.float32(l)) + mn) - xi)
        diff = _qkx2_err(diff, use_mad)
        best_error = np.float32(best_error + np.float32(np.float32(weights[i]) * diff))
    if nstep < 1:
        return scale, np.float32(-mn)
    for step in range(nstep + 1):
        iscale = np.float32(np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step)))
                                       + np.float32(nmax)) / np.float32(mx - mn))
        sum_l = np.float32(0.0)
        sum_l2 = np.float32(0.0)
        sum_xl = np.float32(0.0)
        for i in range(n):
            xi = np.float32(x[off + i])
            l = nearest_int(np.float32(iscale * np.float32(xi - mn)))
            l = max(0, min(nmax, l))
            Laux[i] = l
            w = np.float32(weights[i])
            fl = np.float32(l)
            sum_l = np.float32(sum_l + np.float32(w * fl))
            sum_l2 = np.float32(sum_l2 + np.float32(np.float32(w * fl) * fl))
            sum_xl = np.float32(sum_xl + np.float32(np.float32(w * fl) * xi))
        D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
        if D > np.float32(0.0):
            this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl)
                                               - np.float32(sum_x * sum_l)) / D)
            this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x)
                                             - np.float32(sum_l * sum_xl)) / D)
            if this_min > np.float32(0.0):
                this_min = np.float32(0.0)
                this_scale = np.float32(sum_xl / sum_l2)
            cur_error = np.float32(0.0)
            for i in range(n):
                diff = np.float32(np.float32(np.float32(this_scale * np.float32(Laux[i]))
                                             + this_min) - np.float32(x[off + i]))
                diff = _qkx2_err(diff, use_mad)
                cur_error = np.float32(cur_error + np.float32(np.float32(weights[i]) * diff))
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, np.float32(-mn)


@kernel
def _quantize_block_q4_k(values, b, out, L, scales, mins, lanes):
    x = values[b]
    xt, wt, Lt, scr, laux, weights, sub, Laux, dd = lanes
    for j in range(8):  # ggml's weights: av_x + |x_i|, av_x = sqrtf(sum x^2 / 32) per sub-block
        sum_x2 = np.float32(0.0)
        for l in range(32):
            xv = np.float32(x[32 * j + l])
            sum_x2 = np.float32(sum_x2 + np.float32(xv * xv))
        av_x = np.float32(np.sqrt(np.float32(sum_x2 / np.float32(32.0))))
        for l in range(32):
            xv = np.float32(x[32 * j + l])
            xt[l, j] = xv
            wt[l, j] = np.float32(av_x + abs(xv))
    if ENCODE_LANES:  # the 8 sub-blocks' searches side by side (same bits)
        qkx2_lanes(xt, wt, 32, 8, 15, np.float32(-1.0), np.float32(0.1), 20, False, Lt,
                   scales, mins, scr, laux)
    else:
        for j in range(8):
            for l in range(32):
                weights[l] = wt[l, j]
            sc, mn = make_qkx2_quants(x, 32 * j, 32, 15, weights, sub, Laux, np.float32(-1.0),
                                      np.float32(0.1), 20)
            for l in range(32):
                Lt[l, j] = sub[l]
            scales[j] = sc
            mins[j] = mn
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for j in range(8):
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = np.float32(np.float32(63.0) / max_scale) if max_scale > 0 else np.float32(0.0)
    inv_min = np.float32(np.float32(63.0) / max_min) if max_min > 0 else np.float32(0.0)
    for k in range(_SC_AT, _QS_AT):
        out[b, k] = 0
    for j in range(8):
        ls = min(63, nearest_int(np.float32(inv_scale * scales[j])) & 0xFF)  # uint8_t, MIN
        lm = min(63, nearest_int(np.float32(inv_min * mins[j])) & 0xFF)
        if j < 4:
            out[b, _SC_AT + j] = np.uint8(ls)
            out[b, _SC_AT + j + 4] = np.uint8(lm)
        else:
            out[b, _SC_AT + j + 4] = np.uint8((ls & 0xF) | ((lm & 0xF) << 4))
            out[b, _SC_AT + j - 4] |= np.uint8((ls >> 4) << 6)
            out[b, _SC_AT + j] |= np.uint8((lm >> 4) << 6)
    hd = f32_to_f16_bits(np.float32(max_scale / np.float32(63.0)))
    hm = f32_to_f16_bits(np.float32(max_min / np.float32(63.0)))
    out[b, _D_AT] = np.uint8(hd & np.uint16(0xFF))
    out[b, _D_AT + 1] = np.uint8(hd >> np.uint16(8))
    out[b, _DMIN_AT] = np.uint8(hm & np.uint16(0xFF))
    out[b, _DMIN_AT + 1] = np.uint8(hm >> np.uint16(8))
    d_all = f16_to_f32(hd)
    dmin_all = f16_to_f32(hm)
    for j in range(8):
        if j < 4:
            sc = np.int32(out[b, _SC_AT + j] & 63)
            m = np.int32(out[b, _SC_AT + 4 + j] & 63)
        else:
            sc = np.int32((out[b, _SC_AT + 4 + j] & 0xF) | ((out[b, _SC_AT + j - 4] >> 6) << 4))
            m = np.int32((out[b, _SC_AT + 4 + j] >> 4) | ((out[b, _SC_AT + j] >> 6) << 4))
        dd[1, j] = np.float32(d_all * np.float32(sc))     # C: if (!d) continue; (lanes keep L)
        dd[0, j] = np.float32(dmin_all * np.float32(m))
    requant_lanes(xt, dd[0], dd[1], 0, 15, 0, Lt, 32, 8)  # nearest_int((x + dm)/d), 0..15
    for j in range(8):
        for l in range(32):
            L[32 * j + l] = Lt[l, j]
    for j in range(4):
        for l in range(32):
            out[b, _QS_AT + 32 * j + l] = np.uint8(L[64 * j + l] | (L[64 * j + l + 32] << 4))


@kernel
def quantize_q4_k(values, out):
    """ggml's quantize_row_q4_K_ref for f32 ``[G, 256]`` into ``out`` ``[G, 144]``.

    Returns -1, or the first block holding a non-finite value (nothing written then).
    """
    for b in range(values.shape[0]):
        for i in range(values.shape[1]):
            v = np.float32(values[b, i])
            if (v - v) != np.float32(0.0):
                return b
    L = np.zeros(256, np.int32)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    lanes = lanes_scratch(32, 8)
    for b in range(values.shape[0]):
        _quantize_block_q4_k(values, b, out, L, scales, mins, lanes)
    return -1


@kernel
def lanes_scratch(n, nl):
    """Scratch of the sub-block searches: ``(xt, wt, Lt, scr, laux, weights, sub, Laux, dd)``,
    the transposed sub-blocks and weights ``[n, nl]``, their quants, ``qkx2_lanes``' scratch,
    the scalar path's per-sub-block arrays and the per-sub-block ``(dm, d)`` of the final pass."""
    scr, laux = lane_scratch(n, nl)
    return (np.zeros((n, nl), np.float32), np.zeros((n, nl), np.float32),
            np.zeros((n, nl), np.int32), scr, laux, np.zeros(n, np.float32),
            np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((2, nl), np.float32))
