"""IQ2_XXS / IQ2_XS / IQ2_S encoders: ggml's ``quantize_row_iq2_xxs_impl``,
``quantize_row_iq2_xs_impl`` and ``quantize_row_iq2_s_impl`` as ``ggml_quantize_chunk`` calls
them (``quantize_iq2_*``, row by row), byte for byte.  ggml quantizes IQ2_XXS and IQ2_XS only
with an importance matrix (``ggml_quantize_requires_imatrix``; their ``_impl`` asserts
``quant_weights``); IQ2_S with or without one.

``encode_iq2_<t>(values, qw, out, grid, kmap, neighbours) -> -1 | first bad block`` (``@njit``):
f32 ``values`` [G, 256] whose blocks run along rows of ``len(qw)`` values (IQ2_S: ``qw`` of
length 0 = no importance matrix), ``grid / kmap / neighbours`` the search tables of the format
(``grid_search.tables(fmt)``).  The records go to a scratch array and are copied into ``out``
only when every block is in the domain: a block holding a non-finite value, or one on which
ggml's search would abort the process (see below), is reported (the first one) and ``out`` is
left untouched.  ``quantize_iq2_<t>_weighted(values, qw, out)`` / ``quantize_iq2_s(values, out)``
(``@njit`` too) pass the tables, which are made when they compile and frozen into them.

Numerics: every C float step is one explicit f32 rounding in C's evaluation order (``a*b*c`` is
``R32(R32(a*b)*c)``, ``s += a*b`` is ``R32(s + R32(a*b))``; no double anywhere in these C
functions).  No step is fused: ggml-quants.c is compiled into libggml-base, which both oracles
(the native llama.cpp 0.3.36 build and libggml-python) build without ``-march`` flags
(x86-64 baseline: no FMA instruction exists in either libggml-base.so, so GCC cannot contract
``a*b+c``); the byte comparisons in tests/iq/test_iq2_encode.py confirm it.

Domain: finite values on which ggml does not abort.  ggml aborts (``GGML_ASSERT`` /
``GGML_ABORT``) when, for some group of 8, every weighted squared distance of
``iq2_find_best_neighbour`` is >= FLT_MAX or NaN (no neighbour chosen), when a sub-block's final
scale is NaN (``GGML_ASSERT(scale >= 0)``), or when its final codes are off the grid ("Oops");
these kernels follow the C step by step and report the block where that happens.  It happens
once the weighted products ``sqrt(w) * (scale*q - x)^2`` overflow f32: about |x| > 1e10 with
imatrix weights near 1 (docs/numerics_iq_grid.md).
"""

import numpy as np
from llvmlite import ir

from numba.core import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

from numba_qk._jit import closure_named, inline_kernel, kernel
from numba_qk.formats import iq as _iq
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.iq import grid_search as _gs
from numba_qk.kernels.kquants.common import store_f16
from numba_qk.kernels.kquants.weighted import make_qp_quants

_XXS, _XS, _S = _iq.iq2_xxs, _iq.iq2_xs, _iq.iq2_s
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_HALF = np.float32(0.5)
_TENTH = np.float32(0.1)
_FLT_MAX = np.float32(3.4028234663852886e38)
_GROUP_MAX_EPS = np.float32(1e-15)
_GROUP_MAX_EPS_IQ2_S = np.float32(1e-8)
_KMAX_Q = 3
_KMAP_SIZE = _gs.KMAP_SIZE
_S_QH, _S_SIGNS, _S_SC = _S.field("qh").start, _S.field("signs").start, _S.field("ls").start
_XS_SC = _XS.field("ls").start


@intrinsic
def weighted_d2_8(typingctx, grid, at, scale, xval, waux, xo):
    """``d2 = 0; d2 += waux[xo+i] * (scale * grid.flat[at+i] - xval[xo+i])^2`` for i = 0..7:
    the loop of ``find_best_neighbour`` with ``n`` = 8, each step one f32 rounding in C's order
    (``R32(R32(R32(w * diff) * diff))``, the sum left to right from 0), as 8-lane vector steps
    (the eight products are independent) and an in-order fold of the lanes: the loop's bits,
    about a third of its instructions.  ``grid`` int8, ``xval`` / ``waux`` f32, all C-contiguous
    (the encoders' tables and scratch); the caller keeps ``at + 8`` and ``xo + 8`` in bounds."""
    def c_array(a, dtype):
        return isinstance(a, types.Array) and a.dtype == dtype and a.layout == "C"
    if not (c_array(grid, types.int8) and c_array(xval, types.float32)
            and c_array(waux, types.float32)):
        raise TypingError("weighted_d2_8: int8 grid, f32 xval / waux, all C-contiguous")
    sig = types.float32(grid, types.intp, types.float32, xval, waux, types.intp)

    def codegen(context, builder, signature, args):
        f32, f8 = ir.FloatType(), ir.VectorType(ir.FloatType(), 8)

        def lanes(k, ty, offset, elem):
            data = context.make_array(signature.args[k])(context, builder, args[k]).data
            ptr = builder.bitcast(builder.gep(data, [offset]), ir.VectorType(elem, 8).as_pointer())
            return builder.load(ptr, align=1)

        q = builder.sitofp(lanes(0, grid, args[1], ir.IntType(8)), f8)
        x, w = lanes(3, xval, args[5], f32), lanes(4, waux, args[5], f32)
        s = builder.insert_element(ir.Constant(f8, ir.Undefined), args[2], ir.Constant(ir.IntType(32), 0))
        s = builder.shuffle_vector(s, ir.Constant(f8, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8))
        diff = builder.fsub(builder.fmul(s, q), x)
        p = builder.fmul(builder.fmul(w, diff), diff)
        d2 = ir.Constant(f32, 0.0)
        for i in range(8):
            d2 = builder.fadd(d2, builder.extract_element(p, ir.Constant(ir.IntType(32), i)))
        return d2

    return sig, codegen


@inline_kernel
def find_best_neighbour(neighbours, start, grid, xval, xo, waux, scale, L, lo, n=8, xx=None):
    """ggml's ``iq2_find_best_neighbour`` (``n`` = 8 values from ``xo``; ``n`` = 4:
    ``iq3_find_best_neighbour``): among the neighbour list at ``neighbours[start]`` (count, then
    entries), the entry minimising ``sum_i waux_i * (scale*q_i - x_i)^2`` (f32, in order, first
    of equals); writes its levels ``(g - 1) / 2`` (``g`` its grid values) to ``L[lo:lo+n]`` and
    returns it, or returns -1 (L untouched) where ggml's ``GGML_ASSERT(grid_index >= 0)``
    aborts.  ``q = g``; with ``xx``, ``q = xx[(g - 1) / 2]`` (``iq1_find_best_neighbour2`` of
    IQ1_S / IQ1_M, where ggml then scans the whole grid out of bounds and asserts)."""
    m = np.int32(neighbours[start])
    best_d2 = _FLT_MAX
    gi = -1
    for j in range(1, m + 1):
        idx = np.int32(neighbours[start + j])
        if n == 8 and xx is None:
            d2 = weighted_d2_8(grid, idx * 8, scale, xval, waux, xo)
        else:
            d2 = _F0
            for i in range(n):
                if xx is None:   # pruned at compile time: one loop per case
                    q = np.float32(grid[idx, i])
                else:
                    q = xx[(np.int32(grid[idx, i]) - 1) // 2]
                diff = np.float32(np.float32(scale * q) - xval[xo + i])
                d2 = np.float32(d2 + np.float32(np.float32(waux[xo + i] * diff) * diff))
        if d2 < best_d2:
            best_d2 = d2
            gi = idx
    if gi >= 0:
        for i in range(n):
            L[lo + i] = (np.int32(grid[gi, i]) - 1) // 2
    return gi


@inline_kernel
def grid_levels(idv, xval, xo, L, lo):
    """``l_i = clamp(nearest_int(0.5f * (idv * x_i - 1)), 0, 2)`` into ``L[lo:lo+8]``; returns
    the code ``u = sum l_i << 2i``."""
    u = 0
    for i in range(8):
        l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * xval[xo + i]) - _F1)))
        l = max(0, min(_KMAX_Q - 1, l))
        L[lo + i] = l
        u |= l << (2 * i)
    return u


@inline_kernel
def snap(idv, scale, xval, waux, xo, L, lo, grid, kmap, neighbours):
    """Levels of group ``xo`` at ``1/idv``, moved onto the grid as ggml does (the best
    neighbour at ``scale`` when off it): the grid index, -1 where ggml aborts; ``L[lo:lo+8]``
    the levels (the rounded ones where they are on the grid).  Also returns whether the
    rounded levels were on the grid."""
    u = grid_levels(idv, xval, xo, L, lo)
    gi = np.int32(kmap[u])
    if gi >= 0:
        return gi, True
    return find_best_neighbour(neighbours, -gi - 1, grid, xval, xo, waux, scale, L, lo), False


@inline_kernel
def weighted_sums(weight, xval, L, n):
    """``sumqx = sum R32(R32(w*x)*q)``, ``sumq2 = sum R32(R32(w*q)*q)``, ``q = 2 L + 1``."""
    sumqx = _F0
    sumq2 = _F0
    for i in range(n):
        w = weight[i]
        q = np.float32(2 * L[i] + 1)
        sumqx = np.float32(sumqx + np.float32(np.float32(w * xval[i]) * q))
        sumq2 = np.float32(sumq2 + np.float32(np.float32(w * q) * q))
    return sumqx, sumq2


@inline_kernel
def code_of(L, lo):
    """C's ``uint16_t u |= (L[i] << 2*i)`` over 8 int8 levels (sign-extended, 16 bits kept)."""
    u = 0
    for i in range(8):
        u |= np.int32(np.int8(L[lo + i])) << (2 * i)
    return u & 0xFFFF


@inline_kernel
def sigma2_of(values, b, twice):
    """``sumx2 / 256`` (``twice``: ``2 * sumx2 / 256``, IQ2_S), ``sumx2 = sum R32(x*x)``."""
    s = _F0
    for i in range(256):
        x = values[b, i]
        s = np.float32(s + np.float32(x * x))
    if twice:
        s = np.float32(np.float32(2.0) * s)
    return np.float32(s / np.float32(256.0))


@inline_kernel
def block_weights(values, b, off, n, qw, qoff, sigma2, weight, waux):
    """``weight_i = qw_i * sqrtf(sigma2 + x_i^2)`` (IQ2_S without qw: ``0.25f*sigma2 + x_i^2``),
    ``waux_i = sqrtf(weight_i)``."""
    for i in range(n):
        x = values[b, off + i]
        x2 = np.float32(x * x)
        if qw.shape[0]:
            weight[i] = np.float32(qw[qoff + i] * np.float32(np.sqrt(np.float32(sigma2 + x2))))
        else:
            weight[i] = np.float32(np.float32(np.float32(0.25) * sigma2) + x2)
        waux[i] = np.float32(np.sqrt(weight[i]))


@inline_kernel
def plain_signs(values, b, off, k, xval):
    """The signs of group ``k`` (8 values from ``off + 8 k``): ``|x|`` into ``xval``, the
    sign bits (bit i set where x_i < 0) returned."""
    s = 0
    for i in range(8):
        x = values[b, off + 8 * k + i]
        if x >= _F0:
            xval[8 * k + i] = x
        else:
            xval[8 * k + i] = -x
            s |= 1 << i
    return s


@inline_kernel
def even_signs(values, b, off, k, weight, xval):
    """ggml's sign handling of IQ2_XXS / IQ2_XS / IQ3_XXS for group ``k``: ``xval = |x|``, and
    for an odd number of negatives the element of least ``R32(R32(w*x)*x)`` keeps its sign
    (flipped in ``xval``); returns the 7 stored sign bits."""
    s = plain_signs(values, b, off, k, xval)
    nflip = 0
    for i in range(8):
        nflip += (s >> i) & 1
    if nflip % 2:
        imin = 0
        x = values[b, off + 8 * k]
        mn = np.float32(np.float32(weight[8 * k] * x) * x)
        for i in range(1, 8):
            x = values[b, off + 8 * k + i]
            ax = np.float32(np.float32(weight[8 * k + i] * x) * x)
            if ax < mn:
                mn = ax
                imin = i
        xval[8 * k + imin] = -xval[8 * k + imin]
        s ^= 1 << imin
    return s & 127


@inline_kernel
def better_scale(sumqx, sumq2, best, scale):
    """ggml's choice among candidate scales: ``(scale, best, True)`` with the candidate's scale
    ``sumqx / sumq2`` where ``sumq2 > 0`` and ``sumqx^2 > best * sumq2``, else the old ``(scale,
    best, False)``.  Scalars only: the caller keeps the candidate's levels (``take_levels``)
    where it wins -- arrays passed to a helper on every candidate cost reference counts
    (measured: IQ2_S 1.25x the time)."""
    if sumq2 > _F0 and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
        scale = np.float32(sumqx / sumq2)
        return scale, np.float32(scale * sumqx), True
    return scale, best, False


@inline_kernel
def take_levels(L, Laux, n, on, on_aux, ngroups):
    """A winning candidate's levels ``Laux[:n]`` and its groups' on-grid flags
    ``on_aux[:ngroups]`` kept in ``L`` / ``on``."""
    for i in range(n):
        L[i] = Laux[i]
    for k in range(ngroups):
        on[k] = on_aux[k]


# Compile time: the per-group helpers above (grid_levels, find_best_neighbour, snap, ...) are
# inlined (as calls they made the encoders 1.3-1.6x slower); the sub-block searches below
# (settle, try_scales, search16, block16, block32) are ordinary calls.  Numba's IR inlining copies
# the callee's scope once per block, so nesting them all made each IQ2 encoder take 25-33 s to
# compile; as calls, 3-10 s, at the same speed (bench/imatrix_vs_ggml.py: 0.67-0.81x ggml).
@kernel
def settle(u, kmap, neighbours, grid, xval, xo, waux, scale, L, lo, n):
    """The grid point of a group (``n`` values at ``xo``) whose rounded levels have code ``u``,
    at the final ``scale``: the code's own point where it is on the grid, else its best
    neighbour (``find_best_neighbour``); that point's levels go to ``L[lo:lo+n]``.  Returns the
    grid index, -1 where ggml aborts."""
    gi = np.int32(kmap[u])
    if gi < 0:
        gi = find_best_neighbour(neighbours, -gi - 1, grid, xval, xo, waux, scale, L, lo, n)
        if gi < 0:
            return gi
    for i in range(n):
        L[lo + i] = (np.int32(grid[gi, i]) - 1) // 2
    return gi


@inline_kernel
def refit(weight, xval, L, n, scale):
    """ggml's last least-squares scale ``sumqx / sumq2`` of the levels ``L[:n]``
    (``weighted_sums``); ``scale`` unchanged where ``sumq2 <= 0``."""
    sumqx, sumq2 = weighted_sums(weight, xval, L, n)
    return np.float32(sumqx / sumq2) if sumq2 > _F0 else scale


@inline_kernel
def max_of(xval, n):
    """C's ``max = xval[0]; max = MAX(max, xval[i])``."""
    mx = xval[0]
    for i in range(1, n):
        mx = mx if mx > xval[i] else xval[i]
    return mx


@kernel
def try_scales(nis, top, scale, xval, weight, waux, L, Laux, on, on_aux, ngroups, grid, kmap,
               neighbours):
    """ggml's candidate scales of an IQ2 sub-block of ``ngroups`` groups of 8: ``id = (2 kMaxQ
    - 1 + 0.1 is) / top`` for ``is = -nis .. nis``, the groups' levels at ``1/id`` snapped to the
    grid (``snap``, on-grid flags into ``on_aux``), each candidate judged by ``better_scale``
    against the best so far, from ``scale`` (kept where none wins).  Returns ``(scale, ok)``;
    ``ok`` False where ggml aborts in ``iq2_find_best_neighbour``."""
    best = _F0
    n = 8 * ngroups
    for is_ in range(-nis, nis + 1):
        idv = np.float32(np.float32(np.float32(2 * _KMAX_Q - 1)
                                    + np.float32(np.float32(is_) * _TENTH)) / top)
        this_scale = np.float32(_F1 / idv)
        for k in range(ngroups):
            gi, hit = snap(idv, this_scale, xval, waux, 8 * k, Laux, 8 * k, grid, kmap,
                           neighbours)
            if gi < 0:
                return scale, False
            on_aux[k] = hit
        sumqx, sumq2 = weighted_sums(weight, xval, Laux, n)
        scale, best, won = better_scale(sumqx, sumq2, best, scale)
        if won:
            take_levels(L, Laux, n, on, on_aux, ngroups)
    return scale, True


@kernel
def search16(xval, weight, waux, L, Laux, on, on_aux, mx, grid, kmap, neighbours):
    """The scale search of ``quantize_row_iq2_xs_impl`` / ``_iq2_s_impl`` for one sub-block of
    16 (``is = -9 .. 9``, then the off-grid groups redone at the best scale): levels in ``L``,
    returns ``(scale, ok)``; ``ok`` False where ggml aborts in ``iq2_find_best_neighbour``."""
    on[0] = True
    on[1] = True
    scale, ok = try_scales(9, mx, np.float32(mx / np.float32(2 * _KMAX_Q - 1)), xval, weight,
                           waux, L, Laux, on, on_aux, 2, grid, kmap, neighbours)
    if not ok:
        return scale, False
    if (not on[0] or not on[1]) and scale > _F0:
        idv = np.float32(_F1 / scale)
        for k in range(2):
            if on[k]:
                continue
            gi, hit = snap(idv, scale, xval, waux, 8 * k, L, 8 * k, grid, kmap, neighbours)
            if gi < 0:
                return scale, False
        scale = refit(weight, xval, L, 16, scale)
    return scale, True


@inline_kernel
def final_index(L, lo, kmap):
    """The grid index of the final levels ``L[lo:lo+8]``, or -1 where ggml aborts ("Oops: found
    point not on grid"; a code past ggml's map, which C would read out of bounds, too)."""
    u = code_of(L, lo)
    return np.int32(kmap[u]) if u < _KMAP_SIZE else np.int32(-1)


@inline_kernel
def ls_code(idv, scale):
    """``clamp(nearest_int(0.5f * (id * scale - 1)), 0, 15)``."""
    l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * scale) - _F1)))
    return max(0, min(15, l))


@inline_kernel
def final_codes(scale, L, bs, gi, ngroups, sign_mask, kmap):
    """The end of an IQ2 sub-block as ggml does it: a negative scale made positive with every
    stored sign bit flipped (``sign_mask``: 127 for 7 bits, 255 for 8), the grid indices of the
    groups' final levels into ``gi``.  Returns ``(scale, status)``: 1, or -1 where ggml aborts
    (a final level off the grid, a NaN scale)."""
    if scale < _F0:
        scale = -scale
        for k in range(ngroups):
            bs[k] = (~bs[k]) & sign_mask
    for k in range(ngroups):
        gi[k] = final_index(L, 8 * k, kmap)
        if gi[k] < 0:
            return scale, -1
    if not scale >= _F0:
        return scale, -1
    return scale, 1


@kernel
def bad_block(values, b):
    """Whether row ``b`` of ``values`` holds a non-finite value (``v - v`` is not +0)."""
    for i in range(values.shape[1]):
        v = values[b, i]
        if (v - v) != _F0:
            return True
    return False


@kernel
def block16(values, b, ib, qw, qoff, sigma2, weight, waux, xval, L, Laux, on, on_aux, bs, gi2,
            grid, kmap, neighbours, is_s):
    """Sub-block ``ib`` (16 values) of ``quantize_row_iq2_xs_impl`` (``is_s`` False: even-parity
    signs, 7 bits) or ``_iq2_s_impl`` (True: 8 plain sign bits, its own epsilon): the groups'
    sign bits in ``bs``, grid indices in ``gi2``; returns ``(scale, status)``: status 1 with the
    sub-block's scale, 0 for a sub-block under the epsilon (scale 0, ``bs`` / ``gi2`` not set),
    -1 where ggml aborts (off-grid search failed, a final level off the grid, a NaN scale)."""
    block_weights(values, b, 16 * ib, 16, qw, qoff + 16 * ib, sigma2, weight, waux)
    for k in range(2):
        if is_s:
            bs[k] = plain_signs(values, b, 16 * ib, k, xval)
        else:
            bs[k] = even_signs(values, b, 16 * ib, k, weight, xval)
    mx = max_of(xval, 16)
    for i in range(16):
        L[i] = 0
    if mx < (_GROUP_MAX_EPS_IQ2_S if is_s else _GROUP_MAX_EPS):
        return _F0, 0
    scale, ok = search16(xval, weight, waux, L, Laux, on, on_aux, mx, grid, kmap, neighbours)
    if not ok:
        return scale, -1
    return final_codes(scale, L, bs, gi2, 2, 255 if is_s else 127, kmap)


@inline_kernel
def store_ls16(rec, b, at, max_scale, d_factor, scales):
    """The super-block scale ``d = max_scale / 31`` (stored as f16 of ``d * d_factor``) and the
    16 4-bit scale codes (two per byte from ``at``, low nibble first) of IQ2_XS / IQ2_S."""
    d = np.float32(max_scale / np.float32(31.0))
    store_f16(rec, b, 0, np.float32(d * d_factor))
    idv = np.float32(_F1 / d)
    for ib in range(16):
        l = ls_code(idv, scales[ib])
        if ib % 2 == 0:
            rec[b, at + ib // 2] = np.uint8(l)
        else:
            rec[b, at + ib // 2] |= np.uint8(l << 4)


@inline_kernel
def search_scratch(n):
    """The per-sub-block scratch of the searches: ``weight``, ``waux``, ``xval`` (f32 [n]),
    ``L``, ``Laux`` (int32 [n])."""
    return (np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
            np.zeros(n, np.int32), np.zeros(n, np.int32))


@kernel
def block32(values, b, ib, qw, qoff, sigma2, weight, waux, xval, L, Laux, on, on_aux, bs, gi4,
            Lqp, Ltmp, grid, kmap, neighbours):
    """Sub-block ``ib`` (32 values) of ``quantize_row_iq2_xxs_impl``: the 4 groups' even-parity
    sign bits in ``bs``, grid indices in ``gi4``; returns ``(scale, status)`` as ``block16``
    (status 0: a sub-block under the epsilon or with no positive ``make_qp_quants`` scale)."""
    block_weights(values, b, 32 * ib, 32, qw, qoff + 32 * ib, sigma2, weight, waux)
    for k in range(4):
        bs[k] = even_signs(values, b, 32 * ib, k, weight, xval)
    mx = max_of(xval, 32)
    if mx < _GROUP_MAX_EPS:
        return _F0, 0
    scale = make_qp_quants(32, _KMAX_Q + 1, xval, Lqp, weight)
    for i in range(32):
        L[i] = np.int8(Lqp[i])
    eff_max = np.float32(scale * np.float32(_KMAX_Q))
    if eff_max <= _F0:
        return _F0, 0
    scale, ok = try_scales(6, eff_max, scale, xval, weight, waux, L, Laux, on, on_aux, 4, grid,
                           kmap, neighbours)
    if not ok:
        return scale, -1
    if scale > _F0:
        idv = np.float32(_F1 / scale)
        for k in range(4):
            u = grid_levels(idv, xval, 8 * k, Ltmp, 0)
            if settle(u, kmap, neighbours, grid, xval, 8 * k, waux, scale, L, 8 * k, 8) < 0:
                return scale, -1
        scale = refit(weight, xval, L, 32, scale)
    return final_codes(scale, L, bs, gi4, 4, 127, kmap)


@inline_kernel
def encode_iq2(values, qw, out, grid, kmap, neighbours, kind):
    """The IQ2 encoders, ``kind`` 0: IQ2_XXS (8 sub-blocks of 32, ``block32``; codes and signs
    gathered in ``q2``, stored with the scales at the end), 1: IQ2_XS and 2: IQ2_S (16
    sub-blocks of 16, ``block16``; IQ2_XS's codes in ``q2`` written only for a block with a
    scale, IQ2_S's written as found, ``len(qw) == 0`` for no importance matrix)."""
    xxs = kind == 0
    is_s = kind == 2
    nsub = 8 if xxs else 16
    per_row = max(qw.shape[0] // 256, 1)
    rec = np.zeros_like(out)
    weight, waux, xval, L, Laux = search_scratch(256 // nsub)
    on = np.zeros(4, np.bool_)
    on_aux = np.zeros(4, np.bool_)
    scales = np.zeros(nsub, np.float32)
    q2 = np.zeros(32, np.int64)
    bs = np.zeros(4, np.int32)
    gi = np.zeros(4, np.int32)
    Lqp = np.zeros(32, np.uint8)
    Ltmp = np.zeros(8, np.int32)
    for b in range(values.shape[0]):
        if bad_block(values, b):
            return b
        qoff = 256 * (b % per_row)
        for i in range(32):
            q2[i] = 0
        max_scale = _F0
        sigma2 = sigma2_of(values, b, is_s)
        for ib in range(nsub):
            if xxs:
                scale, status = block32(values, b, ib, qw, qoff, sigma2, weight, waux, xval, L,
                                        Laux, on, on_aux, bs, gi, Lqp, Ltmp, grid, kmap,
                                        neighbours)
            else:
                scale, status = block16(values, b, ib, qw, qoff, sigma2, weight, waux, xval, L,
                                        Laux, on, on_aux, bs, gi, grid, kmap, neighbours, is_s)
            if status < 0:
                return b
            scales[ib] = scale
            if status == 0:
                continue
            if xxs:
                for k in range(4):
                    q2[2 * ib] |= np.int64(gi[k]) << (8 * k)
                    q2[2 * ib + 1] |= np.int64(bs[k]) << (7 * k)
            else:
                for k in range(2):
                    i8 = 2 * ib + k
                    if is_s:
                        rec[b, 2 + i8] = np.uint8(gi[k] & 255)
                        rec[b, _S_QH + i8 // 4] |= np.uint8((gi[k] >> 8) << (2 * (i8 % 4)))
                        rec[b, _S_SIGNS + i8] = np.uint8(bs[k])
                    else:
                        q2[i8] = gi[k] | (bs[k] << 9)
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == _F0:
            continue
        if xxs:
            d = np.float32(max_scale / np.float32(31.0))
            store_f16(rec, b, 0, d)
            idv = np.float32(_F1 / d)
            for ib in range(8):
                q2[2 * ib + 1] |= np.int64(ls_code(idv, scales[ib])) << 28
            for i in range(16):
                for j in range(4):
                    rec[b, 2 + 4 * i + j] = np.uint8((q2[i] >> (8 * j)) & 0xFF)
        elif is_s:
            store_ls16(rec, b, _S_SC, max_scale, np.float32(0.9875), scales)
        else:
            store_ls16(rec, b, _XS_SC, max_scale, _F1, scales)
            for i in range(32):
                rec[b, 2 + 2 * i] = np.uint8(q2[i] & 0xFF)
                rec[b, 3 + 2 * i] = np.uint8((q2[i] >> 8) & 0xFF)
    out[:] = rec
    return -1


@kernel
def encode_iq2_xs(values, qw, out, grid, kmap, neighbours):
    """ggml's ``quantize_iq2_xs`` with ``quant_weights = qw`` (rows of ``len(qw)``)."""
    return encode_iq2(values, qw, out, grid, kmap, neighbours, 1)


@kernel
def encode_iq2_s(values, qw, out, grid, kmap, neighbours):
    """ggml's ``quantize_iq2_s`` with ``quant_weights = qw`` (rows of ``len(qw)``), or without
    an importance matrix where ``len(qw) == 0``."""
    return encode_iq2(values, qw, out, grid, kmap, neighbours, 2)


@kernel
def encode_iq2_xxs(values, qw, out, grid, kmap, neighbours):
    """ggml's ``quantize_iq2_xxs`` with ``quant_weights = qw`` (rows of ``len(qw)``)."""
    return encode_iq2(values, qw, out, grid, kmap, neighbours, 0)


# ---- the entry points (``@njit``; the tables frozen into them when they compile) ---------------

def tables_for(fmt):
    """A function that, called in ``@njit`` code, gives ``(grid, kmap, neighbours)`` of
    ``fmt``: its overload makes them (``grid_search.tables``) when a kernel calling it is
    compiled, and numba freezes them into that kernel as constants (cached with it: a process
    that loads the kernel from numba's cache never builds them)."""
    def tables():
        raise TypeError("call only from @njit code")

    @overload(tables)
    def _tables():
        t = _gs.tables(fmt)
        grid, kmap = t.grid, t.kmap
        # numba keeps a constant array of over 10**6 bytes by its address, which its cache
        # refuses: the neighbour lists go in as three parts, joined at each call (~1 MB copied)
        nb = t.neighbours
        k = -(-nb.shape[0] // 3)
        n0, n1, n2 = nb[:k].copy(), nb[k:2 * k].copy(), nb[2 * k:].copy()
        assert max(n0.nbytes, n1.nbytes, n2.nbytes) < 10**6

        def impl():
            return grid, kmap, np.concatenate((n0, n1, n2))
        # one name per grid (decision 038): the formats' tables must not share a cached symbol
        return closure_named(impl)
    tables.__name__ = tables.__qualname__ = f"{fmt._attr}_tables"
    return tables


def encoder_entries(fmt, encode):
    """``(quantize_<t>_weighted(values, qw, out), quantize_<t>(values, out))`` of a grid format
    whose encoder is ``encode(values, qw, out, grid, kmap, neighbours)``: the format's tables
    (``tables_for``) passed in, ``qw`` empty for the second (no importance matrix: only the
    formats whose encoder takes none use it)."""
    t = fmt.name.lower()
    tables = tables_for(fmt)

    def weighted(values, qw, out):
        grid, kmap, neighbours = tables()
        return encode(values, qw, out, grid, kmap, neighbours)

    def plain(values, out):
        grid, kmap, neighbours = tables()
        return encode(values, np.zeros(0, np.float32), out, grid, kmap, neighbours)
    weighted.__name__ = weighted.__qualname__ = f"quantize_{t}_weighted"
    weighted.__doc__ = (f"f32 ``values`` [G, 256] (rows of ``len(qw)``) -> {fmt.name} records, "
                        f"weighted by ``qw``.")
    plain.__name__ = plain.__qualname__ = f"quantize_{t}"
    plain.__doc__ = (f"f32 ``values`` [G, 256] -> {fmt.name} records (ggml's ``quantize_{t}`` "
                     f"without an importance matrix).")
    return kernel(weighted), kernel(plain)


quantize_iq2_xxs_weighted = encoder_entries(_XXS, encode_iq2_xxs)[0]
quantize_iq2_xs_weighted = encoder_entries(_XS, encode_iq2_xs)[0]
quantize_iq2_s_weighted, quantize_iq2_s = encoder_entries(_S, encode_iq2_s)


# The weighted path per format: (entry, what it reproduces), read by numba_qk._registry;
# REQUIRES_IMATRIX: formats ggml quantizes only with an importance matrix, with the domain rule
# of their (weighted-only) encoder.
WEIGHTED = {
    _XXS: (quantize_iq2_xxs_weighted, "ggml quantize_iq2_xxs (quantize_row_iq2_xxs_impl) with "
                                      "quant_weights"),
    _XS: (quantize_iq2_xs_weighted, "ggml quantize_iq2_xs (quantize_row_iq2_xs_impl) with "
                                    "quant_weights"),
    _S: (quantize_iq2_s_weighted, "ggml quantize_iq2_s (quantize_row_iq2_s_impl) with "
                                  "quant_weights"),
}
REQUIRES_IMATRIX = {_XXS: "grid", _XS: "grid"}
QUANTIZER_S = "ggml ggml_quantize_chunk (quantize_iq2_s, no imatrix)"
