"""Sub-block lanes for the K-quant encoders: ggml's per-sub-block searches run side by side.

ggml's ``make_qkx2_quants`` (Q2_K, Q4_K, Q5_K), ``make_qx_quants`` (Q6_K) and
``make_q3_quants`` (Q3_K) are called once per sub-block, and each call is one long chain of
dependent f32 additions (running sums per candidate scale, a running error) -- latency-bound,
one element at a time.  The sub-blocks of a block are independent, so here lane ``j`` of an 8-
or 16-wide vector runs sub-block ``j``'s call: every lane performs exactly the f32 operations
of the scalar transcription, in the same order (IEEE vector instructions without fast-math
flags, one rounding each, no FMA), and each lane keeps its own state (current min, best error,
chosen scale, whether its refinement rounds go on), so the bits are those of the scalar code
(``q4_k_encode.make_qkx2_quants_mad``, ``q6_k.make_qx_quants_rmse1``,
``q3_k.make_q3_quants_rmse``), which stays as the portable definition.  Branches of the scalar
code become per-lane selects: every lane computes both sides, keeps what the scalar code would.

Data are transposed: ``xt[i, j]`` is element ``i`` of sub-block ``j`` (C-contiguous scratch
arrays ``[n, nl]``, ``nl`` 16 or a multiple of 8; per-lane values are rows of a scratch ``scr``
``[rows, nl]``).  The intrinsics walk ``i`` over the lanes ``c0..c0+W-1`` (``W`` = 8 or 16;
``<W x float>`` LLVM IR, legal on every target):

* ``lanes_quant_sums``: ``l = clamp(nearest_int(isc * (x - mn)), 0, nmax)`` stored as int32,
  and the running sums ``sum_l += w*l``, ``sum_l2 += (w*l)*l``, ``sum_xl += (w*l)*x``.
* ``lanes_error``: ``err += w * e(((a*l) + b) - x)`` with ``e`` = square or ``fabs``.
* ``lanes_qx_sums``: ``l = clamp(nearest_int(isc * x), -nmax, nmax-1)``, ``sumlx += (w*x)*l``,
  ``suml2 += (w*l)*l`` with ``w = x*x``.
* ``lanes_q3_try``: one refinement round of ``make_q3_quants``.
* ``lanes_requant``: the encoders' last pass, ``l = clamp(nearest_int((x + dm)/d))`` per lane
  where ``d != 0``.

``qkx2_lanes``, ``qx_lanes``, ``q3_lanes`` (the searches) and ``requant_lanes`` drive them; the
candidate bookkeeping between passes is plain numba over the lanes.  ``f16_bits`` (re-exported
``f16.f32_to_f16_bits_ggml_hw``) is the f32 -> f16 conversion by F16C where available (same
bits as ``_round.f32_to_f16_bits``).

``ENCODE_LANES`` is False under ``NUMBA_DISABLE_JIT`` (intrinsics cannot run there) or
``NUMBA_QK_PORTABLE=1``; the encoders then call the scalar transcriptions (same bits).
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import config
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import inline_kernel, kernel
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.f16 import HAVE_F16C  # noqa: F401 (re-exported)
from numba_qk.kernels.f16 import f32_to_f16_bits_ggml_hw as f16_bits  # noqa: F401 (re-exported)

ENCODE_LANES = (not config.DISABLE_JIT
                and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0"))

_f32 = ir.FloatType()
_i32 = ir.IntType(32)
_i64 = ir.IntType(64)


def _data(context, builder, arrty, arr):
    return context.make_array(arrty)(context, builder, arr).data


def _vptr(builder, base, idx, vty):
    return builder.bitcast(builder.gep(base, [idx]), vty.as_pointer())


def _splat(builder, v, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v1 = builder.insert_element(undef, v, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v1, undef, ir.Constant(ir.VectorType(_i32, vty.count),
                                                         [0] * vty.count))


def _cint(v, W):
    return ir.Constant(ir.VectorType(_i32, W), [v] * W)


def _i64_of(builder, v):
    return builder.sext(v, _i64) if v.type.width < 64 else v


def _nearest_int_v(builder, t, W):
    """ggml's ``nearest_int`` lane by lane: the low 23 bits of ``R32(t + 1.5 * 2**23)`` - 2**22."""
    bits = builder.bitcast(builder.fadd(t, ir.Constant(t.type, [12582912.0] * W)),
                           ir.VectorType(_i32, W))
    return builder.sub(builder.and_(bits, _cint(0x007FFFFF, W)), _cint(0x00400000, W))


def _clamp_v(builder, l, lo, hi):
    """``MAX(lo, MIN(hi, l))`` lane by lane (int32 vectors)."""
    l = builder.select(builder.icmp_signed("<", hi, l), hi, l)     # MIN(hi, l)
    return builder.select(builder.icmp_signed("<", l, lo), lo, l)  # MAX(lo, .)


def _accumulate(builder, accs, terms):
    """``acc += term`` for each running sum (an alloca) and its term, in order."""
    for acc, term in zip(accs, terms):
        builder.store(builder.fadd(builder.load(acc), term), acc)


def _store_rows(builder, psc, at, s0_r, accs, VF):
    """The running sums ``accs`` (allocas of ``VF``) into rows ``s0_r, s0_r + 1, ...`` of the
    scratch ``psc`` (``at(row)``: the element index of this lane group in a row)."""
    for k, acc in enumerate(accs):
        row = builder.add(s0_r, ir.Constant(_i64, k))
        builder.store(builder.load(acc), _vptr(builder, psc, at(row), VF), align=4)


def _lanes_quant_sums(W):
    VF, VI = ir.VectorType(_f32, W), ir.VectorType(_i32, W)

    @intrinsic
    def lanes_quant_sums(typingctx, xt, wt, scr, mn_row, isc_row, s0_row, nmax, laux, n, c0, ld):
        """Lanes ``c0..c0+W-1``, with ``mn = scr[mn_row]``, ``isc = scr[isc_row]``: ``laux[i, j]
        = clamp(nearest_int(isc[j]*(xt[i, j] - mn[j])), 0, nmax)`` for ``i < n`` and the sums
        ``scr[s0_row, j] = sum w*l``, ``scr[s0_row + 1, j] = sum (w*l)*l``, ``scr[s0_row + 2, j]
        = sum (w*l)*x`` (f32, in order of ``i``).  Arrays C-contiguous, row length ``ld``.
        (Rows by index rather than views of ``scr``.)"""
        sig = types.void(xt, wt, scr, mn_row, isc_row, s0_row, nmax, laux, n, c0, ld)

        def codegen(context, builder, signature, args):
            px, pw, psc = (_data(context, builder, signature.args[k], args[k]) for k in range(3))
            pl = _data(context, builder, signature.args[7], args[7])
            nmax_v = builder.trunc(args[6], _i32) if args[6].type.width > 32 else args[6]
            mn_r, isc_r, s0_r, n_v, c0_v, ld_v = (_i64_of(builder, args[k])
                                                  for k in (3, 4, 5, 8, 9, 10))
            at = lambda r: builder.add(builder.mul(r, ld_v), c0_v)  # noqa: E731
            mnv = builder.load(_vptr(builder, psc, at(mn_r), VF), align=4)
            iscv = builder.load(_vptr(builder, psc, at(isc_r), VF), align=4)
            nmaxv = _splat(builder, nmax_v, VI)
            zero_f = ir.Constant(VF, [0.0] * W)
            accs = [cgutils.alloca_once_value(builder, zero_f) for _ in range(3)]
            with cgutils.for_range(builder, n_v) as loop:
                off = builder.add(builder.mul(loop.index, ld_v), c0_v)
                xv = builder.load(_vptr(builder, px, off, VF), align=4)
                wv = builder.load(_vptr(builder, pw, off, VF), align=4)
                t = builder.fmul(iscv, builder.fsub(xv, mnv))
                l = _clamp_v(builder, _nearest_int_v(builder, t, W), _cint(0, W), nmaxv)
                builder.store(l, _vptr(builder, pl, off, VI), align=4)
                fl = builder.sitofp(l, VF)
                wl = builder.fmul(wv, fl)
                _accumulate(builder, accs, (wl, builder.fmul(wl, fl), builder.fmul(wl, xv)))
            _store_rows(builder, psc, at, s0_r, accs, VF)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_quant_sums


lanes_quant_sums8, lanes_quant_sums16 = _lanes_quant_sums(8), _lanes_quant_sums(16)


def _lanes_error(W):
    VF, VI = ir.VectorType(_f32, W), ir.VectorType(_i32, W)

    @intrinsic
    def lanes_error(typingctx, xt, wt, laux, scr, a_row, b_row, err_row, use_mad, n, c0, ld):
        """Lanes ``c0..c0+W-1``, with ``a = scr[a_row]``, ``b = scr[b_row]``: ``scr[err_row, j] =
        sum_i w * e(R32(R32(a[j]*laux[i, j]) + b[j]) - x)`` in order of ``i``, ``e(d) = |d|`` if
        ``use_mad`` else ``d*d``."""
        sig = types.void(xt, wt, laux, scr, a_row, b_row, err_row, use_mad, n, c0, ld)

        def codegen(context, builder, signature, args):
            px, pw, pl, psc = (_data(context, builder, signature.args[k], args[k])
                               for k in range(4))
            mad = builder.icmp_unsigned("!=", args[7], ir.Constant(args[7].type, 0))
            a_r, b_r, e_r, n_v, c0_v, ld_v = (_i64_of(builder, args[k])
                                              for k in (4, 5, 6, 8, 9, 10))
            at = lambda r: builder.add(builder.mul(r, ld_v), c0_v)  # noqa: E731
            av = builder.load(_vptr(builder, psc, at(a_r), VF), align=4)
            bv = builder.load(_vptr(builder, psc, at(b_r), VF), align=4)
            acc = cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * W))
            fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF, [VF]),
                                                  f"llvm.fabs.v{W}f32")
            with cgutils.for_range(builder, n_v) as loop:
                off = builder.add(builder.mul(loop.index, ld_v), c0_v)
                xv = builder.load(_vptr(builder, px, off, VF), align=4)
                wv = builder.load(_vptr(builder, pw, off, VF), align=4)
                fl = builder.sitofp(builder.load(_vptr(builder, pl, off, VI), align=4), VF)
                diff = builder.fsub(builder.fadd(builder.fmul(av, fl), bv), xv)
                e = builder.select(mad, builder.call(fabs, [diff]), builder.fmul(diff, diff))
                builder.store(builder.fadd(builder.load(acc), builder.fmul(wv, e)), acc)
            builder.store(builder.load(acc), _vptr(builder, psc, at(e_r), VF), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_error


lanes_error8, lanes_error16 = _lanes_error(8), _lanes_error(16)


# Rows of the f32 lane scratch ``scr`` [_SCR_ROWS, nl].
_MN, _MX, _SW, _SX, _BEST, _SCALE, _ISC, _A, _B, _D, _ERR, _LISC, _LMN, _ACT, _S0 = range(15)
SCR_ROWS = _S0 + 3


@kernel
def lane_scratch(n, nl):
    """(scr f32 [SCR_ROWS, nl], laux int32 [n, nl]): the scratch of ``qkx2_lanes``."""
    return np.zeros((SCR_ROWS, nl), np.float32), np.zeros((n, nl), np.int32)


def over_lanes(lanes8, lanes16):
    """``f(args, n, nl)``: the intrinsic of a pair (``lanes8`` / ``lanes16``, one per width
    ``W``) over all ``nl`` lanes -- the 16-wide one once where ``nl == 16``, else the 8-wide one
    per group of 8 lanes; ``args`` are the intrinsic's arguments before ``n, c0, ld``."""

    def f(args, n, nl):
        if nl == 16:
            lanes16(*args, n, 0, nl)
            return
        for c0 in range(0, nl, 8):
            lanes8(*args, n, c0, nl)
    return inline_kernel(f)


_quant_sums = over_lanes(lanes_quant_sums8, lanes_quant_sums16)
_errors = over_lanes(lanes_error8, lanes_error16)


@inline_kernel
def qkx2_fit(sum_w, sum_x, sum_l, sum_l2, sum_xl):
    """One candidate of ggml's ``make_qkx2_quants``: ``(D, this_scale, this_min)`` from the
    weighted sums, the least-squares scale and min with ``min <= 0`` (else ``min = 0`` and
    ``scale = sum_xl / sum_l2``); scale and min are 0 where ``D <= 0`` (no candidate)."""
    D = np.float32(np.float32(sum_w * sum_l2) - np.float32(sum_l * sum_l))
    this_scale = np.float32(0.0)
    this_min = np.float32(0.0)
    if D > np.float32(0.0):
        this_scale = np.float32(np.float32(np.float32(sum_w * sum_xl)
                                           - np.float32(sum_x * sum_l)) / D)
        this_min = np.float32(np.float32(np.float32(sum_l2 * sum_x)
                                         - np.float32(sum_l * sum_xl)) / D)
        if this_min > np.float32(0.0):
            this_min = np.float32(0.0)
            this_scale = np.float32(sum_xl / sum_l2)
    return D, this_scale, this_min


@kernel
def qkx2_lanes(xt, wt, n, nl, nmax, rmin, rdelta, nstep, use_mad, Lt, scales, mins, scr, laux):
    """ggml's ``make_qkx2_quants(n, nmax, x_j, w_j, L_j, &min_j, Laux, rmin, rdelta, nstep,
    use_mad)`` for the ``nl`` sub-blocks ``x_j = xt[:, j]`` with weights ``wt[:, j]`` at once:
    ``Lt[i, j]`` (int32) gets ``L_j[i]``, ``scales[j]`` the returned scale and ``mins[j]`` the
    ``the_min`` output.  ``scr``/``laux`` from ``lane_scratch(n, nl)``."""
    nmax = np.int32(nmax)
    fnmax = np.float32(nmax)
    for j in range(nl):
        mn = np.float32(xt[0, j])
        mx = np.float32(xt[0, j])
        sum_w = np.float32(wt[0, j])
        sum_x = np.float32(sum_w * np.float32(xt[0, j]))
        for i in range(1, n):
            xi = np.float32(xt[i, j])
            if xi < mn:
                mn = xi
            if xi > mx:
                mx = xi
            w = np.float32(wt[i, j])
            sum_w = np.float32(sum_w + w)
            sum_x = np.float32(sum_x + np.float32(w * xi))
        if mn > np.float32(0.0):
            mn = np.float32(0.0)
        scr[_MN, j] = mn
        scr[_MX, j] = mx
        scr[_SW, j] = sum_w
        scr[_SX, j] = sum_x
        if mx == mn:  # constant sub-block: L = 0, scale 0 (lane inactive from here)
            scr[_ACT, j] = np.float32(0.0)
            scr[_ISC, j] = np.float32(0.0)
            scr[_SCALE, j] = np.float32(0.0)
        else:
            scr[_ACT, j] = np.float32(1.0)
            iscale = np.float32(fnmax / np.float32(mx - mn))
            scr[_ISC, j] = iscale
            scr[_SCALE, j] = np.float32(np.float32(1.0) / iscale)
        scr[_LISC, j] = scr[_ISC, j]
        scr[_LMN, j] = mn
    _quant_sums((xt, wt, scr, _MN, _ISC, _S0, nmax, laux), n, nl)
    _errors((xt, wt, laux, scr, _SCALE, _MN, _ERR, use_mad), n, nl)
    for j in range(nl):
        scr[_BEST, j] = scr[_ERR, j]
    if nstep >= 1:
        for step in range(nstep + 1):
            num = np.float32(np.float32(rmin + np.float32(rdelta * np.float32(step))) + fnmax)
            for j in range(nl):
                scr[_ISC, j] = np.float32(num / np.float32(scr[_MX, j] - scr[_MN, j]))
            _quant_sums((xt, wt, scr, _MN, _ISC, _S0, nmax, laux), n, nl)
            for j in range(nl):
                sum_w = scr[_SW, j]
                sum_x = scr[_SX, j]
                sum_l = scr[_S0, j]
                sum_l2 = scr[_S0 + 1, j]
                sum_xl = scr[_S0 + 2, j]
                D, this_scale, this_min = qkx2_fit(sum_w, sum_x, sum_l, sum_l2, sum_xl)
                scr[_D, j] = D
                scr[_A, j] = this_scale
                scr[_B, j] = this_min
            _errors((xt, wt, laux, scr, _A, _B, _ERR, use_mad), n, nl)
            for j in range(nl):
                if scr[_ACT, j] != np.float32(0.0) and scr[_D, j] > np.float32(0.0) \
                        and scr[_ERR, j] < scr[_BEST, j]:
                    scr[_BEST, j] = scr[_ERR, j]
                    scr[_SCALE, j] = scr[_A, j]
                    scr[_LISC, j] = scr[_ISC, j]
                    scr[_LMN, j] = scr[_MN, j]
                    scr[_MN, j] = scr[_B, j]
    # L of each lane: the quants of its winning candidate, recomputed (same f32 operations)
    _quant_sums((xt, wt, scr, _LMN, _LISC, _S0, nmax, Lt), n, nl)
    for j in range(nl):
        if scr[_ACT, j] == np.float32(0.0):
            for i in range(n):
                Lt[i, j] = 0
        scales[j] = scr[_SCALE, j]
        mins[j] = np.float32(-scr[_MN, j])


@inline_kernel
def column_absmax(xt, j, n):
    """``(amax, mx)`` of sub-block ``j`` (column ``xt[:n, j]``): the largest ``|x|`` and the
    first value reaching it -- ggml's ``if (ax > amax) { amax = ax; max = x[i]; }``."""
    mx = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        xi = np.float32(xt[i, j])
        ax = abs(xi)
        if ax > amax:
            amax = ax
            mx = xi
    return amax, mx


# ---- make_qx_quants (rmse_type 1, no importance weights): Q6_K -------------------------------

def _lanes_qx_sums(W):
    VF, VI = ir.VectorType(_f32, W), ir.VectorType(_i32, W)

    @intrinsic
    def lanes_qx_sums(typingctx, xt, scr, isc_row, s0_row, lo, hi, lq, n, c0, ld):
        """Lanes ``c0..c0+W-1``, with ``isc = scr[isc_row]``: ``lq[i, j] = clamp(nearest_int(
        isc[j]*xt[i, j]), lo, hi)`` and, with ``w = x*x``, ``scr[s0_row, j] = sum (w*x)*l``,
        ``scr[s0_row + 1, j] = sum (w*l)*l`` (f32, in order of ``i``)."""
        sig = types.void(xt, scr, isc_row, s0_row, lo, hi, lq, n, c0, ld)

        def codegen(context, builder, signature, args):
            px, psc = (_data(context, builder, signature.args[k], args[k]) for k in (0, 1))
            pl = _data(context, builder, signature.args[6], args[6])
            lo_v, hi_v = (builder.trunc(args[k], _i32) if args[k].type.width > 32 else args[k]
                          for k in (4, 5))
            isc_r, s0_r, n_v, c0_v, ld_v = (_i64_of(builder, args[k]) for k in (2, 3, 7, 8, 9))
            at = lambda r: builder.add(builder.mul(r, ld_v), c0_v)  # noqa: E731
            iscv = builder.load(_vptr(builder, psc, at(isc_r), VF), align=4)
            lov, hiv = _splat(builder, lo_v, VI), _splat(builder, hi_v, VI)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * W)) for _ in range(2)]
            with cgutils.for_range(builder, n_v) as loop:
                off = builder.add(builder.mul(loop.index, ld_v), c0_v)
                xv = builder.load(_vptr(builder, px, off, VF), align=4)
                l = _clamp_v(builder, _nearest_int_v(builder, builder.fmul(iscv, xv), W), lov, hiv)
                builder.store(l, _vptr(builder, pl, off, VI), align=4)
                fl = builder.sitofp(l, VF)
                w = builder.fmul(xv, xv)
                _accumulate(builder, accs, (builder.fmul(builder.fmul(w, xv), fl),
                                            builder.fmul(builder.fmul(w, fl), fl)))
            _store_rows(builder, psc, at, s0_r, accs, VF)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_qx_sums


lanes_qx_sums8, lanes_qx_sums16 = _lanes_qx_sums(8), _lanes_qx_sums(16)


_QMX, _QACT, _QISC, _QBISC, _QSCALE, _QBEST, _QS0 = range(7)
QX_SCR_ROWS = _QS0 + 2
_EPS = np.float32(1e-15)  # ggml's GROUP_MAX_EPS


@kernel
def _qx_pass(xt, scr, isc_row, nmax, lq, n, nl):
    _qx_sums(xt, scr, isc_row, _QS0, nmax, lq, n, nl)


_qx_lanes_sums = over_lanes(lanes_qx_sums8, lanes_qx_sums16)


@kernel
def _qx_sums(xt, scr, isc_row, s0_row, nmax, lq, n, nl):
    _qx_lanes_sums((xt, scr, isc_row, s0_row, np.int32(-nmax), np.int32(nmax - 1), lq), n, nl)


@inline_kernel
def lane_result(Lt, scales, j, n, nmax, live, scale):
    """Lane ``j``'s result of ``qx_lanes`` / ``q3_lanes``: its quants ``l + nmax`` into ``Lt``
    and ``scale``; an all-zero sub-block (``live`` False) gets L = 0 and scale 0."""
    if live:
        for i in range(n):
            Lt[i, j] += nmax
        scales[j] = scale
    else:
        for i in range(n):
            Lt[i, j] = 0
        scales[j] = np.float32(0.0)


@kernel
def qx_lanes(xt, n, nl, nmax, Lt, scales, scr):
    """ggml's ``make_qx_quants(n, nmax, x_j, L_j, rmse_type=1, NULL)`` for the ``nl``
    sub-blocks ``x_j = xt[:, j]`` at once: ``Lt[i, j]`` (int32) gets ``L_j[i]`` (``l + nmax``),
    ``scales[j]`` the returned scale.  ``scr`` f32 [QX_SCR_ROWS, nl], ``xt``/``Lt`` [n, nl]."""
    nmax = np.int32(nmax)
    fnmax = np.float32(nmax)
    for j in range(nl):
        amax, mx = column_absmax(xt, j, n)
        scr[_QMX, j] = mx
        scr[_QACT, j] = np.float32(0.0) if amax < _EPS else np.float32(1.0)
        scr[_QISC, j] = np.float32(np.float32(-fnmax) / mx)   # -nmax / max
        scr[_QBISC, j] = scr[_QISC, j]
    _qx_pass(xt, scr, _QISC, nmax, Lt, n, nl)
    for j in range(nl):
        sumlx = scr[_QS0, j]
        suml2 = scr[_QS0 + 1, j]
        scale = np.float32(sumlx / suml2) if suml2 != np.float32(0.0) else np.float32(0.0)
        scr[_QSCALE, j] = scale
        scr[_QBEST, j] = np.float32(scale * sumlx)
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        num = np.float32(-np.float32(fnmax + np.float32(np.float32(0.1) * np.float32(is_))))
        for j in range(nl):
            scr[_QISC, j] = np.float32(num / scr[_QMX, j])   # -(nmax + 0.1f*is) / max
        _qx_pass(xt, scr, _QISC, nmax, Lt, n, nl)
        for j in range(nl):
            sumlx = scr[_QS0, j]
            suml2 = scr[_QS0 + 1, j]
            if scr[_QACT, j] != np.float32(0.0) and suml2 > np.float32(0.0) and \
                    np.float32(sumlx * sumlx) > np.float32(scr[_QBEST, j] * suml2):
                scr[_QBISC, j] = scr[_QISC, j]
                scale = np.float32(sumlx / suml2)
                scr[_QSCALE, j] = scale
                scr[_QBEST, j] = np.float32(scale * sumlx)
    _qx_pass(xt, scr, _QBISC, nmax, Lt, n, nl)  # L of the chosen candidate, recomputed
    for j in range(nl):
        lane_result(Lt, scales, j, n, nmax, scr[_QACT, j] != np.float32(0.0), scr[_QSCALE, j])


# ---- make_q3_quants (do_rmse): Q3_K ---------------------------------------------------------

def _lanes_q3_try(W):
    VF, VI = ir.VectorType(_f32, W), ir.VectorType(_i32, W)

    @intrinsic
    def lanes_q3_try(typingctx, xt, lq, st, nmax, n, c0, ld):
        """One ``itry`` round of ggml's make_q3_quants refinement for lanes ``c0..c0+W-1``, in order
        of ``i``; lane state in ``st`` rows: 0 ``sumlx``, 1 ``suml2``, 2 active (non-zero: the lane
        still iterates), 3 set to 1.0 where the round changed a quant, else 0.0.  Per element, with
        ``w = x*x`` and ``L = lq[i, j]``: ``slx = sumlx - (w*x)*L``; if ``slx > 0``: ``sl2 = suml2 -
        (w*L)*L``, ``new = clamp(nearest_int((x*sl2)/slx), -nmax, nmax-1)``; if ``new != L``:
        ``slx += (w*x)*new``, ``sl2 += (w*new)*new``; if ``sl2 > 0`` and ``(slx*slx)*suml2 >
        (sumlx*sumlx)*sl2``: take ``new``, ``sumlx = slx``, ``suml2 = sl2``.  (Lanes compute every
        branch; selects keep only what the scalar code would.)"""
        sig = types.void(xt, lq, st, nmax, n, c0, ld)

        def codegen(context, builder, signature, args):
            px, pl, ps = (_data(context, builder, signature.args[k], args[k]) for k in range(3))
            nmax_v = builder.trunc(args[3], _i32) if args[3].type.width > 32 else args[3]
            n_v, c0_v, ld_v = (_i64_of(builder, args[k]) for k in (4, 5, 6))
            row = [builder.add(builder.mul(ir.Constant(_i64, k), ld_v), c0_v) for k in range(4)]
            slx_p, sl2_p = (cgutils.alloca_once_value(
                builder, builder.load(_vptr(builder, ps, row[k], VF), align=4)) for k in range(2))
            zero_f = ir.Constant(VF, [0.0] * W)
            active = builder.fcmp_unordered("!=", builder.load(_vptr(builder, ps, row[2], VF),
                                                               align=4), zero_f)
            changed_p = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(ir.IntType(1), W),
                                                                       [0] * W))
            hiv = _splat(builder, builder.sub(nmax_v, ir.Constant(_i32, 1)), VI)
            lov = _splat(builder, builder.neg(nmax_v), VI)
            with cgutils.for_range(builder, n_v) as loop:
                off = builder.add(builder.mul(loop.index, ld_v), c0_v)
                xv = builder.load(_vptr(builder, px, off, VF), align=4)
                lp = _vptr(builder, pl, off, VI)
                li = builder.load(lp, align=4)
                fli = builder.sitofp(li, VF)
                sumlx = builder.load(slx_p)
                suml2 = builder.load(sl2_p)
                w = builder.fmul(xv, xv)
                wx = builder.fmul(w, xv)
                slx = builder.fsub(sumlx, builder.fmul(wx, fli))
                c1 = builder.fcmp_ordered(">", slx, zero_f)
                sl2 = builder.fsub(suml2, builder.fmul(builder.fmul(w, fli), fli))
                q = builder.fdiv(builder.fmul(xv, sl2), slx)
                nl = _clamp_v(builder, _nearest_int_v(builder, q, W), lov, hiv)
                c2 = builder.icmp_signed("!=", nl, li)
                fn = builder.sitofp(nl, VF)
                slx2 = builder.fadd(slx, builder.fmul(wx, fn))
                sl2b = builder.fadd(sl2, builder.fmul(builder.fmul(w, fn), fn))
                c3 = builder.and_(
                    builder.fcmp_ordered(">", sl2b, zero_f),
                    builder.fcmp_ordered(">", builder.fmul(builder.fmul(slx2, slx2), suml2),
                                         builder.fmul(builder.fmul(sumlx, sumlx), sl2b)))
                take = builder.and_(builder.and_(active, c1), builder.and_(c2, c3))
                builder.store(builder.select(take, nl, li), lp, align=4)
                builder.store(builder.select(take, slx2, sumlx), slx_p)
                builder.store(builder.select(take, sl2b, suml2), sl2_p)
                builder.store(builder.or_(builder.load(changed_p), take), changed_p)
            for k, p in ((0, slx_p), (1, sl2_p)):
                builder.store(builder.load(p), _vptr(builder, ps, row[k], VF), align=4)
            one_f = ir.Constant(VF, [1.0] * W)
            builder.store(builder.select(builder.load(changed_p), one_f, zero_f),
                          _vptr(builder, ps, row[3], VF), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_q3_try


lanes_q3_try8, lanes_q3_try16 = _lanes_q3_try(8), _lanes_q3_try(16)
_q3_try = over_lanes(lanes_q3_try8, lanes_q3_try16)


_3SLX, _3SL2, _3ACT, _3CHG, _3ISC, _3NZ = range(6)
Q3_SCR_ROWS = _3NZ + 1


@kernel
def q3_lanes(xt, n, nl, nmax, Lt, scales, scr):
    """ggml's ``make_q3_quants(n, nmax, x_j, L_j, do_rmse=true)`` for the ``nl`` sub-blocks
    ``x_j = xt[:, j]`` at once: ``Lt[i, j]`` (int32) gets ``L_j[i]`` (``l + nmax``, or 0 for an
    all-zero group), ``scales[j]`` the returned scale.  ``scr`` f32 [Q3_SCR_ROWS, nl]."""
    nmax = np.int32(nmax)
    for j in range(nl):
        amax, mx = column_absmax(xt, j, n)
        scr[_3NZ, j] = np.float32(0.0) if amax < _EPS else np.float32(1.0)
        scr[_3ISC, j] = np.float32(np.float32(-np.float32(nmax)) / mx)   # -nmax / max
    _qx_sums(xt, scr, _3ISC, _3SLX, nmax, Lt, n, nl)  # sumlx, suml2 into rows _3SLX, _3SL2
    for j in range(nl):
        scr[_3ACT, j] = scr[_3NZ, j]
    for itry in range(5):
        _q3_try((xt, Lt, scr, nmax), n, nl)
        more = False
        for j in range(nl):  # a lane whose round changed nothing stops (C: break)
            if scr[_3CHG, j] == np.float32(0.0):
                scr[_3ACT, j] = np.float32(0.0)
            else:
                more = True
        if not more:
            break
    for j in range(nl):
        sumlx = scr[_3SLX, j]
        suml2 = scr[_3SL2, j]
        scale = np.float32(sumlx / suml2) if suml2 > np.float32(0.0) else np.float32(0.0)
        lane_result(Lt, scales, j, n, nmax, scr[_3NZ, j] != np.float32(0.0), scale)


# ---- requantization with the stored scales (every K-quant encoder's last step) --------------

def _lanes_requant(W):
    VF, VI = ir.VectorType(_f32, W), ir.VectorType(_i32, W)

    @intrinsic
    def lanes_requant(typingctx, xt, dm, d, lo, hi, off, lq, n, c0, ld):
        """Lanes ``c0..c0+W-1``: where ``d[j] != 0`` (NaN counts as non-zero, like C's
        ``if (!d) continue``), ``lq[i, j] = clamp(nearest_int(R32(xt[i, j] + dm[j]) / d[j]),
        lo, hi) + off``; other lanes keep ``lq``."""
        sig = types.void(xt, dm, d, lo, hi, off, lq, n, c0, ld)

        def codegen(context, builder, signature, args):
            px, pdm, pd = (_data(context, builder, signature.args[k], args[k]) for k in range(3))
            pl = _data(context, builder, signature.args[6], args[6])
            lo_v, hi_v, off_v = (builder.trunc(args[k], _i32) if args[k].type.width > 32
                                 else args[k] for k in (3, 4, 5))
            n_v, c0_v, ld_v = (_i64_of(builder, args[k]) for k in (7, 8, 9))
            dmv = builder.load(_vptr(builder, pdm, c0_v, VF), align=4)
            dv = builder.load(_vptr(builder, pd, c0_v, VF), align=4)
            take = builder.fcmp_unordered("!=", dv, ir.Constant(VF, [0.0] * W))
            lov, hiv, offv = (_splat(builder, v, VI) for v in (lo_v, hi_v, off_v))
            with cgutils.for_range(builder, n_v) as loop:
                at = builder.add(builder.mul(loop.index, ld_v), c0_v)
                xv = builder.load(_vptr(builder, px, at, VF), align=4)
                q = builder.fdiv(builder.fadd(xv, dmv), dv)
                l = _clamp_v(builder, _nearest_int_v(builder, q, W), lov, hiv)
                lp = _vptr(builder, pl, at, VI)
                builder.store(builder.select(take, builder.add(l, offv),
                                             builder.load(lp, align=4)), lp, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return lanes_requant


lanes_requant8, lanes_requant16 = _lanes_requant(8), _lanes_requant(16)
_requant = over_lanes(lanes_requant8, lanes_requant16)


@kernel
def requant_lanes(xt, dm, d, lo, hi, off, lq, n, nl):
    """ggml's final pass for the ``nl`` sub-blocks ``xt[:, j]``: for each ``j`` with ``d[j] !=
    0``, ``lq[i, j] = clamp(nearest_int(R32(xt[i, j] + dm[j]) / d[j]), lo, hi) + off`` (pass
    ``dm[j] = -0.0`` for ggml's plain ``x / d``: ``x + -0.0`` is ``x`` for every ``x``)."""
    lo = np.int32(lo)
    hi = np.int32(hi)
    off = np.int32(off)
    if ENCODE_LANES:
        _requant((xt, dm, d, lo, hi, off, lq), n, nl)
        return
    for j in range(nl):
        if d[j] == np.float32(0.0):  # C: if (!d) continue;
            continue
        for i in range(n):
            l = nearest_int(np.float32(np.float32(np.float32(xt[i, j]) + dm[j]) / d[j]))
            lq[i, j] = max(lo, min(hi, l)) + off
