"""Explicit-SIMD decoders of ggml's legacy formats (LLVM IR through numba intrinsics).

Every weight quant becomes a signed i16 lane (q-8, q, q-16, q or the int8), every Q8_0/Q8_1
activation quant a sign-extended i16 lane, and pmaddwd sums lane pairs into i32
(|pair| <= 2 * 128 * 128: exact for any record bytes).  S_b is the sum of those lanes; the float
steps are lane-wise IEEE instructions in the order of ``legacy.py``'s docstring.  Codes and byte
offsets come from ``_legacy_layout.py`` (the schemas); ``code`` must be a compile-time literal.
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from . import _legacy_layout as _LL
from ._simd import (HAVE_AVX512, _Ops, _gather_f16, _i8, _i16, _i32, _literal_int, _load,
                    _pmaddwd32, _ptr, _reduce_many, _tile_fold, _vec)

__all__ = ["legacy_block_value", "legacy_accumulate_x8"]

# Per-code layout, read from the schemas (_legacy_layout.py): only weight formats have a dot.
_L_WEIGHT = {c for c, fmt in enumerate(_LL.FORMATS) if fmt in _LL.WEIGHT_FORMATS}


def _legacy_weights(builder, code, wbase):
    """<32 x i16>: the integers a dot multiplies, for one legacy weight record."""
    v32i16 = _vec(_i16, 32)
    if _LL.FORMATS[code].field("qs").signed:  # int8 quants
        return builder.sext(_load(builder, wbase, _LL._QS_AT[code], _vec(_i8, 32)), v32i16)
    qs = _load(builder, wbase, _LL._QS_AT[code], _vec(_i8, 16))
    lo = builder.and_(qs, ir.Constant(_vec(_i8, 16), [0x0F] * 16))
    hi = builder.lshr(qs, ir.Constant(_vec(_i8, 16), [4] * 16))
    q = builder.shuffle_vector(lo, hi, ir.Constant(_vec(_i32, 32), list(range(32))))
    if _LL._QH_AT[code] >= 0:  # fifth bits: bit j of the u32 qh -> 16 in lane j
        qh = _load(builder, wbase, _LL._QH_AT[code], _i32)
        mask = builder.bitcast(qh, _vec(ir.IntType(1), 32))
        q = builder.or_(q, builder.select(mask, ir.Constant(_vec(_i8, 32), [16] * 32),
                                          ir.Constant(_vec(_i8, 32), [0] * 32)))
    q16 = builder.zext(q, v32i16)
    if _LL._ZERO[code]:  # q - 8 (Q4_0), q - 16 (Q5_0)
        q16 = builder.sub(q16, ir.Constant(v32i16, [_LL._ZERO[code]] * 32))
    return q16


def _legacy_sums(builder, ops, code, wbases, xbases):
    """S for the record pairs zip(wbases, xbases) as one <n x i32> vector."""
    decoded, xs, accs = {}, {}, []
    x_at = _LL._X_QS_AT[code]
    for wb, xb in zip(wbases, xbases):
        if id(wb) not in decoded:
            decoded[id(wb)] = _legacy_weights(builder, code, wb)
        if id(xb) not in xs:
            xs[id(xb)] = builder.sext(_load(builder, xb, x_at, _vec(_i8, 32)), _vec(_i16, 32))
        accs.append(_pmaddwd32(builder, ops, decoded[id(wb)], xs[id(xb)]))
    return _reduce_many(builder, accs)


def _legacy_values(builder, code, s_vec, wbs, xbs):
    """Lane-wise float steps: v = R32(dx * R32(dw * f32(S))) [+ R32(mw * sx)]."""
    f32v = _vec(ir.FloatType(), s_vec.type.count)
    dw = _gather_f16(builder, wbs, _LL._D_AT[code])
    dx = _gather_f16(builder, xbs, _LL._X_D_AT[code])
    v = builder.fmul(dx, builder.fmul(dw, builder.sitofp(s_vec, f32v)))
    if _LL._M_AT[code] >= 0:
        v = builder.fadd(v, builder.fmul(_gather_f16(builder, wbs, _LL._M_AT[code]),
                                         _gather_f16(builder, xbs, _LL._X_S_AT[code])))
    return v


def _make_legacy_value(wide: bool):
    @intrinsic
    def legacy_block_value(typingctx, code, w, w_off, x, x_off):
        """v_b of the canonical legacy dot for the weight record at byte ``w_off`` of ``w`` and
        the activation record at byte ``x_off`` of ``x``; ``code`` must be a literal."""
        c = _literal_int(code)
        if c is None or c not in _L_WEIGHT or not isinstance(w, types.Array):
            return None
        sig = types.float32(code, w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            wb = _ptr(context, builder, signature.args[1], args[1], args[2])
            xb = _ptr(context, builder, signature.args[3], args[3], args[4])
            s_vec = _legacy_sums(builder, ops, c, [wb], [xb])
            v = _legacy_values(builder, c, s_vec, [wb], [xb])
            return builder.extract_element(v, ir.Constant(_i32, 0))
        return sig, codegen
    return legacy_block_value


def _make_legacy_accumulate(wide: bool, n: int = 8):
    @intrinsic
    def legacy_accumulate(typingctx, code, over_rows, w, w_off, x, x_off, step, acc, acc_at,
                          first):
        """As the Q4_K accumulate intrinsics, for legacy format ``code`` (a literal);
        ``over_rows`` (a literal bool) picks the gemv (8 weight rows) or gemm (8 activations)
        tiling."""
        c = _literal_int(code)
        rows = over_rows.literal_value if isinstance(over_rows, types.BooleanLiteral) else None
        if c is None or c not in _L_WEIGHT or rows is None:
            return None
        sig = types.none(code, over_rows, w, types.intp, x, types.intp, types.intp, acc,
                         types.intp, types.intp)

        def codegen(context, builder, signature, args):
            def values(wbs, xbs):
                s_vec = _legacy_sums(builder, _Ops(builder, wide), c, wbs, xbs)
                return _legacy_values(builder, c, s_vec, wbs, xbs)
            return _tile_fold(context, builder, signature, args, 2, rows, n, values)
        return sig, codegen
    return legacy_accumulate


legacy_block_value = _make_legacy_value(wide=HAVE_AVX512)
legacy_accumulate_x8 = _make_legacy_accumulate(wide=HAVE_AVX512)
