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

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats import quant
from numba_qk.kernels.kquants.common import av_weights_in, k4_encode_scales, quantizer_for, transpose_out
from numba_qk.kernels.kquants.encode_lanes import ENCODE_LANES, lane_scratch, qkx2_fit, qkx2_lanes, requant_lanes
from numba_qk.kernels._round import nearest_int

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


@inline_kernel
def _qkx2_quant(iscale, xi, mn, nmax):
    """ggml: ``l = nearest_int(iscale*(x[i] - min)); L[i] = MAX(0, MIN(nmax, l))``."""
    l = nearest_int(np.float32(iscale * np.float32(xi - mn)))
    return max(0, min(nmax, l))


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
        l = _qkx2_quant(iscale, xi, mn, nmax)
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
            l = _qkx2_quant(iscale, xi, mn, nmax)
            Laux[i] = l
            w = np.float32(weights[i])
            fl = np.float32(l)
            sum_l = np.float32(sum_l + np.float32(w * fl))
            sum_l2 = np.float32(sum_l2 + np.float32(np.float32(w * fl) * fl))
            sum_xl = np.float32(sum_xl + np.float32(np.float32(w * fl) * xi))
        D, this_scale, this_min = qkx2_fit(sum_w, sum_x, sum_l, sum_l2, sum_xl)
        if D > np.float32(0.0):
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


@inline_kernel
def qkx2_search(x, n, nl, nmax, rmin, rdelta, nstep, use_mad, lanes, scales, mins):
    """ggml's ``make_qkx2_quants`` on the ``nl`` sub-blocks of ``n`` of block ``x`` (Q2_K, Q4_K,
    Q5_K), transposed in ``lanes = lanes_scratch(n, nl)`` with their weights: quants into its
    ``Lt``, ``scales[j]``/``mins[j]``.  The lanes side by side where ``ENCODE_LANES``, else one
    :func:`make_qkx2_quants_mad` call per sub-block (same bits)."""
    xt, wt, Lt, scr, laux, weights, sub, Laux, dd = lanes
    if ENCODE_LANES:  # the sub-blocks' searches side by side (same bits)
        qkx2_lanes(xt, wt, n, nl, nmax, rmin, rdelta, nstep, use_mad, Lt, scales, mins, scr, laux)
    else:
        for j in range(nl):
            for l in range(n):
                weights[l] = wt[l, j]
            sc, mn = make_qkx2_quants_mad(x, n * j, n, nmax, weights, sub, Laux, rmin, rdelta,
                                          nstep, use_mad)
            for l in range(n):
                Lt[l, j] = sub[l]
            scales[j] = sc
            mins[j] = mn


@kernel
def qkx2_scratch(n, nl):
    """Scratch of a block encoder built on :func:`qkx2_search` (``nl`` sub-blocks of ``n``):
    ``L`` int32 [n * nl], ``scales``/``mins`` f32 [nl], ``lanes_scratch(n, nl)``."""
    return (np.zeros(n * nl, np.int32), np.empty(nl, np.float32), np.empty(nl, np.float32),
            lanes_scratch(n, nl))


def qkx2_scratch_of(n, nl):
    """The ``scratch()`` (``quantizer_for``) of a block encoder on :func:`qkx2_block` with
    ``nl`` sub-blocks of ``n``: ``qkx2_scratch(n, nl)``."""
    def scratch():
        return qkx2_scratch(n, nl)
    return kernel(scratch)


@inline_kernel
def qkx2_block(values, b, work, n, nl, av, nmax, rmin, nstep, use_mad):
    """The search half of the Q2_K / Q4_K / Q5_K block encoders (``work = qkx2_scratch(n,
    nl)``): block ``values[b]`` transposed into the lanes with ggml's weights (``av``: ``av_x +
    |x_i|``, ``av_weights_in``, Q4_K / Q5_K; else ``|x_i|``, Q2_K), then ggml's
    ``make_qkx2_quants(n, nmax, x, w, L, &min, Laux, rmin, 0.1f, nstep, use_mad)`` of every
    sub-block (:func:`qkx2_search`).  Returns ``(L, scales, mins, xt, Lt, dd)`` of ``work``."""
    L, scales, mins, lanes = work
    x = values[b]
    xt, wt, Lt, scr, laux, weights, sub, Laux, dd = lanes
    if av:
        av_weights_in(x, xt, wt, n, nl)
    else:
        for j in range(nl):
            for l in range(n):
                xv = np.float32(x[n * j + l])
                xt[l, j] = xv
                wt[l, j] = abs(xv)
    qkx2_search(x, n, nl, nmax, rmin, np.float32(0.1), nstep, use_mad, lanes, scales, mins)
    return L, scales, mins, xt, Lt, dd


#: Scratch of the Q4_K/Q5_K block encoders (8 sub-blocks of 32).
k4_scratch = qkx2_scratch_of(32, 8)


@inline_kernel
def k4_block(values, b, out, work, sc_at, d_at, dmin_at, nmax, rmin, nstep):
    """Q4_K / Q5_K's block encoder but the packing of the quants (``work = k4_scratch()``):
    the search (:func:`qkx2_block`, weights ``av_x + |x_i|``), the 6-bit scales and mins with
    ``d``/``dmin`` (``k4_encode_scales``), the quants requantized with them into ``0..nmax``
    (``nearest_int((x + dm)/d)``).  Returns ``L`` (int32 [256], element order)."""
    L, scales, mins, xt, Lt, dd = qkx2_block(values, b, work, 32, 8, True, nmax, rmin, nstep,
                                             False)
    k4_encode_scales(out, b, sc_at, d_at, dmin_at, scales, mins, dd)
    requant_lanes(xt, dd[0], dd[1], 0, nmax, 0, Lt, 32, 8)
    transpose_out(Lt, L, 32, 8)
    return L


@kernel
def quantize_block_q4_k(values, b, out, work):
    """One finite block ``values[b]`` into record ``out[b]`` (``work = k4_scratch()``)."""
    L = k4_block(values, b, out, work, _SC_AT, _D_AT, _DMIN_AT, 15, np.float32(-1.0), 20)
    for j in range(4):
        for l in range(32):
            out[b, _QS_AT + 32 * j + l] = np.uint8(L[64 * j + l] | (L[64 * j + l + 32] << 4))


quantize_q4_k = quantizer_for(quant.q4_k, block=quantize_block_q4_k, scratch=k4_scratch)


@kernel
def lanes_scratch(n, nl):
    """Scratch of the sub-block searches: ``(xt, wt, Lt, scr, laux, weights, sub, Laux, dd)``,
    the transposed sub-blocks and weights ``[n, nl]``, their quants, ``qkx2_lanes``' scratch,
    the scalar path's per-sub-block arrays and the per-sub-block ``(dm, d)`` of the final pass."""
    scr, laux = lane_scratch(n, nl)
    return (np.zeros((n, nl), np.float32), np.zeros((n, nl), np.float32),
            np.zeros((n, nl), np.int32), scr, laux, np.zeros(n, np.float32),
            np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((2, nl), np.float32))
