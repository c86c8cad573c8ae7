"""Explicit-SIMD record values of IQ4_NL against Q8_0 (LLVM IR through numba intrinsics, the
plumbing of ``base.py``): the record value and the 8-lane tiles of the driver
(``kernels/drive.py``), registered by ``kernels/iq/iq4.py``, and the record decoder of its
batched gemm (``iq4_nl_panel_decode``: the legacy formats' panel layout, see simd/legacy.py);
equal bit for bit to its portable loops.

Integers, per record pair (exact in any order): the 16 code bytes split into nibbles, low ones
first (elements 0..15, then 16..31), looked up in ``kvalues_iq4nl`` by ``pshufb`` (int8, |k| <=
127); ``k' = psignb(k, q)`` carries the activation quant's sign (|k'| <= 127, and 0 where q = 0),
``pmaddubsw(|q|, k')`` multiplies (|q| as u8: |-128| = 128; each i16 pair <= 2 * 128 * 127 =
32512, no saturation) and ``pmaddwd`` with ones widens to i32 lanes, or with AVX-512 VNNI one
``vpdpbusd(|q|, k')`` (four products per i32 lane, no saturation); the lanes sum to ``S``
(|S| <= 32 * 127 * 128 < 2**20).
Floats: the portable steps, lane by lane, ``v = R32(d_x * R32(f32(d) * f32(S)))`` (no fast-math
flags).  The records' bytes must be contiguous (the driver checks it).
"""

from llvmlite import ir

from numba_qk.formats.iq import KVALUES_IQ4NL, iq4_nl as _NL
from numba_qk.formats.legacy import q8_0 as _Q80
from numba_qk.kernels.simd.base import (HAVE_VNNI, Ops, decl, gather_f16, i8, i16, i32, load,
                                        nibble_lookup, record_intrinsic, reduce_many,
                                        tile_intrinsic, vec)
from numba_qk.kernels.simd.legacy import LDEC_DW_AT, panel_decode_intrinsic, store_decoded_ints

_D_AT, _QS_AT = _NL.field("d").start, _NL.field("qs").start
_X_D_AT, _X_QS_AT = _Q80.field("d").start, _Q80.field("qs").start
_V16, _V32 = vec(i8, 16), vec(i8, 32)


def _codes(b, wb):
    """<32 x i8>: the record's 32 values k(c) in element order."""
    return nibble_lookup(b, load(b, wb, _QS_AT, _V16), KVALUES_IQ4NL)


def _sums(b, ops, wbs, xbs):
    """<n x i32> S of the record pairs zip(wbs, xbs); a record listed several times (the same IR
    value) is decoded once."""
    psign = decl(b, "llvm.x86.avx2.psign.b", _V32, [_V32, _V32])
    ones = ir.Constant(vec(i16, 16), [1] * 16)
    codes, xs, accs = {}, {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in codes:
            codes[id(wb)] = _codes(b, wb)
        if id(xb) not in xs:
            q = load(b, xb, _X_QS_AT, _V32)
            neg = b.ashr(q, ir.Constant(_V32, [7] * 32))
            xs[id(xb)] = (q, b.sub(b.xor(q, neg), neg))      # (q, |q| as u8)
        q, aq = xs[id(xb)]
        k = b.call(psign, [codes[id(wb)], q])
        if ops.dpbusd is not None:   # four u8 x i8 products per i32 lane, no saturation
            accs.append(b.call(ops.dpbusd, [ir.Constant(vec(i32, 8), None), aq, k]))
        else:
            accs.append(b.call(ops.maddwd, [b.call(ops.maddubs, [aq, k]), ones]))
    return reduce_many(b, accs)


def _values(b, ops, wbs, xbs):
    """<n x float> record values v = R32(d_x * R32(f32(d) * f32(S))), lane by lane."""
    n = len(wbs)
    s = _sums(b, ops, wbs, xbs)
    d = gather_f16(b, wbs, _D_AT)
    dx = gather_f16(b, xbs, _X_D_AT)
    return b.fmul(dx, b.fmul(d, b.sitofp(s, vec(ir.FloatType(), n))))


def _make_tile(over_rows):
    def make_values(builder):
        ops = Ops(builder, False, HAVE_VNNI)
        return lambda wbs, xbs: _values(builder, ops, wbs, xbs)
    return tile_intrinsic(over_rows, 8, make_values)


iq4_nl_q8_0_value = record_intrinsic(
    True, lambda b, wb, xb: _values(b, Ops(b, False, HAVE_VNNI), [wb], [xb]))
iq4_nl_q8_0_s = record_intrinsic(
    False, lambda b, wb, xb: _sums(b, Ops(b, False, HAVE_VNNI), [wb], [xb]))
iq4_nl_rows_x8 = _make_tile(True)
iq4_nl_acts_x8 = _make_tile(False)



def _write_panel_record(b, c, wb, store):
    store_decoded_ints(b, store, _codes(b, wb))
    store(LDEC_DW_AT, b.fpext(load(b, wb, _D_AT, ir.HalfType()), ir.FloatType()))


#: The IQ4_NL record at byte ``w_off`` of uint8 ``w`` decoded into the legacy panel layout
#: (simd/legacy.py, LDEC_BYTES at byte ``d_off`` of ``dec``): its 32 values k(c) as int8 (|k| <=
#: 127), ``C = 128 * sum k`` and f32(d).  Any ``code`` is accepted and ignored: the panel gemm
#: passes the weight code its activations and microtile go by, Q4_0's, whose float steps
#: ``v = R32(dx * R32(dw * f32(S)))`` are IQ4_NL's.
iq4_nl_panel_decode = panel_decode_intrinsic(lambda c: True, _write_panel_record)


__all__ = ["iq4_nl_q8_0_value", "iq4_nl_q8_0_s", "iq4_nl_rows_x8", "iq4_nl_acts_x8",
           "iq4_nl_panel_decode"]
