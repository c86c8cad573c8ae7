"""Explicit-SIMD record sums of the ternary formats TQ1_0 and TQ2_0 against Q8_K (LLVM IR
through numba intrinsics, the plumbing of ``base.py``): the record value ``v``, the 8-row gemv
tile and the 8-activation gemm tile of the driver (``kernels/drive.py``), registered by
``kernels/ternary/tq.py``.

A record's weight bytes (TQ1_0: ``qs`` and ``qh``, bytes 0..51; TQ2_0: ``qs``, bytes 0..63) are
loaded as they lie, in chunks of L lanes (L = 64 with AVX-512BW, 32 with AVX2; a short chunk is
zero-filled: one masked load with AVX-512BW), and each byte gives one code per *digit* ``n``
as u8 ``u = t + 1``::

    TQ1_0  q_n = (u8)(byte * 3^n)                 q_{n-1} * 3 as two byte adds, wrapping as ggml's
           u   = (q_n >= 86) + (q_n >= 171)       = ((u8)(byte * 3^n) * 3) >> 8 (0..2) for every
                                                  byte (86 * 3 = 258, 171 * 3 = 513; checked for
                                                  all 256 values by the tests)
    TQ2_0  u   = (byte >> 2n) & 3                 (0..3; code 3 gives t = 2, as ggml)

Lane m of chunk k, digit n, holds element ``elem(byte, n)`` of the record (``tq1_0_place`` /
ggml's dequantize order), or none (TQ1_0's pad lanes 52.., and digit 4 of the ``qh`` bytes,
which hold four digits).  Integer work, exact in any order (so these give the integers of the
readable loops ``record_sum_tq*_q8_k`` of ``kernels/ternary/tq.py``), in two arrangements:

* rows (the record value, the gemv tile; the activation record is shared by the tile's 8 rows):
  the activation quants are gathered into the lanes of each (chunk, digit), 0 where the lane has
  no element, once per activation record, and::

      S = sum_{k,n} dot(u, xq) - sum_i xq_i            u = t + 1 >= 0 is the unsigned operand

* acts (the gemm tile; the weight record is shared by the tile's 8 activations): the codes
  shuffled into element order once per weight record as signed ``t``, and::

      S = sum_j dot(xq ^ 0x80, t) - 128 * sum_i t_i    xq ^ 0x80 = xq + 128 as u8 (0..255)

``dot(a, b)`` of u8 ``a`` and i8 ``b``: with AVX-512 VNNI one ``vpdpbusd`` per vector (i32
lanes of four products, exact, no saturation); without, ``pmaddubsw`` per vector (i16 lane =
a0 b0 + a1 b1, |.| <= 2 * 3 * 128 = 768 (rows) or 2 * 255 * 2 = 1020 (acts): no saturation),
the record's i16 lanes summed and widened once by ``pmaddwd`` with ones.  Every partial i16 sum
stays below 2**15: rows at most 10 vectors of <= 512 (TQ1_0, u <= 2) or 8 of <= 768 (TQ2_0),
plus 8 of the correction's |x0 + x1| <= 256: <= 8192; acts 8 of <= 1020 plus 8 of the
correction's |128 (t0 + t1)| <= 512: <= 12256 (the counts are those of 256-bit vectors; 512-bit
ones have half).  The correction term starts each accumulator (computed from the quants, never
the stored ``bsum``).  |S| <= 256 * 2 * 128.

The float steps are those of ``record_value_d`` (one IEEE instruction each, no fast-math, in the
same order): ``v = R32(ds * R32(f32(d) * f32(S)))``; the tiles fold the 8 values lane by lane
(``base.fold_into``).  The record's bytes must be contiguous (the driver checks it).
"""

from llvmlite import ir

from numba_qk.formats import kquants as _kq
from numba_qk.formats import quant
from numba_qk.kernels.simd.base import (HAVE_AVX512, HAVE_VNNI, Ops, decl, dots, gather_f16,
                                        gather_f32, i8, i16, i32, load, neg_dots,
                                        record_intrinsic, reduce_many, tile_intrinsic, vec)

_A_DS_AT = quant.q8_k.field("ds").start
_A_Q_AT = quant.q8_k.field("q").start
_F32 = ir.FloatType()
i1 = ir.IntType(1)


def _c(v, t=i32):
    return ir.Constant(t, v)


def _splat8(v, n):
    """<n x i8> of byte ``v`` (0..255, written as its signed value)."""
    return ir.Constant(vec(i8, n), [v - 256 if v > 127 else v] * n)


# ---- the formats: bytes, digits, element of (byte, digit) ----------------------------------

class _TQ1:
    """TQ1_0: 48 ``qs`` bytes of five digits, 4 ``qh`` bytes of four, f16 ``d``."""
    name = "tq1_0"
    QS = _kq.tq1_0.field("qs").start
    QH = _kq.tq1_0.field("qh").start
    D = _kq.tq1_0.field("d").start
    NBYTES = QH + 4 - QS       # qs and qh, contiguous
    DIGITS = 5

    @classmethod
    def elem(cls, j, n):
        """Element of digit ``n`` of weight byte ``j`` (0..51), None if none."""
        if j < 32:
            return 32 * n + j
        if j < 48:
            return 160 + 16 * n + (j - 32)
        return 240 + 4 * n + (j - 48) if n < 4 else None

    @staticmethod
    def digits(b, w):
        """u8 codes (0..2) of the 5 digits of every byte of ``w``: ``q * 3`` as two byte adds
        per digit, each ``q`` passed through an empty inline-asm statement (LLVM would
        otherwise fold the chain into byte multiplies by 9, 27, 81, which x86 lacks: widened
        ``vpmullw`` and a byte shuffle, 3 instructions instead of 2), and the code as a
        select of 1 and a masked add of 1 after the two unsigned byte compares (zext + add
        took one more).  Both together: the gemv 7 % and the gemm 4-7 % faster than the plain
        IR (A/B in one process, 200 rounds)."""
        n = w.type.count
        out, q = [], w
        lo, hi = _splat8(86, n), _splat8(171, n)
        zero, one = _splat8(0, n), _splat8(1, n)
        opaque = ir.InlineAsm(ir.FunctionType(q.type, [q.type]), "", "=v,0")
        for d in range(5):
            if d:
                q = b.add(b.add(q, q), q)           # q * 3 (wrapping), byte by byte
                if d < 4:
                    q = b.call(opaque, [q])
            u = b.select(b.icmp_unsigned(">=", q, lo), one, zero)
            out.append(b.select(b.icmp_unsigned(">=", q, hi), b.add(u, one), u))
        return out


class _TQ2:
    """TQ2_0: 64 ``qs`` bytes of four 2-bit codes, f16 ``d``."""
    name = "tq2_0"
    QS = _kq.tq2_0.field("qs").start
    D = _kq.tq2_0.field("d").start
    NBYTES = 64
    DIGITS = 4

    @classmethod
    def elem(cls, j, n):
        return 128 * (j // 32) + 32 * n + j % 32

    @staticmethod
    def digits(b, w):
        """u8 codes (0..3) of the 4 bit pairs of every byte of ``w``."""
        n = w.type.count
        words = b.bitcast(w, vec(i16, n // 2))
        out = []
        for d in range(4):
            s = b.lshr(words, ir.Constant(vec(i16, n // 2), [2 * d] * (n // 2))) if d else words
            out.append(b.and_(b.bitcast(s, vec(i8, n)), _splat8(3, n)))
        return out


FORMATS = {f.name: f for f in (_TQ1, _TQ2)}


# ---- vector plumbing ---------------------------------------------------------------------------

def _place(b, pieces, n):
    """<n x i8> holding each ``(lane, vector)`` of ``pieces`` from that lane on, 0 elsewhere."""
    acc = None
    for lane, v in pieces:
        m = v.type.count
        if m == n and lane == 0:
            part = v
        else:
            zero = ir.Constant(v.type, None)
            part = b.shuffle_vector(v, zero, ir.Constant(
                vec(i32, n), [i - lane if lane <= i < lane + m else m for i in range(n)]))
        acc = part if acc is None else b.or_(acc, part)
    return acc


def _runs(lanes):
    """Maximal runs ``(lane, first, length)`` of consecutive lanes holding consecutive values
    (``lanes``: value or None per lane), split into power-of-two lengths."""
    out, i = [], 0
    while i < len(lanes):
        if lanes[i] is None:
            i += 1
            continue
        j = i + 1
        while j < len(lanes) and lanes[j] is not None and lanes[j] == lanes[i] + (j - i):
            j += 1
        k = i
        while k < j:
            p = 1 << ((j - k).bit_length() - 1)
            out.append((k, lanes[k], p))
            k += p
        i = j
    return out


def _gather(b, base, at, lanes, masked):
    """<len(lanes) x i8>: lane i = byte ``at + lanes[i]`` of ``base``, 0 where None.  With
    ``masked`` (AVX-512BW) a prefix of contiguous bytes is one masked load (loads nothing past
    it: a record at the end of its array is safe)."""
    n = len(lanes)
    used = [i for i, v in enumerate(lanes) if v is not None]
    if masked and used and used == list(range(len(used))) and \
            all(lanes[i] == lanes[0] + i for i in used) and len(used) < n:
        ptr = b.bitcast(b.gep(base, [ir.Constant(ir.IntType(64), at + lanes[0])]),
                        vec(i8, n).as_pointer())
        fn = decl(b, f"llvm.masked.load.v{n}i8.p0v{n}i8", vec(i8, n),
                  [vec(i8, n).as_pointer(), i32, vec(i1, n), vec(i8, n)])
        mask = ir.Constant(vec(i1, n), [int(i < len(used)) for i in range(n)])
        return b.call(fn, [ptr, _c(1), mask, ir.Constant(vec(i8, n), None)])
    pieces = [(lane, load(b, base, at + first, vec(i8, m) if m > 1 else i8))
              for lane, first, m in _runs(lanes)]
    pieces = [(lane, v if isinstance(v.type, ir.VectorType) else
               b.insert_element(ir.Constant(vec(i8, 1), None), v, _c(0)))
              for lane, v in pieces]
    return _place(b, pieces, n)


class _Shape:
    """The lane layout of format ``kf`` at ``n`` lanes: its weight bytes in chunks of n lanes
    (``chunks[k][m]``: byte or None), the element of each (chunk, digit, lane), and the inverse
    (element -> (chunk, digit, lane))."""

    def __init__(self, kf, n):
        self.kf, self.n = kf, n
        nchunks = -(-kf.NBYTES // n)
        self.chunks = [[k * n + m if k * n + m < kf.NBYTES else None for m in range(n)]
                       for k in range(nchunks)]
        self.elems = {(k, d): [None if j is None else kf.elem(j, d) for j in ch]
                      for k, ch in enumerate(self.chunks) for d in range(kf.DIGITS)}
        self.where = {}
        for (k, d), es in self.elems.items():
            for m, e in enumerate(es):
                if e is not None:
                    assert e not in self.where
                    self.where[e] = (k, d, m)
        assert sorted(self.where) == list(range(256)), kf.name


_SHAPES = {}


def _shape(kf, n):
    key = (kf.name, n)
    if key not in _SHAPES:
        _SHAPES[key] = _Shape(kf, n)
    return _SHAPES[key]


# ---- rows: codes u against gathered activations -------------------------------------------

def _x_rows(b, ops, sh, xb):
    """Per (chunk, digit): the activation quants in its lanes (0 where none), and the start
    -sum(xq) of every accumulator."""
    n = ops.lanes
    xs = {kd: _gather(b, xb, _A_Q_AT, es, False) for kd, es in sh.elems.items()}
    nat = [load(b, xb, _A_Q_AT + n * j, vec(i8, n)) for j in range(256 // n)]
    return xs, neg_dots(b, ops, [(_splat8(1, n), v) for v in nat])


def _w_rows(b, ops, sh, wb):
    """Per (chunk, digit): the u8 codes u = t + 1 of one weight record."""
    out = {}
    for k, ch in enumerate(sh.chunks):
        w = _gather(b, wb, sh.kf.QS, ch, ops.wide)
        for d, u in enumerate(sh.kf.digits(b, w)):
            out[(k, d)] = u
    return out


def _sum_rows(b, ops, wdec, xdec):
    xs, start = xdec
    return dots(b, ops, start, [(wdec[kd], xs[kd]) for kd in xs])


# ---- acts: signed t in element order against xq ^ 0x80 ----------------------------------------

def _w_acts(b, ops, sh, wb):
    """The signed t of one weight record in element order (256 / L vectors) and the start
    -128 * sum(t) of every accumulator."""
    n = ops.lanes
    u = _w_rows(b, ops, sh, wb)
    ts = []
    for j in range(256 // n):
        srcs = {}                          # (chunk, digit) -> its lane per lane (None: other)
        for i in range(n):
            k, d, m = sh.where[n * j + i]
            srcs.setdefault((k, d), [None] * n)[i] = m
        v = None
        for key, idx in srcs.items():     # one shuffle per source (LLVM merges them)
            if v is None:
                zero = ir.Constant(u[key].type, None)
                v = b.shuffle_vector(u[key], zero, ir.Constant(
                    vec(i32, n), [n if m is None else m for m in idx]))
            else:
                v = b.shuffle_vector(v, u[key], ir.Constant(
                    vec(i32, n), [i if m is None else n + m for i, m in enumerate(idx)]))
        ts.append(b.sub(v, _splat8(1, n)))
    return ts, neg_dots(b, ops, [(_splat8(128, n), t) for t in ts])


def _x_acts(b, ops, xb):
    n = ops.lanes
    flip = _splat8(0x80, n)
    return [b.xor(load(b, xb, _A_Q_AT + n * j, vec(i8, n)), flip) for j in range(256 // n)]


def _sum_acts(b, ops, wdec, xdec):
    ts, start = wdec
    return dots(b, ops, start, list(zip(xdec, ts)))


# ---- sums and values -------------------------------------------------------------------------

def _sums(b, ops, kf, wbs, xbs, acts):
    """<n x i32> S of the record pairs zip(wbs, xbs) in the rows or the acts arrangement; a
    record listed several times (the same IR value) is decoded once."""
    sh = _shape(kf, ops.lanes)
    wdec, xdec, s = {}, {}, []
    for wb, xb in zip(wbs, xbs):
        if id(wb) not in wdec:
            wdec[id(wb)] = _w_acts(b, ops, sh, wb) if acts else _w_rows(b, ops, sh, wb)
        if id(xb) not in xdec:
            xdec[id(xb)] = _x_acts(b, ops, xb) if acts else _x_rows(b, ops, sh, xb)
        s.append((_sum_acts if acts else _sum_rows)(b, ops, wdec[id(wb)], xdec[id(xb)]))
    return reduce_many(b, s)


def _values(b, ops, kf, wbs, xbs, acts):
    """<n x float> record values: v = R32(ds * R32(f32(d) * f32(S))), lane by lane."""
    n = len(wbs)
    s = _sums(b, ops, kf, wbs, xbs, acts)
    d = gather_f16(b, wbs, kf.D)
    ds = gather_f32(b, xbs, _A_DS_AT)
    return b.fmul(ds, b.fmul(d, b.sitofp(s, vec(_F32, n))))


def _make_record(name, wide, vnni, value, acts=False):
    """Intrinsic ``f(w, w_off, x, x_off)``: S (int32) of the weight record (format ``name``) at
    byte ``w_off`` of uint8 array ``w`` and the Q8_K record at byte ``x_off`` of ``x`` in the
    rows (or ``acts``) arrangement, or with ``value`` the record value v (float32)."""
    def compute(b, wb, xb):
        kf, ops = FORMATS[name], Ops(b, wide, vnni)
        return (_values if value else _sums)(b, ops, kf, [wb], [xb], acts)
    return record_intrinsic(value, compute)


def _make_tile(name, wide, vnni, over_rows):
    """The 8-lane tile intrinsic of format ``name`` (``base.tile_intrinsic``): rows
    arrangement over rows (gemv), acts over activations (gemm)."""
    def make_values(builder):
        kf, ops = FORMATS[name], Ops(builder, wide, vnni)
        return lambda wbs, xbs: _values(builder, ops, kf, wbs, xbs, not over_rows)
    return tile_intrinsic(over_rows, 8, make_values)


# {t}_q8_k_s_{var} (rows) and {t}_q8_k_s_acts_{var}: S for the tests (each variant against the
# loops); {t}_q8_k_value, {t}_rows_x8, {t}_acts_x8: the widest variant of the target.
VARIANTS = {"avx2": (False, False), "avx2vnni": (False, True),
            "avx512": (True, False), "avx512vnni": (True, True)}
WIDE, VNNI = HAVE_AVX512, HAVE_VNNI

__all__ = []
for _name in FORMATS:
    for _var, (_w, _v) in VARIANTS.items():
        globals()[f"{_name}_q8_k_s_{_var}"] = _make_record(_name, _w, _v, False)
        globals()[f"{_name}_q8_k_s_acts_{_var}"] = _make_record(_name, _w, _v, False, True)
        __all__ += [f"{_name}_q8_k_s_{_var}", f"{_name}_q8_k_s_acts_{_var}"]
    globals()[f"{_name}_q8_k_value"] = _make_record(_name, WIDE, VNNI, True)
    globals()[f"{_name}_rows_x8"] = _make_tile(_name, WIDE, VNNI, True)
    globals()[f"{_name}_acts_x8"] = _make_tile(_name, WIDE, VNNI, False)
    __all__ += [f"{_name}_q8_k_value", f"{_name}_rows_x8", f"{_name}_acts_x8"]
del _name, _var, _w, _v
