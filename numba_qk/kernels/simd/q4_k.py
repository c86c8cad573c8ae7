"""Explicit-SIMD decoder of the Q4_K x Q8_K dot (LLVM IR through numba intrinsics).

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

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numba_qk.formats import quant
from numba_qk.kernels.simd.base import HAVE_AVX512, HAVE_VNNI, Ops, decl, vcall, float_array_ptr, fold_into, gather_f16, gather_f32, i8, i16, i32, i64, load, byte_ptr, reduce_many, literal_int, splat_lanes, tile_fold, vec, fold_signature, tile_intrinsic, tile_signature

__all__ = ["q4_k_q8_k_sums", "q4_k_q8_k_sums_avx2", "q4_k_q8_k_sums_avx512",
           "accumulate_rows_x8", "accumulate_rows_x8_avx2", "accumulate_rows_x8_avx512",
           "accumulate_acts_x8", "accumulate_acts_x8_avx2", "accumulate_acts_x8_avx512"]

# Byte offsets read from the schemas (never retyped).
_K_D_AT = quant.q4_k.field("d").start          # f16
_K_DMIN_AT = quant.q4_k.field("dmin").start    # f16
_K_SCALES_AT = quant.q4_k.field("sc").start    # 12 bytes of packed 6-bit sc/m
_K_QS_AT = quant.q4_k.field("q").start         # 128 bytes of nibbles
_A_DS_AT = quant.q8_k.field("ds").start        # f32
_A_Q_AT = quant.q8_k.field("q").start          # 256 x int8
_A_BSUM_AT = quant.q8_k.field("bsum").start    # 16 x int16


def unpack_scales(builder, wbase):
    """sc[0..7] and m[0..7] of a Q4_K record as two <8 x i16> vectors.

    The 12 scale bytes as little-endian words u0, u1, u2:
      sc[0..3] = u0 & 0x3f3f3f3f               m[0..3] = u1 & 0x3f3f3f3f
      sc[4..7] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)
      m[4..7]  = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)
    """
    u0 = load(builder, wbase, _K_SCALES_AT, i32)
    u1 = load(builder, wbase, _K_SCALES_AT + 4, i32)
    u2 = load(builder, wbase, _K_SCALES_AT + 8, i32)
    low6 = ir.Constant(i32, 0x3F3F3F3F)
    nib = ir.Constant(i32, 0x0F0F0F0F)
    top2 = ir.Constant(i32, 0x03030303)

    def shr(v, n):
        return builder.lshr(v, ir.Constant(i32, n))

    def shl(v, n):
        return builder.shl(v, ir.Constant(i32, n))

    sc_lo = builder.and_(u0, low6)
    m_lo = builder.and_(u1, low6)
    sc_hi = builder.or_(builder.and_(u2, nib), shl(builder.and_(shr(u0, 6), top2), 4))
    m_hi = builder.or_(builder.and_(shr(u2, 4), nib), shl(builder.and_(shr(u1, 6), top2), 4))

    def bytes8(lo, hi):
        word = builder.or_(builder.zext(lo, i64),
                           builder.shl(builder.zext(hi, i64), ir.Constant(i64, 32)))
        return builder.zext(builder.bitcast(word, vec(i8, 8)), vec(i16, 8))

    return bytes8(sc_lo, sc_hi), bytes8(m_lo, m_hi)


def _decode_weights(builder, ops: Ops, wbase):
    """Weight side of one Q4_K record: quants in element order (one vector per ``lanes``
    elements), the matching vectors of sub-block scales (each scale repeated over its 16
    pmaddubsw lanes) and the [m0, m0, m1, m1, ...] vector for T_b."""
    lanes = ops.lanes
    sc16, m16 = unpack_scales(builder, wbase)
    low4 = ir.Constant(vec(i8, lanes), [0x0F] * lanes)
    four = ir.Constant(vec(i8, lanes), [4] * lanes)
    quants, scales = [], []
    for h in range(0, 128, lanes):  # `lanes` bytes of packed nibbles at a time
        qs = load(builder, wbase, _K_QS_AT + h, vec(i8, lanes))
        lo = builder.and_(qs, low4)
        hi = builder.lshr(qs, four)
        for c in range(lanes // 32):  # each 32-byte chunk: low nibbles, then high nibbles
            j = h // 32 + c
            if ops.wide:
                order = [32 * c + k for k in range(32)] + [64 + 32 * c + k for k in range(32)]
                quants.append(builder.shuffle_vector(lo, hi, ir.Constant(vec(i32, 64), order)))
                scales.append(splat_lanes(builder, sc16, [2 * j] * 16 + [2 * j + 1] * 16))
            else:
                quants += [lo, hi]
                scales += [splat_lanes(builder, sc16, [2 * j] * 16),
                           splat_lanes(builder, sc16, [2 * j + 1] * 16)]
    m_pairs = splat_lanes(builder, m16, [k // 2 for k in range(16)])
    return quants, scales, m_pairs


def _pair_vectors(builder, ops: Ops, weights, xbase):
    """Unreduced S and T vectors of one decoded weight record against the Q8_K record at
    ``xbase``.  Element e of a Q8_K record lives at byte _A_Q_AT + e, so activation vector v covers
    elements [lanes*v, lanes*v + lanes) -- the order of the decoded quants."""
    quants, scales, m_pairs = weights
    acc = ir.Constant(ops.maddwd.function_type.return_type, None)
    for v, (q, sc) in enumerate(zip(quants, scales)):
        xv = load(builder, xbase, _A_Q_AT + ops.lanes * v, vec(i8, ops.lanes))
        acc = builder.add(acc, builder.call(ops.maddwd, [builder.call(ops.maddubs, [q, xv]), sc]))
    bsum = load(builder, xbase, _A_BSUM_AT, vec(i16, 16))
    return acc, builder.call(ops.maddwd8, [bsum, m_pairs])


def _gen_sums(builder, ops: Ops, wbases, xbases):
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
    return reduce_many(builder, s_vecs), reduce_many(builder, t_vecs)


def record_values(builder, s_vec, t_vec, d, dmin, ds):
    """The float steps, lane by lane -- each lane is one record pair, each IR instruction one
    IEEE operation in round-to-nearest-even (no fast-math flags, so nothing is fused)."""
    f32v = vec(ir.FloatType(), s_vec.type.count)
    p = builder.fmul(d, builder.sitofp(s_vec, f32v))       # p_b = R32(d * f32(S_b))
    n = builder.fmul(dmin, builder.sitofp(t_vec, f32v))    # n_b = R32(dmin * f32(T_b))
    return builder.fmul(ds, builder.fsub(p, n))            # v_b = R32(ds * R32(p_b - n_b))


def _make_sums(wide: bool):
    @intrinsic
    def q4_k_q8_k_sums(typingctx, w, w_off, x, x_off):
        """(S_b, T_b) as int32 for the Q4_K record at byte ``w_off`` of uint8 array ``w`` and
        the Q8_K record at byte ``x_off`` of ``x`` (both records' bytes contiguous)."""
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = types.UniTuple(types.int32, 2)(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = Ops(builder, wide)
            wb = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            xb = byte_ptr(context, builder, signature.args[2], args[2], args[3])
            s_vec, t_vec = _gen_sums(builder, ops, [wb], [xb])
            zero = ir.Constant(i32, 0)
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
    def make_values(builder):
        def values(wbs, xbs):
            s_vec, t_vec = _gen_sums(builder, Ops(builder, wide), wbs, xbs)
            d = gather_f16(builder, wbs, _K_D_AT)
            dmin = gather_f16(builder, wbs, _K_DMIN_AT)
            ds = gather_f32(builder, xbs, _A_DS_AT)
            return record_values(builder, s_vec, t_vec, d, dmin, ds)
        return values
    return tile_intrinsic(over_rows, n, make_values)


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


# ---- Labelled shuffle trees (the gemv tiles reduce their S/T lanes with them) ---------------

def _merge_labeled(builder, a, la, b, lb):
    """One reduction step: lanes of ``a`` (labels ``la``) paired with a lane of the same label
    and summed into the first half, likewise ``b`` into the second half (pairs in label order).
    Integer adds of exact values: exact."""
    def pairs(labels):
        by = {}
        for i, lab in enumerate(labels):
            by.setdefault(lab, []).append(i)
        out = []
        for lab in sorted(by):
            idx = by[lab]
            assert len(idx) % 2 == 0, "every label must occupy an even number of lanes"
            out += [(lab, idx[j], idx[j + 1]) for j in range(0, len(idx), 2)]
        return out
    pa, pb = pairs(la), pairs(lb)
    width = a.type.count
    assert len(pa) == len(pb) == width // 2
    first = [i for _, i, _ in pa] + [width + i for _, i, _ in pb]
    second = [j for _, _, j in pa] + [width + j for _, _, j in pb]
    v = builder.add(builder.shuffle_vector(a, b, ir.Constant(vec(i32, width), first)),
                    builder.shuffle_vector(a, b, ir.Constant(vec(i32, width), second)))
    return v, [lab for lab, _, _ in pa] + [lab for lab, _, _ in pb]


def _reduce_labeled(builder, items):
    """Pairwise-merge (vector, labels) items until one remains (len(items) a power of two)."""
    while len(items) > 1:
        items = [_merge_labeled(builder, *items[i], *items[i + 1]) for i in range(0, len(items), 2)]
    return items[0]


@intrinsic
def array_address(typingctx, arr):
    """The data pointer of ``arr`` as an integer (to align scratch buffers)."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.intp(arr)

    def codegen(context, builder, signature, args):
        data = float_array_ptr(context, builder, signature.args[0], args[0])
        return builder.ptrtoint(data, i64)
    return sig, codegen




# ---- GEMV tile with AVX-512 VNNI: 8 rows x 1 activation, weights in their stored order --------
#
# The packed quants are never shuffled: 64 stored bytes qs[64h .. 64h+63] (h = 0, 1) give
#     lo = qs & 0x0F   byte k -> element 128h + k (k < 32),  128h + 64 + (k - 32) (k >= 32)
#     hi = qs >> 4     byte k -> element 128h + 32 + k,      128h + 96 + (k - 32)
# so the *activation* is put in that order instead, once per tile step (shared by the 8 rows):
#     XL_h = xq[128h : 128h+32] ++ xq[128h+64 : 128h+96],  XH_h = xq[128h+32 : +64] ++ xq[128h+96 : +128]
# and vpdpbusd(0, lo_h, XL_h) leaves in i32 lane l (16 lanes) the exact sum of 4 products of
# sub-block 4h (l < 8) or 4h + 2 (l >= 8); likewise hi_h for 4h + 1 / 4h + 3.  |lane| <= 4*15*128
# = 7680, so vpackssdw of the same part of two rows A, B is exact; per 128-bit block c it holds
# [A lanes 4c..4c+3, B lanes 4c..4c+3] as i16, and one vpdpwssd with the scale pattern
#     block c: [sc_A[4h + part + 2(c >= 2)]] * 4 + [sc_B[same]] * 4      (one byte permute)
# multiplies each pair of equal-row, equal-sub-block lanes by its scale (|.| <= 2*7680*63, exact)
# and accumulates; one vector per row pair is left for the shuffle tree.  The scales/mins of all
# 8 rows are decoded once per tile step from their 16-byte heads with byte ops (which also give
# d and dmin); T: pmaddwd of [bsum, bsum] against the [m0, m0, m1, m1, ...] patterns of two rows.
# Every step is exact integer arithmetic, so S_b and T_b equal the portable loop's; the float
# steps run lane-wise (lane = row, one IEEE instruction per
# spec step) and each lane is folded in record order, as in the other tiles.

def _gemv_vnni_acts(builder, xbase):
    """[XL_0, XH_0, XL_1, XH_1] (<64 x i8> each) of the Q8_K record at ``xbase``."""
    out = []
    for h in range(2):
        for off in (0, 32):
            a = load(builder, xbase, _A_Q_AT + 128 * h + off, vec(i8, 32))
            b = load(builder, xbase, _A_Q_AT + 128 * h + 64 + off, vec(i8, 32))
            out.append(builder.shuffle_vector(a, b, ir.Constant(vec(i32, 64), list(range(64)))))
    return out


def _gemv_vnni_pair_pattern(h, part):
    """(row, sub-block) of each i16 lane of vpackssdw(X_A, X_B), X = the vpdpbusd lanes of
    stored half ``h``, ``part`` 0 (low nibbles) or 1 (high), rows A = 0 and B = 1: per
    128-bit block c, [A lanes 4c..4c+3, B lanes 4c..4c+3], lane l in sub-block
    4h + part + 2 (l >= 8)."""
    pat = []
    for c in range(4):
        s = 4 * h + part + 2 * (c >= 2)
        pat += [(0, s)] * 4 + [(1, s)] * 4
    return pat


assert (_K_D_AT, _K_DMIN_AT, _K_SCALES_AT) == (0, 2, 4)   # the record head read below


def _gemv_vnni_heads(builder, wbs):
    """Record heads (bytes 0..15: d, dmin, the 12 scale bytes) of 8 rows as two <64 x i8>,
    rows 4q .. 4q+3 in the 128-bit lanes of vector q."""
    heads = [load(builder, wb, 0, vec(i8, 16)) for wb in wbs]

    def cat(a, b):
        n = a.type.count
        return builder.shuffle_vector(a, b, ir.Constant(vec(i32, 2 * n), list(range(2 * n))))
    return [cat(cat(heads[4 * q], heads[4 * q + 1]), cat(heads[4 * q + 2], heads[4 * q + 3]))
            for q in range(len(wbs) // 4)]


def _gemv_vnni_decode_scales(builder, raw):
    """The 6-bit fields of the four records in ``raw`` (<64 x i8> of heads), all at once: in
    each 128-bit lane bytes [sc0..sc7, m0..m7].  With r = the lane's head bytes (scales at
    r[4..15]) -- the byte form of ``unpack_scales``' SWAR:
        sc[0..3] = r[4..7] & 63                  m[0..3] = r[8..11] & 63
        sc[4..7] = (r[12..15] & 15) | ((r[4..7] >> 6) << 4)
        m[4..7]  = (r[12..15] >> 4) | ((r[8..11] >> 6) << 4)"""
    zero = ir.Constant(vec(i8, 64), [0] * 64)

    def in_lane(pattern):   # entries None -> 0
        idx = [16 * q + p if p is not None else 64 for q in range(4) for p in pattern]
        return builder.shuffle_vector(raw, zero, ir.Constant(vec(i32, 64), idx))

    def const(pattern):
        return ir.Constant(vec(i8, 64), list(pattern) * 4)
    a = in_lane([4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15])
    b = in_lane([None] * 4 + [4, 5, 6, 7] + [None] * 4 + [8, 9, 10, 11])
    low = builder.or_(builder.and_(a, const([63] * 4 + [15] * 4 + [63] * 4 + [0] * 4)),
                      builder.and_(builder.lshr(a, const([4] * 16)), const([0] * 12 + [15] * 4)))
    high = builder.shl(builder.lshr(b, const([6] * 16)), const([4] * 16))
    return builder.or_(low, high)


def _zext_pick(builder, dec, picks):
    """<n x i16> whose lane e is byte ``dec[picks[e]]`` zero-extended (one byte permute)."""
    zero = ir.Constant(vec(i8, 64), [0] * 64)
    idx = []
    for p in picks:
        idx += [p, 64]
    v = builder.shuffle_vector(dec, zero, ir.Constant(vec(i32, len(idx)), idx))
    return builder.bitcast(v, vec(i16, len(picks)))


def _gemv_vnni_row_pair(builder, ops, wbases, acts, dec, k):
    """<16 x i32> S lanes of rows A, B = the Q4_K records at ``wbases`` (lanes 4c, 4c+1: A;
    4c+2, 4c+3: B; their sums are S_b of each) against the activation vectors ``acts``; the
    rows' scales are bytes 16k .. 16k+7 and 16(k+1) .. of ``dec``.  Packing the two rows' lanes
    together (|lane| <= 7680: exact) leaves one vector per row pair for the reduction."""
    low4 = ir.Constant(vec(i8, 64), [0x0F] * 64)
    four = ir.Constant(vec(i8, 64), [4] * 64)
    zero = ir.Constant(vec(i32, 16), [0] * 16)
    s_acc = zero
    for h in range(2):
        lanes = {}
        for row, wb in enumerate(wbases):
            qs = load(builder, wb, _K_QS_AT + 64 * h, vec(i8, 64))
            lanes[row, 0] = vcall(builder, ops.dpbusd, [zero, builder.and_(qs, low4), acts[2 * h]])
            lanes[row, 1] = vcall(builder, ops.dpbusd,
                                   [zero, builder.lshr(qs, four), acts[2 * h + 1]])
        for part in range(2):
            packed = builder.call(ops.packssdw, [lanes[0, part], lanes[1, part]])
            pat = _zext_pick(builder, dec, [16 * (k + row) + sb
                                            for row, sb in _gemv_vnni_pair_pattern(h, part)])
            s_acc = vcall(builder, ops.dpwssd, [s_acc, packed, pat])
    return s_acc


@intrinsic
def accumulate_rows_x8_vnni(typingctx, w, w_off, x, x_off, step, acc, acc_at, first):
    """The gemv tile with AVX-512 VNNI (where ``HAVE_VNNI`` and ``HAVE_AVX512``): lane k folds
    the record value of the Q4_K record at byte ``w_off + k*step`` of ``w`` against the Q8_K
    record at byte ``x_off`` of ``x`` into ``acc.flat[acc_at + k]`` (acc = v if ``first`` else
    R32(acc + v)); same contract and same bits as ``accumulate_rows_x8``.  The 8 records' heads
    are decoded together (``_gemv_vnni_decode_scales``); T of two rows per vpmaddwd; S and T
    reduced by one labelled shuffle tree."""
    sig = tile_signature(w, x, acc)
    if sig is None:
        return None

    def codegen(context, builder, signature, args):
        def values(wbs, xbs):
            ops = Ops(builder, True, vnni=True)
            ops.packssdw = decl(builder, "llvm.x86.avx512.packssdw.512", vec(i16, 32),
                                 [vec(i32, 16), vec(i32, 16)])
            xb = xbs[0]
            acts = _gemv_vnni_acts(builder, xb)
            raws = _gemv_vnni_heads(builder, wbs)
            decs = [_gemv_vnni_decode_scales(builder, r) for r in raws]
            s_items = []
            for p in range(4):
                s = _gemv_vnni_row_pair(builder, ops, wbs[2 * p:2 * p + 2], acts, decs[p // 2],
                                        2 * p % 4)
                s_items.append((s, [("S", 2 * p), ("S", 2 * p), ("S", 2 * p + 1),
                                    ("S", 2 * p + 1)] * 4))
            bsum = load(builder, xb, _A_BSUM_AT, vec(i16, 16))
            bsum2 = splat_lanes(builder, bsum, list(range(16)) * 2)
            t_items = []
            for p in range(4):   # rows 2p, 2p+1: lanes [m_s * (bsum[2s] + bsum[2s+1])]
                k = 2 * p % 4
                picks = [16 * k + 8 + e // 2 for e in range(16)]
                picks += [16 * (k + 1) + 8 + e // 2 for e in range(16)]
                mp = _zext_pick(builder, decs[p // 2], picks)
                t_items.append((builder.call(ops.maddwd, [bsum2, mp]),
                                [("T", 2 * p)] * 8 + [("T", 2 * p + 1)] * 8))
            s_vec, s_lab = _reduce_labeled(builder, s_items)
            t_vec, t_lab = _reduce_labeled(builder, t_items)
            st, labels = _merge_labeled(builder, s_vec, s_lab, t_vec, t_lab)
            assert labels == [("S", k) for k in range(8)] + [("T", k) for k in range(8)], labels
            # [d_0..d_7, dmin_0..dmin_7]: i16 8k (d) and 8k + 1 (dmin) of each head
            h16 = [builder.bitcast(r, vec(i16, 32)) for r in raws]
            idx = [8 * k for k in range(4)] + [32 + 8 * k for k in range(4)]
            idx += [i + 1 for i in idx]
            dd = builder.shuffle_vector(h16[0], h16[1], ir.Constant(vec(i32, 16), idx))
            dd = builder.fpext(builder.bitcast(dd, vec(ir.HalfType(), 16)),
                               vec(ir.FloatType(), 16))
            prod = builder.fmul(dd, builder.sitofp(st, vec(ir.FloatType(), 16)))  # [p.., n..]
            ds = load(builder, xb, _A_DS_AT, ir.FloatType())
            ds = splat_lanes(builder, builder.insert_element(
                ir.Constant(vec(ir.FloatType(), 1), None), ds, ir.Constant(i32, 0)), [0] * 8)
            return builder.fmul(ds, builder.fsub(splat_lanes(builder, prod, range(8)),
                                                 splat_lanes(builder, prod, range(8, 16))))
        return tile_fold(context, builder, signature, args, 0, True, 8, values)
    return sig, codegen


# ---- Row-lane GEMM micro-kernel (AVX-512 VNNI): 16 rows x n activations -----------------------
#
# Weights are decoded once per gemm call (per row block) in groups of 16 rows, R16_BYTES per
# (group, record index b):
#
#     [0, 4096)      k-step kk (elements 4kk .. 4kk+3) at 64*kk: row r's four quants at + 4r
#     [4096, 4608)   sub-block s at 4096 + 64s: sc[r, s] as int32 at + 4r
#     [4608, 5120)   sub-block s at 4608 + 64s: m[r, s] twice as int16 (m | m << 16) at + 4r
#     [5120, 5184)   d of row r as f32 at + 4r (exact widening);  [5184, 5248) dmin likewise
#     [5248, 5504)   sub-block pair p at 5248 + 64p: m[r, 2p] | m[r, 2p+1] << 16 at + 4r
#
# An i32 lane is a weight row, so the activation operand of vpdpbusd is one broadcast dword of
# the Q8_K record as stored (no repack): for sub-block s, eight chained vpdpbusd (k-steps 8s ..
# 8s+7) leave in lane r the exact sub-block sum (|.| <= 32*15*128 = 61440), one vpmulld by the
# scale lane vector and one add accumulate S (|S| <= 30,965,760, exact in int32).  T: vpdpwssd of
# [m, m] lanes against the broadcast bsum dword (bsum[2s], bsum[2s+1]) (exact); or, where every
# pair sum bsum[2s] + bsum[2s+1] of the call's activations fits an int16 (always, for records a
# quantizer writes: |bsum| <= 2048), half as many: [m[2p], m[2p+1]] lanes against the broadcast
# pair sums of sub-blocks 2p, 2p+1 (the same integer T, exact either way).  A weight vector
# is loaded once per k-step and used for all n activations.  The float steps run lane-wise
# across the 16 rows (one IEEE instruction per spec step) and each lane is folded in record
# order into acc.flat[acc_at + 16a : + 16] for activation a.

R16_ROWS = 16
R16_Q_AT, R16_SC_AT, R16_M_AT, R16_D_AT, R16_DMIN_AT, R16_M2_AT = 0, 4096, 4608, 5120, 5184, 5248
R16_BYTES = 5504


def _pick_lanes(builder, vecs, sources):
    """A vector whose lane l is lane sources[l][1] of vecs[sources[l][0]] (all ``vecs`` of one
    type), built from two-input shuffles (a tournament over the sources)."""
    n = vecs[0].type.count
    m = len(sources)
    und = ir.Constant(vecs[0].type, ir.Undefined)
    parts = []   # (vector of m lanes, set of defined lanes)
    for i in range(0, len(vecs), 2):
        a = vecs[i]
        b = vecs[i + 1] if i + 1 < len(vecs) else und
        idx, defined = [], set()
        for l, (vi, li) in enumerate(sources):
            if vi == i:
                idx.append(li)
                defined.add(l)
            elif vi == i + 1:
                idx.append(n + li)
                defined.add(l)
            else:
                idx.append(0)   # don't care (llvmlite takes no undef mask lanes)
        if defined:
            parts.append((builder.shuffle_vector(a, b, ir.Constant(vec(i32, m), idx)), defined))
    while len(parts) > 1:
        nxt = []
        for i in range(0, len(parts), 2):
            if i + 1 == len(parts):
                nxt.append(parts[i])
                continue
            (a, da), (b, db) = parts[i], parts[i + 1]
            idx = [l if l in da else (m + l if l in db else 0) for l in range(m)]
            nxt.append((builder.shuffle_vector(a, b, ir.Constant(vec(i32, m), idx)), da | db))
        parts = nxt
    return parts[0][0]


def _transpose16(builder, rows):
    """16 <16 x i32> vectors M[0..15] -> M' with M'[i][j] = M[j][i] (butterfly of shuffles)."""
    m = list(rows)
    for bit in range(4):
        h = 1 << bit
        for i in range(16):
            if i & h:
                continue
            a, b = m[i], m[i | h]
            lo = [j if not j & h else 16 + (j ^ h) for j in range(16)]
            hi = [(j ^ h) if not j & h else 16 + j for j in range(16)]
            m[i] = builder.shuffle_vector(a, b, ir.Constant(vec(i32, 16), lo))
            m[i | h] = builder.shuffle_vector(a, b, ir.Constant(vec(i32, 16), hi))
    return m


@intrinsic
def q4_k_decode_rows16(typingctx, w, w_off, w_step, dec, dec_off):
    """Decode the 16 Q4_K records at bytes ``w_off + r*w_step`` (r = 0..15) of ``w`` into
    R16_BYTES at byte ``dec_off`` of ``dec`` (layout above)."""
    if not (isinstance(w, types.Array) and isinstance(dec, types.Array)):
        return None
    sig = types.none(w, types.intp, types.intp, dec, types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, step_v, d_arr, d_off_v = args
        db = byte_ptr(context, builder, signature.args[3], d_arr, d_off_v)
        wbs = [byte_ptr(context, builder, signature.args[0], w_arr,
                    builder.add(w_off_v, builder.mul(step_v, ir.Constant(step_v.type, r))))
               for r in range(R16_ROWS)]

        def store(offset, v):
            ptr = builder.gep(db, [ir.Constant(i64, offset)])
            builder.store(v, builder.bitcast(ptr, v.type.as_pointer()), align=1)

        # Transpose the packed quants first (16 rows x 32 dwords), then split the nibbles:
        # packed dword 8j + i of a row holds elements 64j + 4i .. + 3 (low nibbles: k-step
        # 8(2j) + i) and 64j + 32 + 4i .. + 3 (high nibbles: k-step 8(2j+1) + i).
        nib = ir.Constant(vec(i32, 16), [0x0F0F0F0F] * 16)
        four = ir.Constant(vec(i32, 16), [4] * 16)
        for h in range(2):
            t = _transpose16(builder, [load(builder, wb, _K_QS_AT + 64 * h, vec(i32, 16))
                                       for wb in wbs])
            for l in range(16):
                j, i = divmod(16 * h + l, 8)
                store(R16_Q_AT + 64 * (8 * (2 * j) + i), builder.and_(t[l], nib))
                store(R16_Q_AT + 64 * (8 * (2 * j + 1) + i),
                      builder.and_(builder.lshr(t[l], four), nib))
        heads = [load(builder, wb, 0, vec(i32, 4)) for wb in wbs]   # d|dmin, u0, u1, u2
        f = [_pick_lanes(builder, heads, [(r, k) for r in range(R16_ROWS)]) for k in range(4)]
        h0, u0, u1, u2 = f

        def c32(x):
            return ir.Constant(vec(i32, 16), [x] * 16)

        def field(v, shift, mask):
            return builder.and_(builder.lshr(v, c32(shift)), c32(mask))
        ms = []
        for s in range(8):
            if s < 4:
                sc = field(u0, 8 * s, 63)
                m = field(u1, 8 * s, 63)
            else:
                q = 8 * (s - 4)
                sc = builder.or_(field(u2, q, 15), builder.shl(field(u0, q + 6, 3), c32(4)))
                m = builder.or_(field(u2, q + 4, 15), builder.shl(field(u1, q + 6, 3), c32(4)))
            store(R16_SC_AT + 64 * s, sc)
            store(R16_M_AT + 64 * s, builder.or_(m, builder.shl(m, c32(16))))
            ms.append(m)
        for p in range(4):
            store(R16_M2_AT + 64 * p, builder.or_(ms[2 * p], builder.shl(ms[2 * p + 1], c32(16))))

        def half(v):
            return builder.fpext(builder.bitcast(builder.trunc(v, vec(i16, 16)),
                                                 vec(ir.HalfType(), 16)),
                                 vec(ir.FloatType(), 16))
        store(R16_D_AT, half(h0))
        store(R16_DMIN_AT, half(builder.lshr(h0, c32(16))))
        return context.get_dummy_value()
    return sig, codegen


def _bcast_dword(builder, base, offset):
    """<16 x i32> of the dword at ``offset`` repeated (a broadcast load)."""
    v = builder.insert_element(ir.Constant(vec(i32, 1), None),
                               load(builder, base, offset, i32), ir.Constant(i32, 0))
    return splat_lanes(builder, v, [0] * 16)


def _rows16_st(builder, ops, db, xbs, b2s, per=2):
    """(S, T) as n <16 x i32> vectors each (lane = row) of the decoded 16-row record at ``db``
    against the Q8_K records at ``xbs``.  One IR loop iteration per ``per`` sub-blocks (fully
    unrolled code lets LLVM hoist every broadcast load and spill): per sub-block eight k-steps x
    n activations and the scale step, and the T steps: with ``b2s`` (pointers to each
    activation's eight int16 pair sums bsum[2s] + bsum[2s+1]) one vpdpwssd per two sub-blocks
    against [m[2p], m[2p+1]] lanes, else one per sub-block against [m[s], m[s]] lanes and the
    stored bsum dword (bsum[2s], bsum[2s+1])."""
    n = len(xbs)
    zero = ir.Constant(vec(i32, 16), [0] * 16)
    pre = builder.block
    loop = builder.append_basic_block("r16.sub_blocks")
    after = builder.append_basic_block("r16.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    p_idx = builder.phi(i64)
    p_idx.add_incoming(ir.Constant(i64, 0), pre)
    s_phi = [builder.phi(vec(i32, 16)) for _ in range(n)]
    t_phi = [builder.phi(vec(i32, 16)) for _ in range(n)]
    for ph in s_phi + t_phi:
        ph.add_incoming(zero, pre)
    wq = builder.gep(db, [builder.mul(p_idx, ir.Constant(i64, per * 8 * 64))])
    xq = [builder.gep(xb, [builder.mul(p_idx, ir.Constant(i64, per * 32))]) for xb in xbs]
    d128 = builder.gep(db, [builder.mul(p_idx, ir.Constant(i64, per * 64))])
    s_new, t_new = list(s_phi), list(t_phi)
    for h in range(per):   # sub-block s = per*p + h
        part = [zero] * n
        for i in range(8):   # |part| <= 32 * 15 * 128 = 61440
            wv = load(builder, wq, R16_Q_AT + 64 * (8 * h + i), vec(i32, 16))
            for a in range(n):
                xv = _bcast_dword(builder, xq[a], _A_Q_AT + 32 * h + 4 * i)
                part[a] = vcall(builder, ops.dpbusd, [part[a], wv, xv])
        sc = load(builder, d128, R16_SC_AT + 64 * h, vec(i32, 16))
        s_new = [builder.add(s_new[a], builder.mul(part[a], sc)) for a in range(n)]
        if b2s is None:
            mv = load(builder, d128, R16_M_AT + 64 * h, vec(i32, 16))
            for a in range(n):
                bs = _bcast_dword(builder, builder.gep(xbs[a], [builder.mul(
                    p_idx, ir.Constant(i64, 4 * per))]), _A_BSUM_AT + 4 * h)
                t_new[a] = vcall(builder, ops.dpwssd, [t_new[a], mv, bs])
    if b2s is not None:
        assert per % 2 == 0
        for q in range(per // 2):   # sub-block pair per//2 * p + q
            mv = load(builder, builder.gep(db, [builder.mul(p_idx, ir.Constant(i64, 32 * per))]),
                       R16_M2_AT + 64 * q, vec(i32, 16))
            for a in range(n):
                bs = _bcast_dword(builder, builder.gep(b2s[a], [builder.mul(
                    p_idx, ir.Constant(i64, 2 * per))]), 4 * q)
                t_new[a] = vcall(builder, ops.dpwssd, [t_new[a], mv, bs])
    p_next = builder.add(p_idx, ir.Constant(i64, 1))
    end = builder.block
    p_idx.add_incoming(p_next, end)
    for ph, v in zip(s_phi + t_phi, s_new + t_new):
        ph.add_incoming(v, end)
    builder.cbranch(builder.icmp_unsigned("<", p_next, ir.Constant(i64, 8 // per)), loop,
                    after)
    builder.position_at_end(after)
    return s_new, t_new


def _make_rows16(pair_sums: bool, per=2):
    @intrinsic
    def accumulate_rows16_vnni(typingctx, dec, dec_off, x, x_off, x_step, b2, b2_off, acc,
                               acc_at, first, nacts):
        """Fold the record values of the 16 decoded weight rows at byte ``dec_off`` of ``dec``
        against the ``nacts`` (a literal int) Q8_K records at bytes ``x_off + a*x_step`` of
        ``x`` into ``acc.flat[acc_at + 16a : acc_at + 16a + 16]`` (acc = v if ``first`` else
        R32(acc + v), lane by lane)."""
        if not (isinstance(dec, types.Array) and isinstance(x, types.Array)
                and isinstance(b2, types.Array) and isinstance(acc, types.Array)
                and acc.dtype == types.float32):
            return None
        n = literal_int(nacts)
        if n is None:
            return None
        sig = types.none(dec, types.intp, x, types.intp, types.intp, b2, types.intp, acc,
                         types.intp, types.intp, nacts)

        def codegen(context, builder, signature, args):
            (d_arr, d_off_v, x_arr, x_off_v, step_v, b2_arr, b2_off_v, acc_arr, acc_at_v,
             first_v, _) = args
            ops = Ops(builder, True, vnni=True)
            db = byte_ptr(context, builder, signature.args[0], d_arr, d_off_v)
            xbs = [byte_ptr(context, builder, signature.args[2], x_arr,
                        builder.add(x_off_v, builder.mul(step_v, ir.Constant(step_v.type, a))))
                   for a in range(n)]
            b2s = None
            if pair_sums:
                b2s = [byte_ptr(context, builder, signature.args[5], b2_arr,
                            builder.add(b2_off_v, ir.Constant(b2_off_v.type, 16 * a)))
                       for a in range(n)]
            s_acc, t_acc = _rows16_st(builder, ops, db, xbs, b2s, per)
            f32v = vec(ir.FloatType(), 16)
            d = load(builder, db, R16_D_AT, f32v)
            dmin = load(builder, db, R16_DMIN_AT, f32v)
            acc_base = float_array_ptr(context, builder, signature.args[7], acc_arr)
            for a in range(n):
                p = builder.fmul(d, builder.sitofp(s_acc[a], f32v))       # p = R32(d * f32(S))
                q = builder.fmul(dmin, builder.sitofp(t_acc[a], f32v))    # n = R32(dmin * f32(T))
                ds = builder.bitcast(_bcast_dword(builder, xbs[a], _A_DS_AT), f32v)
                v = builder.fmul(ds, builder.fsub(p, q))                  # v = R32(ds * R32(p - n))
                at = builder.add(acc_at_v, ir.Constant(acc_at_v.type, 16 * a))
                fold_into(builder, builder.gep(acc_base, [at]), v, first_v)
            return context.get_dummy_value()
        return sig, codegen
    return accumulate_rows16_vnni


# T from the stored bsum (any bytes), one sub-block per loop iteration (measured faster than
# two); T from the int16 pair sums (where every one fits), two sub-blocks per iteration.
accumulate_rows16_vnni = _make_rows16(False, 1)
accumulate_rows16_vnni_b2 = _make_rows16(True, 2)


# ---- Repacked ("x16") Q4_K weights: the gemv tile of numba_qk.repack (AVX-512 VNNI) ----------
#
# Layout of one (16-row group, record b) block, X16_BYTES = 2304 bytes (see kernels/kquants/q4_k_x16.py,
# which writes it): the 16 plain records' bytes, transposed so that a 64-byte line holds one
# dword of each of the 16 rows (the same size as the plain records)::
#
#     [0, 2048)      packed dword q (qs bytes 4q .. 4q+3) at 64q: row r's at + 4r
#     [2048, 2240)   scale word k (scale bytes 4k .. 4k+3: u0, u1, u2) at 2048 + 64k: row r's
#                    at + 4r
#     [2240, 2272)   f16 d of row r at + 2r;  [2272, 2304) f16 dmin of row r at + 2r
#
# Lane r of every i32 vector is weight row r.  Packed dword q = 8j + i holds, in its low
# nibbles, elements 64j + 4i .. + 3 (sub-block 2j, k-step i) and, in its high nibbles, elements
# 64j + 32 + 4i .. + 3 (sub-block 2j + 1).  Low: vpdpbusd(q & 0x0F0F0F0F, broadcast activation
# dword at element 64j + 4i); high: vpdpbusd(q & 0xF0F0F0F0, broadcast dword at 64j + 32 + 4i),
# i.e. 16 times the high-nibble products (the shift is folded into the end: |16 x sub-block
# sum| <= 16 * 61440, times a 6-bit scale and summed over the 4 odd sub-blocks at most
# 247,726,080 < 2**31, so S_hi16 = 16 * S_hi exactly and S = S_lo + (S_hi16 >> 4) exactly).
# The 6-bit scales and mins are unpacked lane-wise from the three scale words (as
# q4_k_decode_rows16 does).  Eight chained vpdpbusd per sub-block and one vpmulld by the scale
# lane vector give S; T: vpdpwssd of the [m[2p], m[2p+1]] i16 lanes against the broadcast int16
# pair sums (bsum[4p] + bsum[4p+1], bsum[4p+2] + bsum[4p+3]) where every pair sum of the
# activation fits an int16 (always, for records a quantizer writes), else vpmulld of each m
# lane vector by the broadcast int32 pair sum -- the same integer T either way.  The float steps
# are those of accumulate_rows16_vnni, lane-wise (lane = row), folded per row in record order.

X16_ROWS = 16
X16_Q_AT, X16_U_AT, X16_D_AT, X16_DMIN_AT = 0, 2048, 2240, 2272
X16_BYTES = 2304


def _raw_byte_ptr(context, builder, arrty, arr, offset):
    """i8* to byte ``offset`` of ``arr``'s data, whatever its dtype."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.gep(builder.bitcast(data, i8.as_pointer()), [offset])


def _make_x16(pair16: bool):
    @intrinsic
    def q4_k_x16_rows(typingctx, tiles, t_off, x, x_off, ps, ps_off, acc, acc_at, first):
        """Fold the record values of the repacked (16 rows, record) block at byte ``t_off`` of
        ``tiles`` against the Q8_K record at byte ``x_off`` of ``x`` into
        ``acc[acc_at : acc_at + 16]`` (float32, contiguous; acc = v if ``first`` else
        R32(acc + v), lane = row).  ``ps`` at byte ``ps_off``: the
        record's 8 pair sums, as int16 (pair16 form) or int32."""
        sig = fold_signature(acc, tiles, x, ps)
        if sig is None:
            return None

        def codegen(context, builder, signature, args):
            t_arr, t_off_v, x_arr, x_off_v, p_arr, p_off_v, acc_arr, acc_at_v, first_v = args
            ops = Ops(builder, True, vnni=True)
            tb = byte_ptr(context, builder, signature.args[0], t_arr, t_off_v)
            xb = byte_ptr(context, builder, signature.args[2], x_arr, x_off_v)
            pb = _raw_byte_ptr(context, builder, signature.args[4], p_arr, p_off_v)
            v16 = vec(i32, 16)

            def c32(val):
                return ir.Constant(v16, [val] * 16)

            def field(v, shift, mask):
                return builder.and_(builder.lshr(v, c32(shift)) if shift else v, c32(mask))
            u0, u1, u2 = (load(builder, tb, X16_U_AT + 64 * k, v16) for k in range(3))
            scs, ms = [], []
            for s in range(8):
                if s < 4:
                    scs.append(field(u0, 8 * s, 63))
                    ms.append(field(u1, 8 * s, 63))
                else:
                    q = 8 * (s - 4)
                    scs.append(builder.or_(field(u2, q, 15), field(u0, q + 2, 0x30)))
                    ms.append(builder.or_(field(u2, q + 4, 15), field(u1, q + 2, 0x30)))
            zero = c32(0)
            lo_mask, hi_mask = c32(0x0F0F0F0F), c32(-0x0F0F0F10)   # 0xF0F0F0F0
            s_lo, s_hi = zero, zero
            for j in range(4):
                p_lo, p_hi = zero, zero
                for i in range(8):
                    q = load(builder, tb, X16_Q_AT + 64 * (8 * j + i), v16)
                    p_lo = vcall(builder, ops.dpbusd, [
                        p_lo, builder.and_(q, lo_mask),
                        _bcast_dword(builder, xb, _A_Q_AT + 64 * j + 4 * i)])
                    p_hi = vcall(builder, ops.dpbusd, [
                        p_hi, builder.and_(q, hi_mask),
                        _bcast_dword(builder, xb, _A_Q_AT + 64 * j + 32 + 4 * i)])
                s_lo = builder.add(s_lo, builder.mul(p_lo, scs[2 * j]))
                s_hi = builder.add(s_hi, builder.mul(p_hi, scs[2 * j + 1]))
            s_acc = builder.add(s_lo, builder.ashr(s_hi, c32(4)))
            t_acc = zero
            for p in range(4):
                if pair16:
                    mv = builder.or_(ms[2 * p], builder.shl(ms[2 * p + 1], c32(16)))
                    t_acc = vcall(builder, ops.dpwssd,
                                   [t_acc, mv, _bcast_dword(builder, pb, 4 * p)])
                else:
                    for s in (2 * p, 2 * p + 1):
                        t_acc = builder.add(t_acc, builder.mul(
                            ms[s], _bcast_dword(builder, pb, 4 * s)))
            f32v = vec(ir.FloatType(), 16)
            hv = vec(ir.HalfType(), 16)
            d = builder.fpext(load(builder, tb, X16_D_AT, hv), f32v)
            dmin = builder.fpext(load(builder, tb, X16_DMIN_AT, hv), f32v)
            p_v = builder.fmul(d, builder.sitofp(s_acc, f32v))       # p = R32(d * f32(S))
            n_v = builder.fmul(dmin, builder.sitofp(t_acc, f32v))    # n = R32(dmin * f32(T))
            ds = builder.bitcast(_bcast_dword(builder, xb, _A_DS_AT), f32v)
            v = builder.fmul(ds, builder.fsub(p_v, n_v))             # v = R32(ds * R32(p - n))
            acc_base = float_array_ptr(context, builder, signature.args[6], acc_arr)
            fold_into(builder, builder.gep(acc_base, [acc_at_v]), v, first_v)
            return context.get_dummy_value()
        return sig, codegen
    return q4_k_x16_rows


q4_k_x16_rows_p16 = _make_x16(True)    # T from the int16 pair sums (where every one fits)
q4_k_x16_rows_p32 = _make_x16(False)   # T from the int32 pair sums (any bytes)
