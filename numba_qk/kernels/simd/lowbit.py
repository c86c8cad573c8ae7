"""Explicit-SIMD record values of Q1_0 and Q2_0 against Q8_0 (LLVM IR through numba intrinsics,
the plumbing of ``base.py``): the record value ``v`` and the 8-row gemv tile of the driver
(``kernels/drive.py``), registered by ``kernels/lowbit/q1q2.py``.  No gemm tile: the driver's
gemm runs the gemv per activation, which at batch 32 took about half the time of an
8-activation tile built from these pieces (Q1_0 6.9 ms against 13.0 ms, Q2_0 10.0 against 14.7;
the tile gathers 8 activations' scales per sub-record and redoes their quants' sums per row).

One weight record spans ``S`` Q8_0 records (Q1_0: 4, Q2_0: 2), consecutive 34-byte records
from the activation offset (the driver checks it).  Sub-record ``k`` (elements ``32k..32k+31``
of the weight record) pairs with Q8_0 record ``k``; its 32 weight codes fill 32 byte lanes as
u8 ``u`` (L = 64 lanes with AVX-512BW hold two sub-records, 32 with AVX2 one)::

    Q1_0  u = 2 bit_j (0 or 2), lane i = element 32k + i: the sub-record's 4 sign bytes as
          a <32 x i1> mask (a <64 x i1> of 8 bytes for two), selecting 2 or 0
    Q2_0  u = q_j (0..3), lane 8n + m = element 32k + 4m + n: the sub-record's 8 code bytes
          in each of 4 qwords, shifted right by 2n (vpsrlvq), & 3

so that ``t = u - 1`` (Q2_0) and ``t = u - 1`` with ``u = 2 bit`` (Q1_0: ``t = 2 bit - 1``),
and the Q8_0 quants ``xq`` of the sub-record are placed in the same lanes (Q1_0: as they lie;
Q2_0: a byte shuffle), once per activation record (shared by a gemv tile's 8 rows)::

    S_k = sum_i dot(u_i, xq_i) - sum_i xq_i        exact int32, |S_k| <= 32 * 2 * 128

``dot`` (``base.dots``): one ``vpdpbusd`` per vector with AVX-512 VNNI; otherwise
``pmaddubsw`` (i16 lane a0 b0 + a1 b1, |.| <= 2 * 3 * 128 = 768) on a start of the negated
``pmaddubsw(1, xq)`` lanes (|.| <= 256; their sum <= 1024 < 2**15), widened by ``pmaddwd``
with ones.  Either way i32 lane ``i`` holds bytes ``4i..4i+3``: 8 lanes per sub-record,
contiguous.  The sums of a record (or a tile's 8 records) are reduced by ``reduce_groups``
to ``S_k`` per (lane, k), exact in any order.

The float steps are the portable ``record_value_q*_0_q8_0``'s (one IEEE instruction each, no
fast-math, in the same order), lane by lane::

    T = R32(... R32(R32(0 + R32(dx_0 * f32(S_0))) + R32(dx_1 * f32(S_1))) ...)
    v = R32(d * T)

the tiles fold the 8 values lane by lane (``base.fold_into``).  A record's bytes are read as
they lie (no byte past the weight record's 18 or the activation records' S * 34).
"""

from llvmlite import ir

from numba_qk.formats import quant
from numba_qk.formats.lowbit import q1_0 as _FMT1
from numba_qk.formats.lowbit import q2_0 as _FMT2
from numba_qk.kernels.simd.base import (HAVE_AVX512, HAVE_VNNI, Ops, dots, gather_f16, i8,
                                        i32, i64, load, neg_dots, record_intrinsic,
                                        tile_intrinsic, vec)

_X_D_AT = quant.q8_0.field("d").start
_X_QS_AT = quant.q8_0.field("qs").start
_X_BYTES = quant.q8_0.block_bytes
_F32 = ir.FloatType()
i1 = ir.IntType(1)


def _bytes(v, n):
    """<n x i8> constant of byte ``v`` (0..255)."""
    return ir.Constant(vec(i8, n), [v - 256 if v > 127 else v] * n)


class _Q1:
    """Q1_0: 16 sign bytes (4 per sub-record), f16 ``d``."""
    name = "q1_0"
    SPAN = 4
    QS = _FMT1.field("qs").start
    D = _FMT1.field("d").start
    PERM = list(range(32))          # lane i of a sub-record: element i

    @classmethod
    def codes(cls, b, wb, k, c):
        """u8 ``u = 2 bit`` of sub-records ``k .. k + c - 1`` (32 c lanes)."""
        n = 32 * c
        bits = b.bitcast(load(b, wb, cls.QS + 4 * k, ir.IntType(n)), vec(i1, n))
        return b.select(bits, _bytes(2, n), _bytes(0, n))


class _Q2:
    """Q2_0: 16 code bytes (8 per sub-record), f16 ``d``."""
    name = "q2_0"
    SPAN = 2
    QS = _FMT2.field("qs").start
    D = _FMT2.field("d").start
    PERM = [4 * (i % 8) + i // 8 for i in range(32)]   # lane 8n + m: element 4m + n

    @classmethod
    def codes(cls, b, wb, k, c):
        """u8 codes ``q`` (0..3) of sub-records ``k .. k + c - 1`` (32 c lanes, ``PERM``)."""
        words = load(b, wb, cls.QS + 8 * k, vec(i64, c))
        rep = b.shuffle_vector(words, ir.Constant(words.type, ir.Undefined),
                               ir.Constant(vec(i32, 4 * c), [j // 4 for j in range(4 * c)]))
        shifted = b.lshr(rep, ir.Constant(vec(i64, 4 * c), [2 * (j % 4) for j in range(4 * c)]))
        return b.and_(b.bitcast(shifted, vec(i8, 32 * c)), _bytes(3, 32 * c))


FORMATS = {f.name: f for f in (_Q1, _Q2)}


def reduce_groups(b, vecs, group):
    """The sums of each ``group`` (a power of two) consecutive lanes of the equal-length i32
    vectors ``vecs``, as vectors whose lanes, read in order, are those sums in order (vector by
    vector): pairs of vectors merged as ``base.reduce_many`` does (lane sums of neighbours, which
    stay within a group), then a lone vector halved."""
    while group > 1:
        width = vecs[0].type.count
        if len(vecs) > 1:
            even = [2 * i for i in range(width)]
            odd = [e + 1 for e in even]
            vecs = [b.add(b.shuffle_vector(x, y, ir.Constant(vec(i32, width), even)),
                          b.shuffle_vector(x, y, ir.Constant(vec(i32, width), odd)))
                    for x, y in zip(vecs[0::2], vecs[1::2])]
        else:
            v, half = vecs[0], width // 2
            und = ir.Constant(v.type, ir.Undefined)
            vecs = [b.add(
                b.shuffle_vector(v, und, ir.Constant(vec(i32, half), [2 * i for i in range(half)])),
                b.shuffle_vector(v, und, ir.Constant(vec(i32, half),
                                                     [2 * i + 1 for i in range(half)])))]
        group //= 2
    return vecs


def _pick(b, vecs, idx):
    """<len(idx) x i32> of the lanes ``idx`` of ``vecs`` read as one run of lanes."""
    width = vecs[0].type.count
    srcs = sorted({i // width for i in idx})
    if len(srcs) == 1:
        v = vecs[srcs[0]]
        return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(
            vec(i32, len(idx)), [i % width for i in idx]))
    assert len(srcs) == 2, idx
    lo, hi = srcs
    return b.shuffle_vector(vecs[lo], vecs[hi], ir.Constant(
        vec(i32, len(idx)), [i % width + (width if i // width == hi else 0) for i in idx]))


def _w_codes(b, ops, kf, wb):
    """The u8 code vectors of one weight record (``ops.lanes`` lanes each)."""
    c = ops.lanes // 32
    return [kf.codes(b, wb, k, c) for k in range(0, kf.SPAN, c)]


def _x_quants(b, ops, kf, xb):
    """The activation quants of one weight record's S Q8_0 records, in the lanes of
    ``_w_codes``, and per vector the start ``-sum(xq)`` of its accumulator."""
    c = ops.lanes // 32
    xs = []
    for k in range(0, kf.SPAN, c):
        parts = [load(b, xb, _X_BYTES * (k + j) + _X_QS_AT, vec(i8, 32)) for j in range(c)]
        v = parts[0] if c == 1 else b.shuffle_vector(parts[0], parts[1], ir.Constant(
            vec(i32, 64), list(range(64))))
        if kf.PERM != list(range(32)):
            v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(
                vec(i32, 32 * c), [32 * (i // 32) + kf.PERM[i % 32] for i in range(32 * c)]))
        xs.append(v)
    n = ops.lanes
    return xs, [neg_dots(b, ops, [(_bytes(1, n), v)]) for v in xs]


def _values(b, ops, kf, wbs, xbs):
    """<n x float> record values of the record pairs zip(wbs, xbs); a record listed several
    times (the same IR value) is decoded once."""
    wdec, xdec = {}, {}
    accs = []                         # (vector j, lane r) order
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in wdec:
            wdec[id(wb)] = _w_codes(b, ops, kf, wb)
        if id(xb) not in xdec:
            xdec[id(xb)] = _x_quants(b, ops, kf, xb)
    n, c = len(wbs), ops.lanes // 32
    for j in range(kf.SPAN // c):
        for wb, xb in zip(wbs, xbs):
            xs, starts = xdec[id(xb)]
            accs.append(dots(b, ops, starts[j], [(wdec[id(wb)][j], xs[j])]))
    flat = reduce_groups(b, accs, 8)  # lane (j n + r) c + g: S of sub-record j c + g, lane r
    t = ir.Constant(vec(_F32, n), None)  # +0.0, ggml's seed
    for k in range(kf.SPAN):
        j, g = divmod(k, c)
        s = _pick(b, flat, [(j * n + r) * c + g for r in range(n)])
        dx = gather_f16(b, xbs, _X_BYTES * k + _X_D_AT)
        t = b.fadd(t, b.fmul(dx, b.sitofp(s, vec(_F32, n))))
    return b.fmul(gather_f16(b, wbs, kf.D), t)


def _make_record(name, wide, vnni):
    """Intrinsic ``f(w, w_off, x, x_off)``: the record value v (float32) of the weight record
    (format ``name``) at byte ``w_off`` of uint8 array ``w`` and the S Q8_0 records from byte
    ``x_off`` of ``x``."""
    def compute(b, wb, xb):
        return _values(b, Ops(b, wide, vnni), FORMATS[name], [wb], [xb])
    return record_intrinsic(True, compute)


def _make_tile(name, wide, vnni):
    """The 8-row gemv tile intrinsic of format ``name`` (``base.tile_intrinsic``)."""
    def make_values(builder):
        kf, ops = FORMATS[name], Ops(builder, wide, vnni)
        return lambda wbs, xbs: _values(builder, ops, kf, wbs, xbs)
    return tile_intrinsic(True, 8, make_values)


# {t}_q8_0_value_{var}: the record value of each variant (the tests compare each with the
# portable value); {t}_q8_0_value, {t}_rows_x8: the widest variant of the target.
VARIANTS = {"avx2": (False, False), "avx2vnni": (False, True),
            "avx512": (True, False), "avx512vnni": (True, True)}
WIDE, VNNI = HAVE_AVX512, HAVE_VNNI

__all__ = ["reduce_groups"]
for _name in FORMATS:
    for _var, (_w, _v) in VARIANTS.items():
        globals()[f"{_name}_q8_0_value_{_var}"] = _make_record(_name, _w, _v)
        __all__.append(f"{_name}_q8_0_value_{_var}")
    globals()[f"{_name}_q8_0_value"] = _make_record(_name, WIDE, VNNI)
    globals()[f"{_name}_rows_x8"] = _make_tile(_name, WIDE, VNNI)
    __all__ += [f"{_name}_q8_0_value", f"{_name}_rows_x8"]
del _name, _var, _w, _v
