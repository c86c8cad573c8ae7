"""IQ1_S / IQ1_M encoders: ggml's ``quantize_row_iq1_s_impl`` / ``quantize_row_iq1_m_impl`` as
``ggml_quantize_chunk`` calls them (``quantize_iq1_s`` / ``_m``, row by row), byte for byte.
ggml quantizes IQ1_S only with an importance matrix (``ggml_quantize_requires_imatrix``; the
``_impl`` asserts ``quant_weights``), IQ1_M with or without one (weights ``x^2`` then).  IQ1_M
works per 16 values with a shift per group of 8 (four sign patterns per sub-block), prefix
sums kept per half, then refits the super-block scale over all 256 values.

``encode_iq1_<t>(values, qw, out, grid, kmap, neighbours) -> -1 | first bad block`` (``@njit``,
the tables of ``grid_search.tables(iq1_s)``, shared by IQ1_M); ``quantize_iq1_s_weighted``,
``quantize_iq1_m_weighted(values, qw, out)`` and ``quantize_iq1_m(values, out)`` pass them
(frozen into them when they compile).  As in ``iq2_encode``: every C float step one
explicit f32 rounding in C order (no double, no FMA: see there), the records written to a
scratch array and copied into ``out`` only when every block is in the domain.

Per sub-block of 32, ggml sorts the values (glibc's ``qsort``: the glibc 2.36 of the oracles
merge-sorts, so equal values keep their order; here a stable insertion sort, for IQ1_M's 16
values the same order by counting), then tries every split of the sorted values into levels
-1, 0, 1 with the shifts ``+-1/8``.  Domain: finite
values on which ggml does not abort: a group off the grid whose every neighbour distance of
``iq1_find_best_neighbour2`` is >= FLT_MAX or NaN (ggml then scans the whole grid with an
out-of-bounds read, undefined behaviour, and asserts unless that finds a point; numba_qk
reports the block), or a final scale that is NaN (``GGML_ASSERT(scale >= 0)``).
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats import iq as _iq
from numba_qk.kernels._round import f32_to_f16_bits, nearest_int
from numba_qk.kernels.iq.iq2_encode import bad_block, encoder_entries, sigma2_of
from numba_qk.kernels.kquants.common import store_f16

_S1 = _iq.iq1_s
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_HALF = np.float32(0.5)
_FLT_MAX = np.float32(3.4028234663852886e38)
_GROUP_MAX_EPS_IQ1_S = np.float32(1e-12)
_DELTA = np.float32(0.125)
X_P = np.array([np.float32(-1) + _DELTA, _DELTA, _F1 + _DELTA], np.float32)
X_M = np.array([np.float32(-1) - _DELTA, -_DELTA, _F1 - _DELTA], np.float32)
_QH = _S1.field("qh").start


@inline_kernel
def max_abs(xb, n):
    """C's ``max = fabsf(xb[0]); max = MAX(max, fabsf(xb[i]))``."""
    mx = abs(xb[0])
    for i in range(1, n):
        ax = abs(xb[i])
        mx = mx if mx > ax else ax
    return mx


@inline_kernel
def stable_order(xb, order, n):
    """``order[:n]``: the indices of ``xb[:n]`` sorted by value, equal values in index order
    (glibc 2.36's msort, as the oracles' qsort; an insertion sort)."""
    for j in range(n):
        order[j] = j
    for j in range(1, n):
        t = order[j]
        k = j - 1
        while k >= 0 and xb[order[k]] > xb[t]:
            order[k + 1] = order[k]
            k -= 1
        order[k + 1] = t


@inline_kernel
def rank_order(xb, order, n):
    """``stable_order`` by counting, without its data-dependent branches (IQ1_M: ~6 % of the
    encoder's time): value ``i`` goes to position ``#{j: x_j < x_i} + #{j < i: x_j == x_i}``,
    its place in the stable sort (finite values, +-0 equal, as the insertion sort compares)."""
    for i in range(n):
        xi = xb[i]
        r = 0
        for j in range(i):
            r += np.int64(xb[j] <= xi)
        for j in range(i + 1, n):
            r += np.int64(xb[j] < xi)
        order[r] = i


@inline_kernel
def levels_of(L, order, n, i1, i2, flip):
    """The levels of the best split: sorted positions below ``i1`` 0, below ``i2`` 1, the rest
    2; with ``flip`` (a negative scale) 2 - level."""
    for j in range(n):
        L[order[j]] = 0 if j < i1 else (1 if j < i2 else 2)
    if flip:
        for j in range(n):
            L[j] = 2 - L[j]


@inline_kernel
def best_neighbour(neighbours, start, grid, xb, weight, scale, L, lo, xx, tab):
    """``find_best_neighbour`` for IQ1 (grid values 1, 3, 5 -> ``xx``): the terms
    ``R32(R32(w_i * diff) * diff)`` of each position and level made once per group."""
    for i in range(8):
        w = weight[lo + i]
        x = xb[lo + i]
        for l in range(3):
            diff = np.float32(np.float32(scale * xx[l]) - x)
            tab[8 * i + 2 * l + 1] = np.float32(np.float32(w * diff) * diff)
    m = np.int32(neighbours[start])
    best_d2 = _FLT_MAX
    gi = -1
    for j in range(1, m + 1):
        idx = np.int32(neighbours[start + j])
        d2 = _F0
        for i in range(8):
            d2 = np.float32(d2 + tab[8 * i + np.int32(grid[idx, i])])
        if d2 < best_d2:
            best_d2 = d2
            gi = idx
    if gi >= 0:
        for i in range(8):
            L[lo + i] = (np.int32(grid[gi, i]) - 1) >> 1
    return gi


@inline_kernel
def snap_groups(ngroups, L, xb, weight, scale, xx0, xx1, grid, kmap, neighbours, index, tab):
    """Groups of 8 levels to grid indices (``index``; ``iq1_find_best_neighbour2`` for a group
    off the grid, the scale then refitted over all groups); group 0 has the level values
    ``xx0``, the others ``xx1``.  Returns ``(scale, ok)``; ``ok`` False where ggml aborts."""
    all_on_grid = True
    for k in range(ngroups):
        xx = xx0 if k == 0 else xx1
        u = 0
        for j in range(8):
            u |= L[8 * k + j] << (2 * j)
        gi = np.int32(kmap[u])
        if gi < 0:
            all_on_grid = False
            gi = best_neighbour(neighbours, -gi - 1, grid, xb, weight, scale, L, 8 * k, xx, tab)
            if gi < 0:
                return scale, False
        index[k] = gi
    if not all_on_grid:
        sumqx = _F0
        sumq2 = _F0
        for k in range(ngroups):
            xx = xx0 if k == 0 else xx1
            for j in range(8):
                w = weight[8 * k + j]
                q = xx[(np.int32(grid[index[k], j]) - 1) // 2]
                sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * xb[8 * k + j]))
                sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
        if sumqx > _F0 and sumq2 > _F0:
            scale = np.float32(sumqx / sumq2)
    return scale, True


@kernel
def encode_iq1_s(values, qw, out, grid, kmap, neighbours):
    """ggml's ``quantize_iq1_s`` with ``quant_weights = qw`` (rows of ``len(qw)``)."""
    per_row = qw.shape[0] // 256
    rec = np.zeros_like(out)
    weight = np.zeros(32, np.float32)
    xb = np.zeros(32, np.float32)
    order = np.zeros(32, np.int64)
    sumx = np.zeros(33, np.float32)
    sumw = np.zeros(33, np.float32)
    tx = np.zeros((2, 33), np.float32)
    tw = np.zeros((2, 33), np.float32)
    L = np.zeros(32, np.int32)
    index = np.zeros(4, np.int32)
    tab = np.zeros(64, np.float32)
    scales = np.zeros(8, np.float32)
    shifts = np.zeros(8, np.int32)
    for b in range(values.shape[0]):
        if bad_block(values, b):
            return b
        qoff = 256 * (b % per_row)
        max_scale = _F0
        sigma2 = sigma2_of(values, b, True)
        for ib in range(8):
            for i in range(32):
                x = values[b, 32 * ib + i]
                xb[i] = x
                weight[i] = np.float32(qw[qoff + 32 * ib + i]
                                       * np.float32(np.sqrt(np.float32(sigma2
                                                                       + np.float32(x * x)))))
            mx = max_abs(xb, 32)
            if mx < _GROUP_MAX_EPS_IQ1_S:
                scales[ib] = _F0
                shifts[ib] = 1
                continue
            stable_order(xb, order, 32)
            sumx[0] = _F0
            sumw[0] = _F0
            for j in range(32):
                i = order[j]
                sumx[j + 1] = np.float32(sumx[j] + np.float32(weight[i] * xb[i]))
                sumw[j + 1] = np.float32(sumw[j] + weight[i])
            best_score = -_FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_shift = 0
            for i2 in range(33):            # the terms of the top group (C's third terms)
                for t in range(2):
                    xs = X_P if t == 0 else X_M
                    tx[t, i2] = np.float32(np.float32(sumx[32] - sumx[i2]) * xs[2])
                    tw[t, i2] = np.float32(np.float32(np.float32(sumw[32] - sumw[i2]) * xs[2])
                                           * xs[2])
            for i1 in range(33):
                ax_p = np.float32(np.float32(sumx[i1] - sumx[0]) * X_P[0])
                aw_p = np.float32(np.float32(np.float32(sumw[i1] - sumw[0]) * X_P[0]) * X_P[0])
                ax_m = np.float32(np.float32(sumx[i1] - sumx[0]) * X_M[0])
                aw_m = np.float32(np.float32(np.float32(sumw[i1] - sumw[0]) * X_M[0]) * X_M[0])
                for i2 in range(i1, 33):
                    dx = np.float32(sumx[i2] - sumx[i1])
                    dw = np.float32(sumw[i2] - sumw[i1])
                    sumqx = np.float32(np.float32(ax_p + np.float32(dx * X_P[1])) + tx[0, i2])
                    sumq2 = np.float32(np.float32(aw_p + np.float32(np.float32(dw * X_P[1])
                                                                    * X_P[1])) + tw[0, i2])
                    if sumq2 > _F0 and np.float32(sumqx * sumqx) > np.float32(best_score * sumq2):
                        scale = np.float32(sumqx / sumq2)
                        best_score = np.float32(scale * sumqx)
                        besti1 = i1
                        besti2 = i2
                        best_shift = 1
                    sumqx = np.float32(np.float32(ax_m + np.float32(dx * X_M[1])) + tx[1, i2])
                    sumq2 = np.float32(np.float32(aw_m + np.float32(np.float32(dw * X_M[1])
                                                                    * X_M[1])) + tw[1, i2])
                    if sumq2 > _F0 and np.float32(sumqx * sumqx) > np.float32(best_score * sumq2):
                        scale = np.float32(sumqx / sumq2)
                        best_score = np.float32(scale * sumqx)
                        besti1 = i1
                        besti2 = i2
                        best_shift = -1
            if besti1 < 0 or besti2 < 0 or best_shift == 0:
                scales[ib] = _F0
                shifts[ib] = 1
                continue
            levels_of(L, order, 32, besti1, besti2, scale < _F0)
            if scale < _F0:
                scale = -scale
                best_shift = -best_shift
            xx = X_P if best_shift == 1 else X_M
            scale, ok = snap_groups(4, L, xb, weight, scale, xx, xx, grid, kmap, neighbours,
                                    index, tab)
            if not ok:
                return b
            h = 0
            for k in range(4):
                rec[b, 2 + 4 * ib + k] = np.uint8(index[k] & 255)
                h |= (index[k] >> 8) << (3 * k)
            rec[b, _QH + 2 * ib] = np.uint8(h & 0xFF)
            rec[b, _QH + 2 * ib + 1] = np.uint8((h >> 8) & 0xFF)
            if not scale >= _F0:
                return b
            scales[ib] = scale
            shifts[ib] = best_shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _F0:
            continue
        d = np.float32(max_scale / np.float32(15.0))
        store_f16(rec, b, 0, np.float32(d * np.float32(1.125)))
        idv = np.float32(_F1 / d)
        for ib in range(8):
            l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * scales[ib]) - _F1)))
            l = max(0, min(7, l))
            if shifts[ib] == -1:
                l |= 8
            rec[b, _QH + 2 * ib + 1] |= np.uint8((l << 4) & 0xFF)
    out[:] = rec
    return -1


_M1 = _iq.iq1_m
_GROUP_MAX_EPS_IQ1_M = np.float32(1e-7)
_M_QH, _M_SC = _M1.field("qh").start, _M1.field("ls").start
_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.int32)
_CP1 = np.float32(np.float32(X_P[0] * X_P[0]) - np.float32(X_P[1] * X_P[1]))
_CP2 = np.float32(np.float32(X_P[1] * X_P[1]) - np.float32(X_P[2] * X_P[2]))
_CM1 = np.float32(np.float32(X_M[0] * X_M[0]) - np.float32(X_M[1] * X_M[1]))
_CM2 = np.float32(np.float32(X_M[1] * X_M[1]) - np.float32(X_M[2] * X_M[2]))


@inline_kernel
def _m_weights(values, b, off, qw, qoff, sigma2, weight):
    """IQ1_M's weights: ``qw_i * sqrtf(sigma2 + x_i^2)``, without ``qw`` ``x_i^2``."""
    for i in range(16):
        x = values[b, off + i]
        if qw.shape[0]:
            weight[i] = np.float32(qw[qoff + i] * np.float32(np.sqrt(np.float32(
                sigma2 + np.float32(x * x)))))
        else:
            weight[i] = np.float32(x * x)


@inline_kernel
def _xx_of(k, best_k):
    """The level values of group ``k`` (0, 1) for the shift pattern ``best_k``."""
    if k == 0:
        return X_P if best_k < 2 else X_M
    return X_P if best_k % 2 == 0 else X_M


@kernel
def encode_iq1_m(values, qw, out, grid, kmap, neighbours):
    """ggml's ``quantize_iq1_m`` with ``quant_weights = qw`` (rows of ``len(qw)``), or without
    an importance matrix where ``len(qw) == 0``."""
    per_row = max(qw.shape[0] // 256, 1)
    rec = np.zeros_like(out)
    weight = np.zeros(16, np.float32)
    xb = np.zeros(16, np.float32)
    order = np.zeros(16, np.int64)
    px = np.zeros((2, 17), np.float32)
    pw = np.zeros((2, 17), np.float32)
    L = np.zeros(16, np.int32)
    index = np.zeros(2, np.int32)
    tab = np.zeros(64, np.float32)
    scales = np.zeros(16, np.float32)
    shifts = np.zeros(16, np.int32)
    hp = np.zeros((2, 4), np.float32)
    w1 = np.zeros((2, 4, 17), np.float32)
    sc = np.zeros(4, np.int32)
    wblock = np.zeros(256, np.float32)
    for b in range(values.shape[0]):
        if bad_block(values, b):
            return b
        qoff = 256 * (b % per_row)
        max_scale = _F0
        sigma2 = sigma2_of(values, b, True)
        for ib in range(16):
            _m_weights(values, b, 16 * ib, qw, qoff + 16 * ib, sigma2, weight)
            for i in range(16):
                xb[i] = values[b, 16 * ib + i]
                wblock[16 * ib + i] = weight[i]
            mx = max_abs(xb, 16)
            if mx < _GROUP_MAX_EPS_IQ1_M:
                scales[ib] = _F0
                shifts[ib] = 0
                continue
            rank_order(xb, order, 16)
            px[0, 0] = _F0
            px[1, 0] = _F0
            pw[0, 0] = _F0
            pw[1, 0] = _F0
            for j in range(16):
                i = order[j]
                h = 0 if i < 8 else 1
                px[h, j + 1] = np.float32(px[h, j] + np.float32(weight[i] * xb[i]))
                px[1 - h, j + 1] = px[1 - h, j]
                pw[h, j + 1] = np.float32(pw[h, j] + weight[i])
                pw[1 - h, j + 1] = pw[1 - h, j]
            best_score = -_FLT_MAX
            scale = mx
            besti1 = -1
            besti2 = -1
            best_k = -1
            p2 = X_P[2]
            m2 = X_M[2]
            # the products that depend on one end of the pair only, each computed once (the
            # same f32 operations as ggml's loop, which computes them per pair)
            for h in range(2):
                hp[h, 0] = np.float32(px[h, 16] * p2)
                hp[h, 1] = np.float32(px[h, 16] * m2)
                hp[h, 2] = np.float32(np.float32(pw[h, 16] * p2) * p2)
                hp[h, 3] = np.float32(np.float32(pw[h, 16] * m2) * m2)
                for i in range(17):
                    w1[h, 0, i] = np.float32(pw[h, i] * _CP1)
                    w1[h, 1, i] = np.float32(pw[h, i] * _CM1)
                    w1[h, 2, i] = np.float32(pw[h, i] * _CP2)
                    w1[h, 3, i] = np.float32(pw[h, i] * _CM2)
            pxp0, pxm0, pwp0, pwm0 = hp[0, 0], hp[0, 1], hp[0, 2], hp[0, 3]
            pxp1, pxm1, pwp1, pwm1 = hp[1, 0], hp[1, 1], hp[1, 2], hp[1, 3]
            for i1 in range(17):
                ep0 = np.float32(pwp0 + w1[0, 0, i1])
                fm0 = np.float32(pwm0 + w1[0, 1, i1])
                ep1 = np.float32(pwp1 + w1[1, 0, i1])
                fm1 = np.float32(pwm1 + w1[1, 1, i1])
                for i2 in range(i1, 17):
                    sx0 = np.float32(px[0, i1] + px[0, i2])
                    sx1 = np.float32(px[1, i1] + px[1, i2])
                    qxp0 = np.float32(pxp0 - sx0)
                    qxm0 = np.float32(pxm0 - sx0)
                    qxp1 = np.float32(pxp1 - sx1)
                    qxm1 = np.float32(pxm1 - sx1)
                    q2p0 = np.float32(ep0 + w1[0, 2, i2])
                    q2m0 = np.float32(fm0 + w1[0, 3, i2])
                    q2p1 = np.float32(ep1 + w1[1, 2, i2])
                    q2m1 = np.float32(fm1 + w1[1, 3, i2])
                    for k in range(4):
                        a = qxp0 if k < 2 else qxm0
                        c = qxp1 if k % 2 == 0 else qxm1
                        e = q2p0 if k < 2 else q2m0
                        f = q2p1 if k % 2 == 0 else q2m1
                        sqx = np.float32(a + c)
                        sq2 = np.float32(e + f)
                        if sq2 > _F0 and (np.float32(sqx * sqx)
                                          > np.float32(best_score * sq2)):
                            scale = np.float32(sqx / sq2)
                            best_score = np.float32(scale * sqx)
                            besti1 = i1
                            besti2 = i2
                            best_k = k
            if besti1 < 0 or besti2 < 0 or best_k < 0:
                scales[ib] = _F0
                shifts[ib] = 0
                continue
            levels_of(L, order, 16, besti1, besti2, scale < _F0)
            if scale < _F0:
                scale = -scale
                best_k = 3 - best_k
            scale, ok = snap_groups(2, L, xb, weight, scale, _xx_of(0, best_k),
                                    _xx_of(1, best_k), grid, kmap, neighbours, index, tab)
            if not ok:
                return b
            rec[b, 2 * ib] = np.uint8(index[0] & 255)
            rec[b, 2 * ib + 1] = np.uint8(index[1] & 255)
            rec[b, _M_QH + ib] = np.uint8((index[0] >> 8) | ((index[1] >> 8) << 4))
            if not scale >= _F0:
                return b
            scales[ib] = scale
            shifts[ib] = best_k
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _F0:
            continue
        for t in range(4):
            sc[t] = 0
        d = np.float32(max_scale / np.float32(15.0))
        idv = np.float32(_F1 / d)
        sumqx = _F0
        sumq2 = _F0
        for ib in range(16):
            l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * scales[ib]) - _F1)))
            l = max(0, min(7, l))
            sc[ib // 4] |= l << (3 * (ib % 4))
            qh = np.int32(rec[b, _M_QH + ib]) | _MASKS[shifts[ib]]
            rec[b, _M_QH + ib] = np.uint8(qh)
            fl = np.float32(2 * l + 1)
            for k in range(2):
                xx = _xx_of(k, shifts[ib])
                gi = np.int32(rec[b, 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = wblock[16 * ib + 8 * k + j]
                    q = np.float32(xx[(np.int32(grid[gi, j]) - 1) // 2] * fl)
                    x = values[b, 16 * ib + 8 * k + j]
                    sumqx = np.float32(sumqx + np.float32(np.float32(w * q) * x))
                    sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
        if sumq2 > _F0:
            d = np.float32(sumqx / sumq2)
        s16 = np.int32(f32_to_f16_bits(np.float32(d * np.float32(1.1125))))
        sc[0] |= (s16 & 0x000F) << 12
        sc[1] |= (s16 & 0x00F0) << 8
        sc[2] |= (s16 & 0x0F00) << 4
        sc[3] |= s16 & 0xF000
        for t in range(4):
            rec[b, _M_SC + 2 * t] = np.uint8(sc[t] & 0xFF)
            rec[b, _M_SC + 2 * t + 1] = np.uint8((sc[t] >> 8) & 0xFF)
    out[:] = rec
    return -1


quantize_iq1_s_weighted = encoder_entries(_S1, encode_iq1_s)[0]
quantize_iq1_m_weighted, quantize_iq1_m = encoder_entries(_M1, encode_iq1_m)


WEIGHTED = {
    _S1: (quantize_iq1_s_weighted, "ggml quantize_iq1_s (quantize_row_iq1_s_impl) with "
                                   "quant_weights"),
    _M1: (quantize_iq1_m_weighted, "ggml quantize_iq1_m (quantize_row_iq1_m_impl) with "
                                   "quant_weights"),
}
QUANTIZER_M = "ggml ggml_quantize_chunk (quantize_iq1_m, no imatrix)"
REQUIRES_IMATRIX = {_S1: "grid"}
