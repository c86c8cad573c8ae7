"""IQ3_XXS / IQ3_S encoders: ggml's ``quantize_iq3_xxs`` / ``quantize_iq3_s`` (what
``ggml_quantize_chunk`` runs; ``quantize_row_iq3_xxs_impl(256, ...)`` and
``quantize_row_iq3_s_impl(32, ...)`` of ggml-quants.c), byte for byte, with and without an
importance matrix.  All ``@njit``.  Numerics and domain: docs/numerics_iq_grid.md
("Encoders").

The tables of ggml's ``iq3xs_init_impl`` (grid sizes 256 and 512) are made once, at import, in
numpy, from the grid data numba_qk already holds (``numba_qk.formats.iq_grids``): for grid
point ``k`` the 4 levels ``l_i`` (0..7) of its coordinates ``2 l_i + 1``; ``MAP[u]`` (``u =
sum l_i << 3 i``, 4096 entries) the grid index of ``u`` or, off the grid, ``-(start + 1)`` of
its neighbour list in ``NEIGHBOURS`` (``[n, idx_1 .. idx_n]``: the grid points at the
``nwant`` smallest squared distances (2 for 256, 3 for 512), ordered by (distance, index), as
ggml's ``qsort`` with ``iq3_compare_func`` orders them).  Integer-only and sorted by a total
order, so deterministic; derived (a few ms) rather than stored, since they follow from data
already in the package (ggml's ``kgrid_256`` / ``kgrid_512`` are the level codes of
``iq3xxs_grid`` / ``iq3s_grid``; checked by tests/iq/test_iq3_encode.py).

Every float step is one f32 rounding in C order (``a*b*c`` is ``(a*b)*c``; ``2*sumx2/QK_K`` is
``(2*sumx2)/256``).  ggml-base is compiled for baseline x86-64 (no FMA instruction in
``libggml-base.so`` of either oracle build), so nothing is contracted.

``quantize_<t>(values, out)`` / ``quantize_<t>_weighted(values, qw, out)``: f32 ``values``
``[G, 256]`` (blocks along rows of ``len(qw)`` values) -> records ``out``; returns -1, or the
first block that holds a non-finite value or on which ggml's search aborts (``GGML_ASSERT`` in
``iq3_find_best_neighbour`` when every candidate's distance is inf/NaN, ``GGML_ASSERT(scale >=
0)`` on a NaN scale, or its "point not on grid" abort); ``out`` is then not written.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats import iq as _iq
from numba_qk.formats import iq_grids as _g
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.iq.iq2_encode import better_scale, even_signs, find_best_neighbour, max_of, plain_signs, refit, search_scratch, settle, take_levels, weighted_sums
from numba_qk.kernels.kquants.common import first_nonfinite_block, store_f16

_XXS, _S = _iq.iq3_xxs, _iq.iq3_s
# ggml's iq3xxs_grid holds 4 (2 l + 1) but 62 for level 7; iq3s_grid holds 2 l + 1.
_XXS_VALUES = (4, 12, 20, 28, 36, 44, 52, 62)
_S_VALUES = (1, 3, 5, 7, 9, 11, 13, 15)


def _grid_bytes(table):
    """``[len(table), 4]`` uint8: the 4 bytes of each u32 grid entry (little-endian)."""
    return np.array(table, "<u4").view(np.uint8).reshape(-1, 4)


def grid_tables(grid_bytes, values, nwant):
    """``(GRID, MAP, NEIGHBOURS)`` of ggml's ``iq3xs_init_impl`` for the grid whose points
    (``[n, 4]`` bytes) take the coordinate ``values`` (one per level 0..7): GRID int8 ``[n, 4]``
    (``2 l + 1``), MAP int32 ``[4096]``, NEIGHBOURS uint16 (see the module docstring)."""
    levels = np.searchsorted(np.array(values), grid_bytes.astype(np.int64))
    if not (np.array(values)[levels] == grid_bytes).all():
        raise AssertionError("iq3 grid: a coordinate outside the expected levels")
    grid = (2 * levels + 1).astype(np.int8)
    n = grid.shape[0]
    codes = (levels << (3 * np.arange(4))).sum(axis=1)
    kmap = np.full(4096, -1, np.int64)
    kmap[codes] = np.arange(n)
    off = np.flatnonzero(kmap < 0)
    pos = 2 * ((off[:, None] >> (3 * np.arange(4))) & 7) + 1
    d2 = ((grid[None, :, :].astype(np.int64) - pos[:, None, :]) ** 2).sum(axis=2)
    order = np.argsort(d2, axis=1, kind="stable")          # by (d2, index): ggml's qsort order
    sd2 = np.take_along_axis(d2, order, axis=1)
    rank = np.concatenate([np.ones((len(off), 1), np.int64),
                           1 + np.cumsum(sd2[:, 1:] > sd2[:, :-1], axis=1)], axis=1)
    keep = rank <= nwant
    nbrs = []
    for r, u in enumerate(off):
        kmap[u] = -(len(nbrs) + 1)
        chosen = order[r][keep[r]]
        nbrs.append(len(chosen))
        nbrs.extend(chosen.tolist())
    return grid, kmap.astype(np.int32), np.array(nbrs, np.uint16)


GRID256, MAP256, NEIGHBOURS256 = grid_tables(_grid_bytes(_g.IQ3XXS_GRID), _XXS_VALUES, 2)
GRID512, MAP512, NEIGHBOURS512 = grid_tables(_grid_bytes(_g.IQ3S_GRID), _S_VALUES, 3)

_F0, _F1, _F2, _HALF = np.float32(0.0), np.float32(1.0), np.float32(2.0), np.float32(0.5)
_F15, _F31, _F256, _F02 = np.float32(15.0), np.float32(31.0), np.float32(256.0), np.float32(0.2)
_EPS_XXS = np.float32(1e-8)                       # GROUP_MAX_EPS_IQ3_XXS
_FUDGE_XXS, _FUDGE_S = np.float32(1.0125), np.float32(1.033)
_XXS_SS = _XXS.field("signs").start               # u32 per sub-block: 4 x 7 sign bits, ls << 28
_S_QH, _S_SIGNS, _S_LS = _S.field("qh").start, _S.field("signs").start, _S.field("ls").start
_QS = 2


@kernel
def group_code(xval, at, idv, L):
    """``L[at+i] = clamp(nearest_int(0.5 (idv xval_i - 1)), 0, 7)`` for 4 values; their code
    ``u = sum L_i << 3 i``."""
    u = 0
    for i in range(4):
        l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * xval[at + i]) - _F1)))
        l = max(0, min(7, l))
        L[at + i] = l
        u |= l << (3 * i)
    return u


@kernel
def encode_block(values, b, qw, qoff, weighted, xxs, grid, kmap, nbrs, rec, r,
                 weight, waux, xval, L, Laux, on_grid, on_aux, signs, scales):
    """One super-block: ``values[b]`` -> ``rec[r]`` (IQ3_XXS when ``xxs``, else IQ3_S);
    weights ``qw[qoff:qoff+256]`` when ``weighted``.  Returns False where ggml aborts."""
    for j in range(rec.shape[1]):
        rec[r, j] = 0
    sumx2 = _F0
    for i in range(256):
        xi = np.float32(values[b, i])
        sumx2 = np.float32(sumx2 + np.float32(xi * xi))
    sigma2 = np.float32(np.float32(_F2 * sumx2) / _F256)
    max_scale = _F0
    qs_off = 0      # IQ3_S: ggml advances its qs / signs pointers only past non-zero sub-blocks
    sg_off = 0
    for ib in range(8):
        o = 32 * ib
        for i in range(32):
            xi = np.float32(values[b, o + i])
            if weighted:
                weight[i] = np.float32(np.float32(qw[qoff + o + i]) * np.float32(
                    np.sqrt(np.float32(sigma2 + np.float32(xi * xi)))))
            else:
                weight[i] = np.float32(xi * xi)
            waux[i] = np.float32(np.sqrt(weight[i]))
        for k in range(4):
            if xxs:
                signs[k] = even_signs(values, b, o, k, weight, xval)
            else:
                signs[k] = plain_signs(values, b, o, k, xval)
        mx = max_of(xval, 32)
        for i in range(32):
            L[i] = 0
        if (mx < _EPS_XXS) if xxs else (mx == _F0):
            scales[ib] = _F0
            continue
        best = _F0
        scale = np.float32(mx / _F15)
        for k in range(8):
            on_grid[k] = xxs
        nis = 15 if xxs else 9
        for it in range(-nis, nis + 1):
            idv = np.float32(np.float32(_F15 + np.float32(np.float32(it) * _F02)) / mx)
            this_scale = np.float32(_F1 / idv)
            for k in range(8):
                gi = kmap[group_code(xval, 4 * k, idv, Laux)]
                on_aux[k] = True
                if gi < 0:
                    on_aux[k] = False
                    if find_best_neighbour(nbrs, -gi - 1, grid, xval, 4 * k, waux, this_scale,
                                           Laux, 4 * k, 4) < 0:
                        return False
            sumqx, sumq2 = weighted_sums(weight, xval, Laux, 32)
            scale, best, won = better_scale(sumqx, sumq2, best, scale)
            if won:
                take_levels(L, Laux, 32, on_grid, on_aux, 8)
        n_not_on_grid = 0
        for k in range(8):
            if not on_grid[k]:
                n_not_on_grid += 1
        if n_not_on_grid > 0 and scale > _F0:
            idv = np.float32(_F1 / scale)
            for k in range(8):
                if xxs and on_grid[k]:
                    continue
                u = group_code(xval, 4 * k, idv, Laux)
                if settle(u, kmap, nbrs, grid, xval, 4 * k, waux, scale, L, 4 * k, 4) < 0:
                    return False
            scale = refit(weight, xval, L, 32, scale)
        if scale < _F0:
            scale = -scale
            for k in range(4):
                signs[k] = (~signs[k]) & (127 if xxs else 255)
        for k in range(8):
            u = 0
            for i in range(4):
                u |= L[4 * k + i] << (3 * i)
            gi = kmap[u]
            if gi < 0:
                return False                                  # ggml: "point not on grid"
            if xxs:
                rec[r, _QS + 8 * ib + k] = np.uint8(gi)
            else:
                rec[r, _QS + qs_off + k] = np.uint8(gi & 255)
                rec[r, _S_QH + ib] |= np.uint8((gi >> 8) << k)
        if xxs:
            ss = signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)
            for j in range(4):
                rec[r, _XXS_SS + 4 * ib + j] = np.uint8((ss >> (8 * j)) & 255)
        else:
            qs_off += 8
            for k in range(4):
                rec[r, _S_SIGNS + sg_off + k] = np.uint8(signs[k])
            sg_off += 4
        if not scale >= _F0:
            return False                                      # GGML_ASSERT(scale >= 0)
        scales[ib] = scale
        max_scale = max_scale if max_scale > scale else scale
    if max_scale == _F0:
        if xxs:
            for j in range(_QS, rec.shape[1]):
                rec[r, j] = 0
        return True
    d = np.float32(max_scale / _F31)
    store_f16(rec, r, 0, np.float32(d * (_FUDGE_XXS if xxs else _FUDGE_S)))
    idv = np.float32(_F1 / d)
    for ib in range(8):
        l = nearest_int(np.float32(_HALF * np.float32(np.float32(idv * scales[ib]) - _F1)))
        l = max(0, min(15, l))
        if xxs:
            rec[r, _XXS_SS + 4 * ib + 3] |= np.uint8(l << 4)
        else:
            rec[r, _S_LS + ib // 2] |= np.uint8(l << (4 * (ib % 2)))
    return True


@kernel
def encode_rows(values, qw, weighted, xxs, grid, kmap, nbrs, out):
    """Records of every block (see the module docstring); -1, or the first bad block."""
    g = values.shape[0]
    bad = first_nonfinite_block(values)
    stop = bad if bad >= 0 else g
    per_row = qw.shape[0] // 256 if weighted else 1
    tmp = np.empty((stop, out.shape[1]), np.uint8)
    weight, waux, xval, L, Laux = search_scratch(32)
    on_grid = np.zeros(8, np.bool_)
    on_aux = np.zeros(8, np.bool_)
    signs = np.zeros(4, np.int64)
    scales = np.zeros(8, np.float32)
    for b in range(stop):
        if not encode_block(values, b, qw, 256 * (b % per_row), weighted, xxs, grid, kmap, nbrs,
                            tmp, b, weight, waux, xval, L, Laux, on_grid, on_aux, signs, scales):
            return b
    if bad >= 0:
        return bad
    for b in range(g):
        for j in range(out.shape[1]):
            out[b, j] = tmp[b, j]
    return -1


@kernel
def quantize_iq3_xxs(values, out):
    """ggml's ``quantize_iq3_xxs`` without an importance matrix: f32 ``values`` [G, 256] ->
    IQ3_XXS records ``out`` [G, 98]; -1 or the first bad block (nothing written then)."""
    return encode_rows(values, np.empty(0, np.float32), False, True, GRID256, MAP256,
                       NEIGHBOURS256, out)


@kernel
def quantize_iq3_s(values, out):
    """ggml's ``quantize_iq3_s`` without an importance matrix: f32 ``values`` [G, 256] ->
    IQ3_S records ``out`` [G, 110]; -1 or the first bad block (nothing written then)."""
    return encode_rows(values, np.empty(0, np.float32), False, False, GRID512, MAP512,
                       NEIGHBOURS512, out)


@kernel
def quantize_iq3_xxs_weighted(values, qw, out):
    """``quantize_iq3_xxs`` with ``quant_weights = qw`` (f32, one per column of rows of
    ``len(qw)`` values): ``weight_i = qw_i * sqrtf(sigma2 + x_i^2)``."""
    return encode_rows(values, qw, True, True, GRID256, MAP256, NEIGHBOURS256, out)


@kernel
def quantize_iq3_s_weighted(values, qw, out):
    """``quantize_iq3_s`` with ``quant_weights = qw`` (see ``quantize_iq3_xxs_weighted``)."""
    return encode_rows(values, qw, True, False, GRID512, MAP512, NEIGHBOURS512, out)


# The weighted path per format: (kernel, what it reproduces), read by numba_qk._registry.
WEIGHTED = {
    _XXS: (quantize_iq3_xxs_weighted, "ggml quantize_iq3_xxs with quant_weights"),
    _S: (quantize_iq3_s_weighted, "ggml quantize_iq3_s with quant_weights"),
}
