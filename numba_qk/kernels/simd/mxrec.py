"""Explicit-SIMD dots of ggml's FP4 records (MXFP4, NVFP4) with Q8_0 (LLVM IR through numba
intrinsics), equal bit for bit to the portable loops of ``mxrec.py``.

Integers: the packed codes are split into nibbles and looked up in ggml's doubled-e2m1 table with
``pshufb`` (exact int8 values -12..12); ``pmaddubsw`` multiplies ``|q|`` (unsigned: |-128| = 128
fits, where ggml's sign-the-activation trick would overflow) by ``k`` carrying q's sign (|k| <=
12 fits), each i16 pair sum <= 2 * 128 * 12, then ``pmaddwd`` with ones widens to i32 (measured
~20 % faster than widening both sides to i16 first): every ``S`` is exact.
Floats: lane-wise IEEE instructions in the order of ``mxrec.py``'s docstring -- ``t = R32(d_y *
scale)``, ``v = R32(t * f32(S))`` -- and an in-order fold per lane (one ``fadd`` per term).  No
fast-math flags, so nothing is contracted.  Byte offsets come from the schemas (``mxrec.py``).
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numba_qk.kernels.simd.base import HAVE_VNNI, decl, nibble_lookup, float_array_ptr, fold_into, i8, i16, i32, load, byte_ptr, reduce_many, vcall, vec
from numba_qk.kernels.fp4.layout import KVALUES, MX_E_AT, MX_QS_AT, NV_D_AT, NV_QS_AT, Y_QS_AT

__all__ = ["mxfp4_q8_0_s", "mxfp4_rows_x8_t",
           "nvfp4_rows_x8_t", "mxfp4_acts_x8_t", "nvfp4_acts_x8_t", "XT_ROWS"]

_F32 = ir.FloatType()


def _maddubs_sum(builder, k, q):
    """<8 x i32> pair sums of k * q for <32 x i8> k (|k| <= 12) and Q8_0 quants q: pmaddubsw of
    |q| (unsigned; |-128| = 128 fits) and k with q's sign (|k * sgn q| <= 12 fits), each i16
    pair sum <= 2 * 128 * 12 = 3072 (no saturation), then pmaddwd with ones: exact."""
    v = vec(i8, 32)
    zero = ir.Constant(v, [0] * 32)
    neg = builder.icmp_signed("<", q, zero)
    absq = builder.select(neg, builder.sub(zero, q), q)         # -128 wraps to 0x80 = 128
    ks = builder.select(neg, builder.sub(zero, k),
                        builder.select(builder.icmp_signed("==", q, zero), zero, k))
    maddubs = decl(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(i16, 16), [v, v])
    maddwd = decl(builder, "llvm.x86.avx2.pmadd.wd", vec(i32, 8),
                   [vec(i16, 16), vec(i16, 16)])
    p16 = builder.call(maddubs, [absq, ks])
    return builder.call(maddwd, [p16, ir.Constant(vec(i16, 16), [1] * 16)])


def _mxfp4_sums(builder, wbs, xbs):
    """<n x i32>: S of each (MXFP4 record, Q8_0 record) pair; shared records decoded once."""
    decoded, accs = {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in decoded:
            decoded[id(wb)] = nibble_lookup(builder, load(builder, wb, MX_QS_AT, vec(i8, 16)),
                                            KVALUES)
        accs.append(_maddubs_sum(builder, decoded[id(wb)],
                                 load(builder, xb, Y_QS_AT, vec(i8, 32))))
    return reduce_many(builder, accs)


def _e8m0_half(builder, e):
    """2^(e - 128) lane-wise from <n x i32> bytes: bits 0x00200000 << e for e < 2, else
    (e - 1) << 23 (ggml_e8m0_to_fp32_half)."""
    n = e.type.count
    vi = vec(i32, n)
    small = builder.shl(ir.Constant(vi, [0x00200000] * n), e)
    big = builder.shl(builder.sub(e, ir.Constant(vi, [1] * n)), ir.Constant(vi, [23] * n))
    bits = builder.select(builder.icmp_unsigned("<", e, ir.Constant(vi, [2] * n)), small, big)
    return builder.bitcast(bits, vec(_F32, n))


def _ue4m3_half(builder, d):
    """u(d) lane-wise from <n x i32> bytes (ggml_ue4m3_to_fp32): E = (d >> 3) & 15, M = d & 7;
    E > 0: (1 + M/8) * 2^(E - 8), built as f32 bits ((E + 119) << 23) | (M << 20); E = 0:
    R32(f32(M) * 2^-10) (exact); d == 0x7F: 0 (0x00 is 0 by the E = 0 rule)."""
    n = d.type.count
    vi, vf = vec(i32, n), vec(_F32, n)
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
        wb = byte_ptr(context, builder, signature.args[0], args[0], args[1])
        xb = byte_ptr(context, builder, signature.args[2], args[2], args[3])
        s = _mxfp4_sums(builder, [wb], [xb])
        return builder.extract_element(s, ir.Constant(i32, 0))
    return sig, codegen


# ---- gemv tiles in the transposed ("lane = row") layout --------------------------------------
#
# The single-record decoder above computes S in i32 lanes and reduces them horizontally.
# The tiles below never reduce: lane k of every vector belongs to row k of the tile.  The 16
# code bytes of each of the 8 weight records are read as 4 i32 words and transposed (8 x 4, two
# 128-bit loads per ymm and 8 in-lane unpacks), so vector U_c holds word c of every row; one
# pshufb per nibble half turns the codes into ``k + 12`` (u8, 0..24), and ``vpdpbusd`` (or
# pmaddubsw + pmaddwd without VNNI) multiplies them by the 4 matching activation quants
# broadcast to every lane.  Word c's low nibbles are elements 4c..4c+3, its high nibbles
# 16+4c..16+4c+3 (MXFP4), so each lane sums 4 products per instruction and 8 instructions give
# the whole record.  The offset is removed exactly: the accumulator starts at
# ``-12 * sum(q)`` of the activation record (computed once per call), so each lane ends at
# ``sum (k + 12) * q - 12 * sum q = S``.  Bounds: each product |(k + 12) * q| <= 24 * 128, each
# vpdpbusd lane adds 4 of them (or pmaddubsw's i16 pair <= 6144), |S| < 2^17: exact, no
# saturation (vpdpbusd, not vpdpbusds).

KVALUES_U12 = [int(v) + 12 for v in KVALUES]  # 12, 13, ..., 24, 12, 11, ..., 0


def _transpose_words(builder, bases, at):
    """4 <8 x i32> vectors: vector c, lane k = i32 word c of the 16 bytes at ``at`` of
    ``bases[k]`` (8 bases)."""
    v4 = vec(i32, 4)
    rows = [load(builder, b, at, v4) for b in bases]
    cat = ir.Constant(vec(i32, 8), list(range(8)))
    y = [builder.shuffle_vector(rows[k], rows[k + 4], cat) for k in range(4)]  # [r_k | r_k+4]

    def sh(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(vec(i32, 8), idx))

    lo32, hi32 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]   # unpack{lo,hi}_epi32
    lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]   # unpack{lo,hi}_epi64
    t0, t1 = sh(y[0], y[1], lo32), sh(y[0], y[1], hi32)
    t2, t3 = sh(y[2], y[3], lo32), sh(y[2], y[3], hi32)
    return [sh(t0, t2, lo64), sh(t0, t2, hi64), sh(t1, t3, lo64), sh(t1, t3, hi64)]


def _codes_u12(builder, words):
    """(<32 x i8>, <32 x i8>): ``k + 12`` of the low and the high nibbles of each byte."""
    v = vec(i8, 32)
    pshufb = decl(builder, "llvm.x86.avx2.pshuf.b", v, [v, v])
    table = ir.Constant(v, KVALUES_U12 * 2)
    b8 = builder.bitcast(words, v)
    lo = builder.and_(b8, ir.Constant(v, [0x0F] * 32))
    hi = builder.lshr(b8, ir.Constant(v, [4] * 32))
    return builder.call(pshufb, [table, lo]), builder.call(pshufb, [table, hi])


def _splat_word(builder, base, at):
    """<32 x i8>: the 4 bytes at ``at`` of ``base`` repeated in every i32 lane."""
    w = load(builder, base, at, i32)
    v = builder.insert_element(ir.Constant(vec(i32, 8), None), w, ir.Constant(i32, 0))
    v = builder.shuffle_vector(v, ir.Constant(vec(i32, 8), None),
                               ir.Constant(vec(i32, 8), [0] * 8))
    return builder.bitcast(v, vec(i8, 32))


def _splat(builder, value, n=8):
    v = builder.insert_element(ir.Constant(vec(value.type, n), None), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vec(value.type, n), None),
                                  ir.Constant(vec(i32, n), [0] * n))


class _Dot4:
    """acc + (4-byte sums of u8 x i8 products) per i32 lane: vpdpbusd with VNNI, else pmaddubsw
    (i16 pair <= 2 * 24 * 128, no saturation) + pmaddwd with ones + add."""

    def __init__(self, builder):
        self.b = builder
        v8, v16 = vec(i8, 32), vec(i16, 16)
        if HAVE_VNNI:
            self.dpbusd = decl(builder, "llvm.x86.avx512.vpdpbusd.256", vec(i32, 8),
                                [vec(i32, 8), vec(i32, 8), vec(i32, 8)])
        else:
            self.dpbusd = None
            self.maddubs = decl(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [v8, v8])
            self.maddwd = decl(builder, "llvm.x86.avx2.pmadd.wd", vec(i32, 8), [v16, v16])

    def __call__(self, acc, u, s):
        b = self.b
        if self.dpbusd is not None:
            return vcall(b, self.dpbusd, [acc, u, s])
        p16 = vcall(b, self.maddubs, [u, s])
        return b.add(acc, b.call(self.maddwd, [p16, ir.Constant(vec(i16, 16), [1] * 16)]))


def _gather_i32(builder, bases, offset):
    v = ir.Constant(vec(i32, len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, load(builder, b, offset, i32), ir.Constant(i32, i))
    return v


def _row_bases(context, builder, wty, w_arr, w_off, step):
    return [byte_ptr(context, builder, wty, w_arr,
                 builder.add(w_off, builder.mul(step, ir.Constant(step.type, k))))
            for k in range(8)]


def _fold_term(builder, acc_ptr, dy, scale, s, first):
    """Fold the 8 lanes' v = R32(R32(dy * scale) * f32(S)) into the accumulators at
    ``acc_ptr`` (acc = v if ``first`` else R32(acc + v)): the float steps of every FP4 term."""
    t = builder.fmul(dy, scale)                              # R32(d_y * scale)
    v = builder.fmul(t, builder.sitofp(s, vec(_F32, 8)))    # R32(t * f32(S))
    fold_into(builder, acc_ptr, v, first)


@intrinsic
def mxfp4_rows_x8_t(typingctx, w, w_off, step, x, x_off, corr, dy, acc, first):
    """Fold v = R32(R32(dy * 2^(e-128)) * f32(S)) of 8 MXFP4 records (rows ``step`` bytes
    apart from byte ``w_off``) against the Q8_0 record at ``x_off`` into ``acc[0:8]`` (lane k:
    ``acc = v`` if ``first`` else ``R32(acc + v)``).  ``corr`` = -12 * (sum of the record's
    quants), ``dy`` = f32 of its f16 scale (both computed once per call)."""
    if not isinstance(w, types.Array) or not isinstance(x, types.Array):
        return None
    sig = types.none(w, types.intp, types.intp, x, types.intp, types.int32, types.float32, acc,
                     types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, step_v, x_arr, x_off_v, corr_v, dy_v, acc_arr, first_v = args
        wbs = _row_bases(context, builder, signature.args[0], w_arr, w_off_v, step_v)
        xb = byte_ptr(context, builder, signature.args[3], x_arr, x_off_v)
        dot4 = _Dot4(builder)
        words = _transpose_words(builder, wbs, MX_QS_AT)
        acc_lo = _splat(builder, corr_v)
        acc_hi = ir.Constant(vec(i32, 8), [0] * 8)
        for c in range(4):
            lo, hi = _codes_u12(builder, words[c])
            acc_lo = dot4(acc_lo, lo, _splat_word(builder, xb, Y_QS_AT + 4 * c))
            acc_hi = dot4(acc_hi, hi, _splat_word(builder, xb, Y_QS_AT + 16 + 4 * c))
        s = builder.add(acc_lo, acc_hi)
        e = builder.and_(_gather_i32(builder, wbs, MX_E_AT), ir.Constant(vec(i32, 8), [0xFF] * 8))
        dy = _splat(builder, dy_v)
        _fold_term(builder, float_array_ptr(context, builder, signature.args[7], acc_arr), dy,
                   _e8m0_half(builder, e), s, first_v)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def nvfp4_rows_x8_t(typingctx, w, w_off, step, x, x_off, x_next, c0, c1, c2, c3, dy0, dy1, acc,
                    first):
    """As ``mxfp4_rows_x8_t`` for NVFP4: per row its 4 sub-block terms
    v_s = R32(R32(dy * u(d_s)) * f32(S_s)) folded in order (``first`` applies to s = 0);
    sub-blocks 0, 1 against the Q8_0 record at ``x_off`` (``dy0``), 2, 3 against the one at
    ``x_off + x_next`` (``dy1``); ``c_s`` = -12 * (sum of the 16 quants sub-block s meets)."""
    if not isinstance(w, types.Array) or not isinstance(x, types.Array):
        return None
    sig = types.none(w, types.intp, types.intp, x, types.intp, types.intp, types.int32,
                     types.int32, types.int32, types.int32, types.float32, types.float32, acc,
                     types.intp)

    def codegen(context, builder, signature, args):
        (w_arr, w_off_v, step_v, x_arr, x_off_v, x_next_v, c0, c1, c2, c3, dy0, dy1, acc_arr,
         first_v) = args
        wbs = _row_bases(context, builder, signature.args[0], w_arr, w_off_v, step_v)
        xbs = [byte_ptr(context, builder, signature.args[3], x_arr, x_off_v),
               byte_ptr(context, builder, signature.args[3], x_arr, builder.add(x_off_v, x_next_v))]
        dot4 = _Dot4(builder)
        corr = [c0, c1, c2, c3]
        sums = []
        for g in range(2):   # code bytes 16g .. 16g + 16: sub-blocks 2g, 2g + 1
            words = _transpose_words(builder, wbs, NV_QS_AT + 16 * g)
            for t in range(2):
                o = Y_QS_AT + 16 * t
                lo0, hi0 = _codes_u12(builder, words[2 * t])       # elements 0..3, 8..11
                lo1, hi1 = _codes_u12(builder, words[2 * t + 1])   # elements 4..7, 12..15
                xb = xbs[g]
                a = dot4(_splat(builder, corr[2 * g + t]), lo0, _splat_word(builder, xb, o))
                a = dot4(a, hi0, _splat_word(builder, xb, o + 8))
                a2 = dot4(ir.Constant(vec(i32, 8), [0] * 8), lo1, _splat_word(builder, xb, o + 4))
                a2 = dot4(a2, hi1, _splat_word(builder, xb, o + 12))
                sums.append(builder.add(a, a2))
        vi = vec(i32, 8)
        scales = _gather_i32(builder, wbs, NV_D_AT)  # the 4 scale bytes of each record
        acc_ptr = float_array_ptr(context, builder, signature.args[12], acc_arr)
        for s_idx in range(4):
            d_s = builder.and_(builder.lshr(scales, ir.Constant(vi, [8 * s_idx] * 8)),
                               ir.Constant(vi, [0xFF] * 8))
            u = _ue4m3_half(builder, d_s)
            _fold_term(builder, acc_ptr, _splat(builder, dy0 if s_idx < 2 else dy1), u,
                       sums[s_idx], first_v if s_idx == 0 else ir.Constant(first_v.type, 0))
        return context.get_dummy_value()
    return sig, codegen


# ---- gemm tiles in the transposed ("lane = activation") layout ------------------------------
#
# The activations are transposed once per call (``mxrec._q8_0_transpose``) into groups of 8:
# per group and Q8_0 record j, 11 rows of 8 i32 lanes (lane k = activation 8 * group + k):
# rows 0..7 the record's quant words (word i = quants 4i .. 4i + 3), rows 8, 9 the seeds
# ``-12 * sum`` of quants 0..15 and 16..31, row 10 the bits of f32(d_y).  A weight record's
# code words are broadcast (one load each) and turned into ``k + 12`` as in the gemv tiles, so
# one vpdpbusd handles 4 elements of 8 (record, activation) pairs and lane k ends at S of
# activation k, exactly.

XT_ROWS = 11   # i32 rows of 8 lanes per (group, Q8_0 record)


def _xt_row(builder, xtb, row):
    """<8 x i32> row ``row`` of the transposed record at byte pointer ``xtb``."""
    return load(builder, xtb, 32 * row, vec(i32, 8))


def _xt_ptr(context, builder, xty, xt, off):
    data = context.make_array(xty)(context, builder, xt).data
    return builder.gep(builder.bitcast(data, i8.as_pointer()), [off])


@intrinsic
def mxfp4_acts_x8_t(typingctx, w, w_off, xt, xt_off, acc, first):
    """Fold v = R32(R32(dy_k * 2^(e-128)) * f32(S_k)) of the MXFP4 record at byte ``w_off`` of
    ``w`` against the 8 activations of the transposed record at byte ``xt_off`` of ``xt`` into
    ``acc[0:8]`` (lane k: ``acc = v`` if ``first`` else ``R32(acc + v)``)."""
    if not isinstance(w, types.Array) or not isinstance(xt, types.Array):
        return None
    sig = types.none(w, types.intp, xt, types.intp, acc, types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, xt_arr, xt_off_v, acc_arr, first_v = args
        wb = byte_ptr(context, builder, signature.args[0], w_arr, w_off_v)
        xtb = _xt_ptr(context, builder, signature.args[2], xt_arr, xt_off_v)
        dot4 = _Dot4(builder)
        acc_lo = builder.add(_xt_row(builder, xtb, 8), _xt_row(builder, xtb, 9))
        acc_hi = ir.Constant(vec(i32, 8), [0] * 8)
        for c in range(4):
            lo, hi = _codes_u12(builder, builder.bitcast(_splat_word(builder, wb, MX_QS_AT + 4 * c),
                                                         vec(i32, 8)))
            acc_lo = dot4(acc_lo, lo, _xt_row(builder, xtb, c))
            acc_hi = dot4(acc_hi, hi, _xt_row(builder, xtb, 4 + c))
        s = builder.add(acc_lo, acc_hi)
        e = builder.zext(load(builder, wb, MX_E_AT, i8), i32)
        h = _e8m0_half(builder, _splat(builder, e))
        dy = builder.bitcast(_xt_row(builder, xtb, 10), vec(_F32, 8))
        _fold_term(builder, float_array_ptr(context, builder, signature.args[4], acc_arr), dy,
                   h, s, first_v)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def nvfp4_acts_x8_t(typingctx, w, w_off, xt, xt_off, xt_next, acc, first):
    """As ``mxfp4_acts_x8_t`` for NVFP4: the 4 sub-block terms of the record folded in order
    (``first`` applies to s = 0); sub-blocks 0, 1 against the transposed record at ``xt_off``,
    2, 3 against the one at ``xt_off + xt_next``."""
    if not isinstance(w, types.Array) or not isinstance(xt, types.Array):
        return None
    sig = types.none(w, types.intp, xt, types.intp, types.intp, acc, types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, xt_arr, xt_off_v, xt_next_v, acc_arr, first_v = args
        wb = byte_ptr(context, builder, signature.args[0], w_arr, w_off_v)
        xtbs = [_xt_ptr(context, builder, signature.args[2], xt_arr, xt_off_v),
                _xt_ptr(context, builder, signature.args[2], xt_arr,
                        builder.add(xt_off_v, xt_next_v))]
        dot4 = _Dot4(builder)
        vi = vec(i32, 8)
        scales = _splat(builder, load(builder, wb, NV_D_AT, i32))
        acc_ptr = float_array_ptr(context, builder, signature.args[5], acc_arr)
        for s_idx in range(4):
            g, t = divmod(s_idx, 2)
            xtb = xtbs[g]
            at = NV_QS_AT + 8 * s_idx
            lo0, hi0 = _codes_u12(builder, builder.bitcast(_splat_word(builder, wb, at), vi))
            lo1, hi1 = _codes_u12(builder, builder.bitcast(_splat_word(builder, wb, at + 4), vi))
            a = dot4(_xt_row(builder, xtb, 8 + t), lo0, _xt_row(builder, xtb, 4 * t))
            a = dot4(a, hi0, _xt_row(builder, xtb, 4 * t + 2))
            a2 = dot4(ir.Constant(vi, [0] * 8), lo1, _xt_row(builder, xtb, 4 * t + 1))
            a2 = dot4(a2, hi1, _xt_row(builder, xtb, 4 * t + 3))
            s = builder.add(a, a2)
            d_s = builder.and_(builder.lshr(scales, ir.Constant(vi, [8 * s_idx] * 8)),
                               ir.Constant(vi, [0xFF] * 8))
            u = _ue4m3_half(builder, d_s)
            dy = builder.bitcast(_xt_row(builder, xtb, 10), vec(_F32, 8))
            _fold_term(builder, acc_ptr, dy, u, s,
                       first_v if s_idx == 0 else ir.Constant(first_v.type, 0))
        return context.get_dummy_value()
    return sig, codegen
