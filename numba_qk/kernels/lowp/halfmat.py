"""F16 and BF16 weight matrices times activations: the portable gemv/gemm kernels of
docs/halfmat.md (numba_qk's canonical numerics for ``matmul`` with ``numba_qk.f16`` /
``numba_qk.bf16`` weights).

Inputs: weights as their 16-bit codes ``w`` uint16 ``[rows, K]`` (C-contiguous), activations
already rounded to the weight's type and widened back, ``x`` float32 ``[K]`` (gemv) or
``[batch, K]`` (gemm).  Every output is

    lanes l = 0..31 start at +0.0;  for i = 0..K-1 in order: acc[i % 32] = R32(acc[i % 32] + R32(w_i * x_i))
    then 16 -> 8 -> 4 -> 2 -> 1: acc[j] = R32(acc[j] + acc[j + h]) for j < h;  NaN -> 0x7FC00000

so gemv and gemm give the same bits for every element, for any row split (threads).

Compiled (and, for f16, with hardware f16 conversion) each dot runs in an intrinsic that keeps
the 32 lanes as one ``<32 x float>`` vector per (weight row, activation) pair, in register tiles
of several rows x activations (each weight chunk widened once per tile; F16C ``vcvtph2ps``),
the last partial chunk zero-padded (a ``+0.0`` product leaves a lane unchanged: a lane that
starts at ``+0.0`` is never ``-0.0``), and the tree as vector halvings.  The portable path
(``NUMBA_DISABLE_JIT``, or f16 without F16C) runs the same steps as scalar loops.
"""

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import inline_kernel, kernel
from numba_qk.kernels.f16 import HW_F16, f16_to_f32, fpext_f16_bits_to_f32
from numba_qk.kernels.simd.base import decl

__all__ = ["LANES", "TILE_ROWS", "TILE_BATCH", "widen", "reduce_lanes", "dot_lanes",
           "gemv_f16", "gemv_bf16", "gemm_f16", "gemm_bf16"]

#: Accumulator lanes of one dot (element i goes to lane i % LANES).
LANES = 32
_CANONICAL_NAN = 0x7FC00000
# The vector fold (an intrinsic) runs only in compiled code; NUMBA_DISABLE_JIT takes the loop.
_VECTOR = not numba.config.DISABLE_JIT


def _widen_vec(builder, wv, bf16):
    """<32 x float> of <32 x i16> codes: ``fpext`` of half (F16C ``vcvtph2ps``) or
    ``code << 16`` (bf16); exact."""
    f32v = ir.VectorType(ir.FloatType(), LANES)
    if bf16:
        i32v = ir.VectorType(ir.IntType(32), LANES)
        return builder.bitcast(builder.shl(builder.zext(wv, i32v),
                                           ir.Constant(i32v, [16] * LANES)), f32v)
    return builder.fpext(builder.bitcast(wv, ir.VectorType(ir.HalfType(), LANES)), f32v)


def _prefetch(builder, ptr):
    """``llvm.prefetch`` read, locality 2 (``prefetcht1``, as ``simd.base.prefetch``): never
    faults, changes no value."""
    i32 = ir.IntType(32)
    fn = decl(builder, "llvm.prefetch.p0i8", ir.VoidType(),
              [ir.IntType(8).as_pointer(), i32, i32, i32])
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])


def _tree(builder, v):
    """``acc[j] += acc[j + h]`` for h = 16, 8, 4, 2, 1 as vector halvings; NaN -> 0x7FC00000."""
    i32 = ir.IntType(32)
    h = LANES // 2
    while h:
        def half(lo):
            idx = ir.Constant(ir.VectorType(i32, h), list(range(lo, lo + h)))
            return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), idx)
        v = builder.fadd(half(0), half(h))
        h //= 2
    s = builder.extract_element(v, ir.Constant(i32, 0))
    nan = builder.bitcast(ir.Constant(i32, _CANONICAL_NAN), ir.FloatType())
    return builder.select(builder.fcmp_unordered("uno", s, s), nan, s)


#: gemm register tile: weight rows x activations per pass (4 x 2 pairs of 2 zmm lanes each:
#: the two activations' K floats stay near the core while 4 weight rows stream; batch 32 of a
#: 4096 x 4096 F16 matrix on Zen 5 10.6-11.1 ms against 13.3-13.8 for 2 x 4; 5-7 x 2 and
#: 4 x 3 about the same as 4 x 2, bench/RESULTS_lowp.md); an odd activation left over runs
#: in TILE_ROWS x 1 tiles, the rows left over (and gemv) one row at a time (measured: 4-row
#: passes stream a 4096 x 4096 F16 matrix 1.45x slower than single rows on Zen 4).
TILE_ROWS, TILE_BATCH = 4, 2
#: single-row dots (gemv) prefetch the weights this many bytes ahead (one forward stream
#: running on into the next rows; simd/base.py's measured 64 KiB).
PREFETCH_BYTES = 1 << 16


def _make_tile(bf16: bool, nr: int, nb: int):
    """Intrinsic ``tile(w, r0, x, b0, out)``: ``out[b0 + j, r0 + i]`` = the canonical dot of
    weight row ``w[r0 + i]`` (uint16 codes) with ``x[b0 + j]`` (f32) for i < nr, j < nb, in one
    pass over K (2-D arrays whose rows are contiguous, ``out`` float32 ``[batch, rows]``)."""
    @intrinsic
    def tile(typingctx, w, r0, x, b0, out):
        if not all(isinstance(a, types.Array) and a.dtype == d and a.ndim == 2
                   for a, d in ((w, types.uint16), (x, types.float32), (out, types.float32))):
            return None
        sig = types.none(w, types.intp, x, types.intp, out)

        def codegen(context, builder, signature, args):
            wty, _, xty, _, oty = signature.args
            i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
            f32v = ir.VectorType(ir.FloatType(), LANES)
            i16v = ir.VectorType(ir.IntType(16), LANES)
            wa = context.make_array(wty)(context, builder, args[0])
            xa = context.make_array(xty)(context, builder, args[2])
            oa = context.make_array(oty)(context, builder, args[4])
            k = builder.extract_value(wa.shape, 1)

            def at(arr, first, i, col, elt):     # &arr[first + i, col]
                row = builder.mul(builder.add(first, ir.Constant(i64, i)),
                                  builder.extract_value(arr.strides, 0))
                col = builder.mul(col, builder.extract_value(arr.strides, 1))
                return builder.bitcast(builder.gep(builder.bitcast(arr.data, i8p),
                                                   [builder.add(row, col)]), elt.as_pointer())
            zero = ir.Constant(i64, 0)
            wps = [at(wa, args[1], i, zero, ir.IntType(16)) for i in range(nr)]
            xps = [at(xa, args[3], j, zero, ir.FloatType()) for j in range(nb)]
            slots = [cgutils.alloca_once_value(builder, ir.Constant(f32v, [0.0] * LANES))
                     for _ in range(nr * nb)]

            def step(wvs, xvs):
                wf = [_widen_vec(builder, v, bf16) for v in wvs]
                for i in range(nr):
                    for j in range(nb):
                        sl = slots[i * nb + j]
                        builder.store(builder.fadd(builder.load(sl),
                                                   builder.fmul(wf[i], xvs[j])), sl)

            def vload(p, off, vt, align):
                return builder.load(builder.bitcast(builder.gep(p, [off]), vt.as_pointer()),
                                    align=align)
            chunks = builder.udiv(k, ir.Constant(i64, LANES))
            kv = builder.mul(chunks, ir.Constant(i64, LANES))
            with cgutils.for_range(builder, chunks) as loop:
                off = builder.mul(loop.index, ir.Constant(i64, LANES))
                if nr == 1:    # one row stream: its line PREFETCH_BYTES ahead into L2
                    _prefetch(builder, builder.gep(builder.bitcast(wps[0], i8p), [
                        builder.add(builder.add(off, off), ir.Constant(i64, PREFETCH_BYTES))]))
                step([vload(p, off, i16v, 2) for p in wps], [vload(p, off, f32v, 4) for p in xps])
            tail = builder.sub(k, kv)
            with builder.if_then(builder.icmp_signed(">", tail, zero)):
                # the partial chunk, zero-padded (+0.0 products leave the lanes unchanged)
                bufs = []
                for p, vt in [(p, i16v) for p in wps] + [(p, f32v) for p in xps]:
                    buf = cgutils.alloca_once_value(builder, ir.Constant(vt, None))
                    elems = builder.bitcast(buf, vt.element.as_pointer())
                    with cgutils.for_range(builder, tail) as loop:
                        builder.store(builder.load(builder.gep(p, [builder.add(kv, loop.index)])),
                                      builder.gep(elems, [loop.index]))
                    bufs.append(builder.load(buf))
                step(bufs[:nr], bufs[nr:])
            for i in range(nr):
                for j in range(nb):
                    s = _tree(builder, builder.load(slots[i * nb + j]))
                    builder.store(s, at(oa, args[3], j, builder.add(args[1], ir.Constant(i64, i)),
                                        ir.FloatType()))
            return context.get_dummy_value()

        return sig, codegen
    return tile


_f16_tile, _f16_one = _make_tile(False, TILE_ROWS, TILE_BATCH), _make_tile(False, 1, 1)
_bf16_tile, _bf16_one = _make_tile(True, TILE_ROWS, TILE_BATCH), _make_tile(True, 1, 1)
_f16_col, _bf16_col = _make_tile(False, TILE_ROWS, 1), _make_tile(True, TILE_ROWS, 1)


@inline_kernel
def widen(code, bf16):
    """The float32 value of one f16 (``bf16`` False) or bf16 code (exact)."""
    if bf16:
        return np.uint32(np.uint32(code) << np.uint32(16)).view(np.float32)
    if HW_F16:
        return fpext_f16_bits_to_f32(np.uint16(code))
    return f16_to_f32(code)


@inline_kernel
def reduce_lanes(acc):
    """The fixed tree 32 -> 16 -> 8 -> 4 -> 2 -> 1 (``acc[j] += acc[j + h]``, in place), with
    any NaN result as the canonical quiet NaN ``0x7FC00000``."""
    h = LANES // 2
    while h:
        for j in range(h):
            acc[j] = np.float32(acc[j] + acc[j + h])
        h //= 2
    s = acc[0]
    if s != s:
        return np.uint32(_CANONICAL_NAN).view(np.float32)
    return s


@inline_kernel
def dot_lanes(bf16, w, x, acc):
    """The canonical dot of codes ``w`` [K] with ``x`` [K] as plain scalar loops (the portable
    path), ``acc`` (float32 [32]) holding the lanes."""
    acc[:] = np.float32(0.0)
    for i in range(w.shape[0]):
        acc[i % LANES] = np.float32(acc[i % LANES] + np.float32(widen(w[i], bf16) * x[i]))
    return reduce_lanes(acc)


@inline_kernel
def _vector(bf16, w, x):
    """The intrinsics apply: compiled, hardware f16 (for f16) and contiguous rows."""
    return _VECTOR and (bf16 or HW_F16) and w.strides[1] == 2 and x.strides[1] == 4


@inline_kernel
def _portable(bf16, w, x, out):
    acc = np.empty(LANES, np.float32)
    for r in range(w.shape[0]):
        for b in range(x.shape[0]):
            out[b, r] = dot_lanes(bf16, w[r], x[b], acc)


@inline_kernel
def _singles(bf16, w, x, out, rt, bt):
    """Single dots for every ``out[b, r]`` outside the tiles ``[0, bt) x [0, rt)``."""
    for r in range(w.shape[0]):
        for b in range(bt if r < rt else 0, x.shape[0]):
            if bf16:
                _bf16_one(w, r, x, b, out)
            else:
                _f16_one(w, r, x, b, out)


@inline_kernel
def _gemm(bf16, w, x, out):
    """Every ``out[b, r]``: tiles of TILE_ROWS x TILE_BATCH, TILE_ROWS x 1 for the activations
    left over, then single dots for the rows left over -- the same bits for each."""
    if not _vector(bf16, w, x):
        _portable(bf16, w, x, out)
        return
    rt = w.shape[0] // TILE_ROWS * TILE_ROWS
    bt = x.shape[0] // TILE_BATCH * TILE_BATCH
    for r0 in range(0, rt, TILE_ROWS):
        for b0 in range(0, bt, TILE_BATCH):
            if bf16:
                _bf16_tile(w, r0, x, b0, out)
            else:
                _f16_tile(w, r0, x, b0, out)
        for b in range(bt, x.shape[0]):
            if bf16:
                _bf16_col(w, r0, x, b, out)
            else:
                _f16_col(w, r0, x, b, out)
    _singles(bf16, w, x, out, rt, x.shape[0])


@inline_kernel
def _gemv(bf16, w, x, out):
    """Single dots (a row stream each, prefetched) as a batch of one."""
    x2 = x.reshape((1, x.shape[0]))
    o2 = out.reshape((1, out.shape[0]))
    if _vector(bf16, w, x2):
        _singles(bf16, w, x2, o2, 0, 0)
    else:
        _portable(bf16, w, x2, o2)


def _entries(bf16):
    """``(gemv_<t>, gemm_<t>)`` of weight type ``t`` (bf16 or f16): ``_gemv`` / ``_gemm``."""
    t = "bf16" if bf16 else "f16"

    def gemv(w, x, out):
        _gemv(bf16, w, x, out)

    def gemm(w, x, out):
        _gemm(bf16, w, x, out)
    gemv.__doc__ = (f"``out[r]`` = the canonical dot of {t} row ``w[r]`` (codes) with ``x`` "
                    f"(f32 values); contiguous 1-d ``x`` and ``out``.")
    gemm.__doc__ = f"``out[b, r]`` = ``gemv_{t}(w, x[b])[r]`` bit for bit, in register tiles."
    for f in (gemv, gemm):
        f.__name__ = f.__qualname__ = f"{f.__name__}_{t}"
    return kernel(gemv), kernel(gemm)


gemv_f16, gemm_f16 = _entries(False)
gemv_bf16, gemm_bf16 = _entries(True)
