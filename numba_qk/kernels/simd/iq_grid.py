"""Explicit-SIMD record sums of the grid IQ formats against Q8_K (IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; LLVM IR through numba intrinsics, the plumbing of ``base.py``):
the record value ``v``, the 8-activation gemm tile and the 8-row gemv tile of the driver
(``kernels/drive.py``), registered by ``kernels/iq/grid.py``; with AVX-512 VNNI the gemm runs
on records decoded once per call instead (``<t>_decode`` and the 8-row x 16-activation
``microtile_sub{32,16}``, section "gemm by decoded records" below).

Integer work (exact in any order, so these give the integers of the readable loops
``record_sums_<t>_q8_k`` of ``kernels/iq/grid.py``), per record pair, in units of 32 elements in
element order::

    w      = the unit's signed element multipliers q as int8 (|q| <= 62; IQ1: 8 grid +- 1, |q|
             <= 9): grid entries gathered from the tables (one u64 per 8 elements, one u32 per
             4 for IQ3) by the record's indices, signs as byte masks m (0 / -1) from 8 sign
             bits per group compared with [1, 2, 4, ..., 128] -- the plain sign bytes (IQ2_S,
             IQ3_S) or ksigns_iq2xs of the 7 stored bits, computed as the bits and their parity
             (popcount & 1) in bit 7.  Indices with high bits in qh (IQ2_S, IQ3_S, IQ1) are put
             together 4 at a time by two BMI2 pdep into the u16 lanes of a u64 where the target
             has BMI2.  IQ3_S with AVX-512 VBMI: no per-entry loads, the 64 entries' bytes
             (1..15, nibbles) looked up together from two byte tables by vpermi2b and spread
             by vpmultishiftqb (``_iq3_s_nibbles``, ``_iq3_s_grid64``); the IQ2 formats' the
             same way as 2-bit codes (grid bytes 8, 25, 43: ``_iq2_codes``, ``_iq2_grid64``,
             a vpermb maps codes to bytes), summed 64 elements per 512-bit step
             (``_pair64``).  IQ1 reads a table of
             q = 8 grid +- 1 by a 12-bit index whose bit 11 is the delta sign (qh's nibble of
             the group, IQ1_M; bit 15 of the sub-block's qh word, IQ1_S), so q needs no shift
             after the gather
    w'     = (grid ^ mm) - mm, mm = m ^ (xq >> 7)    w with the sign of xq applied (a
                                                     conditional negate: |w| <= 62 never wraps);
                                                     with AVX-512BW/VL m and xq < 0 are k masks
                                                     (kmovd / vptestmb, vpmovb2m), w' a vpsubb
                                                     from 0 under their kxor;
                                                     IQ1 (no sign bits): psignb(q, xq), which
                                                     differs only where xq = 0 = |xq|
    p      = pmaddubsw(|xq|, w')                     i16 lane = |x0| w0' + |x1| w1' = x0 w0 + x1 w1
                                                     |.| <= 2 * 128 * 62 (no saturation; |xq| as
                                                     u8: |-128| = 128 is exact)
    acc   += pmaddwd(p, sc16)                        sc16: each i16 lane's 2 ls + 1 (vpdpwssd
                                                     with AVX-512 VNNI: the same sum), splat
                                                     from the record's scale codes decoded
                                                     together (one vector per record)
    S      = reduce_add(acc)                         |S| < 2**31 (docs/numerics_iq_grid.md)

The float steps are those of ``record_value`` in ``kernels/iq/grid.py`` (one IEEE instruction
each, no fast-math, in the same order): ``v = R32(ds * R32(R32(d * c) * f32(S)))``.  Tiles: 8
weight records against one activation record (gemv) or one weight record against 8 activation
records (gemm), the shared record decoded once, the 8 values folded lane by lane
(``base.fold_into``); the gemv tile makes the activation record's side (|xq|, its sign
mask) once for its 8 rows.  The record's bytes must be contiguous (the driver checks it).

The grid and sign tables are module constants of the generated code (internal LLVM globals,
built from ``numba_qk.formats.iq_grids``, ggml's data).
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk.formats import iq as _iq
from numba_qk.formats import iq_grids as _g
from numba_qk.formats import quant

from numba_qk.kernels.simd.base import (FEATURES, HAVE_AVX2, HAVE_AVX512, HAVE_VNNI, Ops, decl,
                                        float_array_ptr, fold_into, gather_f16, gather_f32, i8,
                                        i16, i32, i64, load, nibble_lookup, record_intrinsic,
                                        reduce_many, splat_lanes, tile_intrinsic, vcall, vec)

_A_DS_AT = quant.q8_k.field("ds").start
_A_Q_AT = quant.q8_k.field("q").start
_V32 = vec(i8, 32)
_K32 = vec(ir.IntType(1), 32)
_F32 = ir.FloatType()
# BMI2 pdep spreads 4 index bytes and their high bits into 4 u16 lanes of a u64 in 3 ops (as
# ggml's AVX2 IQ1 code does); without it the indices are assembled by shifts and masks.
HAVE_BMI2 = HAVE_AVX2 and {"bmi", "bmi2"} <= FEATURES   # pdep (BMI2), bextr (BMI1)
# AVX-512BW/VL: a unit's 32 signs as one k mask (kmovd of the plain sign bytes, vptestmb of the
# ksigns bytes) and the weights negated under it (a masked vpsubb) in place of byte masks.
_MASKS = HAVE_AVX512 and "avx512vl" in FEATURES


# ---- tables --------------------------------------------------------------------------------

def _iq1_q(grid):
    """u64 per iq1s_grid entry: byte j = 8 * (int8 byte j of the entry) as int8 (q before the
    +-1 shift)."""
    out = []
    for e in grid:
        v = 0
        for j in range(8):
            b = (e >> (8 * j)) & 0xFF
            b = b - 256 if b >= 128 else b
            v |= ((8 * b) & 0xFF) << (8 * j)
        out.append(v)
    return out


def _iq1_q12(grid):
    """u64 per 12-bit IQ1 index (the 11-bit iq1s_grid index, bit 11 the delta sign t): byte j
    = 8 * (byte j of the grid entry) + 1 - 2 t as int8 (q with its +-1 shift: |q| <= 9)."""
    base = _iq1_q(grid)
    out = []
    for t in (0, 1):
        d = 1 - 2 * t
        out += [sum((((v >> (8 * j)) + d) & 0xFF) << (8 * j) for j in range(8)) for v in base]
    return out


_TABLES = {
    "iq2xxs": (i64, list(_g.IQ2XXS_GRID)),
    "iq2xs": (i64, list(_g.IQ2XS_GRID)),
    "iq2s": (i64, list(_g.IQ2S_GRID)),
    "iq3xxs": (i32, list(_g.IQ3XXS_GRID)),
    "iq3s": (i32, list(_g.IQ3S_GRID)),
    "iq1_q12": (i64, _iq1_q12(_g.IQ1S_GRID)),
}


def _table(b, name):
    """The internal constant global holding table ``name`` in the function's module."""
    module = b.module
    gname = f"numba_qk_iq_grid_{name}"
    try:
        return module.get_global(gname)
    except KeyError:
        elt, values = _TABLES[name]
        ty = ir.ArrayType(elt, len(values))
        gv = ir.GlobalVariable(module, ty, gname)
        gv.linkage = "internal"
        gv.global_constant = True
        gv.initializer = ir.Constant(ty, [int(v) for v in values])
        gv.align = 64
        return gv


def _entry(b, name, idx, base=None):
    """Entry ``idx`` (an i32 value) of table ``name``, or of the entries from ``base``
    (``_part``) on."""
    i = b.zext(idx, i64) if idx.type != i64 else idx
    if base is not None:
        return b.load(b.gep(base, [i], inbounds=True))
    gv = _table(b, name)
    return b.load(b.gep(gv, [ir.Constant(i32, 0), i], inbounds=True))


def _part(b, name, first):
    """Pointer to entry ``first`` (an i32 value) of table ``name``: one address per unit
    for ``_entry``'s lookups (the register base of their loads)."""
    gv = _table(b, name)
    return b.gep(gv, [ir.Constant(i32, 0), b.zext(first, i64)], inbounds=True)


# ---- scalar field reads (i32 results) ----------------------------------------------------------

def _c(v, t=i32):
    return ir.Constant(t, v)


def _u8(b, wb, off):
    return b.zext(load(b, wb, off, i8), i32)


def _u16(b, wb, off):
    return b.zext(load(b, wb, off, i16), i32)


def _shr(b, v, n):
    return b.lshr(v, _c(n, v.type)) if n else v


def _shl(b, v, n):
    return b.shl(v, _c(n, v.type)) if n else v


def _and(b, v, m):
    return b.and_(v, _c(m, v.type))


def _idx4(b, lo, hi, width):
    """The 4 indices (i32 values) ``byte k of lo | (bits width*k .. of hi) << 8`` (k < 4) of the
    i32 ``lo`` and the i32 ``hi`` (bits above 4 * width ignored): with BMI2 two pdep into the
    4 u16 lanes of a u64, lanes 1..3 read out by ``bextr`` (one op each: a shift and a movzx
    were two, plus a register copy); else shifts and masks."""
    if HAVE_BMI2:
        pdep = decl(b, "llvm.x86.bmi.pdep.64", i64, [i64, i64])
        bextr = decl(b, "llvm.x86.bmi.bextr.64", i64, [i64, i64])
        m = (1 << width) - 1
        lanes = b.or_(b.call(pdep, [b.zext(lo, i64), _c(0x00FF00FF00FF00FF, i64)]),
                      b.call(pdep, [b.zext(hi, i64), _c((m << 8) * 0x0001000100010001, i64)]))
        return [b.zext(b.trunc(lanes, i16), i32)] + [
            b.trunc(b.call(bextr, [lanes, _c(16 * k | 16 << 8, i64)]), i32) for k in (1, 2, 3)]
    return [b.or_(_and(b, _shr(b, lo, 8 * k), 0xFF),
                  _shl(b, _and(b, _shr(b, hi, width * k), (1 << width) - 1), 8))
            for k in range(4)]


# ---- vector builders ---------------------------------------------------------------------------

def _pack(b, vals):
    """<32 x i8> from 4 i64 or 8 i32 scalars (element order)."""
    t = vals[0].type
    v = ir.Constant(vec(t, len(vals)), None)
    for k, x in enumerate(vals):
        v = b.insert_element(v, x, _c(k))
    return b.bitcast(v, _V32)


def _bits_to_masks(b, signs, at):
    """Element k of the unit is negated where bit k % 8 of byte ``at + k // 8`` of the <32 x
    i8> ``signs`` is set: with AVX-512BW/VL the <32 x i1> mask (``vptestmb``), else the <32 x
    i8> byte mask (-1 / 0)."""
    v = splat_lanes(b, signs, [at + k // 8 for k in range(32)])
    bit = ir.Constant(_V32, [1 << (k % 8) for k in range(32)])
    if _MASKS:
        return b.icmp_unsigned("!=", b.and_(v, bit), ir.Constant(_V32, None))
    return b.sext(b.icmp_unsigned("==", b.and_(v, bit), bit), _V32)


def _plain_sign_masks(b, wb, at, s):
    """Unit ``s``'s signs from the plain sign bytes at ``at`` (IQ2_S, IQ3_S: bit k of the u32
    at ``at + 4 s`` for element k): with AVX-512BW/VL the u32 as a <32 x i1> mask (``kmovd``),
    else the <32 x i8> byte mask."""
    if _MASKS:
        return b.bitcast(load(b, wb, at + 4 * s, i32), _K32)
    return _bits_to_masks(b, load(b, wb, at, _V32), 4 * s)


def _byte_masks(b, signs):
    """``signs`` (``_bits_to_masks``) as the <32 x i8> byte mask (-1 / 0)."""
    return b.sext(signs, _V32) if signs.type == _K32 else signs


def _even_parity(b, s7):
    """<32 x i8>: ksigns_iq2xs of each byte of ``s7`` (7 sign bits, the 8th their parity)."""
    ctpop = decl(b, "llvm.ctpop.v32i8", _V32, [_V32])
    odd = b.and_(b.call(ctpop, [s7]), ir.Constant(_V32, [1] * 32))
    return b.or_(s7, b.shl(odd, ir.Constant(_V32, [7] * 32)))


def _odd(b, codes):
    """2 c + 1 of each lane c of the <n x i16> ``codes``."""
    return b.add(b.add(codes, codes), ir.Constant(codes.type, [1] * codes.type.count))


def _unit_scales(b, sc, s):
    """Unit ``s``'s <16 x i16> pmaddubsw-lane scales from the record's 2 ls + 1 ``sc`` (<8 x
    i16>, one per 32 elements: lane s everywhere; <16 x i16>, one per 16: lanes 2s, 2s + 1)."""
    if sc.type.count == 8:
        return splat_lanes(b, sc, [s] * 16)
    return splat_lanes(b, sc, [2 * s + k // 8 for k in range(16)])


def _nibble_scale_vector(b, wb, at):
    """<16 x i16> 2 ls + 1 of the 16 4-bit codes of the 8 bytes at ``at`` (IQ2_XS, IQ2_S:
    code k in nibble k % 2 of byte k // 2)."""
    v = b.zext(splat_lanes(b, load(b, wb, at, vec(i8, 8)), [k // 2 for k in range(16)]),
               vec(i16, 16))
    return _odd(b, _lanes(b, v, [4 * (k % 2) for k in range(16)], 15))


def _ksigns_of_aux(b, aux):
    """<32 x i8>: the 8-bit signs of group l of sub-block s at byte 4s + l, from the <8 x i32>
    ``aux`` (lane s: 4 x 7 sign bits at bits 7l; IQ2_XXS, IQ3_XXS)."""
    m7 = ir.Constant(vec(i32, 8), [127] * 8)
    v = None
    for l in range(4):
        t = b.and_(b.lshr(aux, ir.Constant(vec(i32, 8), [7 * l] * 8)), m7)
        t = b.shl(t, ir.Constant(vec(i32, 8), [8 * l] * 8)) if l else t
        v = t if v is None else b.or_(v, t)
    return _even_parity(b, b.bitcast(v, _V32))


def _lanes(b, v, shifts, mask):
    """(v >> shifts[k]) & mask, lane by lane (constant shifts)."""
    n = v.type.count
    return b.and_(b.lshr(v, ir.Constant(v.type, list(shifts))), ir.Constant(v.type, [mask] * n))


# ---- per-format weight units: [(grid <32 x i8>, sign mask <32 x i8> or None, sc16)] ----------

class _Fmt:
    """A grid format's layout (byte offsets from its schema), its constant ``c`` and the
    decoding of one record into 8 units of 32 elements."""

    def __init__(self, fmt, c, units, d_at=0, sub=32):
        self.fmt, self.name, self.c, self.units, self.d_at = fmt, fmt.name.lower(), c, units, d_at
        self.sub = sub    # elements per scale code (16: IQ2_XS, IQ2_S, IQ1_M)


_QS = 2


def _opaque(b, ptr):
    """``ptr`` through an empty inline-asm statement: the same address, which LLVM no longer
    knows, so scalar loads through it are not rewritten as lane extracts (``vpextrb`` /
    ``vpextrw``, 2 uops each) of a vector load of the same bytes."""
    return b.call(ir.InlineAsm(ir.FunctionType(ptr.type, [ptr.type]), "", "=r,0"), [ptr])


def _units_aux(b, wb, table, n, aux, grids=None):
    """IQ2_XXS (``n`` = 4 byte indices per unit) and IQ3_XXS (8): the indices of unit s at
    bytes ``2 + 8 s``, lane s of the <8 x i32> ``aux`` its u32 of 4 x 7 sign bits and ls (bits
    28..31); ``grids``: the 8 units' grid bytes where the caller made them (else looked up
    entry by entry)."""
    sb = _ksigns_of_aux(b, aux)
    scales = _odd(b, b.trunc(b.lshr(aux, ir.Constant(vec(i32, 8), [28] * 8)), vec(i16, 8)))
    out = []
    wi = _opaque(b, wb)   # the index bytes as byte loads (IQ2_XXS: aux is a vector load of them)
    for s in range(8):
        grid = grids[s] if grids is not None else _pack(
            b, [_entry(b, table, _u8(b, wi, _QS + 8 * s + k)) for k in range(n)])
        out.append((grid, _bits_to_masks(b, sb, 4 * s), _unit_scales(b, scales, s)))
    return out


def _units_iq2_xxs(b, wb):
    return (_units_iq2_xxs_vbmi if HAVE_VBMI else _units_iq2_xxs_loads)(b, wb)


def _units_iq2_xxs_loads(b, wb):
    words = load(b, wb, _QS, vec(i32, 16))        # lane 2s + 1: the aux word of sub-block s
    aux = splat_lanes(b, words, [2 * s + 1 for s in range(8)])
    return _units_aux(b, wb, "iq2xxs", 4, aux)


_XS2_SC = _iq.iq2_xs.field("ls").start


def _units_iq2_xs(b, wb):
    return (_units_iq2_xs_vbmi if HAVE_VBMI else _units_iq2_xs_loads)(b, wb)


def _units_iq2_xs_loads(b, wb):
    words = load(b, wb, _QS, vec(i16, 32))
    sb = _even_parity(b, b.trunc(b.lshr(words, ir.Constant(vec(i16, 32), [9] * 32)), _V32))
    out = []
    scv = _nibble_scale_vector(b, wb, _XS2_SC)
    wi = _opaque(b, wb)   # the index words as scalar loads, not lane extracts of ``words``
    for s in range(8):
        if HAVE_BMI2:     # the 9 index bits of word l of the unit's u64: one bextr each
            u = load(b, wi, _QS + 8 * s, i64)
            bextr = decl(b, "llvm.x86.bmi.bextr.64", i64, [i64, i64])
            idx = [b.call(bextr, [u, _c(16 * l | 9 << 8, i64)]) for l in range(4)]
        else:
            idx = [_and(b, _u16(b, wi, _QS + 8 * s + 2 * l), 511) for l in range(4)]
        grid = _pack(b, [_entry(b, "iq2xs", i) for i in idx])
        out.append((grid, _bits_to_masks(b, sb, 4 * s), _unit_scales(b, scv, s)))
    return out


_S2_SIGNS = _iq.iq2_s.field("signs").start
_S2_QH = _iq.iq2_s.field("qh").start
_S2_SC = _iq.iq2_s.field("ls").start


def _units_qh_signs(b, wb, table, n, width, qh_at, signs_at, scales):
    """IQ2_S (``n`` = 4 indices of 10 bits per unit, ``width`` = 2) and IQ3_S (8 of 9 bits,
    width 1): index k of unit s is byte ``n s + k`` of qs with bits ``width k ..`` of qh byte s
    as its bits 8 and up; plain sign bytes at ``signs_at``; ``scales`` the record's 2 ls + 1
    (``_unit_scales``)."""
    out = []
    for s in range(8):
        qh = _u8(b, wb, qh_at + s)
        idx = [i for h in range(n // 4)
               for i in _idx4(b, load(b, wb, _QS + n * s + 4 * h, i32),
                              _shr(b, qh, 4 * width * h), width)]
        out.append((_pack(b, [_entry(b, table, i) for i in idx]),
                    _plain_sign_masks(b, wb, signs_at, s), _unit_scales(b, scales, s)))
    return out


def _units_iq2_s(b, wb):
    return (_units_iq2_s_vbmi if HAVE_VBMI and HAVE_BMI2 else _units_iq2_s_loads)(b, wb)


def _units_iq2_s_loads(b, wb):
    return _units_qh_signs(b, wb, "iq2s", 4, 2, _S2_QH, _S2_SIGNS,
                           _nibble_scale_vector(b, wb, _S2_SC))


_XXS3_AUX = _iq.iq3_xxs.field("signs").start


def _units_iq3_xxs(b, wb):
    aux = load(b, wb, _XXS3_AUX, vec(i32, 8))
    return _units_aux(b, wb, "iq3xxs", 8, aux, _iq3_xxs_grids(b, wb) if HAVE_VBMI else None)


_S3_QH = _iq.iq3_s.field("qh").start
_S3_SIGNS = _iq.iq3_s.field("signs").start
_S3_SC = _iq.iq3_s.field("ls").start


def _units_iq3_s(b, wb):
    if HAVE_VBMI:
        return _units_iq3_s_vbmi(b, wb)
    v = b.zext(splat_lanes(b, load(b, wb, _S3_SC, vec(i8, 4)), [s // 2 for s in range(8)]),
               vec(i16, 8))
    scales = _odd(b, _lanes(b, v, [4 * (s % 2) for s in range(8)], 15))
    return _units_qh_signs(b, wb, "iq3s", 8, 1, _S3_QH, _S3_SIGNS, scales)


_S1_QH = _iq.iq1_s.field("qh").start


def _units_iq1_s(b, wb):
    out = []
    scv = _odd(b, _lanes(b, load(b, wb, _S1_QH, vec(i16, 8)), [12] * 8, 7))
    for s in range(8):
        qh = _u16(b, wb, _S1_QH + 2 * s)
        # the 12-bit index of the q table: 11 index bits, the sub-block's delta sign as bit 11
        # (the second half of the table from the address of entry 2048 on)
        half = _part(b, "iq1_q12", b.and_(_shr(b, qh, 4), _c(0x0800)))
        idx = _idx4(b, load(b, wb, _QS + 4 * s, i32), qh, 3)
        out.append((_pack(b, [_entry(b, "iq1_q12", i, half) for i in idx]), None,
                    _unit_scales(b, scv, s)))
    return out


_M1_QH = _iq.iq1_m.field("qh").start
_M1_SC = _iq.iq1_m.field("ls").start


def _units_iq1_m(b, wb):
    # the 16 scale codes as 2 ls + 1: lane k from bits 3 (k % 4) of u16 k // 4
    words = splat_lanes(b, load(b, wb, _M1_SC, vec(i16, 4)), [k // 4 for k in range(16)])
    ls = _lanes(b, words, [3 * (k % 4) for k in range(16)], 7)
    sc16 = b.add(b.add(ls, ls), ir.Constant(vec(i16, 16), [1] * 16))
    out = []
    for s in range(8):
        # group l's qh nibble (3 index bits, the delta sign) is nibble l of u16 s of qh: the
        # 12-bit index of the q table
        idx = _idx4(b, load(b, wb, 4 * s, i32), _u16(b, wb, _M1_QH + 2 * s), 4)
        out.append((_pack(b, [_entry(b, "iq1_q12", i) for i in idx]), None,
                    splat_lanes(b, sc16, [2 * s + k // 8 for k in range(16)])))
    return out


def _d_iq1_m(b, wbs):
    """<n x float>: the f16 super-block scales of the IQ1_M records ``wbs`` (the top nibbles of
    their 4 scale words, the u64 at _M1_SC) widened, lane by lane."""
    n = len(wbs)
    t = vec(i64, n)
    u, seen = ir.Constant(t, None), {}
    for k, wb in enumerate(wbs):
        if id(wb) not in seen:
            seen[id(wb)] = load(b, wb, _M1_SC, i64)
        u = b.insert_element(u, seen[id(wb)], _c(k))

    def nibble(t_):       # bits 12..15 of word t_ at bits 4 t_ ..
        sh, m = 12 + 16 * t_ - 4 * t_, 0xF << (4 * t_)
        return b.and_(b.lshr(u, ir.Constant(t, [sh] * n)), ir.Constant(t, [m] * n))
    bits = b.or_(b.or_(nibble(0), nibble(1)), b.or_(nibble(2), nibble(3)))
    return b.fpext(b.bitcast(b.trunc(bits, vec(i16, n)), vec(ir.HalfType(), n)), vec(_F32, n))


_XS4 = _iq.iq4_xs
_XS4_LS, _XS4_QS = _XS4.field("ls").start, _XS4.field("qs").start


def _iq4_xs_scales(b, wb):
    """<8 x i16>: ``ls_s - 32`` of the IQ4_XS record ``wb``'s 8 units (6 bits: nibble s % 2
    of scales_l byte s // 2, bits 2s of the scales_h word as bits 4, 5)."""
    v16 = vec(i16, 8)
    lo = b.zext(splat_lanes(b, load(b, wb, _XS4_LS + 2, vec(i8, 4)), [s // 2 for s in range(8)]),
                v16)
    hi = splat_lanes(b, load(b, wb, _XS4_LS, vec(i16, 1)), [0] * 8)
    ls = b.or_(_lanes(b, lo, [4 * (s % 2) for s in range(8)], 15),
               b.shl(_lanes(b, hi, [2 * s for s in range(8)], 3), ir.Constant(v16, [4] * 8)))
    return b.sub(ls, ir.Constant(v16, [32] * 8))


def _units_iq4_xs(b, wb):
    """IQ4_XS (not a grid format, but the same shape: signed int8 multipliers and one scale per
    32 elements): unit s is the 16 code bytes at ``qs + 16 s``, low nibbles then high ones,
    through ``kvalues_iq4nl`` (``pshufb``: |k| <= 127, so ``psignb`` and ``pmaddubsw`` stay
    exact), its scale ``ls_s - 32`` (``_iq4_xs_scales``)."""
    sc = _iq4_xs_scales(b, wb)
    out = []
    for s in range(8):
        q = nibble_lookup(b, load(b, wb, _XS4_QS + 16 * s, vec(i8, 16)), _iq.KVALUES_IQ4NL)
        out.append((q, None, _unit_scales(b, sc, s)))
    return out


FORMATS = {f.name: f for f in (
    _Fmt(_iq.iq2_xxs, 0.125, _units_iq2_xxs),
    _Fmt(_iq.iq2_xs, 0.125, _units_iq2_xs, sub=16),
    _Fmt(_iq.iq2_s, 0.125, _units_iq2_s, sub=16),
    _Fmt(_iq.iq3_xxs, 0.25, _units_iq3_xxs),
    _Fmt(_iq.iq3_s, 1.0, _units_iq3_s),
    _Fmt(_iq.iq1_s, 0.125, _units_iq1_s),
    _Fmt(_iq.iq1_m, 0.125, _units_iq1_m, d_at=None, sub=16),
    _Fmt(_XS4, 1.0, _units_iq4_xs),
)}


# ---- sums and values ---------------------------------------------------------------------------

def _x_side(b, xb):
    """Per unit of 32 activation quants: (|xq| as u8, xq >> 7 (0 / -1 per byte), xq, and with
    AVX-512BW/VL xq < 0 as a <32 x i1> mask (``vpmovb2m``), else None)."""
    out = []
    for u in range(8):
        x = load(b, xb, _A_Q_AT + 32 * u, _V32)
        neg = b.ashr(x, ir.Constant(_V32, [7] * 32))
        kx = b.icmp_signed("<", x, ir.Constant(_V32, None)) if _MASKS else None
        out.append((b.sub(b.xor(x, neg), neg), neg, x, kx))
    return out


def _pair(b, ops, units, xside):
    """<8 x i32> whose lane sum is S of one decoded weight record and one Q8_K record."""
    if units[0][0].type.count == 64:
        return _pair64(b, ops, units, xside)
    acc = None
    psign = decl(b, "llvm.x86.avx2.psign.b", _V32, [_V32, _V32])
    for (grid, signs, sc), (ax, xneg, x, kx) in zip(units, xside):
        if signs is None:    # psignb: w' = w * sign(xq) (0 where xq = 0, and |xq| = 0 there)
            w = b.call(psign, [grid, x])
        elif signs.type == _K32:   # one k mask: negate where the weight's and xq's signs differ
            k = b.xor(signs, kx)
            w = b.select(k, b.sub(ir.Constant(_V32, None), grid), grid)
        else:
            mm = b.xor(signs, xneg)
            w = b.sub(b.xor(grid, mm), mm)
        p = b.call(ops.maddubs, [ax, w])
        if ops.dpwssd is not None:
            acc = b.call(ops.dpwssd, [acc if acc is not None else ir.Constant(vec(i32, 8), None),
                                      p, sc])
        else:
            m = b.call(ops.maddwd, [p, sc])
            acc = m if acc is None else b.add(acc, m)
    return acc


def _pair64(b, ops, units, xside):
    """``_pair`` of wide units (``_iq2_units_vbmi``): per 64 elements one masked ``vpsubb``,
    ``vpmaddubsw`` and ``vpdpwssd`` (or ``vpmaddwd`` and add) of 512 bits, the activation's
    halves joined (the same for every row: computed once); the 16 lanes folded to 8."""
    wide = Ops(b, True, ops.dpwssd is not None)
    v64, v16 = vec(i8, 64), vec(i32, 16)
    both = list(range(64))
    acc = None
    for c, (grid, signs, sc) in enumerate(units):
        (ax0, _, _, kx0), (ax1, _, _, kx1) = xside[2 * c], xside[2 * c + 1]
        ax = b.shuffle_vector(ax0, ax1, ir.Constant(vec(i32, 64), both))
        kx = b.shuffle_vector(kx0, kx1, ir.Constant(vec(i32, 64), both))
        w = b.select(b.xor(signs, kx), b.sub(ir.Constant(v64, None), grid), grid)
        p = b.call(wide.maddubs, [ax, w])
        if wide.dpwssd is not None:
            acc = b.call(wide.dpwssd, [acc if acc is not None else ir.Constant(v16, None), p, sc])
        else:
            m = b.call(wide.maddwd, [p, sc])
            acc = m if acc is None else b.add(acc, m)
    return b.add(splat_lanes(b, acc, list(range(8))), splat_lanes(b, acc, list(range(8, 16))))


def _spilled_units(b, units):
    """``units`` as (signed weights w = (grid ^ m) - m, None, sc16) loaded back from a stack
    slot that an empty inline-asm statement has seen (so LLVM keeps it in memory): the gemm
    tile then reads each decoded weight unit from L1 per activation instead of holding 8
    activations' worth of vectors in registers at once (measured: that spilled, and the tile
    ran 2x slower than 8 record values)."""
    slot = cgutils.alloca_once(b, ir.ArrayType(_V32, 8))
    scs = cgutils.alloca_once(b, ir.ArrayType(vec(i16, 16), 8))
    for u, (grid, signs, sc) in enumerate(_narrow(b, units)):
        signs = None if signs is None else _byte_masks(b, signs)
        w = grid if signs is None else b.sub(b.xor(grid, signs), signs)
        b.store(w, b.gep(slot, [_c(0), _c(u)]))
        b.store(sc, b.gep(scs, [_c(0), _c(u)]))
    fence = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [slot.type, scs.type]), "",
                         "r,r,~{memory}", side_effect=True)
    b.call(fence, [slot, scs])
    return [(b.load(b.gep(slot, [_c(0), _c(u)])), None, b.load(b.gep(scs, [_c(0), _c(u)])))
            for u in range(8)]


# ---- IQ4_XS's 8-row gemv tile with AVX-512 VNNI ---------------------------------------------
#
# IQ4_XS's codes index kvalues_iq4nl (|k| <= 127), looked up as k + 128 (a u8, 1..241) by one
# 512-bit ``vpshufb`` per 64 nibbles, so ``vpdpbusd`` multiplies them with the int8 quants
# directly (no sign step, no i16 stage).  A 64-byte half h of ``qs`` holds units 4h .. 4h + 3,
# 16 bytes each: the low nibbles are the unit's first 16 elements, the high ones its last 16;
# the activation's quants are arranged to match once per tile step (XL_h: the first 16 quants
# of each of the 4 units, XH_h the last 16; two 128-bit-lane shuffles), shared by the 8 rows.
# Per row and half, the i32 lane j (bytes 4j .. 4j + 3 of XL_h and XH_h: 8 elements of unit
# 4h + j // 4) is
#
#     a_j = -128 sum q  +  dpbusd(k + 128 of the low nibbles, XL_h)  +  dpbusd(.. high, XH_h)
#         = sum k q over its 8 elements                      (|a_j| <= 8 * 127 * 128 < 2**17)
#
# (the -128 sum q start is made once per activation by vpdpbusd with ones), then multiplied by
# the unit's scale ls - 32 (vpmulld; |.| <= 32) and added: the lane sum of the row's vector is
# S = sum_s (ls_s - 32) sum_{i in s} k_i q_i exactly (|S| < 2**23), the integer of the readable
# loop ``record_sums_iq4_xs_q8_k``; the float steps are ``_values``'.

_IQ4_XS_ROWS = HAVE_AVX512 and HAVE_VNNI
_KV_U8 = [(v + 128) & 0xFF for v in _iq.KVALUES_IQ4NL]


def _iq4_xs_x_halves(b, xb):
    """Per half h of a Q8_K record: (XL_h, XH_h, -128 sum q per lane) (layout above)."""
    v64, v16 = vec(i8, 64), vec(i32, 16)
    dpbusd = Ops(b, True, True).dpbusd
    ones = ir.Constant(v64, [1] * 64)
    out = []
    for h in range(2):
        a = load(b, xb, _A_Q_AT + 128 * h, v64)
        c = load(b, xb, _A_Q_AT + 128 * h + 64, v64)
        xl = b.shuffle_vector(a, c, ir.Constant(vec(i32, 64), [32 * (j // 16) + j % 16
                                                               for j in range(64)]))
        xh = b.shuffle_vector(a, c, ir.Constant(vec(i32, 64), [32 * (j // 16) + 16 + j % 16
                                                               for j in range(64)]))
        qsum = b.call(dpbusd, [b.call(dpbusd, [ir.Constant(v16, None), ones, xl]), ones, xh])
        start = b.sub(ir.Constant(v16, None), b.shl(qsum, ir.Constant(v16, [7] * 16)))
        out.append((xl, xh, start))
    return out


def _iq4_xs_lookups(b, wb, h, values):
    """(low, high) <64 x i8>: ``values`` (16 bytes, repeated per 128-bit lane) at the low and
    the high nibbles of the 64 code bytes of half ``h`` of IQ4_XS record ``wb``'s ``qs``: one
    512-bit ``vpshufb`` each."""
    v64 = vec(i8, 64)
    shuf = decl(b, "llvm.x86.avx512.pshuf.b.512", v64, [v64, v64])
    table, low = ir.Constant(v64, list(values) * 4), ir.Constant(v64, [0x0F] * 64)
    q = load(b, wb, _XS4_QS + 64 * h, v64)
    return (b.call(shuf, [table, b.and_(q, low)]),
            b.call(shuf, [table, b.and_(b.lshr(q, ir.Constant(v64, [4] * 64)), low)]))


def _iq4_xs_scaled(b, sc, h, v):
    """The <16 x i32> per-lane sums ``v`` of half ``h`` (lane j: 8 elements of unit 4h + j // 4)
    times their units' scales from the <8 x i32> ``sc``."""
    return b.mul(v, splat_lanes(b, sc, [4 * h + j // 4 for j in range(16)]))


def _iq4_xs_row(b, wb, xhalves):
    """<16 x i32> whose lane sum is S of IQ4_XS record ``wb`` and the activation of
    ``xhalves`` (``_iq4_xs_x_halves``)."""
    dpbusd = Ops(b, True, True).dpbusd
    sc = b.sext(_iq4_xs_scales(b, wb), vec(i32, 8))
    acc = None
    for h, (xl, xh, start) in enumerate(xhalves):
        wl, wh = _iq4_xs_lookups(b, wb, h, _KV_U8)
        t = _iq4_xs_scaled(b, sc, h, b.call(dpbusd, [b.call(dpbusd, [start, wl, xl]), wh, xh]))
        acc = t if acc is None else b.add(acc, t)
    return acc


def _iq4_xs_rows(b, wbs, xb):
    """<8 x i32> S of the 8 IQ4_XS records ``wbs`` against one Q8_K record ``xb``, one row
    after the other (stored behind a memory clobber, as ``_sums_one_by_one``)."""
    xhalves = _iq4_xs_x_halves(b, xb)
    slot = cgutils.alloca_once(b, ir.ArrayType(vec(i32, 16), len(wbs)))
    fence = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [slot.type]), "", "r,~{memory}",
                         side_effect=True)
    for k, wb in enumerate(wbs):
        b.store(_iq4_xs_row(b, wb, xhalves), b.gep(slot, [_c(0), _c(k)]))
        b.call(fence, [slot])
    return reduce_many(b, [b.load(b.gep(slot, [_c(0), _c(k)])) for k in range(len(wbs))])


def _sums(b, ops, kf, wbs, xbs):
    """<n x i32> S of the record pairs zip(wbs, xbs); a record listed several times (the same
    IR value) is decoded once (one weight record for several activation records: through
    ``_spilled_units``)."""
    if (kf.fmt is _XS4 and _IQ4_XS_ROWS and len(wbs) == 8 and all(xb is xbs[0] for xb in xbs)
            and len({id(wb) for wb in wbs}) == 8):
        return _iq4_xs_rows(b, wbs, xbs[0])
    if len(wbs) > 1 and all(wb is wbs[0] for wb in wbs):
        units = _spilled_units(b, kf.units(b, wbs[0]))
        return reduce_many(b, [_pair(b, ops, units, _x_side(b, xb)) for xb in xbs])
    if len(wbs) > 1 and len({id(wb) for wb in wbs}) == len(wbs):
        return _sums_one_by_one(b, ops, kf, wbs, xbs)
    wdec, xdec, s = {}, {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in wdec:
            wdec[id(wb)] = kf.units(b, wb)
        if id(xb) not in xdec:
            xdec[id(xb)] = _x_side(b, xb)
        s.append(_pair(b, ops, wdec[id(wb)], xdec[id(xb)]))
    return reduce_many(b, s)


def _sums_one_by_one(b, ops, kf, wbs, xbs):
    """``_sums`` of distinct record pairs (the 8-row tile), each pair's lane sums stored to a
    stack slot behind an empty inline-asm statement that clobbers memory before the next pair
    is decoded: LLVM then decodes one pair after the other (left to itself it interleaves all
    8, spills, and the tile ran 1.1-3.4x the time of 8 record values); the lane sums are
    reduced together as before."""
    slot = cgutils.alloca_once(b, ir.ArrayType(vec(i32, 8), len(wbs)))
    fence = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [slot.type]), "", "r,~{memory}",
                         side_effect=True)
    # one activation record for all (the gemv tile): its side made once, before the rows
    xs = _x_side(b, xbs[0]) if all(xb is xbs[0] for xb in xbs) else None
    for k, (wb, xb) in enumerate(zip(wbs, xbs)):
        b.store(_pair(b, ops, kf.units(b, wb), xs or _x_side(b, xb)),
                b.gep(slot, [_c(0), _c(k)]))
        b.call(fence, [slot])
    return reduce_many(b, [b.load(b.gep(slot, [_c(0), _c(k)])) for k in range(len(wbs))])


def _values(b, ops, kf, wbs, xbs):
    """<n x float> record values: v = R32(ds * R32(R32(d * c) * f32(S))), lane by lane."""
    n = len(wbs)
    s = _sums(b, ops, kf, wbs, xbs)
    if kf.d_at is None:
        d = _d_iq1_m(b, wbs)
    else:
        d = gather_f16(b, wbs, kf.d_at)
    f32v = vec(_F32, n)
    dc = b.fmul(d, ir.Constant(f32v, [kf.c] * n))            # exact: c a power of two
    ds = gather_f32(b, xbs, _A_DS_AT)
    return b.fmul(ds, b.fmul(dc, b.sitofp(s, f32v)))


def _make_record(name, vnni, value):
    """Intrinsic ``f(w, w_off, x, x_off)``: S (int32) of the weight record (format ``name``) at
    byte ``w_off`` of uint8 array ``w`` and the Q8_K record at byte ``x_off`` of ``x``, or with
    ``value`` the record value v (float32)."""
    def compute(b, wb, xb):
        kf, ops = FORMATS[name], Ops(b, False, vnni)
        return (_values if value else _sums)(b, ops, kf, [wb], [xb])
    return record_intrinsic(value, compute)


def _make_tile(name, vnni, over_rows):
    """The 8-lane tile intrinsic of format ``name`` (``base.tile_intrinsic``)."""
    def make_values(builder):
        kf, ops = FORMATS[name], Ops(builder, False, vnni)
        return lambda wbs, xbs: _values(builder, ops, kf, wbs, xbs)
    return tile_intrinsic(over_rows, 8, make_values)


# ---- gemm by decoded records (AVX-512 VNNI): 8 weight rows x 16 activations per step ----------
#
# The weight records are decoded once per gemm call into DEC_BYTES each: the 256 multipliers q
# as int8 (|q| <= 62), the nsub = 256 / sub scale factors 2 ls + 1 as i32 at byte DEC_SC_AT,
# R32(f32(d) * c) (exact) at DEC_DC_AT and C = BIAS * sum_s (2 ls_s + 1) sum_{i in s} q_i
# (i32) at DEC_C_AT.  The activations are laid out once per call in tiles of 16 (``XT_BYTES``
# per tile and record, see kernels/iq/grid.py): the quants plus BIAS as u8 (xq ^ 0x80), 64
# vectors of 16 i32 (vector k: quants 4k .. 4k+3 of each activation), then the 16 ds (f32) at
# XT_DS_AT.  Per weight row, one zmm lane per activation (as ggml's tiled kernels):
#
#     a_s  = sum of vpdpbusd(xq + BIAS quads, the row's q quad broadcast) over sub-block s
#          = sum_{i in s} (xq_i + BIAS) q_i                             i32 lane per activation
#     S    = sum_s (2 ls_s + 1) a_s - C                                (vpmulld, vpaddd)
#
# exact: every intermediate fits int32 (sum_s (2 ls_s + 1) a_s <= 31 * 255 * 62 * 256 < 2**27,
# C < 2**26; docs/numerics_iq_grid.md), so S is the exact integer of the record pair; then the record value's float steps, lane by lane, folded
# into the row's 16 lanes in record order (``base.fold_into``).

BIAS = 128     # the activations' u8 quants are xq ^ 0x80 (kernels/drive.py x_tiles16)
DEC_BYTES = 384
DEC_SC_AT, DEC_DC_AT, DEC_C_AT = 256, 320, 324
# formats with a min term (Q2_K, Q5_K: v = R32(ds * R32(R32(d S) - R32(dmin T)))): f32(dmin)
# and the 16 mins m_j (one per 16 elements, i16 pairs) of T = sum_j m_j bsum_j
DEC_DMIN_AT, DEC_M_AT = 328, 332
XT_BYTES = 4096 + 64 + 512
XT_DS_AT = 4096
XT_BS_AT = 4160   # 8 vectors of 16 i32: the bsum pair (2k, 2k + 1) of each activation
MK_ROWS, MK_ACTS = 8, 16


def _raw_ptr(context, builder, arrty, arr, off):
    """i8* to byte ``off`` of any array's data (its element type ignored)."""
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.gep(builder.bitcast(data, i8.as_pointer()), [off])


def store_at(b, base, off, v):
    """Store vector or scalar ``v`` at byte ``off`` of i8* ``base`` (unaligned)."""
    b.store(v, b.bitcast(b.gep(base, [_c(off, i64)]), v.type.as_pointer()), align=1)


def _store_wide_tail(b, db, wb, csum, sc):
    """The 512-bit decoders' last fields: C (``BIAS`` times the lane sum of the <16 x i32>
    ``csum``), the scales ``sc`` and ``dc`` (the record's f16 ``d`` at byte 0; the format's
    constant c is 1)."""
    radd = decl(b, "llvm.vector.reduce.add.v16i32", i32, [vec(i32, 16)])
    store_at(b, db, DEC_C_AT, b.mul(b.call(radd, [csum]), _c(BIAS)))
    store_at(b, db, DEC_SC_AT, sc)
    d = gather_f16(b, [wb], 0)
    store_at(b, db, DEC_DC_AT, b.fmul(b.extract_element(d, _c(0)), ir.Constant(_F32, 1.0)))


def _decode_iq4_xs_into(b, wb, db):
    """``_decode_into`` of an IQ4_XS record with 512-bit steps: per 64-byte half of ``qs``,
    the low and high nibbles looked up by one ``vpshufb`` each (kvalues_iq4nl as int8) and
    interleaved by 16-byte chunks into element order (unit u: its low chunk, then its high
    one); C's per-unit sums of k by ``vpdpbusd`` with ones (lane j: 8 elements of unit 4h +
    j // 4, as ``_iq4_xs_row``), times the unit's scale: the same integers and bytes as the
    unit-by-unit decode."""
    v64, v16 = vec(i8, 64), vec(i32, 16)
    dpbusd = Ops(b, True, True).dpbusd
    ones = ir.Constant(v64, [1] * 64)
    sc = b.sext(_iq4_xs_scales(b, wb), vec(i32, 8))
    csum = None
    for h in range(2):
        lo, hi = _iq4_xs_lookups(b, wb, h, [v & 0xFF for v in _iq.KVALUES_IQ4NL])
        for half in range(2):   # units 4h + 2 half, 4h + 2 half + 1
            order = [64 * (j // 16 % 2) + 16 * (2 * half + j // 32) + j % 16 for j in range(64)]
            store_at(b, db, 128 * h + 64 * half,
                     b.shuffle_vector(lo, hi, ir.Constant(vec(i32, 64), order)))
        k = b.call(dpbusd, [b.call(dpbusd, [ir.Constant(v16, None), ones, lo]), ones, hi])
        t = _iq4_xs_scaled(b, sc, h, k)
        csum = t if csum is None else b.add(csum, t)
    _store_wide_tail(b, db, wb, csum, sc)


# IQ3_S's grid bytes are 1, 3, .., 15: an entry fits 16 bits as 4 nibbles, kept as two byte
# tables of 512 entries (bytes 0, 1 of the entry as the low and high nibble of _IQ3S_LO, bytes
# 2, 3 of _IQ3S_HI), 8 zmm each: an AVX-512 VBMI ``vpermi2b`` looks up 64 indices in 128 of them.
_IQ3S_LO = [(e & 0xF) | ((e >> 8) & 0xF) << 4 for e in _g.IQ3S_GRID]
_IQ3S_HI = [((e >> 16) & 0xF) | ((e >> 24) & 0xF) << 4 for e in _g.IQ3S_GRID]
assert all(((e >> (8 * j)) & 0xFF) < 16 for e in _g.IQ3S_GRID for j in range(4))
HAVE_VBMI = HAVE_AVX512 and "avx512vbmi" in FEATURES and "avx512vl" in FEATURES


def _iq3_s_nibbles(b, wb):
    """(lo, hi) <64 x i8>: the _IQ3S_LO and _IQ3S_HI bytes of the IQ3_S record ``wb``'s 64
    grid indices (qs byte i, bit i of the qh u64 as bit 8): one ``vpermi2b`` per table and
    quarter (the index's low 7 bits), the quarter chosen by bit 7 (``vpmovb2m``) and the qh
    bit (``kmovq``) by blends."""
    v64, k64 = vec(i8, 64), vec(ir.IntType(1), 64)
    perm = decl(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [v64, v64, v64])
    x = load(b, wb, _QS, v64)
    b7 = b.icmp_signed("<", x, ir.Constant(v64, None))
    b8 = b.bitcast(load(b, wb, _S3_QH, i64), k64)
    out = []
    for table in (_IQ3S_LO, _IQ3S_HI):
        quarter = []
        for t in range(4):
            lo, hi = (ir.Constant(v64, table[128 * t + 64 * h:128 * t + 64 * h + 64])
                      for h in range(2))
            quarter.append(b.call(perm, [lo, x, hi]))
        out.append(b.select(b8, b.select(b7, quarter[3], quarter[2]),
                            b.select(b7, quarter[1], quarter[0])))
    return out


def _iq3_s_grid64(b, lo, hi, c):
    """<64 x i8>: the unsigned grid bytes of elements 64 c .. 64 c + 63 from the nibbles
    ``lo``, ``hi`` (``_iq3_s_nibbles``): one ``vpermi2b`` puts entries e, e + 1's lo, hi bytes in
    bytes 0..3 of a qword, one ``vpmultishiftqb`` moves nibble j of them to byte j, an and
    keeps it."""
    v64 = vec(i8, 64)
    perm = decl(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [v64, v64, v64])
    mshift = decl(b, "llvm.x86.avx512.pmultishift.qb.512", v64, [v64, v64])
    order = [(16 * c + 2 * (n // 8) + (n % 8) // 2) + 64 * (n % 2) if n % 8 < 4 else 0
             for n in range(64)]
    pairs = b.call(perm, [lo, ir.Constant(v64, order), hi])
    ctrl = ir.Constant(v64, [4 * j for j in range(8)] * 8)
    return b.and_(b.call(mshift, [ctrl, pairs]), ir.Constant(v64, [0x0F] * 64))


def _units_iq3_s_vbmi(b, wb):
    """``_units_iq3_s`` with AVX-512 VBMI: the grid bytes of all 64 entries by the nibble tables
    (``_iq3_s_grid64``), as 4 wide units of 64 elements (``_iq2_units_vbmi``'s shape: 512-bit
    record sums by ``_pair64``)."""
    v = b.zext(splat_lanes(b, load(b, wb, _S3_SC, vec(i8, 4)), [s // 2 for s in range(8)]),
               vec(i16, 8))
    scales = _odd(b, _lanes(b, v, [4 * (s % 2) for s in range(8)], 15))
    lo, hi = _iq3_s_nibbles(b, wb)
    k64 = vec(ir.IntType(1), 64)
    return [(_iq3_s_grid64(b, lo, hi, c), b.bitcast(load(b, wb, _S3_SIGNS + 8 * c, i64), k64),
             splat_lanes(b, scales, [2 * c + k // 16 for k in range(32)])) for c in range(4)]


# IQ3_XXS's grid bytes take 8 values (4, 12, .., 52, 62): an entry is 4 codes 0..7, kept as
# nibbles in two byte tables of 256 entries as IQ3_S's (bytes 0, 1 of the entry in _IQ3XXS_LO,
# bytes 2, 3 in _IQ3XXS_HI), the code turned into its byte by one ``vpshufb`` per 64 elements.
_IQ3XXS_LEVELS = sorted({(e >> (8 * j)) & 0xFF for e in _g.IQ3XXS_GRID for j in range(4)})
assert len(_IQ3XXS_LEVELS) == 8


def _iq3xxs_code(e, j):
    return _IQ3XXS_LEVELS.index((e >> (8 * j)) & 0xFF)


_IQ3XXS_LO = [_iq3xxs_code(e, 0) | _iq3xxs_code(e, 1) << 4 for e in _g.IQ3XXS_GRID]
_IQ3XXS_HI = [_iq3xxs_code(e, 2) | _iq3xxs_code(e, 3) << 4 for e in _g.IQ3XXS_GRID]


def _iq3_xxs_grids(b, wb):
    """The 8 units' <32 x i8> grid bytes of the IQ3_XXS record ``wb`` with AVX-512 VBMI: the 64
    indices (qs bytes) looked up in the nibble tables by one ``vpermi2b`` per table and
    128-entry half (bit 7 choosing by a blend), spread to codes per 64 elements
    (``_iq3_s_grid64``) and turned into the grid bytes by ``vpshufb``."""
    v64 = vec(i8, 64)
    perm = decl(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [v64, v64, v64])
    shuf = decl(b, "llvm.x86.avx512.pshuf.b.512", v64, [v64, v64])
    x = load(b, wb, _QS, v64)
    b7 = b.icmp_signed("<", x, ir.Constant(v64, None))
    halves = []
    for table in (_IQ3XXS_LO, _IQ3XXS_HI):
        lo, hi = (b.call(perm, [ir.Constant(v64, table[128 * t:128 * t + 64]), x,
                                ir.Constant(v64, table[128 * t + 64:128 * t + 128])])
                  for t in range(2))
        halves.append(b.select(b7, hi, lo))
    levels = ir.Constant(v64, (_IQ3XXS_LEVELS + [0] * 8) * 4)
    grids = []
    for c in range(4):
        g64 = b.call(shuf, [levels, _iq3_s_grid64(b, halves[0], halves[1], c)])
        grids += [splat_lanes(b, g64, list(range(32 * h, 32 * h + 32))) for h in range(2)]
    return grids


def _decode_iq3_s_vbmi(b, wb, db):
    """``_decode_into`` of an IQ3_S record with AVX-512 VBMI: the 64 entries' nibbles
    (``_iq3_s_nibbles``), per 64 elements their grid bytes (``_iq3_s_grid64``) and the 64 sign
    bits as one k mask negating them (a masked ``vpsubb`` from 0); C's sums of q by
    ``vpdpbusd`` with ones (lane j: 4 elements of unit 2 c + j // 8) times the unit's scale: the
    same integers and bytes as the unit-by-unit decode."""
    v16, v64 = vec(i32, 16), vec(i8, 64)
    k64 = vec(ir.IntType(1), 64)
    dpbusd = Ops(b, True, True).dpbusd
    ones, zero = ir.Constant(v64, [1] * 64), ir.Constant(v16, None)
    lo, hi = _iq3_s_nibbles(b, wb)
    v8 = vec(i32, 8)
    codes = b.zext(splat_lanes(b, load(b, wb, _S3_SC, vec(i8, 4)), [s // 2 for s in range(8)]),
                   v8)
    sc = _odd(b, _lanes(b, codes, [4 * (s % 2) for s in range(8)], 15))
    csum = None
    for c in range(4):
        grid = _iq3_s_grid64(b, lo, hi, c)
        neg = b.bitcast(load(b, wb, _S3_SIGNS + 8 * c, i64), k64)
        w = b.select(neg, b.sub(ir.Constant(v64, None), grid), grid)
        store_at(b, db, 64 * c, w)
        t = b.mul(b.call(dpbusd, [zero, ones, w]),
                  splat_lanes(b, sc, [2 * c + j // 8 for j in range(16)]))
        csum = t if csum is None else b.add(csum, t)
    _store_wide_tail(b, db, wb, csum, sc)



# IQ2's grid bytes are 8, 25, 43: an entry fits 16 bits as 8 2-bit codes (0, 1, 2), kept as two
# byte tables (codes of bytes 0..3 of the entry in _IQ2_LO, of bytes 4..7 in _IQ2_HI; code j at
# bits 2 j), looked up 64 indices at a time by ``vpermi2b`` as IQ3_S's nibbles, the 128-entry
# quarter chosen by the index's bits 7 (8, 9) by blends; a ``vpmultishiftqb`` puts code j of an
# entry's 16 bits in the low bits of byte j and a ``vpermb`` maps them to the grid bytes.
_IQ2_LEVELS = (8, 25, 43)


def _iq2_code_tables(grid):
    code = {v: k for k, v in enumerate(_IQ2_LEVELS)}
    assert all(((e >> (8 * j)) & 0xFF) in code for e in grid for j in range(8))
    return [[sum(code[(e >> (8 * (4 * h + j))) & 0xFF] << (2 * j) for j in range(4))
             for e in grid] for h in range(2)]


_IQ2_CODES = {name: _iq2_code_tables(grid) for name, grid in (
    ("iq2xxs", _g.IQ2XXS_GRID), ("iq2xs", _g.IQ2XS_GRID), ("iq2s", _g.IQ2S_GRID))}


def _iq2_codes(b, table, x, highs):
    """(lo, hi) <64 x i8>: the _IQ2_CODES[table] bytes at the indices of the 64 bytes ``x``
    (bits 0..6; bit 7 of the byte and the <64 x i1> masks ``highs`` as bits 8, 9: the quarter,
    by blends)."""
    v64 = vec(i8, 64)
    perm = decl(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [v64, v64, v64])
    bits = [b.icmp_signed("<", x, ir.Constant(v64, None))] + list(highs)
    out = []
    for codes in _IQ2_CODES[table]:
        level = []
        for t in range(len(codes) // 128):
            lo, hi = (ir.Constant(v64, codes[128 * t + 64 * h:128 * t + 64 * h + 64])
                      for h in range(2))
            level.append(b.call(perm, [lo, x, hi]))
        for k in bits:
            level = [b.select(k, level[i + 1], level[i]) for i in range(0, len(level), 2)]
        assert len(level) == 1
        out.append(level[0])
    return out


def _iq2_grid64(b, lo, hi, at):
    """<64 x i8>: the grid bytes of the 8 entries whose codes are at bytes ``at`` (8 positions)
    of ``lo``, ``hi`` (``_iq2_codes``): one ``vpermi2b`` puts entry q's lo, hi bytes in bytes 0,
    1 of qword q, one ``vpmultishiftqb`` code j in the low 2 bits of byte j, one ``vpermb``
    (index bits 0..5) the grid byte of the code."""
    v64 = vec(i8, 64)
    perm = decl(b, "llvm.x86.avx512.vpermi2var.qi.512", v64, [v64, v64, v64])
    mshift = decl(b, "llvm.x86.avx512.pmultishift.qb.512", v64, [v64, v64])
    permb = decl(b, "llvm.x86.avx512.permvar.qi.512", v64, [v64, v64])
    order = [at[n // 8] + 64 * (n % 8) if n % 8 < 2 else 0 for n in range(64)]
    pairs = b.call(perm, [lo, ir.Constant(v64, order), hi])
    codes = b.call(mshift, [ir.Constant(v64, [2 * j for j in range(8)] * 8), pairs])
    values = ir.Constant(v64, [(_IQ2_LEVELS + (0,))[i % 4] for i in range(64)])
    return b.call(permb, [values, codes])


def _iq2_units_vbmi(b, lo, hi, at, signs, scales):
    """The units of an IQ2 record from its codes ``lo``, ``hi`` (``_iq2_codes``) as 4 wide
    units of 64 elements (units 2 c, 2 c + 1: grid <64 x i8>, sign mask <64 x i1>, scales <32 x
    i16>; ``_pair`` takes them in 512-bit steps, ``_narrow`` splits them): unit s's 4 entries
    at bytes ``at(s, k)``, ``signs(c)`` the mask of units 2 c, 2 c + 1."""
    n = scales.type.count      # 8: one scale per 32 elements, 16: per 16
    out = []
    for c in range(4):
        g64 = _iq2_grid64(b, lo, hi, [at(2 * c + q // 4, q % 4) for q in range(8)])
        sc = splat_lanes(b, scales, [(2 * c + k // 16) if n == 8 else (4 * c + k // 8)
                                     for k in range(32)])
        out.append((g64, signs(c), sc))
    return out


def _bits_to_masks64(b, signs, at):
    """<64 x i1>: element k negated where bit k % 8 of byte ``at + k // 8`` of the <32 x i8>
    ``signs`` is set (``vptestmb``)."""
    v64 = vec(i8, 64)
    v = splat_lanes(b, signs, [at + k // 8 for k in range(64)])
    bit = ir.Constant(v64, [1 << (k % 8) for k in range(64)])
    return b.icmp_unsigned("!=", b.and_(v, bit), ir.Constant(v64, None))


def _narrow(b, units):
    """``units`` with each wide unit of 64 elements (``_iq2_units_vbmi``) split into the two
    units of 32 it holds."""
    if units[0][0].type.count == 32:
        return units
    out = []
    for grid, signs, sc in units:
        for h in range(2):
            half = list(range(32 * h, 32 * h + 32))
            out.append((splat_lanes(b, grid, half), splat_lanes(b, signs, half),
                        splat_lanes(b, sc, list(range(16 * h, 16 * h + 16)))))
    return out


def _units_iq2_xxs_vbmi(b, wb):
    """``_units_iq2_xxs`` with AVX-512 VBMI (``_iq2_codes``: the index bytes of unit s at qs
    bytes 8 s .. 8 s + 3)."""
    words = load(b, wb, _QS, vec(i32, 16))
    aux = splat_lanes(b, words, [2 * s + 1 for s in range(8)])
    sb = _ksigns_of_aux(b, aux)
    scales = _odd(b, b.trunc(b.lshr(aux, ir.Constant(vec(i32, 8), [28] * 8)), vec(i16, 8)))
    lo, hi = _iq2_codes(b, "iq2xxs", b.bitcast(words, vec(i8, 64)), [])
    return _iq2_units_vbmi(b, lo, hi, lambda s, k: 8 * s + k,
                           lambda c: _bits_to_masks64(b, sb, 8 * c), scales)


def _units_iq2_xs_vbmi(b, wb):
    """``_units_iq2_xs`` with AVX-512 VBMI: index l of unit s (9 bits of qs word 4 s + l) looked
    up at its low byte, its bit 8 the sign bit of the word shifted right by one."""
    v64 = vec(i8, 64)
    words = load(b, wb, _QS, vec(i16, 32))
    sb = _even_parity(b, b.trunc(b.lshr(words, ir.Constant(vec(i16, 32), [9] * 32)), _V32))
    b8 = b.icmp_signed("<", b.bitcast(b.lshr(words, ir.Constant(vec(i16, 32), [1] * 32)), v64),
                       ir.Constant(v64, None))
    lo, hi = _iq2_codes(b, "iq2xs", b.bitcast(words, v64), [b8])
    return _iq2_units_vbmi(b, lo, hi, lambda s, k: 2 * (4 * s + k),
                           lambda c: _bits_to_masks64(b, sb, 8 * c),
                           _nibble_scale_vector(b, wb, _XS2_SC))


def _units_iq2_s_vbmi(b, wb):
    """``_units_iq2_s`` with AVX-512 VBMI: index p = 4 s + k's bits 8, 9 are bits 2 p, 2 p + 1
    of the qh u64 (``pext`` into two masks)."""
    k64 = vec(ir.IntType(1), 64)
    pext = decl(b, "llvm.x86.bmi.pext.64", i64, [i64, i64])
    qh = load(b, wb, _S2_QH, i64)
    highs = [b.bitcast(b.call(pext, [qh, _c(m, i64)]), k64)
             for m in (0x5555555555555555, 0xAAAAAAAAAAAAAAAA)]
    lo, hi = _iq2_codes(b, "iq2s", load(b, wb, _QS, vec(i8, 64)), highs)
    return _iq2_units_vbmi(b, lo, hi, lambda s, k: 4 * s + k,
                           lambda c: b.bitcast(load(b, wb, _S2_SIGNS + 8 * c, i64),
                                               vec(ir.IntType(1), 64)),
                           _nibble_scale_vector(b, wb, _S2_SC))


# the formats' 512-bit panel decoders, where the target has what they need (the decode runs
# only where it has AVX-512 VNNI: ``HAVE_GEMM_TILES``)
_DECODE_WIDE = {"iq4_xs": _decode_iq4_xs_into} if _IQ4_XS_ROWS else {}
if HAVE_VBMI and _IQ4_XS_ROWS:
    _DECODE_WIDE["iq3_s"] = _decode_iq3_s_vbmi


def _decode_into(b, kf, wb, db, wide=True):
    """Store weight record ``wb`` of format ``kf`` decoded at ``db`` (layout above); ``wide``:
    through the format's 512-bit decoder where it has one (``_DECODE_WIDE``; without, the
    unit-by-unit decode: same bytes; wide units of 64 elements, IQ2 with VBMI, in 512-bit
    steps)."""
    if wide and kf.name in _DECODE_WIDE:
        return _DECODE_WIDE[kf.name](b, wb, db)
    units = kf.units(b, wb)
    n = units[0][0].type.count      # 64: wide units (``_iq2_units_vbmi``), in 512-bit steps
    ops = Ops(b, n == 64, False)
    ones = ir.Constant(vec(i8, n), [1] * n)
    csum = None
    for u, (grid, signs, sc) in enumerate(units):
        if signs is None:
            w = grid
        elif n == 64:
            w = b.select(signs, b.sub(ir.Constant(grid.type, None), grid), grid)
        else:
            signs = _byte_masks(b, signs)
            w = b.sub(b.xor(grid, signs), signs)
        store_at(b, db, n * u, w)
        m = b.call(ops.maddwd, [b.call(ops.maddubs, [ones, w]), sc])   # (2 ls + 1) q pairs
        csum = m if csum is None else b.add(csum, m)
    radd = decl(b, f"llvm.vector.reduce.add.v{n // 4}i32", i32, [vec(i32, n // 4)])
    store_at(b, db, DEC_C_AT, b.mul(b.call(radd, [csum]), _c(BIAS)))
    lanes = list(range(0, n // 2, kf.sub // 2))   # sc's first i16 lane of each scale span
    k = 0
    for _, _, sc in units:
        for lane in lanes:
            store_at(b, db, DEC_SC_AT + 4 * k, b.sext(b.extract_element(sc, _c(lane)), i32))
            k += 1
    d = _d_iq1_m(b, [wb]) if kf.d_at is None else gather_f16(b, [wb], kf.d_at)
    dc = b.fmul(b.extract_element(d, _c(0)), ir.Constant(_F32, kf.c))   # exact: c = 2**-k
    store_at(b, db, DEC_DC_AT, dc)


def decode_intrinsic(write):
    """Intrinsic ``decode(w, w_off, dec, d_off)``: ``write(builder, wb, db)`` stores the record
    at byte ``w_off`` of uint8 array ``w`` decoded into ``DEC_BYTES`` at byte ``d_off`` of
    array ``dec`` (the panel gemm's decode: this module's formats, simd/kquants.py's Q3_K and
    Q6_K)."""
    @intrinsic
    def decode(typingctx, w, w_off, dec, d_off):
        if not (isinstance(w, types.Array) and isinstance(dec, types.Array)):
            return None
        sig = types.none(w, types.intp, dec, types.intp)

        def codegen(context, builder, signature, args):
            wb = _raw_ptr(context, builder, signature.args[0], args[0], args[1])
            db = _raw_ptr(context, builder, signature.args[2], args[2], args[3])
            write(builder, wb, db)
            return context.get_dummy_value()
        return sig, codegen
    return decode


def _make_decode(name):
    """The panel decode of format ``name`` (``_decode_into``)."""
    return decode_intrinsic(lambda b, wb, db: _decode_into(b, FORMATS[name], wb, db))


def _splat_load(b, ptr, ty, n):
    """<n x ty>: the scalar at ``ptr`` (i8*) in every lane."""
    v = b.load(b.bitcast(ptr, ty.as_pointer()), align=1)
    z = ir.Constant(vec(ty, 1), None)
    return b.shuffle_vector(b.insert_element(z, v, _c(0)), z,
                            ir.Constant(vec(i32, n), [0] * n))


def _make_microtile(sub, mins=False, prescaled=False):
    """Intrinsic ``mk(dec, d_off, r_step, xt, x_off, acc, first)``: record values of
    ``MK_ROWS`` decoded weight records (at bytes ``d_off + t * r_step`` of ``dec``; ``sub``
    elements per scale) against the ``MK_ACTS`` activations of the tile record at byte
    ``x_off`` of ``xt``, folded into ``acc.flat[16 t : 16 t + 16]`` (f32) for row t
    (``first``: the fold's first record).  With ``mins``, T = sum_j m_j bsum_j (``vpdpwssd``
    over the bsum pairs, exact) and v = R32(ds * R32(R32(dc * f32(S)) - R32(dmin * f32(T)))).
    ``prescaled``: the decoded quants carry their scale already (Q2_K's u sc), S is one
    vpdpbusd chain per row over the record, no scale products."""
    @intrinsic
    def microtile(typingctx, dec, d_off, r_step, xt, x_off, acc, first):
        if not all(isinstance(a, types.Array) for a in (dec, xt, acc)):
            return None
        sig = types.none(dec, types.intp, types.intp, xt, types.intp, acc, types.boolean)

        def codegen(context, builder, signature, args):
            b = builder
            nsub, quads = 256 // sub, sub // 4
            v16, f16v = vec(i32, 16), vec(_F32, 16)
            ops = Ops(b, True, True)
            dec_v, d_off_v, r_step_v, xt_v, x_off_v, acc_v, first_v = args
            rows = [_raw_ptr(context, b, signature.args[0], dec_v,
                             b.add(d_off_v, b.mul(r_step_v, ir.Constant(r_step_v.type, t))))
                    for t in range(MK_ROWS)]
            xb = _raw_ptr(context, b, signature.args[3], xt_v, x_off_v)

            def at(p, off):
                return b.gep(p, [_c(off, i64)])

            # an empty inline-asm statement that clobbers memory after each quad step: the
            # row's broadcast loads then stay beside their vpdpbusd (a {1to16} memory
            # operand); left alone, LLVM hoisted them all and spilled
            fence = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "", "~{memory}",
                                 side_effect=True)
            # and an empty one that returns its operand in the same register: each sub-block's
            # product is added when it is made (LLVM otherwise kept them all for one sum at
            # the end, and spilled)
            keep = ir.InlineAsm(ir.FunctionType(v16, [v16]), "", "=v,0", side_effect=False)
            zero = ir.Constant(v16, None)
            s1 = [None] * MK_ROWS
            for s in range(nsub):
                a = [zero] * MK_ROWS
                for g in range(quads):
                    kq = s * quads + g
                    xq = b.load(b.bitcast(at(xb, 64 * kq), v16.as_pointer()), align=1)
                    for t in range(MK_ROWS):
                        wq = _splat_load(b, at(rows[t], 4 * kq), i32, 16)
                        a[t] = vcall(b, ops.dpbusd, [a[t], xq, wq])
                    b.call(fence, [])
                if prescaled:      # independent chains per sub-block, summed as they end
                    for t in range(MK_ROWS):
                        s1[t] = a[t] if s1[t] is None else b.call(keep, [b.add(s1[t], a[t])])
                    continue
                for t in range(MK_ROWS):
                    m = b.mul(a[t], _splat_load(b, at(rows[t], DEC_SC_AT + 4 * s), i32, 16))
                    s1[t] = m if s1[t] is None else b.call(keep, [b.add(s1[t], m)])
            ds = b.load(b.bitcast(at(xb, XT_DS_AT), f16v.as_pointer()), align=1)
            accp = float_array_ptr(context, b, signature.args[5], acc_v)
            if mins:
                bs = [b.load(b.bitcast(at(xb, XT_BS_AT + 64 * k), v16.as_pointer()), align=1)
                      for k in range(8)]
            for t in range(MK_ROWS):
                st = b.sub(s1[t], _splat_load(b, at(rows[t], DEC_C_AT), i32, 16))
                dc = _splat_load(b, at(rows[t], DEC_DC_AT), _F32, 16)
                p = b.fmul(dc, b.sitofp(st, f16v))
                if mins:
                    tt = zero
                    for k in range(8):
                        mk = _splat_load(b, at(rows[t], DEC_M_AT + 4 * k), i32, 16)
                        tt = vcall(b, ops.dpwssd, [tt, bs[k], mk])
                    dmin = _splat_load(b, at(rows[t], DEC_DMIN_AT), _F32, 16)
                    p = b.fsub(p, b.fmul(dmin, b.sitofp(tt, f16v)))
                v = b.fmul(ds, p)
                fold_into(b, b.gep(accp, [_c(16 * t)]), v, b.zext(first_v, i32))
            return context.get_dummy_value()
        return sig, codegen
    return microtile


# {t}_q8_k_s_{avx2, avx2vnni}: S (the tests check both against the loops); {t}_q8_k_value,
# {t}_acts_x8 and {t}_rows_x8 with VNNI where the target has it.  The 8-row gemv tile decodes its
# records one after the other (``_sums_one_by_one``): left to interleave them, LLVM spilled and
# the tile of the formats with qh index bits or IQ1 shifts ran 1.1-3.4x the time of 8 record
# values; serialised, it saves each record's horizontal sum and float steps (one reduction and
# one vector of 8 values per tile) and beat the record values row by row for every format
# (bench/RESULTS_iq_grid.md).
VARIANTS = {"avx2": False, "avx2vnni": True}

__all__ = []
for _name in FORMATS:
    for _var, _v in VARIANTS.items():
        globals()[f"{_name}_q8_k_s_{_var}"] = _make_record(_name, _v, False)
        __all__.append(f"{_name}_q8_k_s_{_var}")
    globals()[f"{_name}_q8_k_value"] = _make_record(_name, HAVE_VNNI, True)
    globals()[f"{_name}_acts_x8"] = _make_tile(_name, HAVE_VNNI, False)
    __all__ += [f"{_name}_q8_k_value", f"{_name}_acts_x8"]
    globals()[f"{_name}_rows_x8"] = _make_tile(_name, HAVE_VNNI, True)
    __all__.append(f"{_name}_rows_x8")
    globals()[f"{_name}_decode"] = _make_decode(_name)
    __all__.append(f"{_name}_decode")
del _name, _var, _v
# The gemm microtiles (one per scale span) where the target has AVX-512 VNNI.
HAVE_GEMM_TILES = HAVE_VNNI and HAVE_AVX512
microtile_sub32 = _make_microtile(32)
microtile_sub16 = _make_microtile(16)
microtile_sub32_mins = _make_microtile(32, mins=True)
microtile_prescaled_mins = _make_microtile(32, mins=True, prescaled=True)
__all__ += ["microtile_sub32", "microtile_sub16", "microtile_sub32_mins",
            "microtile_prescaled_mins", "HAVE_GEMM_TILES"]
