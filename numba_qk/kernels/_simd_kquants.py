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

Q5_K, Q3_K and Q2_K the same way, eight vectors of 32 elements in element order, the (signed)
sub-block scale multiplied into each i16 lane first (|q * sc| <= 31 * 63, 4 * 32, 3 * 15: exact),
then pmaddwd against the sign-extended Q8_K quants.  Their T (Q5_K, Q2_K: mins times the stored
bsum) stays in the numba code.

The record's bytes must be contiguous (unit stride along the byte axis); the callers check it
and use the portable loops otherwise.
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ..formats import quant
from ._simd import HAVE_AVX512, _Ops, _i8, _i16, _i32, _load, _pmaddwd32, _ptr, _reduce_many, _vec
from ._simd import _splat_lanes
from ._simd_q4_k import _unpack_scales

__all__ = ["q6_k_q8_k_s", "q6_k_q8_k_s_avx2", "q6_k_q8_k_s_avx512",
           "q5_k_q8_k_s", "q3_k_q8_k_s", "q2_k_q8_k_s", "q5_k_q8_k_st", "q2_k_q8_k_st"]

_Q6_QL_AT = quant.q6_k.field("ql").start
_Q6_QH_AT = quant.q6_k.field("qh").start
_Q6_SC_AT = quant.q6_k.field("sc").start
_A_Q_AT = quant.q8_k.field("q").start
_A_BSUM_AT = quant.q8_k.field("bsum").start
_Q5_SC_AT = quant.q5_k.field("sc").start
_Q5_QH_AT = quant.q5_k.field("qh").start
_Q5_QL_AT = quant.q5_k.field("ql").start
_Q3_HM_AT = quant.q3_k.field("hmask").start
_Q3_QL_AT = quant.q3_k.field("ql").start
_Q3_SC_AT = quant.q3_k.field("sc").start
_Q2_SC_AT = quant.q2_k.field("sc").start
_Q2_Q_AT = quant.q2_k.field("q").start
# Q5_K packs sc/m exactly as Q4_K (spec 000), at the same offset: _unpack_scales reads both.
assert _Q5_SC_AT == quant.q4_k.field("sc").start


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


def _dot_groups(builder, ops, xb, weights):
    """S from 8 weight vectors <32 x i16> (element order, scales applied, each lane's
    |w| <= 4096) against the 256 Q8_K quants at ``xb``."""
    acc = None
    for v, w16 in enumerate(weights):
        x16 = builder.sext(_load(builder, xb, _A_Q_AT + 32 * v, _vec(_i8, 32)), _vec(_i16, 32))
        p = _pmaddwd32(builder, ops, w16, x16)
        acc = p if acc is None else builder.add(acc, p)
    return builder.extract_element(_reduce_many(builder, [acc]), ir.Constant(_i32, 0))


def _two_scales(builder, sc16, j):
    """<32 x i16>: lanes 0..15 sc16[j], lanes 16..31 sc16[j + 1]."""
    return builder.shuffle_vector(sc16, ir.Constant(sc16.type, ir.Undefined),
                                  ir.Constant(_vec(_i32, 32), [j] * 16 + [j + 1] * 16))


def _q5_k_s(builder, ops, wb, xb):
    """Q5_K: S = sum_s sc_s * sum q x, q = ql nibble | qh bit << 4 (0..31), sc 0..63."""
    v32i8, v32i16 = _vec(_i8, 32), _vec(_i16, 32)
    sc8, _ = _unpack_scales(builder, wb)                   # <8 x i16>
    qh = _load(builder, wb, _Q5_QH_AT, v32i8)
    weights = []
    for p in range(4):
        ql = _load(builder, wb, _Q5_QL_AT + 32 * p, v32i8)
        for half, nib in ((0, builder.and_(ql, _splat_i8(32, 0x0F))),
                          (1, builder.lshr(ql, _splat_i8(32, 4)))):
            bit = builder.and_(builder.lshr(qh, _splat_i8(32, 2 * p + half)), _splat_i8(32, 1))
            q = builder.or_(nib, builder.shl(bit, _splat_i8(32, 4)))
            sc = builder.shuffle_vector(sc8, ir.Constant(sc8.type, ir.Undefined),
                                        ir.Constant(_vec(_i32, 32), [2 * p + half] * 32))
            weights.append(builder.mul(builder.zext(q, v32i16), sc))
    return _dot_groups(builder, ops, xb, weights)


def _q2_k_s(builder, ops, wb, xb):
    """Q2_K: S = sum_j sc_j * sum q x, q = (byte >> 2g) & 3, sc_j = low nibble of byte j."""
    v32i8, v32i16 = _vec(_i8, 32), _vec(_i16, 32)
    sc16 = builder.zext(builder.and_(_load(builder, wb, _Q2_SC_AT, _vec(_i8, 16)),
                                     _splat_i8(16, 0x0F)), _vec(_i16, 16))
    weights = []
    for c in range(2):
        qs = _load(builder, wb, _Q2_Q_AT + 32 * c, v32i8)
        for g in range(4):
            q = builder.and_(builder.lshr(qs, _splat_i8(32, 2 * g)), _splat_i8(32, 3))
            weights.append(builder.mul(builder.zext(q, v32i16), _two_scales(builder, sc16,
                                                                              8 * c + 2 * g)))
    return _dot_groups(builder, ops, xb, weights)


def _q3_k_scales(builder, wb):
    """<16 x i16>: Q3_K's signed scales sc_j - 32 (6-bit fields, see formats/kquants.py)."""
    v = ir.Constant(_vec(_i16, 16), None)
    for j in range(16):
        lo = _load(builder, wb, _Q3_SC_AT + j % 8, _i8)
        lo = builder.and_(builder.lshr(lo, ir.Constant(_i8, 4 * (j // 8))), ir.Constant(_i8, 0x0F))
        hi = _load(builder, wb, _Q3_SC_AT + 8 + j % 4, _i8)
        hi = builder.and_(builder.lshr(hi, ir.Constant(_i8, 2 * (j // 4))), ir.Constant(_i8, 3))
        sc = builder.or_(lo, builder.shl(hi, ir.Constant(_i8, 4)))
        v = builder.insert_element(v, builder.sub(builder.zext(sc, _i16), ir.Constant(_i16, 32)),
                                   ir.Constant(_i32, j))
    return v


def _q3_k_s(builder, ops, wb, xb):
    """Q3_K: S = sum_j (sc_j - 32) * sum q x, q = low 2 bits - (4 where the hmask bit is clear)."""
    v32i8, v32i16 = _vec(_i8, 32), _vec(_i16, 32)
    sc16 = _q3_k_scales(builder, wb)
    hm = _load(builder, wb, _Q3_HM_AT, v32i8)
    weights = []
    for c in range(2):
        qs = _load(builder, wb, _Q3_QL_AT + 32 * c, v32i8)
        for g in range(4):
            low = builder.and_(builder.lshr(qs, _splat_i8(32, 2 * g)), _splat_i8(32, 3))
            bit = builder.and_(builder.lshr(hm, _splat_i8(32, 4 * c + g)), _splat_i8(32, 1))
            # bit set: q = low; clear: q = low - 4  ->  q = low - 4 + 4 * bit
            q = builder.add(builder.sub(low, _splat_i8(32, 4)), builder.shl(bit, _splat_i8(32, 2)))
            weights.append(builder.mul(builder.sext(q, v32i16), _two_scales(builder, sc16,
                                                                              8 * c + 2 * g)))
    return _dot_groups(builder, ops, xb, weights)


def _make_s(gen, wide: bool):
    @intrinsic
    def record_s(typingctx, w, w_off, x, x_off):
        """S (int32) for the weight record at byte ``w_off`` of uint8 array ``w`` and the Q8_K
        record at byte ``x_off`` of ``x`` (both records' bytes contiguous)."""
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = types.int32(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            wb = _ptr(context, builder, signature.args[0], args[0], args[1])
            xb = _ptr(context, builder, signature.args[2], args[2], args[3])
            return gen(builder, ops, wb, xb)
        return sig, codegen
    return record_s


def _t_of(builder, ops, xb, mins16):
    """T = sum_k mins16[k] * bsum[k] (the stored int16 bsum; pmaddwd pairs <= 2 * 32768 * 63)."""
    bsum = _load(builder, xb, _A_BSUM_AT, _vec(_i16, 16))
    t = builder.call(ops.maddwd8, [bsum, mins16])
    return builder.extract_element(_reduce_many(builder, [t]), ir.Constant(_i32, 0))


def _q5_k_t(builder, ops, wb, xb):
    """Q5_K: T = sum_s m_s * (bsum_2s + bsum_2s+1)."""
    _, m8 = _unpack_scales(builder, wb)
    return _t_of(builder, ops, xb, _splat_lanes(builder, m8, [k // 2 for k in range(16)]))


def _q2_k_t(builder, ops, wb, xb):
    """Q2_K: T = sum_j m_j * bsum_j, m_j = high nibble of byte j."""
    m = builder.lshr(_load(builder, wb, _Q2_SC_AT, _vec(_i8, 16)), _splat_i8(16, 4))
    return _t_of(builder, ops, xb, builder.zext(m, _vec(_i16, 16)))


def _make_st(gen_s, gen_t, wide: bool):
    @intrinsic
    def record_st(typingctx, w, w_off, x, x_off):
        """(S, T) (int32) for the weight record at byte ``w_off`` of ``w`` and the Q8_K record
        at byte ``x_off`` of ``x`` (both records' bytes contiguous)."""
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = types.UniTuple(types.int32, 2)(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            wb = _ptr(context, builder, signature.args[0], args[0], args[1])
            xb = _ptr(context, builder, signature.args[2], args[2], args[3])
            return context.make_tuple(builder, signature.return_type,
                                      [gen_s(builder, ops, wb, xb), gen_t(builder, ops, wb, xb)])
        return sig, codegen
    return record_st


q6_k_q8_k_s_avx2 = _make_s(_q6_k_s, wide=False)
q6_k_q8_k_s_avx512 = _make_s(_q6_k_s, wide=True)
q6_k_q8_k_s = q6_k_q8_k_s_avx512 if HAVE_AVX512 else q6_k_q8_k_s_avx2
q5_k_q8_k_s_avx2 = _make_s(_q5_k_s, wide=False)
q5_k_q8_k_s_avx512 = _make_s(_q5_k_s, wide=True)
q5_k_q8_k_s = q5_k_q8_k_s_avx512 if HAVE_AVX512 else q5_k_q8_k_s_avx2
q3_k_q8_k_s_avx2 = _make_s(_q3_k_s, wide=False)
q3_k_q8_k_s_avx512 = _make_s(_q3_k_s, wide=True)
q3_k_q8_k_s = q3_k_q8_k_s_avx512 if HAVE_AVX512 else q3_k_q8_k_s_avx2
q2_k_q8_k_s_avx2 = _make_s(_q2_k_s, wide=False)
q2_k_q8_k_s_avx512 = _make_s(_q2_k_s, wide=True)
q2_k_q8_k_s = q2_k_q8_k_s_avx512 if HAVE_AVX512 else q2_k_q8_k_s_avx2
q5_k_q8_k_st = _make_st(_q5_k_s, _q5_k_t, wide=HAVE_AVX512)
q2_k_q8_k_st = _make_st(_q2_k_s, _q2_k_t, wide=HAVE_AVX512)
