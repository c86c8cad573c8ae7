"""ggml's IQ4 record formats IQ4_NL (type 20) and IQ4_XS (type 23): decoders, ggml's
dequantizers and ``ggml_quantize_chunk`` encoders (no importance matrix) bit for bit, and exact
dots against Q8_0 (IQ4_NL) / Q8_K (IQ4_XS).  All ``@njit``; callable from user ``@njit`` code.
Layouts and the ``kvalues_iq4nl`` table ``k``: ``numba_qk.formats.iq``.

Dequantize (ggml ``dequantize_row_iq4_nl`` / ``_iq4_xs``; every float step one f32 rounding)::

    IQ4_NL:  y = R32(f32(d) * f32(k(c)))
    IQ4_XS:  dl_s = R32(f32(d) * f32(ls_s - 32));  y = R32(dl_s * f32(k(c)))

Dots (numba_qk's canonical numerics, docs/numerics.md; exact integer sums, one f32 rounding per
named step, the left fold seeded with v_0, ``G = 0`` gives ``+0.0``)::

    IQ4_NL . Q8_0 (d_x, q):  S_b = sum_i k(c_i) * q_i                 exact int32 (|S| <= 520,192)
                             v_b = R32(d_x * R32(f32(d) * f32(S_b)))  (as Q4_0 . Q8_0)
    IQ4_XS . Q8_K (ds, q):   S_b = sum_s (ls_s - 32) * sum_{i in s} k(c_i) * q_i
                                                            exact int32 (|S| <= 133,169,152)
                             v_b = R32(ds * R32(f32(d) * f32(S_b)))   (as Q3_K / Q6_K . Q8_K)

Quantize: ggml's ``quantize_row_iq4_nl_impl`` as ``ggml_quantize_chunk`` calls it
(``quantize_iq4_nl`` / ``quantize_iq4_xs``: ``ntry = 7``, no importance matrix; the weights are
``x * x``), every float step an explicit f32 rounding in C evaluation order; see
docs/numerics.md.  Non-finite input is outside the domain (the first such block is reported,
nothing written).
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats.iq import KVALUES_IQ4NL, iq4_nl as _NL, iq4_xs as _XS
from numba_qk.formats.kquants import q8_k as _Q8K
from numba_qk.formats.legacy import q8_0 as _Q80
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.drive import kernels_for, no_records, panel_gemm, register
from numba_qk.kernels.legacy import kernels as _legacy, x8 as _x8
from numba_qk.kernels.legacy.layout import Q4_0 as _LEGACY_Q4_0
from numba_qk.kernels.simd import iq4_nl as _simd_nl, iq_grid as _simd
from numba_qk.kernels.simd.legacy import X8_IQ4_NL
from numba_qk.kernels.kquants.common import f16_at, first_nonfinite_block, portable_dot_for, store_f16, x_ds

KVALUES = np.array(KVALUES_IQ4NL, np.int8)
KVALUES_F32 = KVALUES.astype(np.float32)
_LOW4 = np.uint8(0x0F)
NL_D_AT = _NL.field("d").start      # f16
NL_QS_AT = _NL.field("qs").start    # 16 bytes of codes
NL_BYTES = _NL.block_bytes
XS_D_AT = _XS.field("d").start      # f16
XS_SH_AT = _XS.field("ls").start    # scales_h (u16), then scales_l[4]
XS_SL_AT = XS_SH_AT + 2
XS_QS_AT = _XS.field("qs").start    # 128 bytes of codes
Y0_D_AT = _Q80.field("d").start
Y0_QS_AT = _Q80.field("qs").start
YK_Q_AT = _Q8K.field("q").start
_GROUP_MAX_EPS = np.float32(1e-15)
_NTRY = 7                           # ggml_quantize_chunk's quantize_iq4_nl / _xs


@kernel
def iq4_xs_ls(rec, b, s):
    """The 6-bit scale ``ls_s`` (0..63) of sub-block ``s`` of IQ4_XS record ``rec[b]``."""
    lo = (np.int32(rec[b, XS_SL_AT + s // 2]) >> np.int32(4 * (s % 2))) & np.int32(0xF)
    h = np.int32(rec[b, XS_SH_AT]) | (np.int32(rec[b, XS_SH_AT + 1]) << np.int32(8))
    return lo | (((h >> np.int32(2 * s)) & np.int32(3)) << np.int32(4))


# ---- decoders and dequantizers -----------------------------------------------------------------

@kernel
def iq4_nl_decode_records(records, q):
    """Element codes ``q`` [G, 32] (0..15, element order)."""
    for b in range(records.shape[0]):
        for j in range(16):
            byte = records[b, NL_QS_AT + j]
            q[b, j] = byte & _LOW4
            q[b, j + 16] = byte >> np.uint8(4)


@kernel
def iq4_xs_decode_records(records, ls, q):
    """Sub-block scales ``ls`` [G, 8] (0..63, used as ls - 32) and codes ``q`` [G, 256]."""
    for b in range(records.shape[0]):
        for s in range(8):
            ls[b, s] = np.uint8(iq4_xs_ls(records, b, s))
            for j in range(16):
                byte = records[b, XS_QS_AT + 16 * s + j]
                q[b, 32 * s + j] = byte & _LOW4
                q[b, 32 * s + 16 + j] = byte >> np.uint8(4)


@kernel
def dequantize_iq4_nl(records, out):
    """ggml's ``dequantize_row_iq4_nl``: ``y = R32(f32(d) * f32(k(c)))``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, NL_D_AT)
        for j in range(16):
            byte = records[b, NL_QS_AT + j]
            out[b, j] = np.float32(d * KVALUES_F32[byte & _LOW4])
            out[b, j + 16] = np.float32(d * KVALUES_F32[byte >> np.uint8(4)])


@kernel
def dequantize_iq4_xs(records, out):
    """ggml's ``dequantize_row_iq4_xs``: ``y = R32(R32(f32(d) * f32(ls - 32)) * f32(k(c)))``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, XS_D_AT)
        for s in range(8):
            dl = np.float32(d * np.float32(iq4_xs_ls(records, b, s) - 32))
            for j in range(16):
                byte = records[b, XS_QS_AT + 16 * s + j]
                out[b, 32 * s + j] = np.float32(dl * KVALUES_F32[byte & _LOW4])
                out[b, 32 * s + 16 + j] = np.float32(dl * KVALUES_F32[byte >> np.uint8(4)])


# ---- dots ----------------------------------------------------------------------------------------

@kernel
def record_sums_iq4_nl_q8_0(w, bw, x, bx):
    """``S`` of IQ4_NL record ``w[bw]`` and Q8_0 record ``x[bx]`` (exact int32)."""
    s = np.int32(0)
    for j in range(16):
        byte = w[bw, NL_QS_AT + j]
        s += np.int32(KVALUES[byte & _LOW4]) * np.int32(np.int8(x[bx, Y0_QS_AT + j]))
        s += np.int32(KVALUES[byte >> np.uint8(4)]) * np.int32(np.int8(x[bx, Y0_QS_AT + 16 + j]))
    return s


@kernel
def record_value_iq4_nl_q8_0(w, bw, x, bx):
    """``v = R32(d_x * R32(f32(d) * f32(S)))``."""
    s = record_sums_iq4_nl_q8_0(w, bw, x, bx)
    p = np.float32(f16_at(w, bw, NL_D_AT) * np.float32(s))
    return np.float32(f16_at(x, bx, Y0_D_AT) * p)


@kernel
def record_sums_iq4_xs_q8_k(w, bw, x, bx):
    """``S = sum_s (ls_s - 32) * S_s`` of IQ4_XS record ``w[bw]`` and Q8_K record ``x[bx]``."""
    total = np.int32(0)
    for s in range(8):
        t = np.int32(0)
        for j in range(16):
            byte = w[bw, XS_QS_AT + 16 * s + j]
            t += np.int32(KVALUES[byte & _LOW4]) * np.int32(np.int8(x[bx, YK_Q_AT + 32 * s + j]))
            t += (np.int32(KVALUES[byte >> np.uint8(4)])
                  * np.int32(np.int8(x[bx, YK_Q_AT + 32 * s + 16 + j])))
        total += (iq4_xs_ls(w, bw, s) - np.int32(32)) * t
    return total


@kernel
def record_value_iq4_xs_q8_k(w, bw, x, bx):
    """``v = R32(ds * R32(f32(d) * f32(S)))``."""
    s = record_sums_iq4_xs_q8_k(w, bw, x, bx)
    p = np.float32(f16_at(w, bw, XS_D_AT) * np.float32(s))
    return np.float32(x_ds(x, bx) * p)


# The portable row dots: the left fold of the record values seeded with v_0 (G = 0 gives +0.0),
# built by kquants.common.portable_dot_for.
dot_iq4_nl_q8_0_portable = portable_dot_for(_NL, value=record_value_iq4_nl_q8_0)
dot_iq4_xs_q8_k_portable = portable_dot_for(_XS, value=record_value_iq4_xs_q8_k)


# The shared driver (kernels/drive.py) makes dot / gemv / gemm from the portable row dots and
# the SIMD record values and 8-lane tiles: IQ4_NL's in simd/iq4_nl.py.
# IQ4_XS has the shape of the grid IQ formats (int8 multipliers, one scale per 32 elements,
# v = R32(ds * R32(d * f32(S)))): simd/iq_grid.py's record value, 8-row gemv tile and, with
# AVX-512 VNNI, the panel gemm serve it (the 8-activation tile otherwise); results equal the
# portable dot bit for bit (tests/iq/test_iq_grid_fast.py; IQ4_NL:
# tests/conformance/test_fast_paths.py).
register(_NL.ggml_type, loop_dot=dot_iq4_nl_q8_0_portable, value=_simd_nl.iq4_nl_q8_0_value,
         rows_x8=_simd_nl.iq4_nl_rows_x8, acts_x8=_simd_nl.iq4_nl_acts_x8)
register(_XS.ggml_type, loop_dot=dot_iq4_xs_q8_k_portable, value=_simd.iq4_xs_q8_k_value,
         rows_x8=_simd.iq4_xs_rows_x8,
         acts_x8=None if _simd.HAVE_GEMM_TILES else _simd.iq4_xs_acts_x8)
dot_iq4_nl_q8_0, gemv_iq4_nl_q8_0, gemm_iq4_nl_q8_0 = kernels_for(_NL.ggml_type)
dot_iq4_xs_q8_k, gemv_iq4_xs_q8_k, gemm_iq4_xs_q8_k = kernels_for(_XS.ggml_type)
if _simd.HAVE_GEMM_TILES:   # batches of 3 or more: records decoded once per call
    gemm_iq4_xs_q8_k = panel_gemm(_simd.iq4_xs_decode, _simd.microtile_sub32, gemm_iq4_xs_q8_k)

if _legacy.HAVE_LEGACY_VNNI:
    # Batches of 2 to 16: the legacy small-batch gemm (16 rows in the lanes, records read in
    # place) with IQ4_NL's code, its nibbles looked up there; from 17 IQ4_NL's records decoded
    # into the legacy panel layout run the legacy panel gemm as Q4_0 (the same Q8_0
    # activations and float steps, v = R32(dx * R32(d * f32(S)))).
    _nl_panel = _legacy.panel_gemm_over(_simd_nl.iq4_nl_panel_decode)
    _gemm_nl_tiles = gemm_iq4_nl_q8_0
    _NL_TYPE = _NL.ggml_type

    @kernel
    def gemm_iq4_nl_q8_0(w, x, out):
        """``out[a, r] = dot_iq4_nl_q8_0(w[r], x[a])``: with contiguous record bytes batches of
        2..16 by the small-batch gemm, larger ones by decoded records (the legacy panel gemm);
        others by the driver's tiles."""
        if w.shape[1] != 0 and x.shape[0] >= 2 and w.strides[2] == 1 and x.strides[2] == 1:
            if (x.shape[0] <= _legacy.ROWS16_MAX_BATCH
                    and abs(w.strides[0]) < _legacy.GATHER_STEP_MAX):
                _legacy.rows16_gemm(X8_IQ4_NL, _NL_TYPE, w, x, out)
                return
            if x.shape[0] >= _legacy.PANEL_MIN_BATCH:
                _nl_panel(_LEGACY_Q4_0, w, x, out)
                return
        _gemm_nl_tiles(w, x, out)


@kernel
def tiles_portable_iq4_nl_q8_0(tiles, x, out, rec):
    """``out[:8 T]`` of IQ4_NL x8 ``tiles`` by the portable loops (targets without AVX-512
    VNNI): each row's records rebuilt in ``rec`` ``[G, 18]`` and dotted."""
    for t in range(tiles.shape[0]):
        for k in range(8):
            _x8.x8_row_records(X8_IQ4_NL, tiles, t, k, rec)
            out[8 * t + k] = dot_iq4_nl_q8_0(rec, x)


@kernel
def gemv_x8_iq4_nl_q8_0(tiles, tail, x, out):
    """``gemv_iq4_nl_q8_0`` on IQ4_NL weights repacked into x8 tiles (``numba_qk.repack``:
    ``tiles`` [T, bytes], Q4_0's tile layout, then the plain ``tail`` rows [n, G, 18]); ``out``
    [8 T + n], the same bits.  AVX-512 VNNI: simd/legacy.py's x8 rows (one ``vpshufb`` looks up
    64 codes, one ``vpdpbusd`` per 64 products of 8 rows, no per-row reduction); otherwise each
    row's records are rebuilt and dotted by the portable loops."""
    g = x.shape[0]
    t_n = tiles.shape[0]
    if no_records(g, out):
        return
    if _x8.HAVE_X8:
        _x8.gemv_x8_simd(X8_IQ4_NL, tiles, x, out)
    else:
        tiles_portable_iq4_nl_q8_0(tiles, x, out, np.empty((g, NL_BYTES), np.uint8))
    if tail.shape[0]:
        gemv_iq4_nl_q8_0(tail, x, out[8 * t_n:])


@kernel
def gemv_x8_tiles_iq4_nl_q8_0(tiles, x, out):
    """``gemv_x8_iq4_nl_q8_0`` of whole tiles only (``out`` [8 T]): the row kernel that
    ``numba_qk._threads.run_rows`` splits over tiles (``per=8``)."""
    gemv_x8_iq4_nl_q8_0(tiles, np.empty((0, x.shape[0], NL_BYTES), np.uint8), x, out)


# ---- quantizers (ggml quantize_row_iq4_nl_impl, ntry = 7, no imatrix) ---------------------------

@kernel
def best_index_iq4(x):
    """ggml's ``best_index_int8(16, kvalues_iq4nl, x)`` (binary search, f32 differences)."""
    if x <= KVALUES_F32[0]:
        return 0
    if x >= KVALUES_F32[15]:
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < KVALUES_F32[mav]:
            mu = mav
        else:
            ml = mav
    if np.float32(x - KVALUES_F32[mu - 1]) < np.float32(KVALUES_F32[mu] - x):
        return mu - 1
    return mu


@inline_kernel
def block_scale_search(values, b, off, L, weight, woff, weighted):
    """ggml's scale search over the sub-block of 32 values ``values[b, off:off+32]``
    (``ntry = 7``), each value weighted by ``weight[woff + j]`` where ``weighted``, else by
    ``x*x`` (``weight`` not read); leaves the first pass's codes in ``L[off:off+32]``, returns
    the f32 scale (0 for a sub-block whose largest ``|x|`` is below ``GROUP_MAX_EPS``).  The
    first fit is 0 where its ``sumq2`` is 0 (only weighted: ``x*x`` gives ``sumq2 > 0``)."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(32):
        ax = abs(np.float32(values[b, off + j]))
        if ax > amax:
            amax = ax
            mx = np.float32(values[b, off + j])
    if amax < _GROUP_MAX_EPS:
        return np.float32(0.0)
    d = np.float32(-mx / KVALUES_F32[0])
    idv = np.float32(np.float32(1.0) / d)
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        xj = np.float32(values[b, off + j])
        l = best_index_iq4(np.float32(idv * xj))
        L[off + j] = l
        q = KVALUES_F32[l]
        w = weight[woff + j] if weighted else np.float32(xj * xj)
        wq = np.float32(w * q)
        sumqx = np.float32(sumqx + np.float32(wq * xj))
        sumq2 = np.float32(sumq2 + np.float32(wq * q))
    d = np.float32(sumqx / sumq2) if sumq2 > np.float32(0.0) else np.float32(0.0)
    best = np.float32(d * sumqx)
    for itry in range(-_NTRY, _NTRY + 1):
        idv = np.float32(np.float32(itry + np.int32(KVALUES[0])) / mx)
        sumqx = np.float32(0.0)
        sumq2 = np.float32(0.0)
        for j in range(32):
            xj = np.float32(values[b, off + j])
            q = KVALUES_F32[best_index_iq4(np.float32(idv * xj))]
            w = weight[woff + j] if weighted else np.float32(xj * xj)
            wq = np.float32(w * q)
            sumqx = np.float32(sumqx + np.float32(wq * xj))
            sumq2 = np.float32(sumq2 + np.float32(wq * q))
        if sumq2 > np.float32(0.0) and np.float32(sumqx * sumqx) > np.float32(best * sumq2):
            d = np.float32(sumqx / sumq2)
            best = np.float32(d * sumqx)
    return d


@kernel
def iq4_block_scale(values, b, off, L):
    """One sub-block of 32 values ``values[b, off:off+32]``: ggml's scale search (weights
    ``x*x``, ``ntry = 7``); leaves the first pass's codes in ``L[off:off+32]``, returns the
    f32 scale (0 for a sub-block whose largest ``|x|`` is below ``GROUP_MAX_EPS``)."""
    return block_scale_search(values, b, off, L, KVALUES_F32, 0, False)


@inline_kernel
def iq4_nl_store(values, b, out, L, sc):
    """IQ4_NL record ``out[b]`` of the block's scale ``sc`` (f32): ``d`` and the codes
    ``best_index_iq4(x / sc)`` (0 where ``sc == 0``), by way of ``L``."""
    store_f16(out, b, NL_D_AT, sc)
    idv = np.float32(np.float32(1.0) / sc) if sc != np.float32(0.0) else np.float32(0.0)
    for j in range(32):
        L[j] = best_index_iq4(np.float32(idv * np.float32(values[b, j])))
    for j in range(16):
        out[b, NL_QS_AT + j] = np.uint8(L[j] | (L[16 + j] << 4))


@kernel
def quantize_block_iq4_nl(values, b, out, L):
    """One block of 32 values into IQ4_NL record ``out[b]``."""
    iq4_nl_store(values, b, out, L, iq4_block_scale(values, b, 0, L))


@inline_kernel
def iq4_xs_store(values, b, out, L, scales):
    """IQ4_XS record ``out[b]`` of the 8 sub-block scales ``scales`` (f32): ``d`` from the
    scale of largest magnitude (the first such), the 6-bit scales, and the codes, by way of ``L``."""
    max_scale = np.float32(0.0)
    amax_scale = np.float32(0.0)
    for s in range(8):
        sc = scales[s]
        if abs(sc) > amax_scale:
            amax_scale = abs(sc)
            max_scale = sc
    d = np.float32(-max_scale / np.float32(32.0))
    store_f16(out, b, XS_D_AT, d)
    idv = np.float32(np.float32(1.0) / d) if d != np.float32(0.0) else np.float32(0.0)
    sh = np.int32(0)
    for s in range(4):
        out[b, XS_SL_AT + s] = np.uint8(0)
    for s in range(8):
        l = nearest_int(np.float32(idv * scales[s]))
        l = max(-32, min(31, l))
        dl = np.float32(d * np.float32(l))
        idl = np.float32(np.float32(1.0) / dl) if dl != np.float32(0.0) else np.float32(0.0)
        for j in range(32):
            L[32 * s + j] = best_index_iq4(np.float32(idl * np.float32(values[b, 32 * s + j])))
        l += 32
        out[b, XS_SL_AT + s // 2] |= np.uint8((l & 0xF) << (4 * (s % 2)))
        sh |= np.int32(l >> 4) << np.int32(2 * s)
    out[b, XS_SH_AT] = np.uint8(sh & 0xFF)
    out[b, XS_SH_AT + 1] = np.uint8(sh >> 8)
    for s in range(8):
        for j in range(16):
            out[b, XS_QS_AT + 16 * s + j] = np.uint8(L[32 * s + j] | (L[32 * s + 16 + j] << 4))


@kernel
def quantize_block_iq4_xs(values, b, out, L, scales):
    """One super-block of 256 values into IQ4_XS record ``out[b]``."""
    for s in range(8):
        scales[s] = iq4_block_scale(values, b, 32 * s, L)
    iq4_xs_store(values, b, out, L, scales)


@inline_kernel
def _rows(values, out, xs):
    """IQ4_XS (``xs``) or IQ4_NL records of ``values``: -1, or the first block holding a
    non-finite value (nothing written then)."""
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    L = np.empty(256 if xs else 32, np.int64)
    scales = np.empty(8, np.float32)
    for b in range(values.shape[0]):
        if xs:
            quantize_block_iq4_xs(values, b, out, L, scales)
        else:
            quantize_block_iq4_nl(values, b, out, L)
    return -1


@kernel
def quantize_iq4_nl(values, out):
    """f32 ``values`` ``[G, 32]`` -> IQ4_NL records ``[G, 18]`` (ggml_quantize_chunk, no
    imatrix); -1, or the first block holding a non-finite value (nothing written then)."""
    return _rows(values, out, False)


@kernel
def quantize_iq4_xs(values, out):
    """f32 ``values`` ``[G, 256]`` -> IQ4_XS records ``[G, 136]`` (ggml_quantize_chunk, no
    imatrix); -1, or the first block holding a non-finite value (nothing written then)."""
    return _rows(values, out, True)


# ---- the registry's declaration of this module's formats (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

TRAITS = (
    Traits(
        format=_NL,
        dequantize=dequantize_iq4_nl,
        decode=iq4_nl_decode_records,
        decoded=Decoded("IQ4NLFields", ("d", "q"), (("q", "u1"),),
                        "Decoded fields of ``G`` ggml IQ4_NL records "
                        "(``x = d * kvalues_iq4nl[q]``)."),
        quantize=quantize_iq4_nl,
        domain="finite",
        quantizer="ggml ggml_quantize_chunk (quantize_iq4_nl, no imatrix)",
        find_invalid=None,
        dot=dot_iq4_nl_q8_0,
        gemv=gemv_iq4_nl_q8_0,
        gemm=gemm_iq4_nl_q8_0,
        oracle="numba_qk.testing.reference.iq",
    ),
    Traits(
        format=_XS,
        dequantize=dequantize_iq4_xs,
        decode=iq4_xs_decode_records,
        decoded=Decoded("IQ4XSFields", ("d", "ls", "q"), (("ls", "u1"), ("q", "u1")),
                        "Decoded fields of ``G`` ggml IQ4_XS records "
                        "(``x = d * (ls[i // 32] - 32) * kvalues_iq4nl[q]``)."),
        quantize=quantize_iq4_xs,
        domain="finite",
        quantizer="ggml ggml_quantize_chunk (quantize_iq4_xs, no imatrix)",
        find_invalid=None,
        dot=dot_iq4_xs_q8_k,
        gemv=gemv_iq4_xs_q8_k,
        gemm=gemm_iq4_xs_q8_k,
        oracle="numba_qk.testing.reference.iq",
    ),
)
