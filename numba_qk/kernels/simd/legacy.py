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

from numba_qk.formats.iq import KVALUES_IQ4NL
from numba_qk.kernels.legacy import layout as _LL
from numba_qk.kernels.simd.base import HAVE_AVX512, HAVE_GFNI, Ops, decl, float_array_ptr, gather_f16, i8, i16, i32, i64, literal_int, load, pmaddwd32, byte_ptr, reduce_many, splat_lanes, tile_fold, vcall, vec

__all__ = ["legacy_block_value", "legacy_accumulate_x8"]

# Per-code layout, read from the schemas (_legacy_layout.py): only weight formats have a dot.
_L_WEIGHT = {c for c, fmt in enumerate(_LL.FORMATS) if fmt in _LL.WEIGHT_FORMATS}

#: The code of IQ4_NL in the x8 tiles and the small-batch gemm (``legacy_x8_rows``,
#: ``legacy_rows16``), past the legacy codes: its records have Q4_0's layout (f16 d, then 16
#: bytes of nibbles) and pair with Q8_0; its nibbles index ``kvalues_iq4nl``, looked up by one
#: ``vpshufb`` per 64 nibbles as ``k + 128`` (a u8; ``128 * sum x`` taken off after the exact
#: sum, as for Q8_0's int8 quants).
X8_IQ4_NL = len(_LL.FORMATS)
#: code -> the legacy code whose record layout (field offsets, paired activation) it has
X8_LAYOUT = {**{c: c for c in range(len(_LL.FORMATS))}, X8_IQ4_NL: _LL.Q4_0}
_KVALUES_U8 = [(v + 128) & 0xFF for v in KVALUES_IQ4NL]   # k + 128 (|k| <= 127: 1..255)


def _iq4_nl_lookup(b, nibbles):
    """<64 x i8> k(c) + 128 of the 64 nibbles ``c`` (<64 x i8>, each 0..15): one ``vpshufb``,
    the table repeated in each 128-bit lane."""
    v64 = vec(i8, 64)
    shuf = decl(b, "llvm.x86.avx512.pshuf.b.512", v64, [v64, v64])
    return b.call(shuf, [ir.Constant(v64, _KVALUES_U8 * 4), nibbles])


def _legacy_weights_i8(builder, code, wbase):
    """<32 x i8>: the integers a dot multiplies (q - 8, q - 16, q or the int8: all fit int8),
    for one legacy weight record."""
    v32 = vec(i8, 32)
    if _LL.FORMATS[code].field("qs").signed:  # int8 quants
        return load(builder, wbase, _LL.QS_AT[code], v32)
    qs = load(builder, wbase, _LL.QS_AT[code], vec(i8, 16))
    lo = builder.and_(qs, ir.Constant(vec(i8, 16), [0x0F] * 16))
    hi = builder.lshr(qs, ir.Constant(vec(i8, 16), [4] * 16))
    q = builder.shuffle_vector(lo, hi, ir.Constant(vec(i32, 32), list(range(32))))
    if _LL.QH_AT[code] >= 0:  # fifth bits: bit j of the u32 qh -> 16 in lane j
        qh = load(builder, wbase, _LL.QH_AT[code], i32)
        mask = builder.bitcast(qh, vec(ir.IntType(1), 32))
        q = builder.or_(q, builder.select(mask, ir.Constant(v32, [16] * 32),
                                          ir.Constant(v32, [0] * 32)))
    if _LL.ZERO[code]:  # q - 8 (Q4_0), q - 16 (Q5_0)
        q = builder.sub(q, ir.Constant(v32, [_LL.ZERO[code]] * 32))
    return q


def _legacy_weights(builder, code, wbase):
    """<32 x i16>: ``_legacy_weights_i8`` widened."""
    return builder.sext(_legacy_weights_i8(builder, code, wbase), vec(i16, 32))


def _legacy_sums(builder, ops, code, wbases, xbases):
    """S for the record pairs zip(wbases, xbases) as one <n x i32> vector."""
    decoded, xs, accs = {}, {}, []
    x_at = _LL.X_QS_AT[code]
    for wb, xb in zip(wbases, xbases):
        if id(wb) not in decoded:
            decoded[id(wb)] = _legacy_weights(builder, code, wb)
        if id(xb) not in xs:
            xs[id(xb)] = builder.sext(load(builder, xb, x_at, vec(i8, 32)), vec(i16, 32))
        accs.append(pmaddwd32(builder, ops, decoded[id(wb)], xs[id(xb)]))
    return reduce_many(builder, accs)


def _legacy_values(builder, code, s_vec, wbs, xbs):
    """Lane-wise float steps: v = R32(dx * R32(dw * f32(S))) [+ R32(mw * sx)]."""
    f32v = vec(ir.FloatType(), s_vec.type.count)
    dw = gather_f16(builder, wbs, _LL.D_AT[code])
    dx = gather_f16(builder, xbs, _LL.X_D_AT[code])
    v = builder.fmul(dx, builder.fmul(dw, builder.sitofp(s_vec, f32v)))
    if _LL.M_AT[code] >= 0:
        v = builder.fadd(v, builder.fmul(gather_f16(builder, wbs, _LL.M_AT[code]),
                                         gather_f16(builder, xbs, _LL.X_S_AT[code])))
    return v


def _make_legacy_value(wide: bool):
    @intrinsic
    def legacy_block_value(typingctx, code, w, w_off, x, x_off):
        """v_b of the canonical legacy dot for the weight record at byte ``w_off`` of ``w`` and
        the activation record at byte ``x_off`` of ``x``; ``code`` must be a literal."""
        c = literal_int(code)
        if c is None or c not in _L_WEIGHT or not isinstance(w, types.Array):
            return None
        sig = types.float32(code, w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            ops = Ops(builder, wide)
            wb = byte_ptr(context, builder, signature.args[1], args[1], args[2])
            xb = byte_ptr(context, builder, signature.args[3], args[3], args[4])
            s_vec = _legacy_sums(builder, ops, c, [wb], [xb])
            v = _legacy_values(builder, c, s_vec, [wb], [xb])
            return builder.extract_element(v, ir.Constant(i32, 0))
        return sig, codegen
    return legacy_block_value


def _make_legacy_accumulate(wide: bool, n: int = 8):
    @intrinsic
    def legacy_accumulate(typingctx, code, over_rows, w, w_off, x, x_off, step, acc, acc_at,
                          first):
        """As the Q4_K accumulate intrinsics, for legacy format ``code`` (a literal);
        ``over_rows`` (a literal bool) picks the gemv (8 weight rows) or gemm (8 activations)
        tiling."""
        c = literal_int(code)
        rows = over_rows.literal_value if isinstance(over_rows, types.BooleanLiteral) else None
        if c is None or c not in _L_WEIGHT or rows is None:
            return None
        sig = types.none(code, over_rows, w, types.intp, x, types.intp, types.intp, acc,
                         types.intp, types.intp)

        def codegen(context, builder, signature, args):
            def values(wbs, xbs):
                s_vec = _legacy_sums(builder, Ops(builder, wide), c, wbs, xbs)
                return _legacy_values(builder, c, s_vec, wbs, xbs)
            return tile_fold(context, builder, signature, args, 2, rows, n, values)
        return sig, codegen
    return legacy_accumulate


legacy_block_value = _make_legacy_value(wide=HAVE_AVX512)
legacy_accumulate_x8 = _make_legacy_accumulate(wide=HAVE_AVX512)


# ---- gemv with AVX-512 VNNI: 8 rows x R records per call, two records per 512-bit vector ------
#
# Per row and record pair (b, b+1) one <64 x u8> weight vector W holds the 64 quants in element
# order (bytes 0..31 record b, 32..63 record b+1), the activation vector X the 64 int8 quants of
# the two activation records in the same order (shared by the 8 rows), and one vpdpbusd adds
# four u8 x i8 products per i32 lane: lanes 0..7 belong to record b, 8..15 to record b+1.
# Formats whose integer is not the stored u8 (Q4_0: q - 8, Q5_0: q - 16; Q8_0: the int8 q,
# stored here as the u8 q + 128) start the accumulation at C = -z * (sums of four x), computed
# once per X: lane = sum (u - z) * x, exactly the integers of the portable loop (|lane| <=
# 4 * 255 * 128 + 4 * 128 * 128, i32 exact).  Lane sums are then reduced per (row, record)
# (_reduce_labelled) and the float steps run lane-wise on <16 x float> in spec order; each row's
# fold adds the R record values in record order.

# GFNI vgf2p8affineqb: result bit i of a byte = parity(matrix byte 7-i & byte).  _GF_LOW keeps
# bits 0..3, _GF_HIGH moves bits 4..7 to 0..3 (both clear bits 4..7): the two nibbles, exactly.
_GF_LOW = sum((1 << i) << (8 * (7 - i)) for i in range(4))
_GF_HIGH = sum((1 << (i + 4)) << (8 * (7 - i)) for i in range(4))
_GF_LOW -= (1 << 64) if _GF_LOW >= 1 << 63 else 0    # as signed i64 constants
_GF_HIGH -= (1 << 64) if _GF_HIGH >= 1 << 63 else 0
_U8_BIAS = {**{c: (128 if _LL.FORMATS[c].field("qs").signed else _LL.ZERO[c])
               for c in _L_WEIGHT}, X8_IQ4_NL: 128}


def _pair_weights(builder, code, wb0, wb1):
    """<64 x i8>: the u8 quants (stored nibble/5-bit value, or int8 + 128) of two records."""
    qs_at = _LL.QS_AT[code]
    if _LL.FORMATS[code].field("qs").signed:
        q = builder.shuffle_vector(load(builder, wb0, qs_at, vec(i8, 32)),
                                   load(builder, wb1, qs_at, vec(i8, 32)),
                                   ir.Constant(vec(i32, 64), list(range(64))))
        return builder.xor(q, ir.Constant(vec(i8, 64), [0x80] * 64))
    a = load(builder, wb0, qs_at, vec(i8, 16))
    b = load(builder, wb1, qs_at, vec(i8, 16))
    dup = list(range(16)) * 2 + list(range(16, 32)) * 2   # [qs0, qs0, qs1, qs1]
    y = builder.shuffle_vector(a, b, ir.Constant(vec(i32, 64), dup))
    if HAVE_GFNI:  # one affine bit-matrix per qword: low nibble, or high nibble moved down
        fn = decl(builder, "llvm.x86.vgf2p8affineqb.512", vec(i8, 64),
                   [vec(i8, 64), vec(i8, 64), i8])
        mats = builder.bitcast(ir.Constant(vec(i64, 8), [_GF_LOW, _GF_LOW, _GF_HIGH, _GF_HIGH] * 2),
                               vec(i8, 64))
        q = builder.call(fn, [y, mats, ir.Constant(i8, 0)])
    else:
        y = builder.bitcast(y, vec(i64, 8))
        y = builder.lshr(y, ir.Constant(vec(i64, 8), [0, 0, 4, 4, 0, 0, 4, 4]))
        q = builder.and_(builder.bitcast(y, vec(i8, 64)),
                         ir.Constant(vec(i8, 64), [0x0F] * 64))
    if _LL.QH_AT[code] >= 0:  # bit j of record r's qh -> + 16 in byte 32r + j (masked add)
        qh0 = builder.zext(load(builder, wb0, _LL.QH_AT[code], i32), i64)
        qh1 = builder.zext(load(builder, wb1, _LL.QH_AT[code], i32), i64)
        bits = builder.or_(qh0, builder.shl(qh1, ir.Constant(i64, 32)))
        mask = builder.bitcast(bits, vec(ir.IntType(1), 64))
        q = builder.select(mask, builder.add(q, ir.Constant(vec(i8, 64), [16] * 64)), q)
    return q


def _merge_labelled(builder, a, la, b, lb):
    """Sum lane pairs of equal label from a (and b): returns (vector, labels)."""
    src = list(la) + (list(lb) if b is not None else [])
    groups = {}
    for i, lab in enumerate(src):
        groups.setdefault(lab, []).append(i)
    lo, hi, labels = [], [], []
    for lab, idx in groups.items():
        assert len(idx) % 2 == 0
        for i, j in zip(idx[0::2], idx[1::2]):
            lo.append(i)
            hi.append(j)
            labels.append(lab)
    other = b if b is not None else ir.Constant(a.type, ir.Undefined)
    n = len(lo)
    v = builder.add(builder.shuffle_vector(a, other, ir.Constant(vec(i32, n), lo)),
                    builder.shuffle_vector(a, other, ir.Constant(vec(i32, n), hi)))
    return v, labels


def _reduce_labelled(builder, vecs, labels):
    """Sums of the lanes of equal label over ``vecs`` (each lane's label in ``labels``, the same
    count of lanes per label in every vector): a list of (vector, labels) with one lane per
    label (exact i32 adds: any order gives the same integers)."""
    items = list(zip(vecs, labels))
    while len(items) > 1 and all(len(set(l)) < len(l) for _, l in items):
        items = [_merge_labelled(builder, a, la, b, lb)
                 for (a, la), (b, lb) in zip(items[0::2], items[1::2])]
    return items


def _pick(builder, items, want):
    """<len(want) x i32> whose lane k is the lane labelled want[k] among ``items``."""
    where = {}
    for v_i, (_, labs) in enumerate(items):
        for lane, lab in enumerate(labs):
            where[lab] = (v_i, lane)
    used = sorted({where[w][0] for w in want})
    assert len(used) <= 2
    a = items[used[0]][0]
    b = items[used[1]][0] if len(used) > 1 else ir.Constant(a.type, ir.Undefined)
    idx = [where[w][1] + (a.type.count if where[w][0] != used[0] else 0) for w in want]
    return builder.shuffle_vector(a, b, ir.Constant(vec(i32, len(want)), idx))


def _splat_pair_f16(builder, xb0, xb1, offset, n):
    """<2n x float>: the f16 at ``offset`` of xb0 in lanes 0..n-1, of xb1 in lanes n..2n-1."""
    return gather_f16(builder, [xb0] * n + [xb1] * n, offset)


def _gather_tile_f16(builder, base, step, rec, r0, offset, high=False):
    """<16 x float>: the f16 at ``offset`` of row k's record r0 + h in lane 8h + k, row k at
    ``base + k*step`` (i32 offsets: the caller bounds 8*|step|), records ``rec`` bytes apart;
    one vpgatherdd of the dwords there, the low (or ``high``) halves widened exactly."""
    v16i32 = vec(i32, 16)
    fn = decl(builder, "llvm.x86.avx512.mask.gather.dpi.512", v16i32,
               [v16i32, i8.as_pointer(), v16i32, vec(ir.IntType(1), 16), i32])
    st = builder.trunc(step, i32)
    idx = builder.mul(splat_lanes(builder, builder.insert_element(
        ir.Constant(v16i32, ir.Undefined), st, ir.Constant(i32, 0)), [0] * 16),
        ir.Constant(v16i32, [k for _ in range(2) for k in range(8)]))
    idx = builder.add(idx, ir.Constant(v16i32, [(r0 + h) * rec + offset
                                                for h in range(2) for _ in range(8)]))
    g = builder.call(fn, [ir.Constant(v16i32, [0] * 16), base, idx,
                          ir.Constant(vec(ir.IntType(1), 16), [1] * 16), ir.Constant(i32, 1)])
    if high:
        g = builder.lshr(g, ir.Constant(v16i32, [16] * 16))
    h16 = builder.bitcast(builder.trunc(g, vec(i16, 16)), vec(ir.HalfType(), 16))
    return builder.fpext(h16, vec(ir.FloatType(), 16))


def _make_legacy_rows_vnni(gather: bool):
    @intrinsic
    def legacy_rows_vnni(typingctx, code, nrec, w, w_off, w_rec, x, x_off, x_rec, step, acc,
                         first):
        """Fold ``nrec`` (a literal, even) consecutive records of 8 weight rows into
        ``acc[0:8]`` (float32, contiguous): row k's record r at byte
        ``w_off + k*step + r*w_rec`` of ``w``, the activation record r at byte
        ``x_off + r*x_rec`` of ``x``; acc[k] = R32(acc[k] + v) for each record in order, the
        first record of a fold (``first`` != 0) taking acc[k] = v.  AVX-512 VNNI only."""
        c = literal_int(code)
        nr = literal_int(nrec)
        if c is None or c not in _L_WEIGHT or nr is None or nr < 2 or nr % 2:
            return None
        # record strides given as literals become constant offsets (no per-record pointers
        # for LLVM to carry through the loop)
        w_rec_c, x_rec_c = literal_int(w_rec), literal_int(x_rec)
        sig = types.none(code, nrec, w, types.intp, types.intp, x, types.intp, types.intp,
                         types.intp, acc, types.intp)

        def codegen(context, builder, signature, args):
            ops = Ops(builder, True, vnni=True)
            (_, _, w_arr, w_off_v, w_rec_v, x_arr, x_off_v, x_rec_v, step_v, acc_arr,
             first_v) = args
            wty, xty, accty = signature.args[2], signature.args[5], signature.args[9]
            it = w_off_v.type

            def k(v):
                return ir.Constant(it, v)

            def rec(stride_c, stride_v, r):
                return k(stride_c * r) if stride_c is not None else builder.mul(stride_v, k(r))
            rows0 = [byte_ptr(context, builder, wty, w_arr,
                          builder.add(w_off_v, builder.mul(step_v, k(row)))) for row in range(8)]
            wb = [[builder.gep(rows0[row], [rec(w_rec_c, w_rec_v, r)]) for r in range(nr)]
                  for row in range(8)]
            x0 = byte_ptr(context, builder, xty, x_arr, x_off_v)
            xb = [builder.gep(x0, [rec(x_rec_c, x_rec_v, r)]) for r in range(nr)]
            x_at = _LL.X_QS_AT[c]
            bias = _U8_BIAS[c]
            zero16 = ir.Constant(vec(i32, 16), [0] * 16)
            vecs, labels = [], []
            for p in range(nr // 2):
                xv = builder.shuffle_vector(load(builder, xb[2 * p], x_at, vec(i8, 32)),
                                            load(builder, xb[2 * p + 1], x_at, vec(i8, 32)),
                                            ir.Constant(vec(i32, 64), list(range(64))))
                start = zero16
                if bias:
                    zx = vcall(builder, ops.dpbusd,
                                [zero16, ir.Constant(vec(i8, 64), [bias] * 64), xv])
                    start = builder.sub(zero16, zx)
                for row in range(8):
                    wv = _pair_weights(builder, c, wb[row][2 * p], wb[row][2 * p + 1])
                    vecs.append(vcall(builder, ops.dpbusd, [start, wv, xv]))
                    labels.append([(row, 2 * p + (lane >= 8)) for lane in range(16)])
            items = _reduce_labelled(builder, vecs, labels)
            f32v = vec(ir.FloatType(), 16)
            acc_ptr = builder.bitcast(
                float_array_ptr(context, builder, accty, acc_arr), vec(ir.FloatType(), 8).as_pointer())
            a = builder.load(acc_ptr, align=4)
            is_first = builder.icmp_signed("!=", first_v, ir.Constant(first_v.type, 0))
            for p in range(nr // 2):
                r0, r1 = 2 * p, 2 * p + 1
                s = _pick(builder, items, [(row, r0) for row in range(8)]
                          + [(row, r1) for row in range(8)])
                wbs = [wb[row][r0] for row in range(8)] + [wb[row][r1] for row in range(8)]
                has_m = _LL.M_AT[c] >= 0
                if gather and w_rec_c is not None:
                    dw = _gather_tile_f16(builder, rows0[0], step_v, w_rec_c, r0, _LL.D_AT[c])
                    if has_m:  # m sits in the high half of the dword at d (bytes 0..3)
                        assert _LL.M_AT[c] == _LL.D_AT[c] + 2
                        mw = _gather_tile_f16(builder, rows0[0], step_v, w_rec_c, r0,
                                              _LL.D_AT[c], high=True)
                else:
                    dw = gather_f16(builder, wbs, _LL.D_AT[c])
                    mw = gather_f16(builder, wbs, _LL.M_AT[c]) if has_m else None
                dx = _splat_pair_f16(builder, xb[r0], xb[r1], _LL.X_D_AT[c], 8)
                v = builder.fmul(dx, builder.fmul(dw, builder.sitofp(s, f32v)))
                if has_m:
                    v = builder.fadd(v, builder.fmul(
                        mw, _splat_pair_f16(builder, xb[r0], xb[r1], _LL.X_S_AT[c], 8)))
                for h in range(2):
                    vh = splat_lanes(builder, v, range(8 * h, 8 * h + 8))
                    added = builder.fadd(a, vh)
                    a = builder.select(is_first, vh, added) if p == 0 and h == 0 else added
            builder.store(a, acc_ptr, align=4)
            return context.get_dummy_value()
        return sig, codegen
    return legacy_rows_vnni


legacy_rows_vnni = _make_legacy_rows_vnni(gather=True)
legacy_rows_vnni_inserts = _make_legacy_rows_vnni(gather=False)
__all__ += ["legacy_rows_vnni", "legacy_rows_vnni_inserts"]


# ---- gemv on row-interleaved ("x8") weights, AVX-512 VNNI ----------------------------------
#
# ``numba_qk.repack`` stores 8 weight rows as one tile: first the f16 scales of every record,
# 8 per record (row order), then the quants of every record, 64-byte chunk c of record b holding
# bytes 8c .. 8c+7 of each row's qs in row order (ggml's CPU_REPACK interleave of 8 bytes).  One
# chunk is one 512-bit load whose 64-bit lane k belongs to row k; its low nibbles (or int8 +
# 128) pair with the 8 activation quants of that chunk's elements broadcast to every lane, so
# one vpdpbusd adds 4 products per i32 lane and every lane pair 2k, 2k+1 collects row k's sum of
# the record (no per-row horizontal reduction).  The u8 bias (Q4_0: q = u - 8; Q8_0: q = u -
# 128) is taken off exactly after the integer sum, S = sum(u * x) - z * sum(x), with z * sum(x)
# precomputed per activation record (``xc8``: 8 copies per record, as ``dx8`` holds f32(dx)).
# The float steps then run lane-wise on <16 x float> (lanes 0..7: rows of record b, 8..15:
# record b+1) in spec order and each row's fold adds its record values in record order.

X8_QS_BYTES = {_LL.Q4_0: 128, _LL.Q4_1: 128, _LL.Q5_0: 128, _LL.Q8_0: 256,
               X8_IQ4_NL: 128}   # qs bytes of 8 rows' record
# bytes per record of the plane between the scales and the quants: the 8 rows' f16 mins (Q4_1),
# their qh words (Q5_0: byte c of row k's qh at 8 c + k); 0: none
X8_AUX_BYTES = {_LL.Q4_0: 0, _LL.Q4_1: 16, _LL.Q5_0: 32, _LL.Q8_0: 0, X8_IQ4_NL: 0}


def _bcast_q(builder, base, offset):
    """<64 x i8>: the 8 bytes at ``offset`` of ``base`` repeated in every 64-bit lane."""
    q = load(builder, base, offset, i64)
    v = builder.insert_element(ir.Constant(vec(i64, 8), ir.Undefined), q, ir.Constant(i32, 0))
    return builder.bitcast(splat_lanes(builder, v, [0] * 8), vec(i8, 64))


def _x8_record_sums(builder, ops, code, qrec, xrec, hrec):
    """<16 x i32>: sum(u * x) of one record of 8 rows, row k in lanes 2k and 2k + 1; Q5_0's
    fifth bits from the record's qh plane ``hrec`` (byte 8 c + k: byte c of row k's qh), a
    64-bit mask per chunk of 64 quants (+ 16 where set)."""
    lay = X8_LAYOUT[code]
    x_at = _LL.X_QS_AT[lay]
    a = ir.Constant(vec(i32, 16), [0] * 16)
    v64 = vec(i8, 64)
    for ch in range(X8_QS_BYTES[code] // 64):
        w = load(builder, qrec, 64 * ch, v64)
        if code == _LL.Q8_0:   # int8 q -> u8 q + 128
            a = vcall(builder, ops.dpbusd, [a, builder.xor(w, ir.Constant(v64, [0x80] * 64)),
                                             _bcast_q(builder, xrec, x_at + 8 * ch)])
            continue
        lo = builder.and_(w, ir.Constant(v64, [0x0F] * 64))
        if HAVE_GFNI:
            fn = decl(builder, "llvm.x86.vgf2p8affineqb.512", v64, [v64, v64, i8])
            mat = builder.bitcast(ir.Constant(vec(i64, 8), [_GF_HIGH] * 8), v64)
            hi = builder.call(fn, [w, mat, ir.Constant(i8, 0)])
        else:
            w16 = builder.bitcast(w, vec(i16, 32))
            hi = builder.and_(builder.bitcast(builder.lshr(w16, ir.Constant(vec(i16, 32),
                                                                             [4] * 32)), v64),
                              ir.Constant(v64, [0x0F] * 64))
        if code == X8_IQ4_NL:
            lo, hi = _iq4_nl_lookup(builder, lo), _iq4_nl_lookup(builder, hi)
        if _LL.QH_AT[lay] >= 0:   # elements 8 ch + e (lo) and 16 + 8 ch + e (hi)
            sixteen = ir.Constant(v64, [16] * 64)
            for name, c in (("lo", ch), ("hi", 2 + ch)):
                mask = builder.bitcast(load(builder, hrec, 8 * c, i64), vec(ir.IntType(1), 64))
                if name == "lo":
                    lo = builder.select(mask, builder.or_(lo, sixteen), lo)
                else:
                    hi = builder.select(mask, builder.or_(hi, sixteen), hi)
        a = vcall(builder, ops.dpbusd, [a, lo, _bcast_q(builder, xrec, x_at + 8 * ch)])
        a = vcall(builder, ops.dpbusd, [a, hi, _bcast_q(builder, xrec, x_at + 16 + 8 * ch)])
    return a


@intrinsic
def legacy_x8_rows(typingctx, code, nrec, w, d_off, q_off, x, x_off, xc8, dx8, e_off, acc,
                   first, aux_off, sx8):
    """Fold ``nrec`` (a literal >= 1) consecutive records of one x8 tile into ``acc[0:8]``
    (float32, contiguous): the scales of the first record at byte ``d_off`` of ``w`` (16 bytes
    per record), its quants at ``q_off`` (``X8_QS_BYTES`` per record); activation records
    contiguous from byte ``x_off`` of ``x``; ``xc8`` (int32) / ``dx8`` (float32) hold z*sum(x)
    and f32(dx) of each activation record 8 times, the first record's at element ``e_off``.
    acc[k] = R32(acc[k] + v) for each record in order, the first of a fold (``first`` != 0)
    taking acc[k] = v.  The first record's aux row (``X8_AUX_BYTES`` per record) at byte
    ``aux_off``: Q4_1 adds R32(mw * sx) to each value (the 8 rows' f16 mins there, f32(sx) 8
    times per record in ``sx8``, as ``dx8``); Q5_0's fifth bits are there.  ``code``: Q4_0,
    Q4_1, Q5_0, Q8_0 or X8_IQ4_NL; AVX-512 VNNI only."""
    c = literal_int(code)
    nr = literal_int(nrec)
    if c is None or c not in X8_QS_BYTES or nr is None or nr < 1:
        return None
    sig = types.none(code, nrec, w, types.intp, types.intp, x, types.intp, xc8, dx8, types.intp,
                     acc, types.intp, types.intp, sx8)

    def codegen(context, builder, signature, args):
        ops = Ops(builder, True, vnni=True)
        (_, _, w_arr, d_off_v, q_off_v, x_arr, x_off_v, xc_arr, dx_arr, e_off_v, acc_arr,
         first_v, aux_off_v, sx_arr) = args
        lay = X8_LAYOUT[c]
        has_m = _LL.M_AT[lay] >= 0
        sa = signature.args
        dbase = byte_ptr(context, builder, sa[2], w_arr, d_off_v)
        qbase = byte_ptr(context, builder, sa[2], w_arr, q_off_v)
        xbase = byte_ptr(context, builder, sa[5], x_arr, x_off_v)
        xrec = _LL.FORMATS[_LL.CODES[_LL.activation_format(_LL.FORMATS[lay])]].block_bytes
        xc_p = builder.gep(float_array_ptr(context, builder, sa[7], xc_arr), [e_off_v])
        dx_p = builder.gep(float_array_ptr(context, builder, sa[8], dx_arr), [e_off_v])
        sx_p = builder.gep(float_array_ptr(context, builder, sa[13], sx_arr), [e_off_v])
        abase = byte_ptr(context, builder, sa[2], w_arr, aux_off_v)
        ab = X8_AUX_BYTES[c]
        qb = X8_QS_BYTES[c]
        sums = [_x8_record_sums(builder, ops, c, builder.gep(qbase, [ir.Constant(i64, qb * r)]),
                                builder.gep(xbase, [ir.Constant(i64, xrec * r)]),
                                builder.gep(abase, [ir.Constant(i64, ab * r)]))
                for r in range(nr)]
        f32 = ir.FloatType()
        acc_ptr = builder.bitcast(float_array_ptr(context, builder, sa[10], acc_arr),
                                  vec(f32, 8).as_pointer())
        a = builder.load(acc_ptr, align=4)
        is_first = builder.icmp_signed("!=", first_v, ir.Constant(first_v.type, 0))
        for r0 in range(0, nr, 2):
            n = 16 if r0 + 1 < nr else 8
            other = sums[r0 + 1] if n == 16 else ir.Constant(vec(i32, 16), ir.Undefined)
            ev = ir.Constant(vec(i32, n), list(range(0, 2 * n, 2)))
            od = ir.Constant(vec(i32, n), list(range(1, 2 * n, 2)))
            s = builder.add(builder.shuffle_vector(sums[r0], other, ev),
                            builder.shuffle_vector(sums[r0], other, od))
            vi, vf, vh = vec(i32, n), vec(f32, n), vec(ir.HalfType(), n)
            xc = builder.load(builder.bitcast(builder.gep(xc_p, [ir.Constant(i64, 8 * r0)]),
                                              vi.as_pointer()), align=4)
            s = builder.sub(s, xc)
            dw = builder.fpext(load(builder, dbase, 16 * r0, vh), vf)
            dx = builder.load(builder.bitcast(builder.gep(dx_p, [ir.Constant(i64, 8 * r0)]),
                                              vf.as_pointer()), align=4)
            v = builder.fmul(dx, builder.fmul(dw, builder.sitofp(s, vf)))
            if has_m:
                mw = builder.fpext(load(builder, abase, ab * r0, vh), vf)
                sx = builder.load(builder.bitcast(builder.gep(sx_p, [ir.Constant(i64, 8 * r0)]),
                                                  vf.as_pointer()), align=4)
                v = builder.fadd(v, builder.fmul(mw, sx))
            for h in range(n // 8):
                vh8 = splat_lanes(builder, v, range(8 * h, 8 * h + 8)) if n == 16 else v
                added = builder.fadd(a, vh8)
                a = builder.select(is_first, vh8, added) if r0 == 0 and h == 0 else added
        builder.store(a, acc_ptr, align=4)
        return context.get_dummy_value()
    return sig, codegen


__all__ += ["legacy_x8_rows", "X8_AUX_BYTES", "X8_IQ4_NL", "X8_LAYOUT"]


__all__ += ["U8_BIAS"]
U8_BIAS = _U8_BIAS


# ---- gemm by decoded records (AVX-512 VNNI): 8 weight rows x 16 activations per step ----------
#
# As the K-quants' panel gemm (simd/iq_grid.py), with the legacy formats' per-block float steps.
# Each weight record is decoded once per gemm call into LDEC_BYTES: its 32 integers w (q - 8,
# q - 16, q or the int8: |w| <= 128, int8) at byte 0, C = 128 * sum w (i32) at LDEC_C_AT, f32(d)
# at LDEC_DW_AT and f32(m) at LDEC_MW_AT (Q4_1/Q5_1).  A band of 8 rows keeps record b of row t
# at (8 b + t) * LDEC_BYTES.  The activations are laid out once per call in tiles of 16
# (LXT_BYTES per tile and record): the quants plus 128 as u8 (x ^ 0x80; byte 64 (j // 4) + 4 k
# + j % 4 holds quant j of activation k), then the 16 dx (f32) at LXT_DX_AT and the 16 sx (Q8_1)
# at LXT_SX_AT.  Per row and record, one zmm lane per activation:
#
#     a = sum of 8 vpdpbusd(x + 128 quads, the row's w quad broadcast) = sum (x_i + 128) w_i
#     S = a - C                                  exact (|a| <= 32 * 255 * 128 < 2**21)
#     v = R32(dx * R32(dw * f32(S)))  [+ R32(mw * sx), then R32 of the sum]
#
# and each lane folds its rows' record values in record order (acc starts at -0.0, the identity
# of f32 addition, so acc = v after the first record): the bits of the portable dot.

LDEC_BYTES = 48
LDEC_C_AT, LDEC_DW_AT, LDEC_MW_AT = 32, 36, 40
LXT_BYTES = 512 + 64 + 64
LXT_DX_AT, LXT_SX_AT = 512, 576


def store_decoded_ints(b, store, q):
    """Store a record's 32 integers ``q`` (<32 x i8>) at byte 0 of its decoded layout and
    ``C = 128 * sum q`` (i32) at LDEC_C_AT, the sum by ``vpsadbw`` of ``q + 128`` as u8 less
    32 * 128 (exact)."""
    v32 = vec(i8, 32)
    store(0, q)
    sad = b.call(decl(b, "llvm.x86.avx2.psad.bw", vec(i64, 4), [v32, v32]),
                 [b.xor(q, ir.Constant(v32, [-128] * 32)), ir.Constant(v32, None)])
    s = b.call(decl(b, "llvm.vector.reduce.add.v4i64", i64, [vec(i64, 4)]), [sad])
    s = b.sub(b.trunc(s, i32), ir.Constant(i32, 32 * 128))
    store(LDEC_C_AT, b.mul(s, ir.Constant(i32, 128)))


def panel_decode_intrinsic(accepts, write):
    """The intrinsic ``decode(code, w, w_off, dec, d_off)`` of the panel gemm
    (``legacy.kernels.panel_gemm_over``): ``write(builder, c, wb, store)`` decodes the record at
    the byte pointer ``wb`` (byte ``w_off`` of uint8 ``w``) through ``store(off, value)`` into
    LDEC_BYTES at byte ``d_off`` of ``dec``; ``c`` is the literal ``code``, which
    ``accepts(c)`` must allow."""
    @intrinsic
    def decode(typingctx, code, w, w_off, dec, d_off):
        c = literal_int(code)
        if (c is None or not accepts(c) or not isinstance(w, types.Array)
                or not isinstance(dec, types.Array)):
            return None
        sig = types.none(code, w, types.intp, dec, types.intp)

        def codegen(context, builder, signature, args):
            b = builder
            wb = byte_ptr(context, b, signature.args[1], args[1], args[2])
            db = byte_ptr(context, b, signature.args[3], args[3], args[4])

            def store(off, v):
                b.store(v, b.bitcast(b.gep(db, [ir.Constant(i64, off)]),
                                     v.type.as_pointer()), align=1)
            write(b, c, wb, store)
            return context.get_dummy_value()
        return sig, codegen
    return decode


def _write_legacy(b, c, wb, store):
    f32 = ir.FloatType()
    store_decoded_ints(b, store, _legacy_weights_i8(b, c, wb))
    store(LDEC_DW_AT, b.fpext(load(b, wb, _LL.D_AT[c], ir.HalfType()), f32))
    if _LL.M_AT[c] >= 0:
        store(LDEC_MW_AT, b.fpext(load(b, wb, _LL.M_AT[c], ir.HalfType()), f32))


#: Decode the legacy weight record at byte ``w_off`` of uint8 ``w`` into LDEC_BYTES at byte
#: ``d_off`` of uint8 ``dec`` (layout above); ``code`` a legacy weight format (a literal).
legacy_panel_decode = panel_decode_intrinsic(lambda c: c in _L_WEIGHT, _write_legacy)


@intrinsic
def legacy_microtile(typingctx, code, dec, d_off, xt, x_off, g, acc):
    """Fold ``g`` records of a band of 8 decoded weight rows (byte ``d_off`` of ``dec``) against
    a tile of 16 activations (byte ``x_off`` of ``xt``), records in order, into ``acc``
    (float32 [128]: row t in elements 16 t .. 16 t + 15, one per activation); layout above,
    ``code`` a legacy weight format (a literal); AVX-512 VNNI only."""
    c = literal_int(code)
    if c is None or c not in _L_WEIGHT:
        return None
    sig = types.none(code, dec, types.intp, xt, types.intp, types.intp, acc)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils
        b = builder
        f32 = ir.FloatType()
        v16, f16v = vec(i32, 16), vec(f32, 16)
        ops = Ops(b, True, vnni=True)
        _, dec_v, d_off_v, xt_v, x_off_v, g_v, acc_v = args
        d0 = byte_ptr(context, b, signature.args[1], dec_v, d_off_v)
        x0 = byte_ptr(context, b, signature.args[3], xt_v, x_off_v)
        has_m = _LL.M_AT[c] >= 0
        accs = [cgutils.alloca_once_value(b, ir.Constant(f16v, [-0.0] * 16)) for _ in range(8)]
        # an empty statement that clobbers memory after each quad step keeps the rows'
        # broadcast loads beside their vpdpbusd (as simd/iq_grid.py's microtile)
        fence = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "", "~{memory}",
                             side_effect=True)
        zero = ir.Constant(v16, None)

        def splat(p, off, ty):
            v = b.load(b.bitcast(b.gep(p, [ir.Constant(i64, off)]), ty.as_pointer()), align=1)
            z = ir.Constant(vec(ty, 1), None)
            return b.shuffle_vector(b.insert_element(z, v, ir.Constant(i32, 0)), z,
                                    ir.Constant(vec(i32, 16), [0] * 16))
        with cgutils.for_range(b, g_v) as loop:
            db = b.gep(d0, [b.mul(loop.index, ir.Constant(loop.index.type, 8 * LDEC_BYTES))])
            xb = b.gep(x0, [b.mul(loop.index, ir.Constant(loop.index.type, LXT_BYTES))])
            rows = [b.gep(db, [ir.Constant(i64, t * LDEC_BYTES)]) for t in range(8)]
            a = [zero] * 8
            for k in range(8):
                xq = load(b, xb, 64 * k, v16)
                for t in range(8):
                    a[t] = vcall(b, ops.dpbusd, [a[t], xq, splat(rows[t], 4 * k, i32)])
                b.call(fence, [])
            dx = load(b, xb, LXT_DX_AT, f16v)
            sx = load(b, xb, LXT_SX_AT, f16v) if has_m else None
            for t in range(8):
                s = b.sub(a[t], splat(rows[t], LDEC_C_AT, i32))
                v = b.fmul(dx, b.fmul(splat(rows[t], LDEC_DW_AT, f32), b.sitofp(s, f16v)))
                if has_m:
                    v = b.fadd(v, b.fmul(splat(rows[t], LDEC_MW_AT, f32), sx))
                b.store(b.fadd(b.load(accs[t]), v), accs[t])
        accp = float_array_ptr(context, b, signature.args[6], acc_v)
        for t in range(8):
            p = b.bitcast(b.gep(accp, [ir.Constant(i64, 16 * t)]), f16v.as_pointer())
            b.store(b.load(accs[t]), p, align=4)
        return context.get_dummy_value()
    return sig, codegen


__all__ += ["legacy_panel_decode", "legacy_microtile", "panel_decode_intrinsic",
            "store_decoded_ints", "LDEC_BYTES", "LXT_BYTES", "LXT_DX_AT",
            "LXT_SX_AT"]


# ---- small batches (AVX-512 VNNI): 16 weight rows in the lanes, records read in place ----------
#
# Per record step, the 16 rows' quants are loaded straight from their records (16-byte loads,
# one 128-bit quarter of a zmm per row) and transposed in registers so that lane r of vector c
# holds bytes 4c .. 4c+3 of row r's quants; nibble formats split each such vector into the low
# nibbles (elements 4c .. 4c+3) and the high ones (16 + 4c ..), Q8_0's int8 become u8 (q + 128).
# Each activation's quad of four int8 quants is the broadcast operand of vpdpbusd, so one
# instruction adds the four u8 x i8 products of 16 rows; after the record's 8 quads
#
#     S = lane - z * sum(x)        z = 8 (Q4_0), 128 (Q8_0), 0 (Q4_1): exact in int32
#
# with z * sum(x) precomputed per activation and record (``xc``: i32 z sum x, f32 dx, f32 sx),
# then the float steps lane by lane in the order of the portable dot, each lane (row) folding
# its records in order per activation.  The weights are read once per group of activations
# (no decoded copy): what the panel gemm pays to decode, small batches cannot amortize.

ROWS16_CODES = tuple(c for c in sorted(_L_WEIGHT) if _LL.QH_AT[c] < 0) + (X8_IQ4_NL,)   # Q4_0, Q4_1, Q8_0, IQ4_NL
# the row in lane L (the in-register transpose below leaves rows in this order)
ROWS16_ROW_OF_LANE = tuple(4 * (lane % 4) + lane // 4 for lane in range(16))


def _unpack(b, x, y, wide):
    """vpunpck{l,h}dq (``wide`` False) / vpunpck{l,h}qdq (True) of <16 x i32> x, y: (lo, hi)."""
    if wide:
        lo = [k for j in range(4) for k in (4 * j, 4 * j + 1, 16 + 4 * j, 17 + 4 * j)]
    else:
        lo = [k for j in range(4) for k in (4 * j, 16 + 4 * j, 4 * j + 1, 17 + 4 * j)]
    hi = [k + 2 for k in lo]
    return (b.shuffle_vector(x, y, ir.Constant(vec(i32, 16), lo)),
            b.shuffle_vector(x, y, ir.Constant(vec(i32, 16), hi)))


def _rows16_quant_vectors(b, code, rows):
    """[(u8 weight vector <16 x i32>, activation quad index)] of one record step of 16 rows
    (i8* to each row's record): lane L holds row ``ROWS16_ROW_OF_LANE[L]``."""
    v4, v16 = vec(i32, 4), vec(i32, 16)
    lay = X8_LAYOUT[code]
    qs_at = _LL.QS_AT[lay]
    signed = _LL.FORMATS[lay].field("qs").signed
    pairs = []
    for half in range(2 if signed else 1):
        z = []
        for k in range(4):   # rows 4k .. 4k+3, row 4k + j in 128-bit quarter j
            q = [load(b, rows[4 * k + j], qs_at + 16 * half, v4) for j in range(4)]
            lo = b.shuffle_vector(q[0], q[1], ir.Constant(vec(i32, 8), list(range(8))))
            hi = b.shuffle_vector(q[2], q[3], ir.Constant(vec(i32, 8), list(range(8))))
            z.append(b.shuffle_vector(lo, hi, ir.Constant(vec(i32, 16), list(range(16)))))
        # a 4 x 4 dword transpose within each quarter j: lane 4j + k of vector c = dword c of
        # row 4k + j
        t0, t1 = _unpack(b, z[0], z[1], False)
        t2, t3 = _unpack(b, z[2], z[3], False)
        vs = [*_unpack(b, t0, t2, True), *_unpack(b, t1, t3, True)]
        for c, v in enumerate(vs):
            if signed:
                pairs.append((b.xor(v, ir.Constant(v16, [-0x7F7F7F80] * 16)), 4 * half + c))
            else:
                m = ir.Constant(v16, [0x0F0F0F0F] * 16)
                lo, hi = b.and_(v, m), b.and_(b.lshr(v, ir.Constant(v16, [4] * 16)), m)
                if code == X8_IQ4_NL:
                    lo, hi = (b.bitcast(_iq4_nl_lookup(b, b.bitcast(n, vec(i8, 64))), v16)
                              for n in (lo, hi))
                pairs.append((lo, c))
                pairs.append((hi, 4 + c))
    return pairs


def _gather_rows16_f16(b, base, idx, offset):
    """<16 x float>: the f16 at byte ``offset`` of the record at ``base + idx[L]`` in lane L
    (one vpgatherdd of the dwords there, the low halves widened exactly)."""
    v16 = vec(i32, 16)
    fn = decl(b, "llvm.x86.avx512.mask.gather.dpi.512", v16,
              [v16, i8.as_pointer(), v16, vec(ir.IntType(1), 16), i32])
    g = b.call(fn, [ir.Constant(v16, None), b.gep(base, [ir.Constant(i64, offset)]), idx,
                    ir.Constant(vec(ir.IntType(1), 16), [1] * 16), ir.Constant(i32, 1)])
    return b.fpext(b.bitcast(b.trunc(g, vec(i16, 16)), vec(ir.HalfType(), 16)),
                   vec(ir.FloatType(), 16))


@intrinsic
def legacy_rows16(typingctx, code, na, w, w_off, ws0, ws1, x, x_off, xs0, xs1, xc, xc_off,
                  xcs0, g, acc, pf_off, pf_lines):
    """Fold ``g`` records of 16 weight rows (row r's record b at byte ``w_off + r * ws0 + b *
    ws1`` of uint8 ``w``) against ``na`` (a literal) activations (activation a's record b at
    byte ``x_off + a * xs0 + b * xs1`` of uint8 ``x``; its (i32 z sum x, f32 dx, f32 sx) at
    int32 element ``xc_off + a * xcs0 + 4 b`` of ``xc``), records in order, into ``acc``
    (float32 [16 na]: activation a's rows in lanes 16 a + L, row ``ROWS16_ROW_OF_LANE[L]``);
    ``code`` in ``ROWS16_CODES`` (a literal); 16 |ws0| < 2**31; AVX-512 VNNI only.  Record
    step b also prefetches ``pf_lines`` 64-byte lines of ``w`` from byte ``pf_off + 64 b
    pf_lines`` (the caller's share of the rows ahead: spread over the steps, they arrive in
    time)."""
    c = literal_int(code)
    n = literal_int(na)
    if c is None or c not in ROWS16_CODES or n is None or not 1 <= n <= 8:
        return None
    ip = types.intp
    sig = types.none(code, na, w, ip, ip, ip, x, ip, ip, ip, xc, ip, ip, ip, acc, ip, ip)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils
        b = builder
        f32 = ir.FloatType()
        v16, f16v = vec(i32, 16), vec(f32, 16)
        ops = Ops(b, True, vnni=True)
        (_, _, w_v, w_off_v, ws0_v, ws1_v, x_v, x_off_v, xs0_v, xs1_v, xc_v, xc_off_v,
         xcs0_v, g_v, acc_v, pf_off_v, pf_lines_v) = args
        sa = signature.args
        w0 = byte_ptr(context, b, sa[2], w_v, w_off_v)
        x0 = byte_ptr(context, b, sa[6], x_v, x_off_v)
        xcp = b.gep(float_array_ptr(context, b, sa[10], xc_v), [xc_off_v])
        lay = X8_LAYOUT[c]
        has_m = _LL.M_AT[lay] >= 0
        x_at = _LL.X_QS_AT[lay]
        accs = [cgutils.alloca_once_value(b, ir.Constant(f16v, [-0.0] * 16)) for _ in range(n)]
        zero = ir.Constant(v16, None)

        def splat(v):
            z = ir.Constant(vec(v.type, 1), None)
            return b.shuffle_vector(b.insert_element(z, v, ir.Constant(i32, 0)), z,
                                    ir.Constant(vec(i32, 16), [0] * 16))

        # i32 byte offsets of the rows' records from row 0's, lane by lane (the caller bounds
        # 16 |ws0| below 2**31)
        st = b.trunc(ws0_v, i32)
        idx = b.mul(splat(st), ir.Constant(v16, list(ROWS16_ROW_OF_LANE)))
        pf0 = byte_ptr(context, b, sa[2], w_v, pf_off_v)
        pf_fn = decl(b, "llvm.prefetch.p0i8", ir.VoidType(), [i8.as_pointer(), i32, i32, i32])
        with cgutils.for_range(b, g_v) as loop:
            blk = loop.index
            pfb = b.gep(pf0, [b.mul(b.mul(blk, pf_lines_v), ir.Constant(blk.type, 64))])
            with cgutils.for_range(b, pf_lines_v) as pl:      # prefetcht1 (simd/base.py)
                b.call(pf_fn, [b.gep(pfb, [b.mul(pl.index, ir.Constant(pl.index.type, 64))]),
                               ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
            wb = b.gep(w0, [b.mul(blk, ws1_v)])
            rows = [b.gep(wb, [b.mul(ws0_v, ir.Constant(ws0_v.type, r))]) for r in range(16)]
            pairs = _rows16_quant_vectors(b, c, rows)
            dw = _gather_rows16_f16(b, wb, idx, _LL.D_AT[lay])
            mw = _gather_rows16_f16(b, wb, idx, _LL.M_AT[lay]) if has_m else None
            for a in range(n):
                xb = b.gep(x0, [b.add(b.mul(xs0_v, ir.Constant(xs0_v.type, a)),
                                      b.mul(blk, xs1_v))])
                s = zero
                for wv, quad in pairs:
                    xq = splat(load(b, xb, x_at + 4 * quad, i32))
                    s = vcall(b, ops.dpbusd, [s, wv, xq])
                cp = b.gep(xcp, [b.add(b.mul(xcs0_v, ir.Constant(xcs0_v.type, a)),
                                       b.mul(blk, ir.Constant(blk.type, 4)))])
                corr = b.load(b.bitcast(cp, i32.as_pointer()), align=4)
                dx = b.load(b.gep(cp, [ir.Constant(i64, 1)]), align=4)
                v = b.fmul(splat(dx), b.fmul(dw, b.sitofp(b.sub(s, splat(corr)), f16v)))
                if has_m:
                    sx = b.load(b.gep(cp, [ir.Constant(i64, 2)]), align=4)
                    v = b.fadd(v, b.fmul(mw, splat(sx)))
                b.store(b.fadd(b.load(accs[a]), v), accs[a])
        accp = float_array_ptr(context, b, sa[14], acc_v)
        for a in range(n):
            p = b.bitcast(b.gep(accp, [ir.Constant(i64, 16 * a)]), f16v.as_pointer())
            b.store(b.load(accs[a]), p, align=4)
        return context.get_dummy_value()
    return sig, codegen


__all__ += ["legacy_rows16", "ROWS16_CODES", "ROWS16_ROW_OF_LANE"]
