"""Explicit-SIMD building blocks, written as LLVM IR through numba intrinsics.

Only *exact integer* work is done here (plus two exact loads): the record statistics
``S_b`` and ``T_b`` of the Q4_K x Q8_K dot.  Integer sums are exact in any order, so the
vector organisation below gives the same integers as the readable loop in ``dot.py``; every
float rounding step stays in plain numba code, in spec order.

Per record pair (256-bit AVX2 form shown; with AVX-512BW the same steps run on 512-bit vectors,
two 32-byte chunks at a time, low and high nibbles shuffled into element order)::

    sc, m      <- 6-bit fields, unpacked from the 12 scale bytes with 32-bit SWAR masks
    for chunk j in 0..3 (32 bytes of Q4_K quants = sub-blocks 2j and 2j+1):
        lo, hi  = qs & 0x0F, qs >> 4                         (u8 x 32 each)
        plo     = pmaddubsw(lo, xq[64j : 64j+32])           (i16 x 16, |.| <= 3840: no saturation)
        phi     = pmaddubsw(hi, xq[64j+32 : 64j+64])
        acc    += pmaddwd(plo, splat(sc[2j])) + pmaddwd(phi, splat(sc[2j+1]))   (i32 x 8)
    S_b = reduce_add(acc)
    T_b = reduce_add(pmaddwd(bsum[0:16], [m0, m0, m1, m1, ..., m7, m7]))

Bounds: a pmaddubsw lane is the sum of two products u4 * i8, at most 2 * 15 * 128 = 3840 in
magnitude (the instruction saturates only beyond 32767); pmaddwd lanes stay below 2**19; all
i32 sums stay within the spec's bounds (|S_b| <= 30,965,760).  ``T_b`` uses the stored int16
``bsum`` exactly (|T_b| <= 33,030,144 for any bytes).

The intrinsics read a record's bytes from an array's data pointer plus a byte offset computed
by the caller from the array's strides; the record's own bytes must be contiguous (unit stride
along the byte axis).  ``dot.py`` checks that and falls back to the portable loop otherwise.
Working from offsets (not sub-array views) also keeps numba's reference counting out of the
hot loop.
``HAVE_AVX2`` says whether the compilation target has AVX2 and F16C; without them the
portable loops are used.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import config
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..formats import quant
from . import _legacy_layout as _LL

# Byte offsets read from the schemas (never retyped).
_K_D_AT = quant.q4_k.field("d").start          # f16
_K_DMIN_AT = quant.q4_k.field("dmin").start    # f16
_K_SCALES_AT = quant.q4_k.field("sc").start    # 12 bytes of packed 6-bit sc/m
_K_QS_AT = quant.q4_k.field("q").start         # 128 bytes of nibbles
_A_DS_AT = quant.q8_k.field("ds").start        # f32
_A_Q_AT = quant.q8_k.field("q").start          # 256 x int8
_A_BSUM_AT = quant.q8_k.field("bsum").start    # 16 x int16


def _target_features() -> set[str]:
    """Features of the CPU numba compiles for (host unless NUMBA_CPU_NAME says otherwise)."""
    if config.CPU_NAME and config.CPU_NAME != "host":
        feats = config.CPU_FEATURES or ""
    else:
        try:
            feats = llvm_binding.get_host_cpu_features().flatten()
        except Exception:  # pragma: no cover - exotic hosts
            return set()
    return {f[1:] for f in feats.split(",") if f.startswith("+")}


_FEATURES = _target_features()
# NUMBA_QK_PORTABLE=1 forces the portable loops (they give the same bits, only slower);
# under NUMBA_DISABLE_JIT=1 the intrinsics cannot run, so the portable loops are used too.
HAVE_AVX2 = ({"avx2", "f16c"} <= _FEATURES and not config.DISABLE_JIT
             and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0"))
# 512-bit vectors: AVX-512BW (byte/word ops); NUMBA_QK_NO_AVX512=1 keeps the 256-bit code.
HAVE_AVX512 = (HAVE_AVX2 and {"avx512f", "avx512bw"} <= _FEATURES
               and os.environ.get("NUMBA_QK_NO_AVX512", "") in ("", "0"))

_i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _vec(t, n):
    return ir.VectorType(t, n)


def _decl(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _load(builder, base, offset: int, ty):
    ptr = builder.gep(base, [ir.Constant(_i64, offset)])
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def _splat_lanes(builder, v, lanes):
    """shufflevector v with constant lane indices ``lanes``."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(_vec(_i32, len(lanes)), list(lanes)))


def _unpack_scales(builder, wbase):
    """sc[0..7] and m[0..7] of a Q4_K record as two <8 x i16> vectors.

    The 12 scale bytes as little-endian words u0, u1, u2:
      sc[0..3] = u0 & 0x3f3f3f3f               m[0..3] = u1 & 0x3f3f3f3f
      sc[4..7] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)
      m[4..7]  = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)
    """
    u0 = _load(builder, wbase, _K_SCALES_AT, _i32)
    u1 = _load(builder, wbase, _K_SCALES_AT + 4, _i32)
    u2 = _load(builder, wbase, _K_SCALES_AT + 8, _i32)
    low6 = ir.Constant(_i32, 0x3F3F3F3F)
    nib = ir.Constant(_i32, 0x0F0F0F0F)
    top2 = ir.Constant(_i32, 0x03030303)

    def shr(v, n):
        return builder.lshr(v, ir.Constant(_i32, n))

    def shl(v, n):
        return builder.shl(v, ir.Constant(_i32, n))

    sc_lo = builder.and_(u0, low6)
    m_lo = builder.and_(u1, low6)
    sc_hi = builder.or_(builder.and_(u2, nib), shl(builder.and_(shr(u0, 6), top2), 4))
    m_hi = builder.or_(builder.and_(shr(u2, 4), nib), shl(builder.and_(shr(u1, 6), top2), 4))

    def bytes8(lo, hi):
        word = builder.or_(builder.zext(lo, _i64),
                           builder.shl(builder.zext(hi, _i64), ir.Constant(_i64, 32)))
        return builder.zext(builder.bitcast(word, _vec(_i8, 8)), _vec(_i16, 8))

    return bytes8(sc_lo, sc_hi), bytes8(m_lo, m_hi)


def _byte_ptr(context, builder, arrty, arr, offset):
    """data pointer of a uint8 array plus a byte offset (the caller computed it from strides)."""
    return builder.gep(context.make_array(arrty)(context, builder, arr).data, [offset])


class _Ops:
    """Declarations of the vector instructions used, for one vector width."""

    def __init__(self, builder, wide: bool):
        self.wide = wide
        self.lanes = 64 if wide else 32  # int8 lanes per vector
        self.maddwd8 = _decl(builder, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8),
                             [_vec(_i16, 16), _vec(_i16, 16)])
        if wide:
            self.maddubs = _decl(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec(_i16, 32),
                                 [_vec(_i8, 64), _vec(_i8, 64)])
            self.maddwd = _decl(builder, "llvm.x86.avx512.pmaddw.d.512", _vec(_i32, 16),
                                [_vec(_i16, 32), _vec(_i16, 32)])
        else:
            self.maddubs = _decl(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_i16, 16),
                                 [_vec(_i8, 32), _vec(_i8, 32)])
            self.maddwd = self.maddwd8


def _decode_weights(builder, ops: _Ops, wbase):
    """Weight side of one Q4_K record: quants in element order (one vector per ``lanes``
    elements), the matching vectors of sub-block scales (each scale repeated over its 16
    pmaddubsw lanes) and the [m0, m0, m1, m1, ...] vector for T_b."""
    lanes = ops.lanes
    sc16, m16 = _unpack_scales(builder, wbase)
    low4 = ir.Constant(_vec(_i8, lanes), [0x0F] * lanes)
    four = ir.Constant(_vec(_i8, lanes), [4] * lanes)
    quants, scales = [], []
    for h in range(0, 128, lanes):  # `lanes` bytes of packed nibbles at a time
        qs = _load(builder, wbase, _K_QS_AT + h, _vec(_i8, lanes))
        lo = builder.and_(qs, low4)
        hi = builder.lshr(qs, four)
        for c in range(lanes // 32):  # each 32-byte chunk: low nibbles, then high nibbles
            j = h // 32 + c
            if ops.wide:
                order = [32 * c + k for k in range(32)] + [64 + 32 * c + k for k in range(32)]
                quants.append(builder.shuffle_vector(lo, hi, ir.Constant(_vec(_i32, 64), order)))
                scales.append(_splat_lanes(builder, sc16, [2 * j] * 16 + [2 * j + 1] * 16))
            else:
                quants += [lo, hi]
                scales += [_splat_lanes(builder, sc16, [2 * j] * 16),
                           _splat_lanes(builder, sc16, [2 * j + 1] * 16)]
    m_pairs = _splat_lanes(builder, m16, [k // 2 for k in range(16)])
    return quants, scales, m_pairs


def _pair_vectors(builder, ops: _Ops, weights, xbase):
    """Unreduced S and T vectors of one decoded weight record against the Q8_K record at
    ``xbase``.  Element e of a Q8_K record lives at byte _A_Q_AT + e, so activation vector v covers
    elements [lanes*v, lanes*v + lanes) -- the order of the decoded quants."""
    quants, scales, m_pairs = weights
    acc = ir.Constant(ops.maddwd.function_type.return_type, None)
    for v, (q, sc) in enumerate(zip(quants, scales)):
        xv = _load(builder, xbase, _A_Q_AT + ops.lanes * v, _vec(_i8, ops.lanes))
        acc = builder.add(acc, builder.call(ops.maddwd, [builder.call(ops.maddubs, [q, xv]), sc]))
    bsum = _load(builder, xbase, _A_BSUM_AT, _vec(_i16, 16))
    return acc, builder.call(ops.maddwd8, [bsum, m_pairs])


def _reduce_many(builder, vecs):
    """Horizontal sums of n equal-length i32 vectors as one <n x i32> vector (n a power of
    two, at most the lane count): pairwise lane sums that keep each vector's lanes together,
    so n sums cost about as much as two single reductions."""
    n = len(vecs)
    width = vecs[0].type.count
    while len(vecs) > 1:  # merge pairs: c = [a0+a1, a2+a3, ..., b0+b1, b2+b3, ...]
        merged = []
        for a, b in zip(vecs[0::2], vecs[1::2]):
            even = [2 * i for i in range(width // 2)] + [width + 2 * i for i in range(width // 2)]
            odd = [e + 1 for e in even]
            merged.append(builder.add(
                builder.shuffle_vector(a, b, ir.Constant(_vec(_i32, width), even)),
                builder.shuffle_vector(a, b, ir.Constant(_vec(_i32, width), odd))))
        vecs = merged
    v = vecs[0]
    while v.type.count > n:  # halve: lane i = v[2i] + v[2i+1]; groups keep their order
        half = v.type.count // 2
        und = ir.Constant(v.type, ir.Undefined)
        v = builder.add(
            builder.shuffle_vector(v, und, ir.Constant(_vec(_i32, half), [2 * i for i in range(half)])),
            builder.shuffle_vector(v, und, ir.Constant(_vec(_i32, half), [2 * i + 1 for i in range(half)])))
    return v


def _gen_sums(builder, ops: _Ops, wbases, xbases):
    """(S, T) as two <n x i32> vectors for the record pairs zip(wbases, xbases).  A weight
    record listed several times (same IR value) is decoded once."""
    decoded = {}
    s_vecs, t_vecs = [], []
    for wb, xb in zip(wbases, xbases):
        if id(wb) not in decoded:
            decoded[id(wb)] = _decode_weights(builder, ops, wb)
        s_acc, t_vec = _pair_vectors(builder, ops, decoded[id(wb)], xb)
        s_vecs.append(s_acc)
        t_vecs.append(t_vec)
    return _reduce_many(builder, s_vecs), _reduce_many(builder, t_vecs)


def _ptr(context, builder, arrty, arr, offset):
    return _byte_ptr(context, builder, arrty, arr, offset)


def _gather_f16(builder, bases, offset):
    """<n x float> from the f16 at ``offset`` of each base (exact widening, vcvtph2ps)."""
    v = ir.Constant(_vec(ir.HalfType(), len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, _load(builder, b, offset, ir.HalfType()), ir.Constant(_i32, i))
    return builder.fpext(v, _vec(ir.FloatType(), len(bases)))


def _gather_f32(builder, bases, offset):
    v = ir.Constant(_vec(ir.FloatType(), len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, _load(builder, b, offset, ir.FloatType()), ir.Constant(_i32, i))
    return v


def _record_values(builder, s_vec, t_vec, d, dmin, ds):
    """The float steps, lane by lane -- each lane is one record pair, each IR instruction one
    IEEE operation in round-to-nearest-even (no fast-math flags, so nothing is fused)."""
    f32v = _vec(ir.FloatType(), s_vec.type.count)
    p = builder.fmul(d, builder.sitofp(s_vec, f32v))       # p_b = R32(d * f32(S_b))
    n = builder.fmul(dmin, builder.sitofp(t_vec, f32v))    # n_b = R32(dmin * f32(T_b))
    return builder.fmul(ds, builder.fsub(p, n))            # v_b = R32(ds * R32(p_b - n_b))


def _fold_into(builder, acc_ptr, v, first):
    """acc = v if first else R32(acc + v), lane by lane (each lane its own in-order fold)."""
    ptr = builder.bitcast(acc_ptr, v.type.as_pointer())
    old = builder.load(ptr, align=4)
    new = builder.select(builder.icmp_signed("!=", first, ir.Constant(first.type, 0)),
                         v, builder.fadd(old, v))
    builder.store(new, ptr, align=4)


def _tile_bases(context, builder, wty, w_arr, w_off, xty, x_arr, x_off, step, over_rows, n):
    """Record pointers of one tile: n weight records ``step`` bytes apart against one activation
    record (over_rows, gemv), or one weight record against n activation records (gemm).  The
    shared record is the same IR value n times, so it is decoded/loaded once."""
    offs = [builder.mul(step, ir.Constant(step.type, k)) for k in range(n)]
    if over_rows:
        wbs = [_ptr(context, builder, wty, w_arr, builder.add(w_off, o)) for o in offs]
        xbs = [_ptr(context, builder, xty, x_arr, x_off)] * n
    else:
        wbs = [_ptr(context, builder, wty, w_arr, w_off)] * n
        xbs = [_ptr(context, builder, xty, x_arr, builder.add(x_off, o)) for o in offs]
    return wbs, xbs


def _float_array_ptr(context, builder, arrty, arr):
    return context.make_array(arrty)(context, builder, arr).data


def _make_sums(wide: bool):
    @intrinsic
    def q4_k_q8_k_sums(typingctx, w, w_off, x, x_off):
        """(S_b, T_b) as int32 for the Q4_K record at byte ``w_off`` of uint8 array ``w`` and
        the Q8_K record at byte ``x_off`` of ``x`` (both records' bytes contiguous)."""
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = types.UniTuple(types.int32, 2)(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            wb = _ptr(context, builder, signature.args[0], args[0], args[1])
            xb = _ptr(context, builder, signature.args[2], args[2], args[3])
            s_vec, t_vec = _gen_sums(builder, ops, [wb], [xb])
            zero = ir.Constant(_i32, 0)
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_element(s_vec, zero),
                                       builder.extract_element(t_vec, zero)])
        return sig, codegen
    return q4_k_q8_k_sums


def _make_accumulate(wide: bool, over_rows: bool, n: int = 8):
    """Intrinsic folding ``n`` record values into ``acc.flat[acc_at : acc_at + n]`` (a
    contiguous float32 array).

    over_rows=True  (gemv): lane k pairs weight record ``w_off + k*step`` with the one
                     activation record at ``x_off``.
    over_rows=False (gemm): lane k pairs the one weight record at ``w_off`` (decoded once)
                     with activation record ``x_off + k*step``.
    ``first`` != 0 starts each lane's fold (acc = v), else acc = R32(acc + v).
    """
    @intrinsic
    def accumulate(typingctx, w, w_off, x, x_off, step, acc, acc_at, first):
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)
                and isinstance(acc, types.Array) and acc.dtype == types.float32):
            return None
        sig = types.none(w, types.intp, x, types.intp, types.intp, acc, types.intp, types.intp)

        def codegen(context, builder, signature, args):
            ops = _Ops(builder, wide)
            w_arr, w_off_v, x_arr, x_off_v, step_v, acc_arr, acc_at_v, first_v = args
            wbs, xbs = _tile_bases(context, builder, signature.args[0], w_arr, w_off_v,
                                   signature.args[2], x_arr, x_off_v, step_v, over_rows, n)
            s_vec, t_vec = _gen_sums(builder, ops, wbs, xbs)
            d = _gather_f16(builder, wbs, _K_D_AT)
            dmin = _gather_f16(builder, wbs, _K_DMIN_AT)
            ds = _gather_f32(builder, xbs, _A_DS_AT)
            v = _record_values(builder, s_vec, t_vec, d, dmin, ds)
            acc_ptr = builder.gep(_float_array_ptr(context, builder, signature.args[5], acc_arr),
                                  [acc_at_v])
            _fold_into(builder, acc_ptr, v, first_v)
            return context.get_dummy_value()
        return sig, codegen
    return accumulate


# ---------------------------------------------------------------------------------------------
# ggml's legacy 32-element formats (codes and byte offsets from _legacy_layout.py).  Every weight quant becomes a signed i16 lane (q-8, q, q-16, q or the int8),
# every Q8_0/Q8_1 activation quant a sign-extended i16 lane, and pmaddwd sums lane pairs into
# i32 (|pair| <= 2 * 128 * 128: exact for any record bytes).  S_b is the sum of those lanes.

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


def _pmaddwd32(builder, ops, a, b):
    """pmaddwd of two <32 x i16>: one 512-bit instruction, or two 256-bit ones added."""
    if ops.wide:
        return builder.call(ops.maddwd, [a, b])
    halves = []
    for h in range(2):
        idx = ir.Constant(_vec(_i32, 16), list(range(16 * h, 16 * h + 16)))
        halves.append(builder.call(ops.maddwd8, [
            builder.shuffle_vector(a, ir.Constant(a.type, ir.Undefined), idx),
            builder.shuffle_vector(b, ir.Constant(b.type, ir.Undefined), idx)]))
    return builder.add(halves[0], halves[1])


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


def _literal_int(t):
    return t.literal_value if isinstance(t, types.IntegerLiteral) else None


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
            ops = _Ops(builder, wide)
            _, _, w_arr, w_off_v, x_arr, x_off_v, step_v, acc_arr, acc_at_v, first_v = args
            wbs, xbs = _tile_bases(context, builder, signature.args[2], w_arr, w_off_v,
                                   signature.args[4], x_arr, x_off_v, step_v, rows, n)
            s_vec = _legacy_sums(builder, ops, c, wbs, xbs)
            v = _legacy_values(builder, c, s_vec, wbs, xbs)
            acc_ptr = builder.gep(_float_array_ptr(context, builder, signature.args[7], acc_arr),
                                  [acc_at_v])
            _fold_into(builder, acc_ptr, v, first_v)
            return context.get_dummy_value()
        return sig, codegen
    return legacy_accumulate


legacy_block_value = _make_legacy_value(wide=HAVE_AVX512)
legacy_accumulate_x8 = _make_legacy_accumulate(wide=HAVE_AVX512)


q4_k_q8_k_sums_avx2 = _make_sums(wide=False)
q4_k_q8_k_sums_avx512 = _make_sums(wide=True)
accumulate_rows_x8_avx2 = _make_accumulate(wide=False, over_rows=True)
accumulate_rows_x8_avx512 = _make_accumulate(wide=True, over_rows=True)
accumulate_acts_x8_avx2 = _make_accumulate(wide=False, over_rows=False)
accumulate_acts_x8_avx512 = _make_accumulate(wide=True, over_rows=False)

# The widest available variants, used by the fast paths.
q4_k_q8_k_sums = q4_k_q8_k_sums_avx512 if HAVE_AVX512 else q4_k_q8_k_sums_avx2
accumulate_rows_x8 = accumulate_rows_x8_avx512 if HAVE_AVX512 else accumulate_rows_x8_avx2
accumulate_acts_x8 = accumulate_acts_x8_avx512 if HAVE_AVX512 else accumulate_acts_x8_avx2


@intrinsic
def load_f16_fpext(typingctx, arr, off):
    """IEEE f16 at byte ``off`` of uint8 array ``arr``, widened to f32 by ``fpext`` (exact for
    every value; a signalling NaN may come back quiet; F16C hardware)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.HalfType().as_pointer())
        return builder.fpext(builder.load(ptr, align=1), ir.FloatType())

    return sig, codegen


@intrinsic
def load_f32_raw(typingctx, arr, off):
    """IEEE f32 at byte ``off`` of uint8 array ``arr`` (one unaligned load, bits kept)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.FloatType().as_pointer())
        return builder.load(ptr, align=1)

    return sig, codegen
