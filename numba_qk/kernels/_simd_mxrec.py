"""Explicit-SIMD dots of ggml's FP4 records (MXFP4, NVFP4) with Q8_0 (LLVM IR through numba
intrinsics), equal bit for bit to the portable loops of ``mxrec.py``.

Integers: the packed codes are split into nibbles and looked up in ggml's doubled-e2m1 table with
``pshufb`` (exact int8 values -12..12), sign-extended to i16 lanes beside the sign-extended Q8_0
quants, and ``pmaddwd`` sums lane pairs into i32 (|pair| <= 2 * 12 * 128): every ``S`` is exact.
Floats: lane-wise IEEE instructions in the order of ``mxrec.py``'s docstring -- ``t = R32(d_y *
scale)``, ``v = R32(t * f32(S))`` -- and an in-order fold per lane (one ``fadd`` per term).  No
fast-math flags, so nothing is contracted.  Byte offsets come from the schemas (``mxrec.py``).
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ._simd import (HAVE_AVX512, _Ops, _decl, _float_array_ptr, _fold_into, _gather_f16, _i8,
                    _i16, _i32, _load, _pmaddwd32, _ptr, _reduce_many, _tile_bases, _vec)
from .mxrec import KVALUES, MX_E_AT, MX_QS_AT, NV_D_AT, NV_QS_AT, Y_D_AT, Y_QS_AT

__all__ = ["mxfp4_q8_0_s", "mxfp4_accumulate_x8", "nvfp4_accumulate_x8"]

_F32 = ir.FloatType()


def _kvalues(builder, packed):
    """<2n x i16> k values, element order (all low nibbles, then all high nibbles), of the
    <n x i8> packed code bytes (n = 8 or 16)."""
    n = packed.type.count
    pshufb = _decl(builder, "llvm.x86.ssse3.pshuf.b.128", _vec(_i8, 16),
                   [_vec(_i8, 16), _vec(_i8, 16)])
    table = ir.Constant(_vec(_i8, 16), [int(v) for v in KVALUES])
    if n == 8:  # widen to 16 bytes (upper half unused)
        packed = builder.shuffle_vector(packed, ir.Constant(packed.type, ir.Undefined),
                                        ir.Constant(_vec(_i32, 16), list(range(8)) + [0] * 8))
    lo = builder.and_(packed, ir.Constant(_vec(_i8, 16), [0x0F] * 16))
    hi = builder.lshr(packed, ir.Constant(_vec(_i8, 16), [4] * 16))
    klo = builder.call(pshufb, [table, lo])
    khi = builder.call(pshufb, [table, hi])
    k = builder.shuffle_vector(klo, khi, ir.Constant(_vec(_i32, 2 * n),
                                                      list(range(n)) + list(range(16, 16 + n))))
    return builder.sext(k, _vec(_i16, 2 * n))


def _q8(builder, base, offset, n):
    return builder.sext(_load(builder, base, offset, _vec(_i8, n)), _vec(_i16, n))


def _mxfp4_sums(builder, ops, wbs, xbs):
    """<n x i32>: S of each (MXFP4 record, Q8_0 record) pair; shared records decoded once."""
    decoded, xs, accs = {}, {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in decoded:
            decoded[id(wb)] = _kvalues(builder, _load(builder, wb, MX_QS_AT, _vec(_i8, 16)))
        if id(xb) not in xs:
            xs[id(xb)] = _q8(builder, xb, Y_QS_AT, 32)
        accs.append(_pmaddwd32(builder, ops, decoded[id(wb)], xs[id(xb)]))
    return _reduce_many(builder, accs)


def _gather_u8(builder, bases, offset):
    v = ir.Constant(_vec(_i8, len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, _load(builder, b, offset, _i8), ir.Constant(_i32, i))
    return builder.zext(v, _vec(_i32, len(bases)))


def _e8m0_half(builder, e):
    """2^(e - 128) lane-wise from <n x i32> bytes: bits 0x00200000 << e for e < 2, else
    (e - 1) << 23 (ggml_e8m0_to_fp32_half)."""
    n = e.type.count
    vi = _vec(_i32, n)
    small = builder.shl(ir.Constant(vi, [0x00200000] * n), e)
    big = builder.shl(builder.sub(e, ir.Constant(vi, [1] * n)), ir.Constant(vi, [23] * n))
    bits = builder.select(builder.icmp_unsigned("<", e, ir.Constant(vi, [2] * n)), small, big)
    return builder.bitcast(bits, _vec(_F32, n))


def _ue4m3_half(builder, d):
    """u(d) lane-wise from <n x i32> bytes (ggml_ue4m3_to_fp32): E = (d >> 3) & 15, M = d & 7;
    E > 0: (1 + M/8) * 2^(E - 8), built as f32 bits ((E + 119) << 23) | (M << 20); E = 0:
    R32(f32(M) * 2^-10) (exact); d == 0x7F: 0 (0x00 is 0 by the E = 0 rule)."""
    n = d.type.count
    vi, vf = _vec(_i32, n), _vec(_F32, n)
    e = builder.and_(builder.lshr(d, ir.Constant(vi, [3] * n)), ir.Constant(vi, [15] * n))
    m = builder.and_(d, ir.Constant(vi, [7] * n))
    normal = builder.bitcast(builder.or_(
        builder.shl(builder.add(e, ir.Constant(vi, [119] * n)), ir.Constant(vi, [23] * n)),
        builder.shl(m, ir.Constant(vi, [20] * n))), vf)
    sub = builder.fmul(builder.sitofp(m, vf), ir.Constant(vf, [2.0 ** -10] * n))
    v = builder.select(builder.icmp_unsigned("==", e, ir.Constant(vi, [0] * n)), sub, normal)
    return builder.select(builder.icmp_unsigned("==", d, ir.Constant(vi, [0x7F] * n)),
                          ir.Constant(vf, [0.0] * n), v)


@intrinsic
def mxfp4_q8_0_s(typingctx, w, w_off, x, x_off):
    """S of the MXFP4 record at byte ``w_off`` of ``w`` and the Q8_0 record at ``x_off`` of
    ``x`` (exact int32; both records' bytes contiguous)."""
    if not isinstance(w, types.Array) or not isinstance(x, types.Array):
        return None
    sig = types.int32(w, types.intp, x, types.intp)

    def codegen(context, builder, signature, args):
        ops = _Ops(builder, HAVE_AVX512)
        wb = _ptr(context, builder, signature.args[0], args[0], args[1])
        xb = _ptr(context, builder, signature.args[2], args[2], args[3])
        s = _mxfp4_sums(builder, ops, [wb], [xb])
        return builder.extract_element(s, ir.Constant(_i32, 0))
    return sig, codegen


@intrinsic
def mxfp4_accumulate_x8(typingctx, over_rows, w, w_off, x, x_off, step, acc, acc_at, first):
    """Fold the values v = R32(R32(d_y * 2^(e-128)) * f32(S)) of one tile into
    ``acc.flat[acc_at : acc_at + 8]`` (lane k: ``acc = v`` if ``first`` else ``R32(acc + v)``).
    Tile: 8 weight records ``step`` bytes apart against one Q8_0 record (``over_rows``, gemv), or
    one weight record against 8 Q8_0 records ``step`` bytes apart (gemm)."""
    rows = over_rows.literal_value if isinstance(over_rows, types.BooleanLiteral) else None
    if rows is None:
        return None
    sig = types.none(over_rows, w, types.intp, x, types.intp, types.intp, acc, types.intp,
                     types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, x_arr, x_off_v, step_v, acc_arr, acc_at_v, first_v = args[1:9]
        wbs, xbs = _tile_bases(context, builder, signature.args[1], w_arr, w_off_v,
                               signature.args[3], x_arr, x_off_v, step_v, rows, 8)
        s = _mxfp4_sums(builder, _Ops(builder, HAVE_AVX512), wbs, xbs)
        h = _e8m0_half(builder, _gather_u8(builder, wbs, MX_E_AT))
        t = builder.fmul(_gather_f16(builder, xbs, Y_D_AT), h)           # R32(d_y * h(e))
        v = builder.fmul(t, builder.sitofp(s, _vec(_F32, 8)))            # R32(t * f32(S))
        acc_ptr = builder.gep(_float_array_ptr(context, builder, signature.args[6], acc_arr),
                              [acc_at_v])
        _fold_into(builder, acc_ptr, v, first_v)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def nvfp4_accumulate_x8(typingctx, over_rows, w, w_off, x, x_off, x_next, step, acc, acc_at,
                        first):
    """As ``mxfp4_accumulate_x8`` for NVFP4: per weight record, its 4 sub-block terms
    v_s = R32(R32(d_y * u(d_s)) * f32(S_s)) are folded in order (sub-blocks 0, 1 against the
    Q8_0 record at ``x_off``, 2, 3 against the one at ``x_off + x_next``); ``first`` applies to
    sub-block 0 only.  Tiles as ``mxfp4_accumulate_x8`` (``step`` between the 8 records)."""
    rows = over_rows.literal_value if isinstance(over_rows, types.BooleanLiteral) else None
    if rows is None:
        return None
    sig = types.none(over_rows, w, types.intp, x, types.intp, types.intp, types.intp, acc,
                     types.intp, types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, x_arr, x_off_v, x_next_v, step_v, acc_arr, acc_at_v, first_v = args[1:10]
        wty, xty = signature.args[1], signature.args[3]
        wbs, xbs0 = _tile_bases(context, builder, wty, w_arr, w_off_v, xty, x_arr, x_off_v,
                                step_v, rows, 8)
        _, xbs1 = _tile_bases(context, builder, wty, w_arr, w_off_v, xty, x_arr,
                              builder.add(x_off_v, x_next_v), step_v, rows, 8)
        ops = _Ops(builder, HAVE_AVX512)
        acc_ptr = builder.gep(_float_array_ptr(context, builder, signature.args[7], acc_arr),
                              [acc_at_v])
        decoded, xs = {}, {}
        for s_idx in range(4):
            xbs = xbs0 if s_idx < 2 else xbs1
            lane = Y_QS_AT + 16 * (s_idx % 2)
            accs = []
            for wb, xb in zip(wbs, xbs):
                key = (id(wb), s_idx)
                if key not in decoded:
                    decoded[key] = _kvalues(builder, _load(builder, wb, NV_QS_AT + 8 * s_idx,
                                                           _vec(_i8, 8)))
                if (id(xb), lane) not in xs:
                    xs[(id(xb), lane)] = _q8(builder, xb, lane, 16)
                accs.append(builder.call(ops.maddwd8, [decoded[key], xs[(id(xb), lane)]]))
            s = _reduce_many(builder, accs)                               # <8 x i32> S_s
            u = _ue4m3_half(builder, _gather_u8(builder, wbs, NV_D_AT + s_idx))
            t = builder.fmul(_gather_f16(builder, xbs, Y_D_AT), u)       # R32(d_y * u(d_s))
            v = builder.fmul(t, builder.sitofp(s, _vec(_F32, 8)))        # R32(t * f32(S_s))
            _fold_into(builder, acc_ptr, v,
                       first_v if s_idx == 0 else ir.Constant(first_v.type, 0))
        return context.get_dummy_value()
    return sig, codegen
