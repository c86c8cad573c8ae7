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
to ``S_k`` per (lane, k), exact in any order, with in-block shuffles where the lanes allow; the
256-bit ``pmaddubsw`` path first merges its i16 lanes with ``vphaddw`` (``_reduce_i16``:
Q1_0's AVX2 gemv 10 % faster than widening each vector by ``pmaddwd``).

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
from numba_qk.kernels.simd.base import (HAVE_AVX512, HAVE_VNNI, Ops, decl, dots, gather_f16, i8,
                                        i16, i32, i64, load, neg_dots, record_intrinsic,
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


def _merge_plan(la, lb):
    """Lane pairs ``(i, j)`` (indices into the concatenation of two vectors with lane labels
    ``la``, ``lb``; equal labels only) for one merge that halves the lanes, or None.  Tried in
    order: within each 128-bit block (``vshufps``: block q of the result = neighbour sums of
    block q of a, then of b), block by block (``vshufi64x2`` / ``vperm2i128``: block pairs of
    a, then of b), then neighbours of a, then of b (``reduce_many``'s cross-lane shuffles)."""
    w = len(la)
    lab = la + lb
    plans = []
    if w % 4 == 0:
        plans.append([(s + 4 * q + e, s + 4 * q + e + 1)
                      for q in range(w // 4) for s in (0, w) for e in (0, 2)])
    if w % 8 == 0:
        plans.append([(s + 8 * q + e, s + 8 * q + 4 + e)
                      for s in (0, w) for q in range(w // 8) for e in range(4)])
    plans.append([(2 * i, 2 * i + 1) for i in range(w)])
    for plan in plans:
        if all(lab[i] == lab[j] for i, j in plan):
            return plan
    return None


def _halve_plan(labels):
    """Lane pairs of one vector with equal labels (each lane in one pair), or None."""
    first, plan = {}, []
    for i, lab in enumerate(labels):
        if lab in first:
            plan.append((first.pop(lab), i))
        else:
            first[lab] = i
    return None if first else sorted(plan)


def reduce_groups(b, vecs, labels):
    """Sums of the lanes of equal label of the equal-length i32 vectors ``vecs`` (``labels``:
    per vector, a label per lane; lanes of one label lie in one vector and come in powers of
    two): ``(vectors, labels)`` in which every label is one lane.  Pairs of vectors merge
    (``_merge_plan``) until the lanes of a label meet, a lone vector is halved."""
    def add_pairs(x, y, plan):
        width = len(plan)
        lo = ir.Constant(vec(i32, width), [i for i, _ in plan])
        hi = ir.Constant(vec(i32, width), [j for _, j in plan])
        return b.add(b.shuffle_vector(x, y, lo), b.shuffle_vector(x, y, hi))

    while True:
        if all(len(set(la)) == len(la) for la in labels):
            return vecs, labels
        if len(vecs) > 1:
            plans = [_merge_plan(la, lb) for la, lb in zip(labels[0::2], labels[1::2])]
            if all(p is not None for p in plans):
                pairs = list(zip(vecs[0::2], vecs[1::2], labels[0::2], labels[1::2], plans))
                odd = len(vecs) % 2
                vecs = [add_pairs(x, y, p) for x, y, _, _, p in pairs] + vecs[len(vecs) - odd:]
                labels = ([[(la + lb)[i] for i, _ in p] for _, _, la, lb, p in pairs]
                          + labels[len(labels) - odd:])
                continue
        out_v, out_l = [], []
        for v, la in zip(vecs, labels):
            p = _halve_plan(la)
            if p is None:
                out_v.append(v)
                out_l.append(la)
            else:
                und = ir.Constant(v.type, ir.Undefined)
                out_v.append(add_pairs(v, und, p))
                out_l.append([la[i] for i, _ in p])
        assert out_l != labels, "reduce_groups: no pairing"
        vecs, labels = out_v, out_l


def _reduce_i16(b, vecs, labels):
    """The 256-bit ``pmaddubsw`` path's reduction: i16 vectors (``vecs``, lane ``labels``) merged
    by ``vphaddw`` (within 128-bit halves: a's neighbour sums, then b's) while the neighbours of
    both share labels, each vector then halved while its lanes pair up, then widened to i32 for
    ``reduce_groups``.  Exact in i16: every lane is a sum of products of one sub-record, and a
    sub-record's whole sum is at most 32 * 2 * 128 = 8192 in magnitude."""
    hadd = decl(b, "llvm.x86.avx2.phadd.w", vec(i16, 16), [vec(i16, 16), vec(i16, 16)])

    def pairs_up(la):
        return all(la[2 * i] == la[2 * i + 1] for i in range(len(la) // 2))

    while len(vecs) > 1 and all(pairs_up(la) for la in labels[:len(labels) // 2 * 2]):
        odd = len(vecs) % 2
        nv, nl = [], []
        for x, y, la, lb in zip(vecs[0::2], vecs[1::2], labels[0::2], labels[1::2]):
            nv.append(b.call(hadd, [x, y]))
            nl.append([la[i] for i in range(0, 8, 2)] + [lb[i] for i in range(0, 8, 2)]
                      + [la[i] for i in range(8, 16, 2)] + [lb[i] for i in range(8, 16, 2)])
        vecs, labels = nv + vecs[len(vecs) - odd:], nl + labels[len(labels) - odd:]
    out_v, out_l = [], []
    for v, la in zip(vecs, labels):
        plan = _halve_plan(la)
        while plan is not None and len(set(la)) < len(la):
            und = ir.Constant(v.type, ir.Undefined)
            v = b.add(*(b.shuffle_vector(v, und, ir.Constant(vec(i32, len(plan)),
                                                             [p[e] for p in plan]))
                        for e in (0, 1)))
            la = [la[i] for i, _ in plan]
            plan = _halve_plan(la)
        out_v.append(b.sext(v, vec(i32, v.type.count)))
        out_l.append(la)
    return out_v, out_l


def _pick(b, vecs, labels, want):
    """<len(want) x i32> of the lanes labelled ``want`` (from at most two of ``vecs``)."""
    where = {lab: (v, i) for v, la in enumerate(labels) for i, lab in enumerate(la)}
    srcs = sorted({where[lab][0] for lab in want})
    assert len(srcs) <= 2, want
    x, y = vecs[srcs[0]], vecs[srcs[-1]]
    width = max(x.type.count, y.type.count)

    def widen(v):                     # the narrower of two to the other's width
        m = v.type.count
        return v if m == width else b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                                     ir.Constant(vec(i32, width), list(range(m))
                                                                 + [m] * (width - m)))
    x = widen(x)
    y = widen(y) if len(srcs) == 2 else ir.Constant(x.type, ir.Undefined)
    return b.shuffle_vector(x, y, ir.Constant(vec(i32, len(want)), [
        where[lab][1] + (width if where[lab][0] != srcs[0] else 0) for lab in want]))


def _w_codes(b, ops, kf, wb):
    """The u8 code vectors of one weight record (``ops.lanes`` lanes each)."""
    c = ops.lanes // 32
    return [kf.codes(b, wb, k, c) for k in range(0, kf.SPAN, c)]


def _x_quants(b, ops, kf, xb):
    """The activation quants of one weight record's S Q8_0 records, in the lanes of
    ``_w_codes``, and per vector the start ``-sum(xq)`` of its accumulator (``base.neg_dots``;
    folding the correction in after the reduction instead, one lane per activation record,
    took 10-20 % longer)."""
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
    labels = []                       # (sub-record k, lane r) of each i32 lane
    i16_path = ops.dpbusd is None and not ops.wide
    for j in range(kf.SPAN // c):
        for r, (wb, xb) in enumerate(zip(wbs, xbs)):
            xs, starts = xdec[id(xb)]
            if i16_path:    # the i16 lanes start + pmaddubsw, reduced in i16 below
                accs.append(b.add(starts[j], b.call(ops.maddubs, [wdec[id(wb)][j], xs[j]])))
                labels.append([(j, r)] * 16)
            else:
                accs.append(dots(b, ops, starts[j], [(wdec[id(wb)][j], xs[j])]))
                labels.append([(j * c + i // 8, r) for i in range(8 * c)])
    if i16_path:
        accs, labels = _reduce_i16(b, accs, labels)
    sums, labels = reduce_groups(b, accs, labels)
    t = ir.Constant(vec(_F32, n), None)  # +0.0, ggml's seed
    for k in range(kf.SPAN):
        s = _pick(b, sums, labels, [(k, r) for r in range(n)])
        dx = gather_f16(b, xbs, _X_BYTES * k + _X_D_AT)
        t = b.fadd(t, b.fmul(dx, b.sitofp(s, vec(_F32, n))))
    return b.fmul(gather_f16(b, wbs, kf.D), t)


def _intrinsics(name, wide, vnni):
    """``(value, rows_x8)`` of format ``name`` for one vector variant: the intrinsic
    ``f(w, w_off, x, x_off)``, the record value v (float32) of the weight record at byte
    ``w_off`` of uint8 array ``w`` and the S Q8_0 records from byte ``x_off`` of ``x``
    (``base.record_intrinsic``), and the 8-row gemv tile (``base.tile_intrinsic``)."""
    def values(builder, wbs, xbs):
        return _values(builder, Ops(builder, wide, vnni), FORMATS[name], wbs, xbs)
    return (record_intrinsic(True, lambda builder, wb, xb: values(builder, [wb], [xb])),
            tile_intrinsic(True, 8, lambda builder: lambda wbs, xbs: values(builder, wbs, xbs)))


# {t}_q8_0_value_{var}: the record value of each variant (the tests compare each with the
# portable value); {t}_q8_0_value, {t}_rows_x8: the widest variant of the target.
VARIANTS = {"avx2": (False, False), "avx2vnni": (False, True),
            "avx512": (True, False), "avx512vnni": (True, True)}
WIDE, VNNI = HAVE_AVX512, HAVE_VNNI

__all__ = ["reduce_groups"]
for _name in FORMATS:
    for _var, (_w, _v) in VARIANTS.items():
        globals()[f"{_name}_q8_0_value_{_var}"] = _intrinsics(_name, _w, _v)[0]
        __all__.append(f"{_name}_q8_0_value_{_var}")
    globals()[f"{_name}_q8_0_value"], globals()[f"{_name}_rows_x8"] = _intrinsics(_name, WIDE,
                                                                                  VNNI)
    __all__ += [f"{_name}_q8_0_value", f"{_name}_rows_x8"]
del _name, _var, _w, _v
