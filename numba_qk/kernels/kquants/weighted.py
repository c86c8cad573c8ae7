"""The K-quants' importance-weighted encoders: ggml's ``quantize_row_q{2,3,4,5,6}_K_impl``, the
path ``ggml_quantize_chunk`` takes when it is given an importance matrix (llama.cpp's
``quant_weights``: one f32 weight per column of the row).  All ``@njit``.

Each entry ``quantize_<t>_weighted(values, qw, out)`` takes f32 ``values`` ``[G, 256]`` whose
blocks run along rows of ``n_per_row = len(qw)`` values (block ``b`` is block ``b % (n_per_row /
256)`` of its row, weighted by ``qw[256 * that : 256 * that + 256]``) and returns -1, or the
first block holding a non-finite value (nothing written then).  Without an importance matrix
ggml uses ``quantize_row_<t>_ref`` (the modules ``q2_k.py`` ... ``q6_k.py``); these kernels are
only the weighted path.

Per super-block (every float step one f32 rounding in C's evaluation order)::

    sigma2 = (k * sum x^2) / 256            k = 1 (Q2_K), 2 (Q3_K, Q4_K, Q5_K)
    weight_i = qw_i * sqrtf(sigma2 + x_i * x_i)        (Q6_K: weight_i = qw_i)
    Q2_K  make_qkx3_quants(16, 3)  per 16, scales and mins by make_qp_quants(16, 15, sw)
    Q3_K  make_qx_quants(16, 4)    per 16, scales by make_qx_quants(16, 32, sw)
    Q4_K  make_qkx3_quants(32, 15) per 32, scales and mins by make_qp_quants(8, 63, sw)
    Q5_K  make_qkx3_quants(32, 31) per 32, scales and mins by make_qp_quants(8, 63, sw)
    Q6_K  make_qx_quants(16, 32)   per 16 (weights qw), then the reference's scale step
    (sw_j: the sum of sub-block j's weights), then requantization with the stored scales.

``make_qx_quants`` (rmse_type 1 with weights), ``make_qkx3_quants`` (``rmin = -0.9``, ``rdelta =
0.05``, ``nstep = 36``, squared error) and ``make_qp_quants`` are ggml's searches of the same
names, written out below; the first two also run up to 16 sub-blocks side by side
(``make_qx_lanes_w``, ``make_qkx3_lanes_w``: every lane keeps its own order of operations, so
the bits are the scalar search's) -- 5-10x faster than one sub-block at a time.  The legacy
formats reuse them (``legacy/weighted.py``).
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats.kquants import q2_k as _Q2, q3_k as _Q3, q4_k as _Q4, q5_k as _Q5, q6_k as _Q6
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.kquants.common import (GROUP_MAX_EPS, field_starts, first_nonfinite_block,
                                             k4_pack_scale_min, k4_scale_min_inline,
                                             make_qx_quants, pack_2bit, q3_split_hmask,
                                             q5_pack_quants, signed_absmax, store_f16,
                                             transpose_out)

LANES = 16   # the passes run all 16 lanes of the scratch (a constant trip count vectorizes); lanes >= nl are ignored
_F0 = np.float32(0.0)


# ---- ggml's searches with weights ---------------------------------------------------------------

@kernel
def _qx_pass_w(xt, wt, isc, nmax, n, nl, s1, s2):
    """One pass of make_qx_quants over the lanes ``j < nl`` of ``xt``/``wt`` [n, nl]: ``s1[j] =
    sum (w*x)*l``, ``s2[j] = sum (w*l)*l`` in order of ``i`` (lanes side by side: same bits)."""
    for j in range(LANES):
        s1[j] = _F0
        s2[j] = _F0
    for i in range(n):
        for j in range(LANES):
            xi = xt[i, j]
            l = nearest_int(np.float32(isc[j] * xi))
            fl = np.float32(max(-nmax, min(nmax - 1, l)))
            wi = wt[i, j]
            s1[j] = np.float32(s1[j] + np.float32(np.float32(wi * xi) * fl))
            s2[j] = np.float32(s2[j] + np.float32(np.float32(wi * fl) * fl))


@kernel
def make_qx_lanes_w(xt, wt, n, nl, nmax, Lt, scales, scr):
    """``common.make_qx_quants`` with weights for the ``nl`` sub-blocks ``x_j = xt[:n, j]`` with weights
    ``wt[:n, j]`` at once (the same bits: each lane's sums keep their order; the quants of the
    chosen candidate are recomputed from its ``iscale``): ``Lt[i, j]`` gets ``l + nmax``,
    ``scales[j]`` the scale.  ``scr``: f32 [8, >= nl]."""
    mxs, act, isc, bisc, best, sc, s1, s2 = scr[0], scr[1], scr[2], scr[3], scr[4], scr[5], scr[6], scr[7]
    fnmax = np.float32(nmax)
    for j in range(nl):
        amax = _F0
        mx = _F0
        for i in range(n):
            xi = xt[i, j]
            ax = abs(xi)
            if ax > amax:
                amax = ax
                mx = xi
        mxs[j] = mx
        act[j] = _F0 if amax < GROUP_MAX_EPS else np.float32(1.0)
        isc[j] = np.float32(np.float32(-fnmax) / mx)
        bisc[j] = isc[j]
    _qx_pass_w(xt, wt, isc, nmax, n, nl, s1, s2)
    for j in range(nl):
        scale = np.float32(s1[j] / s2[j]) if s2[j] != _F0 else _F0
        sc[j] = scale
        best[j] = np.float32(scale * s1[j])
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        num = np.float32(-np.float32(fnmax + np.float32(np.float32(0.1) * np.float32(is_))))
        for j in range(nl):
            isc[j] = np.float32(num / mxs[j])
        _qx_pass_w(xt, wt, isc, nmax, n, nl, s1, s2)
        for j in range(nl):
            if s2[j] > _F0 and np.float32(s1[j] * s1[j]) > np.float32(best[j] * s2[j]):
                bisc[j] = isc[j]
                scale = np.float32(s1[j] / s2[j])
                sc[j] = scale
                best[j] = np.float32(scale * s1[j])
    for j in range(nl):
        if act[j] == _F0:
            for i in range(n):
                Lt[i, j] = 0
            scales[j] = _F0
        else:
            for i in range(n):
                l = nearest_int(np.float32(bisc[j] * xt[i, j]))
                Lt[i, j] = max(-nmax, min(nmax - 1, l)) + nmax
            scales[j] = sc[j]


@kernel
def _qkx3_pass(xt, wt, isc, mnv, nmax, n, nl, Laux, s):
    """One pass of make_qkx3_quants over lanes ``j < nl``: ``Laux[i, j] = clamp(nearest_int(
    isc_j * (x - min_j)), 0, nmax)``; ``s[0..2, j]`` = ``sum w*l``, ``sum (w*l)*l``, ``sum (w*l)*x``
    in order of ``i``."""
    for j in range(LANES):
        s[0, j] = _F0
        s[1, j] = _F0
        s[2, j] = _F0
    for i in range(n):
        for j in range(LANES):
            xi = xt[i, j]
            l = nearest_int(np.float32(isc[j] * np.float32(xi - mnv[j])))
            l = max(0, min(nmax, l))
            Laux[i, j] = l
            fl = np.float32(l)
            wl = np.float32(wt[i, j] * fl)
            s[0, j] = np.float32(s[0, j] + wl)
            s[1, j] = np.float32(s[1, j] + np.float32(wl * fl))
            s[2, j] = np.float32(s[2, j] + np.float32(wl * xi))


@kernel
def _qkx3_err(xt, wt, Laux, scl, mnv, n, nl, err):
    """``err[j] = sum w * (scale_j * l + min_j - x)^2`` over lane ``j`` (in order of ``i``)."""
    for j in range(LANES):
        err[j] = _F0
    for i in range(n):
        for j in range(LANES):
            diff = np.float32(np.float32(np.float32(scl[j] * np.float32(Laux[i, j])) + mnv[j])
                              - xt[i, j])
            err[j] = np.float32(err[j] + np.float32(wt[i, j] * np.float32(diff * diff)))


@kernel
def make_qkx3_lanes_w(xt, wt, n, nl, nmax, Lt, Laux, scales, the_mins, scr):
    """ggml's ``make_qkx3_quants(n, nmax, x_j, w_j, L_j, &the_min, Laux, -0.9f, 0.05f, 36,
    false)`` for the ``nl`` sub-blocks ``x_j = xt[:n, j]`` (weights ``w_j = wt[:n, j]``) at once,
    the same bits (each lane's sums keep their order of ``i``; a lane's ``min`` moves with its
    accepted candidates, as in C): ``Lt[i, j]`` the quants 0..nmax, ``scales[j]``,
    ``the_mins[j]``.  ``Laux``
    int32 like ``Lt``; ``scr`` f32 [15, >= nl]."""
    fnmax = np.float32(nmax)
    mxv, mnv, isc, sw, sx, best, scl, ts, tm, ok, err = (scr[0], scr[1], scr[2], scr[3], scr[4],
                                                         scr[5], scr[6], scr[7], scr[8], scr[9],
                                                         scr[10])
    sums = scr[11:14]
    done = scr[14]
    for j in range(nl):
        mn = xt[0, j]
        mx = xt[0, j]
        sum_w = wt[0, j]
        sum_x = np.float32(sum_w * mn)
        for i in range(1, n):
            xi = xt[i, j]
            if xi < mn:
                mn = xi
            if xi > mx:
                mx = xi
            wi = wt[i, j]
            sum_w = np.float32(sum_w + wi)
            sum_x = np.float32(sum_x + np.float32(wi * xi))
        if mn > _F0:
            mn = _F0
        done[j] = np.float32(1.0) if mx <= mn else _F0   # C: L = 0, the_min = -min, scale 0
        mxv[j] = mx
        mnv[j] = mn
        sw[j] = sum_w
        sx[j] = sum_x
        isc[j] = np.float32(fnmax / np.float32(mx - mn))
        scl[j] = np.float32(np.float32(1.0) / isc[j])
    _qkx3_pass(xt, wt, isc, mnv, nmax, n, nl, Lt, sums)
    _qkx3_err(xt, wt, Lt, scl, mnv, n, nl, best)
    for is_ in range(37):
        num = np.float32(np.float32(np.float32(-0.9) + np.float32(np.float32(0.05) * np.float32(is_)))
                         + fnmax)
        for j in range(nl):
            isc[j] = np.float32(num / np.float32(mxv[j] - mnv[j]))
        _qkx3_pass(xt, wt, isc, mnv, nmax, n, nl, Laux, sums)
        for j in range(nl):
            sum_l = sums[0, j]
            sum_l2 = sums[1, j]
            sum_xl = sums[2, j]
            D = np.float32(np.float32(sw[j] * sum_l2) - np.float32(sum_l * sum_l))
            ok[j] = np.float32(1.0) if (D > _F0 and done[j] == _F0) else _F0
            this_scale = np.float32(np.float32(np.float32(sw[j] * sum_xl)
                                               - np.float32(sx[j] * sum_l)) / D)
            this_min = np.float32(np.float32(np.float32(sum_l2 * sx[j])
                                             - np.float32(sum_l * sum_xl)) / D)
            if this_min > _F0:
                this_min = _F0
                this_scale = np.float32(sum_xl / sum_l2)
            ts[j] = this_scale
            tm[j] = this_min
        _qkx3_err(xt, wt, Laux, ts, tm, n, nl, err)
        for j in range(nl):
            if ok[j] != _F0 and err[j] < best[j]:
                for i in range(n):
                    Lt[i, j] = Laux[i, j]
                best[j] = err[j]
                scl[j] = ts[j]
                mnv[j] = tm[j]
    for j in range(nl):
        if done[j] != _F0:
            for i in range(n):
                Lt[i, j] = 0
            scales[j] = _F0
        else:
            scales[j] = scl[j]
        the_mins[j] = np.float32(-mnv[j])


@kernel
def make_qp_quants(n, nmax, x, L, qw):
    """ggml's ``make_qp_quants(n, nmax, x, L, quant_weights)``: quants in ``L[:n]`` (stored as
    C's ``uint8_t``), returns the scale (f32)."""
    fnmax = np.float32(nmax)
    mx = _F0
    for i in range(n):
        xi = np.float32(x[i])
        mx = mx if mx > xi else xi            # MAX(max, x[i])
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    iscale = np.float32(fnmax / mx)
    for i in range(n):
        L[i] = nearest_int(np.float32(iscale * np.float32(x[i]))) & 0xFF
    scale = np.float32(np.float32(1.0) / iscale)
    best_mse = _F0
    for i in range(n):
        xi = np.float32(x[i])
        diff = np.float32(xi - np.float32(scale * np.float32(L[i])))
        best_mse = np.float32(best_mse + np.float32(np.float32(np.float32(qw[i]) * diff) * diff))
    for is_ in range(-4, 5):
        if is_ == 0:
            continue
        iscale_is = np.float32(np.float32(np.float32(np.float32(0.1) * np.float32(is_)) + fnmax) / mx)
        scale_is = np.float32(np.float32(1.0) / iscale_is)
        mse = _F0
        for i in range(n):
            xi = np.float32(x[i])
            l = min(nmax, nearest_int(np.float32(iscale_is * xi)))
            diff = np.float32(xi - np.float32(scale_is * np.float32(l)))
            mse = np.float32(mse + np.float32(np.float32(np.float32(qw[i]) * diff) * diff))
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        xi = np.float32(x[i])
        l = min(nmax, nearest_int(np.float32(iscale * xi)))
        L[i] = l & 0xFF
        wi = np.float32(qw[i])
        fl = np.float32(l)
        sumlx = np.float32(sumlx + np.float32(np.float32(wi * xi) * fl))
        suml2 = np.float32(suml2 + np.float32(np.float32(wi * fl) * fl))
    for itry in range(5):
        n_changed = 0
        for i in range(n):
            wi = np.float32(qw[i])
            xi = np.float32(x[i])
            fL = np.float32(L[i])
            slx = np.float32(sumlx - np.float32(np.float32(wi * xi) * fL))
            sl2 = np.float32(suml2 - np.float32(np.float32(wi * fL) * fL))
            if slx > _F0 and sl2 > _F0:
                new_l = min(nmax, nearest_int(np.float32(np.float32(xi * sl2) / slx)))
                if new_l != L[i]:
                    fn = np.float32(new_l)
                    slx = np.float32(slx + np.float32(np.float32(wi * xi) * fn))
                    sl2 = np.float32(sl2 + np.float32(np.float32(wi * fn) * fn))
                    if (np.float32(np.float32(slx * slx) * suml2)
                            > np.float32(np.float32(sumlx * sumlx) * sl2)):
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return np.float32(sumlx / suml2) if suml2 > _F0 else _F0


# ---- shared steps ----------------------------------------------------------------------------------

@inline_kernel
def sum_sq(values, b, off, n):
    """``sum x^2`` of ``values[b, off:off+n]`` (f32, in order)."""
    s = _F0
    for j in range(n):
        xj = np.float32(values[b, off + j])
        s = np.float32(s + np.float32(xj * xj))
    return s


@inline_kernel
def imatrix_weights(values, b, off, n, qw, qoff, sigma2, weight):
    """``weight[l] = qw[qoff + l] * sqrtf(sigma2 + x*x)`` for ``x = values[b, off + l]``;
    returns their sum (f32, from 0 in order)."""
    sw = _F0
    for l in range(n):
        xl = np.float32(values[b, off + l])
        weight[l] = np.float32(np.float32(qw[qoff + l])
                               * np.float32(np.sqrt(np.float32(sigma2 + np.float32(xl * xl)))))
        sw = np.float32(sw + weight[l])
    return sw


@inline_kernel
def imatrix_lanes_in(values, b, qw, qoff, sigma2, n, nl, sw, weight, xt, wt):
    """Sub-blocks ``j < nl`` of ``n`` values of block ``b`` side by side: ``sw[j]`` =
    :func:`imatrix_weights` of sub-block ``j`` (into ``weight``), ``xt[i, j]``/``wt[i, j]`` its
    values and weights."""
    for j in range(nl):
        sw[j] = imatrix_weights(values, b, n * j, n, qw, qoff + n * j, sigma2, weight)
        for i in range(n):
            xt[i, j] = values[b, n * j + i]
            wt[i, j] = weight[i]


@inline_kernel
def weighted_blocks(values, qw, out, block, work, bs):
    """The blocks of ``values`` [G, bs] in order through ``block(values, b, qw, qoff, out,
    work)``; block ``b`` is weighted from ``qw[qoff:]``, ``qoff = bs * (b % (len(qw) // bs))``.
    -1, or the first block holding a non-finite value (nothing written then)."""
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    per_row = qw.shape[0] // bs
    for b in range(values.shape[0]):
        block(values, b, qw, bs * (b % per_row), out, work)
    return -1


# ---- Q2_K ------------------------------------------------------------------------------------------

_Q2_SC_AT, _Q2_Q_AT, _Q2_D_AT, _Q2_DMIN_AT = field_starts(_Q2, "sc", "q", "d", "dmin")


@kernel
def _k_scratch():
    # L, Laux, weight, scales, mins, sw, Ls, Lm
    return (np.zeros(256, np.int32), np.zeros(32, np.int32), np.zeros(32, np.float32),
            np.zeros(16, np.float32), np.zeros(16, np.float32), np.zeros(16, np.float32),
            np.zeros(16, np.int32), np.zeros(16, np.int32))


@kernel
def lanes_scratch():
    """``(xt, wt, Lt, scr, Laux)`` of :func:`make_qx_lanes_w` / :func:`make_qkx3_lanes_w` for up
    to 16 lanes of up to 32."""
    return (np.zeros((32, 16), np.float32), np.zeros((32, 16), np.float32),
            np.zeros((32, 16), np.int32), np.zeros((16, 16), np.float32),
            np.zeros((32, 16), np.int32))


@kernel
def _kl_scratch():
    return _k_scratch(), lanes_scratch()


@kernel
def quantize_block_q2_k_weighted(values, b, qw, qoff, out, work):
    (L, Laux, weight, scales, mins, sw, Ls, Lm), (xt, wt, Lt, scr, Lx) = work
    sigma2 = np.float32(sum_sq(values, b, 0, 256) / np.float32(256.0))
    imatrix_lanes_in(values, b, qw, qoff, sigma2, 16, 16, sw, weight, xt, wt)
    make_qkx3_lanes_w(xt, wt, 16, 16, 3, Lt, Lx, scales, mins, scr)  # make_qkx3_quants(16, 3)
    transpose_out(Lt, L, 16, 16)
    dm = make_qp_quants(16, 15, scales, Ls, sw)
    mm = make_qp_quants(16, 15, mins, Lm, sw)
    dm = store_f16(out, b, _Q2_D_AT, dm)
    mm = store_f16(out, b, _Q2_DMIN_AT, mm)
    for j in range(16):
        out[b, _Q2_SC_AT + j] = np.uint8((Ls[j] | (Lm[j] << 4)) & 0xFF)
    for j in range(16):
        sc = np.int32(out[b, _Q2_SC_AT + j])
        d = np.float32(dm * np.float32(sc & 0xF))
        if d == _F0:
            continue
        m = np.float32(mm * np.float32(sc >> 4))
        for ii in range(16):
            l = nearest_int(np.float32(np.float32(np.float32(values[b, 16 * j + ii]) + m) / d))
            L[16 * j + ii] = max(0, min(3, l))
    pack_2bit(out, b, _Q2_Q_AT, L)


@kernel
def quantize_q2_k_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> Q2_K records, weighted by ``qw``."""
    return weighted_blocks(values, qw, out, quantize_block_q2_k_weighted, _kl_scratch(), 256)


# ---- Q3_K ------------------------------------------------------------------------------------------

_Q3_HM_AT, _Q3_QL_AT, _Q3_SC_AT, _Q3_D_AT = field_starts(_Q3, "hmask", "ql", "sc", "d")


@kernel
def quantize_block_q3_k_weighted(values, b, qw, qoff, out, work):
    (L, Laux, weight, scales, mins, sw, Ls, Lm), (xt, wt, Lt, scr, Lx) = work
    sigma2 = np.float32(np.float32(np.float32(2.0) * sum_sq(values, b, 0, 256)) / np.float32(256.0))
    imatrix_lanes_in(values, b, qw, qoff, sigma2, 16, 16, sw, weight, xt, wt)
    make_qx_lanes_w(xt, wt, 16, 16, 4, Lt, scales, scr)   # make_qx_quants(16, 4) per sub-block
    transpose_out(Lt, L, 16, 16)
    for k in range(12):
        out[b, _Q3_SC_AT + k] = 0
    d_block = make_qx_quants(scales, 0, 16, 32, Ls, 0, sw, 0)
    for j in range(16):
        l = Ls[j]
        if j < 8:
            out[b, _Q3_SC_AT + j] = np.uint8(l & 0xF)
        else:
            out[b, _Q3_SC_AT + j - 8] |= np.uint8((l & 0xF) << 4)
        l >>= 4
        out[b, _Q3_SC_AT + 8 + j % 4] |= np.uint8((l << (2 * (j // 4))) & 0xFF)
    d_all = store_f16(out, b, _Q3_D_AT, d_block)
    for j in range(16):
        if j < 8:
            sc = np.int32(out[b, _Q3_SC_AT + j] & np.uint8(0xF))
        else:
            sc = np.int32(out[b, _Q3_SC_AT + j - 8] >> np.uint8(4))
        sc = (sc | ((np.int32(out[b, _Q3_SC_AT + 8 + j % 4]) >> (2 * (j // 4))) & 3) << 4) - 32
        d = np.float32(d_all * np.float32(sc))
        if d == _F0:
            continue
        for ii in range(16):
            l = nearest_int(np.float32(np.float32(values[b, 16 * j + ii]) / d))
            L[16 * j + ii] = max(-4, min(3, l)) + 4
    q3_split_hmask(out, b, _Q3_HM_AT, L)
    pack_2bit(out, b, _Q3_QL_AT, L)


@kernel
def quantize_q3_k_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> Q3_K records, weighted by ``qw``."""
    return weighted_blocks(values, qw, out, quantize_block_q3_k_weighted, _kl_scratch(), 256)


# ---- Q4_K and Q5_K ---------------------------------------------------------------------------------

_Q4_D_AT, _Q4_DMIN_AT, _Q4_SC_AT, _Q4_Q_AT = field_starts(_Q4, "d", "dmin", "sc", "q")
_Q5_D_AT, _Q5_DMIN_AT, _Q5_SC_AT, _Q5_QH_AT, _Q5_QL_AT = field_starts(
    _Q5, "d", "dmin", "sc", "qh", "ql")


@kernel
def _k45_scratch():
    # L (two blocks' quants), weight, scales, mins, sw (16 lanes), Ls, Lm
    return ((np.zeros(512, np.int32), np.zeros(32, np.float32), np.zeros(16, np.float32),
             np.zeros(16, np.float32), np.zeros(16, np.float32), np.zeros(8, np.int32),
             np.zeros(8, np.int32)), lanes_scratch())


@inline_kernel
def k45_weighted(values, b, nb, qw, per_row, out, work, nmax, d_at, dmin_at, sc_at, clamp63):
    """Q4_K (``nmax = 15``) / Q5_K (``nmax = 31``, ``clamp63``) blocks ``b .. b + nb - 1`` (``nb``
    1 or 2, block ``b + h`` weighted from ``qw[256 * ((b + h) % per_row):]``): scales, mins,
    ``d``/``dmin`` stored, the requantized quants of block ``b + h`` in ``work[0][0][256 h:]``.
    Two blocks share one ``make_qkx3_lanes_w`` call (their 8 sub-blocks each fill the 16 lanes
    of its passes; every lane is its own search, so the bits are those of one block at a
    time)."""
    (L2, weight, scales, mins, sw, Ls, Lm), (xt, wt, Lt, scr, Lx) = work
    for h in range(nb):
        bb = b + h
        qoff = 256 * (bb % per_row)
        sigma2 = np.float32(np.float32(np.float32(2.0) * sum_sq(values, bb, 0, 256))
                            / np.float32(256.0))
        for j in range(8):
            lane = 8 * h + j
            sw[lane] = imatrix_weights(values, bb, 32 * j, 32, qw, qoff + 32 * j, sigma2, weight)
            for i in range(32):
                xt[i, lane] = values[bb, 32 * j + i]
                wt[i, lane] = weight[i]
    make_qkx3_lanes_w(xt, wt, 32, 8 * nb, nmax, Lt, Lx, scales, mins, scr)  # make_qkx3_quants(32, nmax)
    for h in range(nb):
        bb = b + h
        L = L2[256 * h:256 * h + 256]
        for j in range(8):
            for i in range(32):
                L[32 * j + i] = Lt[i, 8 * h + j]
        d_block = make_qp_quants(8, 63, scales[8 * h:8 * h + 8], Ls, sw[8 * h:8 * h + 8])
        m_block = make_qp_quants(8, 63, mins[8 * h:8 * h + 8], Lm, sw[8 * h:8 * h + 8])
        for j in range(8):
            ls = Ls[j]
            lm = Lm[j]
            if clamp63:
                ls = min(63, ls)
                lm = min(63, lm)
            k4_pack_scale_min(out, bb, sc_at, j, ls, lm)
        d_all = store_f16(out, bb, d_at, d_block)
        dmin_all = store_f16(out, bb, dmin_at, m_block)
        for j in range(8):
            sc, m = k4_scale_min_inline(out, bb, sc_at, j)
            d = np.float32(d_all * np.float32(sc))
            if d == _F0:
                continue
            dm = np.float32(dmin_all * np.float32(m))
            for ii in range(32):
                l = nearest_int(np.float32(np.float32(np.float32(values[bb, 32 * j + ii]) + dm)
                                           / d))
                L[32 * j + ii] = max(0, min(nmax, l))


@inline_kernel
def k45_weighted_rows(values, qw, out, nmax, d_at, dmin_at, sc_at, clamp63):
    """The blocks of ``values`` [G, 256] two at a time through :func:`k45_weighted`, each
    block's quants packed (Q4_K nibbles, or Q5_K with ``clamp63``); -1, or the first block
    holding a non-finite value (nothing written then)."""
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    work = _k45_scratch()
    L2 = work[0][0]
    per_row = qw.shape[0] // 256
    g = values.shape[0]
    for b in range(0, g, 2):
        nb = min(2, g - b)
        k45_weighted(values, b, nb, qw, per_row, out, work, nmax, d_at, dmin_at, sc_at, clamp63)
        for h in range(nb):
            L = L2[256 * h:256 * h + 256]
            if clamp63:
                q5_pack_quants(out, b + h, _Q5_QL_AT, _Q5_QH_AT, L)
            else:
                for j in range(4):
                    for l in range(32):
                        out[b + h, _Q4_Q_AT + 32 * j + l] = np.uint8(
                            L[64 * j + l] | (L[64 * j + l + 32] << 4))
    return -1


@kernel
def quantize_q4_k_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> Q4_K records, weighted by ``qw``."""
    return k45_weighted_rows(values, qw, out, 15, _Q4_D_AT, _Q4_DMIN_AT, _Q4_SC_AT, False)


@kernel
def quantize_q5_k_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> Q5_K records, weighted by ``qw``."""
    return k45_weighted_rows(values, qw, out, 31, _Q5_D_AT, _Q5_DMIN_AT, _Q5_SC_AT, True)


# ---- Q6_K ------------------------------------------------------------------------------------------

_Q6_QL_AT, _Q6_QH_AT, _Q6_SC_AT, _Q6_D_AT = field_starts(_Q6, "ql", "qh", "sc", "d")
_Q6_BYTES = _Q6.block_bytes


@kernel
def quantize_block_q6_k_weighted(values, b, qw, qoff, out, work):
    (L, Laux, weight, scales, mins, sw, Ls, Lm), (xt, wt, Lt, scr, Lx) = work
    for j in range(16):
        for i in range(16):
            xt[i, j] = values[b, 16 * j + i]
            wt[i, j] = qw[qoff + 16 * j + i]
    make_qx_lanes_w(xt, wt, 16, 16, 32, Lt, scales, scr)  # make_qx_quants(16, 32, qw) per sub-block
    transpose_out(Lt, L, 16, 16)
    max_abs_scale, max_scale = signed_absmax(scales, 0, 16)
    if max_abs_scale < GROUP_MAX_EPS:
        for k in range(_Q6_BYTES):
            out[b, k] = 0
        return
    iscale = np.float32(np.float32(-128.0) / max_scale)
    d_all = store_f16(out, b, _Q6_D_AT, np.float32(np.float32(1.0) / iscale))
    for ib in range(16):
        sc = min(127, nearest_int(np.float32(iscale * scales[ib])))
        out[b, _Q6_SC_AT + ib] = np.uint8(sc & 0xFF)
    for j in range(16):
        d = np.float32(d_all * np.float32(np.int8(out[b, _Q6_SC_AT + j])))
        if d == _F0:
            continue
        for ii in range(16):
            l = nearest_int(np.float32(np.float32(values[b, 16 * j + ii]) / d))
            L[16 * j + ii] = max(-32, min(31, l)) + 32
    for c in range(2):
        for l in range(32):
            i = 128 * c + l
            out[b, _Q6_QL_AT + 64 * c + l] = np.uint8((L[i] & 0xF) | ((L[i + 64] & 0xF) << 4))
            out[b, _Q6_QL_AT + 64 * c + 32 + l] = np.uint8((L[i + 32] & 0xF) | ((L[i + 96] & 0xF) << 4))
            out[b, _Q6_QH_AT + 32 * c + l] = np.uint8(((L[i] >> 4) & 3) | (((L[i + 32] >> 4) & 3) << 2)
                                                      | (((L[i + 64] >> 4) & 3) << 4)
                                                      | (((L[i + 96] >> 4) & 3) << 6))


@kernel
def quantize_q6_k_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> Q6_K records, weighted by ``qw``."""
    return weighted_blocks(values, qw, out, quantize_block_q6_k_weighted, _kl_scratch(), 256)


# The weighted path per format: (kernel, what it reproduces), read by numba_qk._registry.
WEIGHTED = {
    _Q2: (quantize_q2_k_weighted, "ggml quantize_q2_K with quant_weights (quantize_row_q2_K_impl)"),
    _Q3: (quantize_q3_k_weighted, "ggml quantize_q3_K with quant_weights (quantize_row_q3_K_impl)"),
    _Q4: (quantize_q4_k_weighted, "ggml quantize_q4_K with quant_weights (quantize_row_q4_K_impl)"),
    _Q5: (quantize_q5_k_weighted, "ggml quantize_q5_K with quant_weights (quantize_row_q5_K_impl)"),
    _Q6: (quantize_q6_k_weighted, "ggml quantize_q6_K with quant_weights (quantize_row_q6_K_impl)"),
}
