"""Explicit-SIMD decoders of the other K-quants' dots against Q8_K (LLVM IR through numba
intrinsics, with the plumbing of ``_simd.py``): Q2_K, Q3_K, Q5_K, Q6_K.

Integer work (exact in any order, so the vector organisation gives the integers of the readable
loops ``record_sums_<t>_q8_k``), per record pair, in units of 32 elements in element order::

    u      = the record's quants as u8 (Q6_K: q + 32 in 0..63; Q3_K: q + 4 in 0..7 -- the hmask
             bit as bit 2; Q5_K: 0..31; Q2_K: 0..3), decoded with byte masks and shifts
    p      = pmaddubsw(u, xq)                    i16 lane = u0*x0 + u1*x1: |.| <= 2*63*128
    p     -= pmaddubsw(splat(off), xq)           Q6_K off = 32, Q3_K off = 4: lane = sum (u-off)*x,
                                                 |.| <= 8192; the xq-only term is computed from
                                                 the quants (never the stored bsum, DESIGN §7)
                                                 and once per activation record in a tile
    acc   += pmaddwd(p, sc16)                    sc16: each i16 lane's sub-block scale (signed);
                                                 vpdpwssd (AVX-512 VNNI) does both in one step
    S      = reduce_add(acc)                     |S| < 2**31 (bounds in each module's docstring)
    T      = reduce_add(pmaddwd(bsum, mins16))   Q2_K, Q5_K: the stored int16 bsum, as DESIGN §7

Q2_K with AVX-512 VBMI + VNNI instead: the products q * sc (u8, <= 45) come from a 64-byte
table tt[4j + q] = q * sc_j (vpermb), and one vpdpbusd per 64 elements adds four u8 x i8
products per i32 lane (exact), replacing pmaddubsw + pmaddwd.

Q5_K and Q6_K with AVX-512 VNNI + GFNI (``busd_weights``): the u8 quants themselves go through
vpdpbusd (Q6_K's lanes start at -sum(32 * xq), computed once per activation record per tile);
every i32 lane then holds four products of one sub-block (|.| <= 16,384 for Q6_K, 15,872 for
Q5_K), so two units pack exactly to i16 (vpackssdw, no saturation possible) and one vpdpwssd
applies the scales to both: 1.5 multiplies per 64 elements instead of 2, half the scale
splats.  Their high bits come from [qh | qh] through one vgf2p8affineqb per unit (a per-qword
bit matrix moves the unit's bit(s) to bit 4 (5) and clears the rest).  (Scaling i32 lanes by
vpmulld instead would cost more than the pack.)

(i16 lane sums of the subtraction may wrap only if the true value does not fit; it always fits,
and i32 adds are modular, so the final S is exact.)  The float steps are the lane-wise IEEE
operations of ``_simd.record_values`` / ``_s_values`` (one instruction per rounding, no fast-math),
in DESIGN §7's order, so every result equals the portable definition bit for bit.

Wide (AVX-512BW) variants decode 64-lane units straight from 64-byte loads (each format's
``wide_weights``: two 32-element groups whose bits sit in the same bytes, e.g. Q2_K's groups
(0, g) and (1, g)); the activation side gathers the matching two element ranges once per tile.  Tiles: 8 weight
records against one activation record (gemv) or one weight record against 8 activation records
(gemm), the shared record decoded once, the 8 values folded lane by lane (``_simd.fold_into``).

The record's bytes must be contiguous (unit stride along the byte axis); the callers check it
and use the portable loops otherwise.
"""

from llvmlite import ir

from numba_qk.formats import quant
from numba_qk.kernels.simd.base import FEATURES, HAVE_AVX512, HAVE_GFNI, HAVE_VNNI, Ops, decl, gather_f16, gather_f32, i8, i16, i32, i64, load, record_intrinsic, reduce_many, splat_lanes, vec, tile_intrinsic
from numba_qk.kernels.simd.q4_k import record_values, unpack_scales
from numba_qk.kernels.simd.iq_grid import BIAS, DEC_C_AT, DEC_DC_AT, DEC_DMIN_AT, DEC_M_AT, DEC_SC_AT, decode_intrinsic, store_at

_A_DS_AT = quant.q8_k.field("ds").start
_A_Q_AT = quant.q8_k.field("q").start
_A_BSUM_AT = quant.q8_k.field("bsum").start
# Q5_K packs sc/m exactly as Q4_K (spec 000), at the same offset: unpack_scales reads both.
assert quant.q5_k.field("sc").start == quant.q4_k.field("sc").start

_V32 = vec(i8, 32)


def _c8(value, n=32):
    return ir.Constant(vec(i8, n), [value] * n)


def _shl(b, v, n):
    return b.shl(v, _c8(n, v.type.count)) if n else v


def _shr(b, v, n):
    return b.lshr(v, _c8(n, v.type.count)) if n else v


def _bit_to(b, v, src, dst, mask):
    """(v >> src) << dst, masked to bit ``dst`` (one shift and one and)."""
    t = _shl(b, v, dst - src) if dst >= src else _shr(b, v, src - dst)
    return b.and_(t, _c8(mask, v.type.count))


def _pairs(b, sc16, j):
    """<16 x i16>: lanes 0..7 sc16[j], lanes 8..15 sc16[j + 1] (pmaddubsw lanes of 2x16 elements)."""
    return splat_lanes(b, sc16, [j] * 8 + [j + 1] * 8)


def _quad(b, sc16, g):
    """<32 x i16> for the 64-lane unit of groups (0, g) and (1, g): sub-blocks 2g, 2g + 1,
    8 + 2g, 9 + 2g, each over 8 pmaddubsw lanes."""
    return splat_lanes(b, sc16, [j for j in (2 * g, 2 * g + 1, 8 + 2 * g, 9 + 2 * g)
                                  for _ in range(8)])


def _cat(b, u, v):
    n = u.type.count
    return b.shuffle_vector(u, v, ir.Constant(vec(i32, 2 * n), list(range(2 * n))))


class _Layout:
    """Base of the per-format classes below: ``name``, ``offset`` (``q = u - offset``), ``has_t``
    (a min term ``T``: the format has ``dmin``) and the byte offsets of the fields named in
    ``fields`` (class attribute -> field), all read from the format's schema."""

    def __init_subclass__(cls, *, fmt, offset, fields, **kwargs):
        super().__init_subclass__(**kwargs)
        names = {f.name for f in fmt.fields}
        cls.name, cls.offset, cls.has_t = fmt.name.lower(), offset, "dmin" in names
        for attr, field in fields.items():
            setattr(cls, attr, fmt.field(field).start)


class _Q6(_Layout, fmt=quant.q6_k, offset=32, fields=dict(D="d", QL="ql", QH="qh", SC="sc")):
    """Q6_K: u = ql nibble | qh bits << 4 (0..63), q = u - 32, int8 scales per 16 elements."""

    @classmethod
    def weights(cls, b, wb):
        sc16 = b.sext(load(b, wb, cls.SC, vec(i8, 16)), vec(i16, 16))
        units = []
        for c in range(2):
            qh = load(b, wb, cls.QH + 32 * c, _V32)
            for g in range(4):
                ql = load(b, wb, cls.QL + 64 * c + 32 * (g & 1), _V32)
                nib = b.and_(ql, _c8(0x0F)) if g < 2 else _shr(b, ql, 4)
                high = _bit_to(b, qh, 2 * g, 4, 0x30)         # bits 2g, 2g+1 -> 4, 5
                units.append((b.or_(nib, high), _pairs(b, sc16, 8 * c + 2 * g)))
        return units, None

    # 64-lane units: per chunk c the 64 ql bytes' low nibbles (elements 128c + [0, 64)), then
    # their high nibbles (128c + [64, 128)); qh as [qh_c | qh_c >> 2] puts the second group's
    # high bits where the first group's are.
    XR_WIDE = [(0, 32), (64, 96), (128, 160), (192, 224)]

    @classmethod
    def wide_weights(cls, b, wb):
        sc16 = b.sext(load(b, wb, cls.SC, vec(i8, 16)), vec(i16, 16))
        units = []
        for c in range(2):
            ql = load(b, wb, cls.QL + 64 * c, vec(i8, 64))
            qh = load(b, wb, cls.QH + 32 * c, _V32)
            qhh = _cat(b, qh, _shr(b, qh, 2))
            units.append((b.or_(b.and_(ql, _c8(0x0F, 64)), _bit_to(b, qhh, 0, 4, 0x30)),
                          splat_lanes(b, sc16, [8 * c + k // 8 for k in range(32)])))
            units.append((b.or_(_shr(b, ql, 4), b.and_(qhh, _c8(0x30, 64))),
                          splat_lanes(b, sc16, [8 * c + 4 + k // 8 for k in range(32)])))
        return units, None

    @classmethod
    def busd_weights(cls, b, wb):
        """With AVX-512 VNNI + GFNI (as ``_Q5.busd_weights``): the units of ``wide_weights``
        as u8 (q + 32 <= 63, so a vpdpbusd lane |sum (u - 32) * xq| <= 4 * 32 * 128 and even
        sum u * xq <= 4 * 63 * 128 = 32,256 fit i16); each 128-bit lane m of unit (c, n) is
        the 16 elements of scale 8c + 4n + m, so the packed pair's i16 lanes 8m + r take
        scale 8c + m (r < 4) or 8c + 4 + m.  High bits: qh_c loaded as [qh_c | qh_c]; one
        vgf2p8affineqb per unit moves bits 0, 1 (lanes 0-31; 2, 3 in lanes 32-63) or 4, 5
        (6, 7) to bits 4, 5."""
        sc16 = b.sext(load(b, wb, cls.SC, vec(i8, 16)), vec(i16, 16))
        units, scales = [], []
        for c in range(2):
            ql = load(b, wb, cls.QL + 64 * c, vec(i8, 64))
            qh = load(b, wb, cls.QH + 32 * c, _V32)
            qq = _cat(b, qh, qh)
            units.append(b.or_(b.and_(ql, _c8(0x0F, 64)),
                               _gf_bits(b, qq, [{0: 4, 1: 5}] * 4 + [{2: 4, 3: 5}] * 4)))
            units.append(b.or_(_shr(b, ql, 4),
                               _gf_bits(b, qq, [{4: 4, 5: 5}] * 4 + [{6: 4, 7: 5}] * 4)))
            scales.append(splat_lanes(b, sc16, [8 * c + 4 * (r >= 4) + m
                                                 for m in range(4) for r in range(8)]))
        return (units, scales), None


class _Q5(_Layout, fmt=quant.q5_k, offset=0, fields=dict(D="d", DMIN="dmin", QL="ql", QH="qh")):
    """Q5_K: u = ql nibble | qh bit << 4 (0..31), 6-bit scales per 32 elements, T from mins."""

    @classmethod
    def weights(cls, b, wb):
        sc8, m8 = unpack_scales(b, wb)                    # <8 x i16> each
        qh = load(b, wb, cls.QH, _V32)
        units = []
        for p in range(4):
            ql = load(b, wb, cls.QL + 32 * p, _V32)
            for half in range(2):
                k = 2 * p + half
                nib = _shr(b, ql, 4) if half else b.and_(ql, _c8(0x0F))
                units.append((b.or_(nib, _bit_to(b, qh, k, 4, 0x10)),
                              splat_lanes(b, sc8, [k] * 16)))
        return units, splat_lanes(b, m8, [k // 2 for k in range(16)])

    # 64-lane units: 64 ql bytes (chunks p = 2h, 2h + 1) give units 4h + n and 4h + 2 + n
    # (n = 0: low nibbles, 1: high); qh as [qh | qh >> 2] aligns the second unit's bit.
    XR_WIDE = [(32 * k, 32 * (k + 2)) for k in (0, 1, 4, 5)]

    @classmethod
    def wide_nibbles(cls, b, wb):
        """``[(k, nibbles)]`` of the four 64-lane units: ``k = 4h + n`` for the 64 ql bytes of
        chunk h (two 32-element chunks p = 2h, 2h + 1), their low (n = 0) or high (n = 1)
        nibbles."""
        out = []
        for h in range(2):
            ql = load(b, wb, cls.QL + 64 * h, vec(i8, 64))
            for n in range(2):
                out.append((4 * h + n, _shr(b, ql, 4) if n else b.and_(ql, _c8(0x0F, 64))))
        return out

    @classmethod
    def wide_weights(cls, b, wb):
        sc8, m8 = unpack_scales(b, wb)
        qh = load(b, wb, cls.QH, _V32)
        qhh = _cat(b, qh, _shr(b, qh, 2))
        units = [(b.or_(nib, _bit_to(b, qhh, k, 4, 0x10)),
                  splat_lanes(b, sc8, [k] * 16 + [k + 2] * 16))
                 for k, nib in cls.wide_nibbles(b, wb)]
        return units, splat_lanes(b, m8, [k // 2 for k in range(16)])

    @classmethod
    def busd_weights(cls, b, wb):
        """With AVX-512 VNNI + GFNI: the same four 64-lane units as ``wide_weights`` as plain
        u8 quants for ``vpdpbusd`` (each i32 lane: four q * xq of one sub-block, |.| <= 4 * 31
        * 128 = 15,872, so a pair of units packs to i16 exactly with ``vpackssdw``), and per
        unit pair (h, 0), (h, 1) the <32 x i16> scales of the packed lanes: within 128-bit
        lane m, i16 lanes 0-3 come from unit (h, 0) (sub-block 4h, or 4h + 2 for m >= 2),
        lanes 4-7 from unit (h, 1) (4h + 1, or 4h + 3).  The 5th bit: qh is loaded once as
        [qh | qh] and one ``vgf2p8affineqb`` per unit moves bit k (lanes 0-31; bit k + 2 in
        lanes 32-63: the matrix is per qword) to bit 4 and clears the rest, so the unit is
        ``nibble | that`` (one vpternlog with the low-nibble mask)."""
        sc8, m8 = unpack_scales(b, wb)
        qh = load(b, wb, cls.QH, _V32)
        qq = _cat(b, qh, qh)
        units = [b.or_(nib, _gf_bits(b, qq, [{k: 4}] * 4 + [{k + 2: 4}] * 4))
                 for k, nib in cls.wide_nibbles(b, wb)]
        scales = [splat_lanes(b, sc8, [4 * h + (r >= 4) + (2 if m >= 2 else 0)
                                        for m in range(4) for r in range(8)])
                  for h in range(2)]
        return (units, scales), splat_lanes(b, m8, [k // 2 for k in range(16)])


def _gf_bits(b, v, moves):
    """<64 x i8>: in each byte of qword j of ``v``, bit ``src`` moved to bit ``dst`` for each
    ``src: dst`` of ``moves[j]``, every other bit 0 -- one ``vgf2p8affineqb`` (result bit i =
    parity(matrix byte 7 - i & x), so the matrix qword holds 1 << src in byte 7 - dst)."""
    gf = decl(b, "llvm.x86.vgf2p8affineqb.512", vec(i8, 64),
               [vec(i8, 64), vec(i8, 64), i8])
    mat = []
    for mv in moves:
        q = [0] * 8
        for src, dst in mv.items():
            q[7 - dst] |= 1 << src
        mat += q
    return b.call(gf, [v, ir.Constant(vec(i8, 64), mat), ir.Constant(i8, 0)])


class _Q3(_Layout, fmt=quant.q3_k, offset=4, fields=dict(D="d", HM="hmask", QL="ql", SC="sc")):
    """Q3_K: u = low 2 bits | hmask bit << 2 (0..7), q = u - 4, 6-bit scales - 32 per 16."""

    @classmethod
    def scales(cls, b, wb):
        """<16 x i16>: sc_j - 32.  With the 12 scale bytes as words a0, a1, a2 (4 scales per
        word): low nibbles from a0, a1 (j < 8) and a0 >> 4, a1 >> 4 (j >= 8); the top 2 bits
        from byte j % 4 of a2, bits 2 * (j // 4)."""
        a0, a1, a2 = (load(b, wb, cls.SC + 4 * k, i32) for k in range(3))
        k2, k1 = ir.Constant(i32, 0x0F0F0F0F), ir.Constant(i32, 0x03030303)

        def sh(v, n):
            return b.lshr(v, ir.Constant(i32, n)) if n else v

        words = []
        for k, (lo, s) in enumerate(((a0, 0), (a1, 0), (a0, 4), (a1, 4))):
            hi = b.shl(b.and_(sh(a2, 2 * k), k1), ir.Constant(i32, 4))
            words.append(b.or_(b.and_(sh(lo, s), k2), hi))
        v = ir.Constant(vec(i32, 4), None)
        for k, wd in enumerate(words):
            v = b.insert_element(v, wd, ir.Constant(i32, k))
        sc = b.zext(b.bitcast(v, vec(i8, 16)), vec(i16, 16))
        return b.sub(sc, ir.Constant(vec(i16, 16), [32] * 16))

    @classmethod
    def weights(cls, b, wb):
        sc16 = cls.scales(b, wb)
        hm = load(b, wb, cls.HM, _V32)
        units = []
        for c in range(2):
            ql = load(b, wb, cls.QL + 32 * c, _V32)
            for g in range(4):
                low = b.and_(_shr(b, ql, 2 * g), _c8(3))
                u = b.or_(low, _bit_to(b, hm, 4 * c + g, 2, 0x04))
                units.append((u, _pairs(b, sc16, 8 * c + 2 * g)))
        return units, None

    # 64-lane units: the 64 ql bytes (chunks c = 0, 1) shifted by 2g give groups (0, g) and
    # (1, g); hmask as [hm | hm >> 4] aligns chunk 1's bits (4 + g) with chunk 0's (g).
    XR_WIDE = [(32 * g, 128 + 32 * g) for g in range(4)]

    @classmethod
    def wide_weights(cls, b, wb):
        sc16 = cls.scales(b, wb)
        hm = load(b, wb, cls.HM, _V32)
        hmm = _cat(b, hm, _shr(b, hm, 4))
        ql = load(b, wb, cls.QL, vec(i8, 64))
        units = []
        for g in range(4):
            u = b.or_(b.and_(_shr(b, ql, 2 * g), _c8(3, 64)), _bit_to(b, hmm, g, 2, 0x04))
            units.append((u, _quad(b, sc16, g)))
        return units, None


class _Q2(_Layout, fmt=quant.q2_k, offset=0, fields=dict(D="d", DMIN="dmin", SC="sc", Q="q")):
    """Q2_K: u = 2-bit quant (0..3), scale = low nibble, min = high nibble of byte j."""

    @classmethod
    def weights(cls, b, wb):
        scm = load(b, wb, cls.SC, vec(i8, 16))
        sc16 = b.zext(b.and_(scm, _c8(0x0F, 16)), vec(i16, 16))
        units = []
        for c in range(2):
            qs = load(b, wb, cls.Q + 32 * c, _V32)
            for g in range(4):
                units.append((b.and_(_shr(b, qs, 2 * g), _c8(3)), _pairs(b, sc16, 8 * c + 2 * g)))
        return units, b.zext(_shr(b, scm, 4), vec(i16, 16))

    # 64-lane units: the 64 quant bytes (chunks c = 0, 1) shifted by 2g: groups (0, g), (1, g).
    XR_WIDE = [(32 * g, 128 + 32 * g) for g in range(4)]

    @classmethod
    def wide_weights(cls, b, wb):
        scm = load(b, wb, cls.SC, vec(i8, 16))
        sc16 = b.zext(b.and_(scm, _c8(0x0F, 16)), vec(i16, 16))
        qs = load(b, wb, cls.Q, vec(i8, 64))
        units = [(b.and_(_shr(b, qs, 2 * g), _c8(3, 64)), _quad(b, sc16, g)) for g in range(4)]
        return units, b.zext(_shr(b, scm, 4), vec(i16, 16))

    @classmethod
    def wide_products(cls, b, wb):
        """With AVX-512 VBMI + VNNI: the u8 products q * sc (<= 3 * 15) of the four 64-lane
        units, looked up in a 64-byte table tt[4j + q] = q * sc_j (vpermb), for vpdpbusd
        against the activation quants (lane sums of four u8 x i8 products: exact)."""
        scm = load(b, wb, cls.SC, vec(i8, 16))
        s4 = splat_lanes(b, b.and_(scm, _c8(0x0F, 16)), [k // 4 for k in range(64)])
        odd = ir.Constant(vec(i8, 64), [0xFF if k % 4 in (1, 3) else 0 for k in range(64)])
        two = ir.Constant(vec(i8, 64), [0xFF if k % 4 in (2, 3) else 0 for k in range(64)])
        tt = b.add(b.and_(s4, odd), b.and_(b.add(s4, s4), two))   # q * sc, q = k % 4
        perm = decl(b, "llvm.x86.avx512.permvar.qi.512", vec(i8, 64),
                     [vec(i8, 64), vec(i8, 64)])
        qs = load(b, wb, cls.Q, vec(i8, 64))
        units = []
        for g in range(4):
            js = (2 * g, 2 * g + 1, 8 + 2 * g, 9 + 2 * g)
            idx = b.or_(b.and_(_shr(b, qs, 2 * g), _c8(3, 64)),
                        ir.Constant(vec(i8, 64), [4 * js[k // 16] for k in range(64)]))
            units.append(b.call(perm, [tt, idx]))
        return units, b.zext(_shr(b, scm, 4), vec(i16, 16))


KQUANTS = {k.name: k for k in (_Q6, _Q5, _Q3, _Q2)}


def _x_side(b, ops, kq, xb):
    """Activation vectors of one Q8_K record matching the weight units (and their offset
    terms), built once per tile: 32-element units in element order, or the two element ranges
    ``kq.XR_WIDE`` of each 64-lane unit."""
    xs, offs = [], []
    if ops.wide:
        for r0, r1 in kq.XR_WIDE:
            if r1 == r0 + 32:
                xv = load(b, xb, _A_Q_AT + r0, vec(i8, 64))
            else:
                xv = _cat(b, load(b, xb, _A_Q_AT + r0, _V32), load(b, xb, _A_Q_AT + r1, _V32))
            xs.append(xv)
    else:
        xs = [load(b, xb, _A_Q_AT + 32 * v, _V32) for v in range(8)]
    if kq.offset and _busd(ops, kq):  # i32 lanes -sum(off * xq): each vpdpbusd's start value
        zero = ir.Constant(vec(i32, 16), None)
        offs = [b.sub(zero, b.call(ops.dpbusd, [zero, _c8(kq.offset, 64), xv])) for xv in xs]
    elif kq.offset:
        offs = [b.call(ops.maddubs, [_c8(kq.offset, ops.lanes), xv]) for xv in xs]
    return xs, offs


# Q2_K's table-lookup products need AVX-512 VBMI (vpermb) besides VNNI.
HAVE_VBMI = "avx512vbmi" in FEATURES


def _products(ops, kq):
    return ops.wide and ops.dpbusd is not None and HAVE_VBMI and hasattr(kq, "wide_products")


# Q5_K's vpdpbusd path moves its 5th bit with GFNI (vgf2p8affineqb): HAVE_GFNI from _simd.


def _busd(ops, kq):
    return ops.wide and ops.dpbusd is not None and HAVE_GFNI and hasattr(kq, "busd_weights")


def _decode(b, ops, kq, wb):
    if _products(ops, kq):
        return kq.wide_products(b, wb)
    if _busd(ops, kq):
        return kq.busd_weights(b, wb)
    return kq.wide_weights(b, wb) if ops.wide else kq.weights(b, wb)


def _pair(b, ops, kq, wdec, xdec, xb):
    """Unreduced S (and T) vectors of one decoded weight record against one Q8_K record."""
    units, mins = wdec
    xs, offs = xdec
    acc = ir.Constant(ops.maddwd.function_type.return_type, None)
    if _products(ops, kq):  # units are u8 products q * sc: one vpdpbusd each
        for v, w8 in enumerate(units):
            acc = b.call(ops.dpbusd, [acc, w8, xs[v]])
        units = []
    elif _busd(ops, kq):  # u8 quants: vpdpbusd per unit, pairs packed to i16, then scaled
        quants, scales = units
        pack = decl(b, "llvm.x86.avx512.packssdw.512", vec(i16, 32),
                     [vec(i32, 16), vec(i32, 16)])
        zero = ir.Constant(vec(i32, 16), None)
        for j, scv in enumerate(scales):  # Q6_K: each lane starts at -sum(32 * xq)
            d = [b.call(ops.dpbusd, [offs[v] if kq.offset else zero, quants[v], xs[v]])
                 for v in (2 * j, 2 * j + 1)]
            acc = b.call(ops.dpwssd, [acc, b.call(pack, d), scv])
        units = []
    for v, (u, sc) in enumerate(units):
        p = b.call(ops.maddubs, [u, xs[v]])
        if kq.offset:
            p = b.sub(p, offs[v])
        if ops.dpwssd is not None:
            acc = b.call(ops.dpwssd, [acc, p, sc])
        else:
            acc = b.add(acc, b.call(ops.maddwd, [p, sc]))
    t = None
    if kq.has_t:
        t = b.call(ops.maddwd8, [load(b, xb, _A_BSUM_AT, vec(i16, 16)), mins])
    return acc, t


def _gen_sums(b, ops, kq, wbases, xbases):
    """(S, T or None) as <n x i32> for the record pairs zip(wbases, xbases); a record listed
    several times (the same IR value) is decoded once."""
    wdec, xdec = {}, {}
    s_vecs, t_vecs = [], []
    for wb, xb in zip(wbases, xbases):
        if id(wb) not in wdec:
            wdec[id(wb)] = _decode(b, ops, kq, wb)
        if id(xb) not in xdec:
            xdec[id(xb)] = _x_side(b, ops, kq, xb)
        s, t = _pair(b, ops, kq, wdec[id(wb)], xdec[id(xb)], xb)
        s_vecs.append(s)
        t_vecs.append(t)
    return reduce_many(b, s_vecs), (reduce_many(b, t_vecs) if kq.has_t else None)


def _values(b, ops, kq, wbs, xbs):
    """<n x float> record values, DESIGN §7's float steps lane by lane."""
    s, t = _gen_sums(b, ops, kq, wbs, xbs)
    d = gather_f16(b, wbs, kq.D)
    ds = gather_f32(b, xbs, _A_DS_AT)
    if kq.has_t:
        return record_values(b, s, t, d, gather_f16(b, wbs, kq.DMIN), ds)
    f32v = vec(ir.FloatType(), len(wbs))
    return b.fmul(ds, b.fmul(d, b.sitofp(s, f32v)))     # v = R32(ds * R32(d * f32(S)))


def _make_record(kq, wide, vnni, value):
    """Intrinsic ``f(w, w_off, x, x_off)`` of the weight record at byte ``w_off`` of uint8 array
    ``w`` and the Q8_K record at byte ``x_off`` of ``x`` (both records' bytes contiguous): S
    (int32), or with ``value`` the record value v (float32, DESIGN §7)."""
    def compute(b, wb, xb):
        ops = Ops(b, wide, vnni)
        if value:
            return _values(b, ops, kq, [wb], [xb])
        return _gen_sums(b, ops, kq, [wb], [xb])[0]
    return record_intrinsic(value, compute)


def _make_accumulate(kq, wide, vnni, over_rows, n=8):
    """Intrinsic folding ``n`` record values into ``acc.flat[acc_at : acc_at + n]`` (float32,
    contiguous): over_rows (gemv) pairs weight records ``w_off + k*step`` with the activation
    record at ``x_off``; otherwise (gemm) the weight record at ``w_off`` with activation records
    ``x_off + k*step``.  ``first`` != 0 starts each lane's fold (acc = v), else acc = R32(acc + v)."""
    def make_values(builder):
        ops = Ops(builder, wide, vnni)
        return lambda wbs, xbs: _values(builder, ops, kq, wbs, xbs)
    return tile_intrinsic(over_rows, n, make_values)


# Variants: {t}_q8_k_s_{avx2, avx2vnni, avx512, avx512vnni} (the tests check each against the
# loops); the widest available ones are used by the kernels.
VARIANTS = {"avx2": (False, False), "avx2vnni": (False, True),
            "avx512": (True, False), "avx512vnni": (True, True)}
WIDE, VNNI = HAVE_AVX512, HAVE_VNNI

__all__ = []
for _name, _kq in KQUANTS.items():
    for _var, (_w, _v) in VARIANTS.items():
        globals()[f"{_name}_q8_k_s_{_var}"] = _make_record(_kq, _w, _v, False)
        __all__.append(f"{_name}_q8_k_s_{_var}")
    globals()[f"{_name}_q8_k_value"] = _make_record(_kq, WIDE, VNNI, True)
    globals()[f"{_name}_rows_x8"] = _make_accumulate(_kq, WIDE, VNNI, over_rows=True)
    globals()[f"{_name}_acts_x8"] = _make_accumulate(_kq, WIDE, VNNI, over_rows=False)
    __all__ += [f"{_name}_q8_k_value", f"{_name}_rows_x8", f"{_name}_acts_x8"]
del _name, _kq, _var, _w, _v


# ---- K-quant records decoded for the panel gemm (kernels/drive.py ``panel_gemm``) -----------
#
# Q3_K and Q6_K have the record value R32(ds * R32(d * f32(S))) with S = sum_j sc_j * sum_{i in j}
# q_i x_i over 16 sub-blocks of 16: the grid IQ formats' form with c = 1, so the same 8 x 16
# microtile (simd/iq_grid.py ``microtile_sub16``) runs them once a record is decoded into its DEC
# layout: q = u - offset as int8 (|q| <= 32), sc_j as i32, dc = f32(d) (exact), C = BIAS *
# sum_j sc_j * sum q.  Q2_K and Q5_K (scales per 32) add the min term (``mins`` microtiles):
# f32(dmin) and their 16 mins, one per Q8_K bsum; Q2_K's quants are stored times their scale
# (``q2_k_decode_prescaled``, <= 45: int8), so its microtile has no scale products.  Exact in
# int32 (Q6_K: |sum_j sc_j a_j| <= 16 * 128 * 16 * 255 * 32 < 2**28; Q5_K: 8 * 63 * 32 * 255 *
# 31 < 2**27; Q2_K: 256 * 255 * 45 < 2**22).

def _panel_decode_into(b, kq, wb, db, sub):
    units, mins = kq.weights(b, wb)
    ops = Ops(b, False, False)
    ones = _c8(1)
    csum = None
    k = 0
    for u, (uu, scp) in enumerate(units):
        q = b.sub(uu, _c8(kq.offset)) if kq.offset else uu
        store_at(b, db, 32 * u, q)
        m = b.call(ops.maddwd, [b.call(ops.maddubs, [ones, q]), scp])   # sc_j * pair sums
        csum = m if csum is None else b.add(csum, m)
        for lane in ([0] if sub == 32 else [0, 8]):                        # scale of each sub-block
            store_at(b, db, DEC_SC_AT + 4 * k,
                     b.sext(b.extract_element(scp, ir.Constant(i32, lane)), i32))
            k += 1
    radd = decl(b, "llvm.vector.reduce.add.v8i32", i32, [vec(i32, 8)])
    store_at(b, db, DEC_C_AT, b.mul(b.call(radd, [csum]), ir.Constant(i32, BIAS)))
    store_at(b, db, DEC_DC_AT, b.extract_element(gather_f16(b, [wb], kq.D), ir.Constant(i32, 0)))
    if kq.has_t:
        store_at(b, db, DEC_DMIN_AT,
                 b.extract_element(gather_f16(b, [wb], kq.DMIN), ir.Constant(i32, 0)))
        store_at(b, db, DEC_M_AT, mins)


def _make_panel_decode(kq, sub):
    return decode_intrinsic(lambda b, wb, db: _panel_decode_into(b, kq, wb, db, sub))


def _q2_k_prescaled_into(b, wb, db):
    """Q2_K decoded with each quant times its sub-block scale (u sc <= 3 * 15: int8), so the
    ``prescaled`` microtile needs no scale product: S = sum_i (u_i sc_j(i)) x_i, the same
    integer; C = BIAS * sum u sc (vpsadbw: the products are >= 0)."""
    kq = KQUANTS["q2_k"]
    units, mins = kq.weights(b, wb)
    scm = b.and_(load(b, wb, kq.SC, vec(i8, 16)), _c8(0x0F, 16))
    v32 = vec(i8, 32)
    sad = decl(b, "llvm.x86.avx2.psad.bw", vec(i64, 4), [v32, v32])
    total = None
    for u, (uu, _) in enumerate(units):     # unit u: sub-blocks 2u (bytes 0..15), 2u + 1
        sc = splat_lanes(b, scm, [2 * u] * 16 + [2 * u + 1] * 16)
        q = b.mul(uu, sc)
        store_at(b, db, 32 * u, q)
        t = b.call(sad, [q, ir.Constant(v32, None)])
        total = t if total is None else b.add(total, t)
    radd = decl(b, "llvm.vector.reduce.add.v4i64", i64, [vec(i64, 4)])
    store_at(b, db, DEC_C_AT, b.mul(b.trunc(b.call(radd, [total]), i32), ir.Constant(i32, BIAS)))
    store_at(b, db, DEC_DC_AT, b.extract_element(gather_f16(b, [wb], kq.D), ir.Constant(i32, 0)))
    store_at(b, db, DEC_DMIN_AT,
             b.extract_element(gather_f16(b, [wb], kq.DMIN), ir.Constant(i32, 0)))
    store_at(b, db, DEC_M_AT, mins)


q2_k_decode_prescaled = decode_intrinsic(_q2_k_prescaled_into)
q3_k_decode = _make_panel_decode(KQUANTS["q3_k"], 16)
q5_k_decode = _make_panel_decode(KQUANTS["q5_k"], 32)
q6_k_decode = _make_panel_decode(KQUANTS["q6_k"], 16)
__all__ += ["q2_k_decode_prescaled", "q3_k_decode", "q5_k_decode",
            "q6_k_decode"]
