"""Explicit-SIMD decoders of the other K-quants' dots against Q8_K (LLVM IR through numba
intrinsics, with the plumbing of ``_simd.py``).

Only exact integer work is done here: the record statistic ``S`` of DESIGN.md section 7.  Integer
sums are exact in any order, so the vector organisation gives the integers of the readable loops
(``record_sums_<t>_q8_k``); every float step stays in plain numba code, in the table's order.

Q6_K, per group of 32 elements ``e = 128c + 32g + l`` (``l`` = lane)::

    ql  = bytes [64c + 32(g & 1), +32)  -> low nibble (g < 2) or high nibble (g >= 2)
    qh  = bytes [128 + 32c, +32)        -> (qh >> 2g) & 3, shifted left 4
    q'  = (nibble | high) - 32           (i8, -32..31)
    w16 = sext(q') * sext(sc[j])         (i16, |.| <= 32 * 128 = 4096: exact; lanes 0..15 use
                                          sub-block j = 8c + 2g, lanes 16..31 sub-block j + 1)
    acc += pmaddwd(w16, sext(xq[e]))     (i32 pairs, |.| <= 2 * 4096 * 128: exact)
    S = reduce_add(acc)                  (|S| <= 2**27: exact in int32)

The record's bytes must be contiguous (unit stride along the byte axis); the callers check it
and use the portable loops otherwise.
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ..formats import quant
from ._simd import HAVE_AVX512, _Ops, _i8, _i16, _i32, _load, _pmaddwd32, _ptr, _reduce_many, _vec

__all__ = ["q6_k_q8_k_s", "q6_k_q8_k_s_avx2", "q6_k_q8_k_s_avx512"]

_Q6_QL_AT = quant.q6_k.field("ql").start
_Q6_QH_AT = quant.q6_k.field("qh").start
_Q6_SC_AT = quant.q6_k.field("sc").start
_A_Q_AT = quant.q8_k.field("q").start


def _splat_i8(n, value):
    return ir.Constant(_vec(_i8, n), [value] * n)


def _q6_k_s(builder, ops, wb, xb):
    """S of one Q6_K record at ``wb`` against the Q8_K record at ``xb``, as an i32."""
    v32i8, v32i16 = _vec(_i8, 32), _vec(_i16, 32)
    sc = builder.sext(_load(builder, wb, _Q6_SC_AT, _vec(_i8, 16)), _vec(_i16, 16))
    acc = None
    for c in range(2):
        qh = _load(builder, wb, _Q6_QH_AT + 32 * c, v32i8)
        for g in range(4):
            ql = _load(builder, wb, _Q6_QL_AT + 64 * c + 32 * (g & 1), v32i8)
            nib = (builder.and_(ql, _splat_i8(32, 0x0F)) if g < 2
                   else builder.lshr(ql, _splat_i8(32, 4)))
            high = builder.shl(builder.and_(builder.lshr(qh, _splat_i8(32, 2 * g)),
                                            _splat_i8(32, 3)), _splat_i8(32, 4))
            q = builder.sub(builder.or_(nib, high), _splat_i8(32, 32))
            j = 8 * c + 2 * g
            scales = builder.shuffle_vector(sc, ir.Constant(sc.type, ir.Undefined),
                                            ir.Constant(_vec(_i32, 32), [j] * 16 + [j + 1] * 16))
            w16 = builder.mul(builder.sext(q, v32i16), scales)
            x16 = builder.sext(_load(builder, xb, _A_Q_AT + 128 * c + 32 * g, v32i8), v32i16)
            p = _pmaddwd32(builder, ops, w16, x16)
            acc = p if acc is None else builder.add(acc, p)
    return builder.extract_element(_reduce_many(builder, [acc]), ir.Constant(_i32, 0))


def _make_q6_k_s(wide: bool):
    @intrinsic
    def q6_k_q8_k_s(typingctx, w, w_off, x, x_off):
        """S (int32) for the Q6_K record at byte ``w_off`` of uint8 array ``w`` and the Q8_K
        record at byte ``x_off`` of ``x`` (both records' bytes contiguous)."""
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = types.int32(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            wb = _ptr(context, builder, signature.args[0], args[0], args[1])
            xb = _ptr(context, builder, signature.args[2], args[2], args[3])
            return _q6_k_s(builder, ops, wb, xb)
        return sig, codegen
    return q6_k_q8_k_s


q6_k_q8_k_s_avx2 = _make_q6_k_s(wide=False)
q6_k_q8_k_s_avx512 = _make_q6_k_s(wide=True)
q6_k_q8_k_s = q6_k_q8_k_s_avx512 if HAVE_AVX512 else q6_k_q8_k_s_avx2
