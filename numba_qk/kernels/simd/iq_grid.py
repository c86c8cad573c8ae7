"""Explicit-SIMD record sums of the grid IQ formats against Q8_K (IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; LLVM IR through numba intrinsics, the plumbing of ``base.py``):
the record value ``v``, the 8-row gemv tile and the 8-activation gemm tile of the driver
(``kernels/drive.py``), registered by ``kernels/iq/grid.py``.

Integer work (exact in any order, so these give the integers of the readable loops
``record_sums_<t>_q8_k`` of ``kernels/iq/grid.py``), per record pair, in units of 32 elements in
element order::

    w      = the unit's signed element multipliers q as int8 (|q| <= 62; IQ1: 8 grid +- 1, |q|
             <= 9): grid entries gathered from the tables (one u64 per 8 elements, one u32 per
             4 for IQ3) by the record's indices, signs as byte masks m (0 / -1: ksigns_iq2xs
             through a 128-entry u64 table of masks, or the 8 plain sign bits compared with
             [1, 2, 4, ..., 128]); IQ1 adds its +-1 per sub-block (IQ1_S) or group (IQ1_M)
    w'     = (grid ^ mm) - mm, mm = m ^ (xq >> 7)    w with the sign of xq applied (a
                                                     conditional negate: |w| <= 62 never wraps)
    p      = pmaddubsw(|xq|, w')                     i16 lane = |x0| w0' + |x1| w1' = x0 w0 + x1 w1
                                                     |.| <= 2 * 128 * 62 (no saturation; |xq| as
                                                     u8: |-128| = 128 is exact)
    acc   += pmaddwd(p, sc16)                        sc16: each i16 lane's 2 ls + 1 (vpdpwssd
                                                     with AVX-512 VNNI: the same sum)
    S      = reduce_add(acc)                         |S| < 2**31 (docs/numerics_iq_grid.md)

The float steps are those of ``record_value`` in ``kernels/iq/grid.py`` (one IEEE instruction
each, no fast-math, in the same order): ``v = R32(ds * R32(R32(d * c) * f32(S)))``.  Tiles: 8
weight records against one activation record (gemv) or one weight record against 8 activation
records (gemm), the shared record decoded once, the 8 values folded lane by lane
(``base.fold_into``).  The record's bytes must be contiguous (the driver checks it).

The grid and sign tables are module constants of the generated code (internal LLVM globals,
built from ``numba_qk.formats.iq_grids``, ggml's data).
"""

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numba_qk.formats import iq as _iq
from numba_qk.formats import iq_grids as _g
from numba_qk.formats import quant
from numba_qk.kernels.simd.base import (HAVE_VNNI, Ops, byte_ptr, decl, gather_f16, gather_f32,
                                        i8, i16, i32, i64, load, reduce_many, splat_lanes,
                                        tile_intrinsic, vec)

_A_DS_AT = quant.q8_k.field("ds").start
_A_Q_AT = quant.q8_k.field("q").start
_V32 = vec(i8, 32)
_F32 = ir.FloatType()


# ---- tables --------------------------------------------------------------------------------

def _sign_masks(ksigns):
    """u64 per 7-bit sign index: byte j = 0xFF where bit j of ksigns_iq2xs is set, else 0."""
    return [sum(0xFF << (8 * j) for j in range(8) if (s >> j) & 1) for s in ksigns]


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


_TABLES = {
    "ksigns_masks": (i64, _sign_masks(_g.KSIGNS_IQ2XS)),
    "iq2xxs": (i64, list(_g.IQ2XXS_GRID)),
    "iq2xs": (i64, list(_g.IQ2XS_GRID)),
    "iq2s": (i64, list(_g.IQ2S_GRID)),
    "iq3xxs": (i32, list(_g.IQ3XXS_GRID)),
    "iq3s": (i32, list(_g.IQ3S_GRID)),
    "iq1s_q": (i64, _iq1_q(_g.IQ1S_GRID)),
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


def _entry(b, name, idx):
    """Entry ``idx`` (an i32 value) of table ``name``."""
    gv = _table(b, name)
    ptr = b.gep(gv, [ir.Constant(i32, 0), b.zext(idx, i64) if idx.type != i64 else idx],
                inbounds=True)
    return b.load(ptr)


# ---- scalar field reads (i32 results) ----------------------------------------------------------

def _c(v, t=i32):
    return ir.Constant(t, v)


def _u8(b, wb, off):
    return b.zext(load(b, wb, off, i8), i32)


def _u16(b, wb, off):
    return b.zext(load(b, wb, off, i16), i32)


def _u32(b, wb, off):
    return load(b, wb, off, i32)


def _shr(b, v, n):
    return b.lshr(v, _c(n, v.type)) if n else v


def _shl(b, v, n):
    return b.shl(v, _c(n, v.type)) if n else v


def _and(b, v, m):
    return b.and_(v, _c(m, v.type))


# ---- vector builders ---------------------------------------------------------------------------

def _pack(b, vals):
    """<32 x i8> from 4 i64 or 8 i32 scalars (element order)."""
    t = vals[0].type
    v = ir.Constant(vec(t, len(vals)), None)
    for k, x in enumerate(vals):
        v = b.insert_element(v, x, _c(k))
    return b.bitcast(v, _V32)


def _bits_to_masks(b, word):
    """<32 x i8>: byte 8k + j = -1 where bit j of byte k of the i32 ``word`` is set, else 0."""
    v = b.bitcast(b.insert_element(ir.Constant(vec(i32, 8), None), word, _c(0)), _V32)
    v = splat_lanes(b, v, [k // 8 for k in range(32)])
    bit = ir.Constant(_V32, [1 << (k % 8) for k in range(32)])
    return b.sext(b.icmp_unsigned("==", b.and_(v, bit), bit), _V32)


def _scales(b, codes):
    """<16 x i16> of pmaddubsw lanes: 2 ls + 1 for each of the i32 scale codes ``codes`` (one
    per 32 elements: all lanes; two, per 16 elements: lanes 0-7 and 8-15)."""
    v = ir.Constant(vec(i16, 2), None)
    for k, ls in enumerate(codes):
        v = b.insert_element(v, b.trunc(b.add(b.add(ls, ls), _c(1)), i16), _c(k))
    if len(codes) == 1:
        return splat_lanes(b, v, [0] * 16)
    return splat_lanes(b, v, [k // 8 for k in range(16)])


# ---- per-format weight units: [(grid <32 x i8>, sign mask <32 x i8> or None, sc16)] ----------

class _Fmt:
    """A grid format's layout (byte offsets from its schema), its constant ``c`` and the
    decoding of one record into 8 units of 32 elements."""

    def __init__(self, fmt, c, units, d_at=0):
        self.fmt, self.name, self.c, self.units, self.d_at = fmt, fmt.name.lower(), c, units, d_at


_QS = 2


def _ksign_masks(b, aux, l):
    return _entry(b, "ksigns_masks", _and(b, _shr(b, aux, 7 * l), 127))


def _units_iq2_xxs(b, wb):
    out = []
    for s in range(8):
        aux = _u32(b, wb, _QS + 8 * s + 4)
        grid = _pack(b, [_entry(b, "iq2xxs", _u8(b, wb, _QS + 8 * s + l)) for l in range(4)])
        signs = _pack(b, [_ksign_masks(b, aux, l) for l in range(4)])
        out.append((grid, signs, _scales(b, [_shr(b, aux, 28)])))
    return out


_XS2_SC = _iq.iq2_xs.field("ls").start


def _units_iq2_xs(b, wb):
    out = []
    for s in range(8):
        vs = [_u16(b, wb, _QS + 8 * s + 2 * l) for l in range(4)]
        grid = _pack(b, [_entry(b, "iq2xs", _and(b, v, 511)) for v in vs])
        signs = _pack(b, [_entry(b, "ksigns_masks", _shr(b, v, 9)) for v in vs])
        sc = _u8(b, wb, _XS2_SC + s)
        out.append((grid, signs, _scales(b, [_and(b, sc, 15), _shr(b, sc, 4)])))
    return out


_S2_SIGNS = _iq.iq2_s.field("signs").start
_S2_QH = _iq.iq2_s.field("qh").start
_S2_SC = _iq.iq2_s.field("ls").start


def _units_iq2_s(b, wb):
    out = []
    for s in range(8):
        qh = _u8(b, wb, _S2_QH + s)
        idx = [b.or_(_u8(b, wb, _QS + 4 * s + l), _and(b, _shl(b, qh, 8 - 2 * l), 0x300))
               for l in range(4)]
        grid = _pack(b, [_entry(b, "iq2s", i) for i in idx])
        signs = _bits_to_masks(b, _u32(b, wb, _S2_SIGNS + 4 * s))
        sc = _u8(b, wb, _S2_SC + s)
        out.append((grid, signs, _scales(b, [_and(b, sc, 15), _shr(b, sc, 4)])))
    return out


_XXS3_AUX = _iq.iq3_xxs.field("signs").start


def _units_iq3_xxs(b, wb):
    out = []
    for s in range(8):
        aux = _u32(b, wb, _XXS3_AUX + 4 * s)
        grid = _pack(b, [_entry(b, "iq3xxs", _u8(b, wb, _QS + 8 * s + h)) for h in range(8)])
        signs = _pack(b, [_ksign_masks(b, aux, l) for l in range(4)])
        out.append((grid, signs, _scales(b, [_shr(b, aux, 28)])))
    return out


_S3_QH = _iq.iq3_s.field("qh").start
_S3_SIGNS = _iq.iq3_s.field("signs").start
_S3_SC = _iq.iq3_s.field("ls").start


def _units_iq3_s(b, wb):
    out = []
    for s in range(8):
        qh = _u8(b, wb, _S3_QH + s)
        idx = [b.or_(_u8(b, wb, _QS + 8 * s + h), _and(b, _shl(b, qh, 8 - h), 256))
               for h in range(8)]
        grid = _pack(b, [_entry(b, "iq3s", i) for i in idx])
        signs = _bits_to_masks(b, _u32(b, wb, _S3_SIGNS + 4 * s))
        ls = _and(b, _shr(b, _u8(b, wb, _S3_SC + s // 2), 4 * (s % 2)), 15)
        out.append((grid, signs, _scales(b, [ls])))
    return out


_S1_QH = _iq.iq1_s.field("qh").start
_ONES = 0x0101010101010101


def _units_iq1_s(b, wb):
    out = []
    for s in range(8):
        qh = _u16(b, wb, _S1_QH + 2 * s)
        idx = [b.or_(_u8(b, wb, _QS + 4 * s + l), _shl(b, _and(b, _shr(b, qh, 3 * l), 7), 8))
               for l in range(4)]
        q8g = _pack(b, [_entry(b, "iq1s_q", i) for i in idx])
        neg = b.icmp_unsigned("!=", _and(b, qh, 0x8000), _c(0))
        delta = b.select(neg, ir.Constant(_V32, [-1 & 0xFF] * 32), ir.Constant(_V32, [1] * 32))
        out.append((b.add(q8g, delta), None, _scales(b, [_and(b, _shr(b, qh, 12), 7)])))
    return out


_M1_QH = _iq.iq1_m.field("qh").start
_M1_SC = _iq.iq1_m.field("ls").start


def _units_iq1_m(b, wb):
    out = []
    words = [_u16(b, wb, _M1_SC + 2 * t) for t in range(4)]
    for s in range(8):
        qs, deltas = [], []
        for l in range(4):
            qh = _u8(b, wb, _M1_QH + 2 * s + l // 2)
            hi = _and(b, _shr(b, qh, 4 * (l % 2)), 7)
            e = _entry(b, "iq1s_q", b.or_(_u8(b, wb, 4 * s + l), _shl(b, hi, 8)))
            neg = b.icmp_unsigned("!=", _and(b, qh, 8 << (4 * (l % 2))), _c(0))
            qs.append(e)
            deltas.append(b.select(neg, _c(-1, i64), _c(_ONES, i64)))
        ls = [_and(b, _shr(b, words[(2 * s + h) // 4], 3 * ((2 * s + h) % 4)), 7)
              for h in range(2)]
        out.append((b.add(_pack(b, qs), _pack(b, deltas)), None, _scales(b, ls)))
    return out


def _d_iq1_m(b, wb):
    """The f16 super-block scale of an IQ1_M record (its scale words' top nibbles) as f32."""
    words = [_u16(b, wb, _M1_SC + 2 * t) for t in range(4)]
    bits = b.or_(b.or_(_shr(b, words[0], 12), _and(b, _shr(b, words[1], 8), 0x00F0)),
                 b.or_(_and(b, _shr(b, words[2], 4), 0x0F00), _and(b, words[3], 0xF000)))
    return b.fpext(b.bitcast(b.trunc(bits, i16), ir.HalfType()), _F32)


FORMATS = {f.name: f for f in (
    _Fmt(_iq.iq2_xxs, 0.125, _units_iq2_xxs),
    _Fmt(_iq.iq2_xs, 0.125, _units_iq2_xs),
    _Fmt(_iq.iq2_s, 0.125, _units_iq2_s),
    _Fmt(_iq.iq3_xxs, 0.25, _units_iq3_xxs),
    _Fmt(_iq.iq3_s, 1.0, _units_iq3_s),
    _Fmt(_iq.iq1_s, 0.125, _units_iq1_s),
    _Fmt(_iq.iq1_m, 0.125, _units_iq1_m, d_at=None),
)}


# ---- sums and values ---------------------------------------------------------------------------

def _x_side(b, xb):
    """Per unit of 32 activation quants: (|xq| as u8, xq >> 7 (0 / -1 per byte))."""
    out = []
    for u in range(8):
        x = load(b, xb, _A_Q_AT + 32 * u, _V32)
        neg = b.ashr(x, ir.Constant(_V32, [7] * 32))
        out.append((b.sub(b.xor(x, neg), neg), neg))
    return out


def _pair(b, ops, units, xside):
    """<8 x i32> whose lane sum is S of one decoded weight record and one Q8_K record."""
    acc = None
    for (grid, signs, sc), (ax, xneg) in zip(units, xside):
        mm = xneg if signs is None else b.xor(signs, xneg)
        w = b.sub(b.xor(grid, mm), mm)
        p = b.call(ops.maddubs, [ax, w])
        if ops.dpwssd is not None:
            acc = b.call(ops.dpwssd, [acc if acc is not None else ir.Constant(vec(i32, 8), None),
                                      p, sc])
        else:
            m = b.call(ops.maddwd, [p, sc])
            acc = m if acc is None else b.add(acc, m)
    return acc


def _sums(b, ops, kf, wbs, xbs):
    """<n x i32> S of the record pairs zip(wbs, xbs); a record listed several times (the same
    IR value) is decoded once."""
    wdec, xdec, s = {}, {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in wdec:
            wdec[id(wb)] = kf.units(b, wb)
        if id(xb) not in xdec:
            xdec[id(xb)] = _x_side(b, xb)
        s.append(_pair(b, ops, wdec[id(wb)], xdec[id(xb)]))
    return reduce_many(b, s)


def _values(b, ops, kf, wbs, xbs):
    """<n x float> record values: v = R32(ds * R32(R32(d * c) * f32(S))), lane by lane."""
    n = len(wbs)
    s = _sums(b, ops, kf, wbs, xbs)
    if kf.d_at is None:
        d = ir.Constant(vec(_F32, n), None)
        seen = {}
        for k, wb in enumerate(wbs):
            if id(wb) not in seen:
                seen[id(wb)] = _d_iq1_m(b, wb)
            d = b.insert_element(d, seen[id(wb)], _c(k))
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
    @intrinsic
    def record(typingctx, w, w_off, x, x_off):
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = (types.float32 if value else types.int32)(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            kf, ops = FORMATS[name], Ops(builder, False, vnni)
            wb = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            xb = byte_ptr(context, builder, signature.args[2], args[2], args[3])
            if value:
                r = _values(builder, ops, kf, [wb], [xb])
            else:
                r = _sums(builder, ops, kf, [wb], [xb])
            return builder.extract_element(r, _c(0))
        return sig, codegen
    return record


def _make_tile(name, vnni, over_rows):
    def make_values(builder):
        kf, ops = FORMATS[name], Ops(builder, False, vnni)
        return lambda wbs, xbs: _values(builder, ops, kf, wbs, xbs)
    return tile_intrinsic(over_rows, 8, make_values)


# {t}_q8_k_s_{avx2, avx2vnni}: S (the tests check both against the loops); {t}_q8_k_value,
# {t}_rows_x8, {t}_acts_x8 with VNNI where the target has it.
VARIANTS = {"avx2": False, "avx2vnni": True}

__all__ = []
for _name in FORMATS:
    _t = _name.lower()
    for _var, _v in VARIANTS.items():
        globals()[f"{_t}_q8_k_s_{_var}"] = _make_record(_name, _v, False)
        __all__.append(f"{_t}_q8_k_s_{_var}")
    globals()[f"{_t}_q8_k_value"] = _make_record(_name, HAVE_VNNI, True)
    globals()[f"{_t}_rows_x8"] = _make_tile(_name, HAVE_VNNI, True)
    globals()[f"{_t}_acts_x8"] = _make_tile(_name, HAVE_VNNI, False)
    __all__ += [f"{_t}_q8_k_value", f"{_t}_rows_x8", f"{_t}_acts_x8"]
del _name, _t, _var, _v
