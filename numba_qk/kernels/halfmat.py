"""F16 and BF16 weight matrices times activations: the portable gemv/gemm kernels of
docs/halfmat.md (numba_qk's canonical numerics for ``matmul`` with ``numba_qk.f16`` /
``numba_qk.bf16`` weights).

Inputs: weights as their 16-bit codes ``w`` uint16 ``[rows, K]`` (C-contiguous), activations
already rounded to the weight's type and widened back, ``x`` float32 ``[K]`` (gemv) or
``[batch, K]`` (gemm).  Every output is

    lanes l = 0..31 start at +0.0;  for i = 0..K-1 in order: acc[i % 32] = R32(acc[i % 32] + R32(w_i * x_i))
    then 16 -> 8 -> 4 -> 2 -> 1: acc[j] = R32(acc[j] + acc[j + h]) for j < h;  NaN -> 0x7FC00000

so gemv and gemm give the same bits for every element, for any row split (threads).  The
32 lanes are explicit arrays, so LLVM vectorizes them without fast-math (4 x 8 f32 lanes on
AVX; the f16 weights widen with ``vcvtph2ps`` where the host has F16C).
"""

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import inline_kernel, kernel
from numba_qk.kernels.f16 import HW_F16, f16_to_f32, fpext_f16_bits_to_f32

__all__ = ["LANES", "TILE_ROWS", "TILE_BATCH", "widen", "reduce_lanes", "dot_row", "gemv_f16",
           "gemv_bf16", "gemm_f16", "gemm_bf16"]

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


def _make_fold(bf16: bool):
    """Intrinsic ``fold(w, x, chunks, acc)``: for c in 0..chunks-1, the 32 lanes
    ``acc[l] = R32(acc[l] + R32(widen(w[32c + l]) * x[32c + l]))`` as one <32 x float> vector
    kept in registers (``w`` uint16 codes, ``x`` float32, ``acc`` float32 [32], all contiguous
    from element 0).  Widening: ``fpext`` of half (F16C ``vcvtph2ps``) or ``code << 16``.  The
    same operations, in the same order per lane, as the scalar definition: plain ``fmul`` then
    ``fadd`` (no contraction flags)."""
    @intrinsic
    def fold(typingctx, w, x, chunks, acc):
        if not all(isinstance(a, types.Array) and a.dtype == d and a.layout == "C"
                   for a, d in ((w, types.uint16), (x, types.float32), (acc, types.float32))):
            return None
        sig = types.none(w, x, types.intp, acc)

        def codegen(context, builder, signature, args):
            wty, xty, _, aty = signature.args
            i64 = ir.IntType(64)
            f32v = ir.VectorType(ir.FloatType(), LANES)
            i16v = ir.VectorType(ir.IntType(16), LANES)
            wp = context.make_array(wty)(context, builder, args[0]).data
            xp = context.make_array(xty)(context, builder, args[1]).data
            accp = builder.bitcast(context.make_array(aty)(context, builder, args[3]).data,
                                   f32v.as_pointer())
            slot = cgutils.alloca_once(builder, f32v)
            builder.store(builder.load(accp, align=4), slot)
            with cgutils.for_range(builder, args[2]) as loop:
                off = builder.mul(loop.index, ir.Constant(i64, LANES))
                wv = builder.load(builder.bitcast(builder.gep(wp, [off]), i16v.as_pointer()),
                                  align=2)
                wf = _widen_vec(builder, wv, bf16)
                xv = builder.load(builder.bitcast(builder.gep(xp, [off]), f32v.as_pointer()),
                                  align=4)
                builder.store(builder.fadd(builder.load(slot), builder.fmul(wf, xv)), slot)
            builder.store(builder.load(slot), accp, align=4)
            return context.get_dummy_value()

        return sig, codegen
    return fold


_fold_f16 = _make_fold(False)
_fold_bf16 = _make_fold(True)

#: gemm register tile: weight rows x activations per pass (2 x 4 x 2 zmm accumulators).
TILE_ROWS, TILE_BATCH = 2, 4


def _make_tile(bf16: bool, nr: int = TILE_ROWS, nb: int = TILE_BATCH):
    """Intrinsic ``tile(w, r0, x, b0, chunks, acc)``: ``fold`` for the ``nr x nb`` pairs of
    weight rows ``w[r0 + i]`` and activations ``x[b0 + j]`` (2-D C arrays) at once, into
    ``acc[i * nb + j]`` (float32 [nr * nb, 32], from +0.0): each weight chunk is widened once
    per pass, each lane of each pair sees the same operations in the same order as ``fold``."""
    @intrinsic
    def tile(typingctx, w, r0, x, b0, chunks, acc):
        if not all(isinstance(a, types.Array) and a.dtype == d and a.layout == "C" and a.ndim == 2
                   for a, d in ((w, types.uint16), (x, types.float32), (acc, types.float32))):
            return None
        sig = types.none(w, types.intp, x, types.intp, types.intp, acc)

        def codegen(context, builder, signature, args):
            wty, _, xty, _, _, aty = signature.args
            i64 = ir.IntType(64)
            f32v = ir.VectorType(ir.FloatType(), LANES)
            i16v = ir.VectorType(ir.IntType(16), LANES)
            wa = context.make_array(wty)(context, builder, args[0])
            xa = context.make_array(xty)(context, builder, args[2])
            wrow = builder.extract_value(wa.strides, 0)   # bytes
            xrow = builder.extract_value(xa.strides, 0)
            i8p = ir.IntType(8).as_pointer()

            def row_ptr(arr, stride, first, i, elt):
                at = builder.mul(builder.add(first, ir.Constant(i64, i)), stride)
                return builder.bitcast(builder.gep(builder.bitcast(arr.data, i8p), [at]),
                                       elt.as_pointer())
            wps = [row_ptr(wa, wrow, args[1], i, ir.IntType(16)) for i in range(nr)]
            xps = [row_ptr(xa, xrow, args[3], j, ir.FloatType()) for j in range(nb)]
            accp = builder.bitcast(context.make_array(aty)(context, builder, args[5]).data,
                                   f32v.as_pointer())
            slots = [cgutils.alloca_once_value(builder, ir.Constant(f32v, [0.0] * LANES))
                     for _ in range(nr * nb)]
            with cgutils.for_range(builder, args[4]) as loop:
                off = builder.mul(loop.index, ir.Constant(i64, LANES))
                wf = [_widen_vec(builder, builder.load(builder.bitcast(
                    builder.gep(p, [off]), i16v.as_pointer()), align=2), bf16) for p in wps]
                xv = [builder.load(builder.bitcast(builder.gep(p, [off]), f32v.as_pointer()),
                                   align=4) for p in xps]
                for i in range(nr):
                    for j in range(nb):
                        s = slots[i * nb + j]
                        builder.store(builder.fadd(builder.load(s), builder.fmul(wf[i], xv[j])), s)
            for k, s in enumerate(slots):
                builder.store(builder.load(s), builder.gep(accp, [ir.Constant(i64, k)]), align=4)
            return context.get_dummy_value()

        return sig, codegen
    return tile


_tile_f16 = _make_tile(False)
_tile_bf16 = _make_tile(True)


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
def dot_row(bf16, w, x, acc):
    """The canonical dot of one row of codes ``w`` [K] with ``x`` [K] (contiguous), using
    ``acc`` (float32 [32]) as the lanes."""
    k = w.shape[0]
    chunks = k // LANES
    kv = chunks * LANES
    acc[:] = np.float32(0.0)
    if bf16 and _VECTOR:
        _fold_bf16(w, x, chunks, acc)
    elif not bf16 and HW_F16:
        _fold_f16(w, x, chunks, acc)
    else:
        for i in range(kv):
            acc[i % LANES] = np.float32(acc[i % LANES] + np.float32(widen(w[i], bf16) * x[i]))
    return _finish(bf16, w, x, acc, kv)


@inline_kernel
def _gemv(bf16, w, x, out):
    acc = np.empty(LANES, np.float32)
    for r in range(w.shape[0]):
        out[r] = dot_row(bf16, w[r], x, acc)


@inline_kernel
def _finish(bf16, w, x, acc, kv):
    """The scalar tail ``[kv, K)`` of one dot into its lanes ``acc``, then the tree."""
    for i in range(kv, w.shape[0]):
        acc[i - kv] = np.float32(acc[i - kv] + np.float32(widen(w[i], bf16) * x[i]))
    return reduce_lanes(acc)


@inline_kernel
def _gemm(bf16, w, x, out):
    """Register tiles of TILE_ROWS weight rows x TILE_BATCH activations (``_tile_*``), the
    rows and activations left over by ``dot_row``: the same bits for every element."""
    rows, k = w.shape
    batch = x.shape[0]
    chunks = k // LANES
    kv = chunks * LANES
    acc = np.empty((TILE_ROWS * TILE_BATCH, LANES), np.float32)
    lanes = np.empty(LANES, np.float32)
    rt = rows // TILE_ROWS * TILE_ROWS if _VECTOR and (bf16 or HW_F16) else 0
    bt = batch // TILE_BATCH * TILE_BATCH
    for r0 in range(0, rt, TILE_ROWS):
        for b0 in range(0, bt, TILE_BATCH):
            if bf16:
                _tile_bf16(w, r0, x, b0, chunks, acc)
            else:
                _tile_f16(w, r0, x, b0, chunks, acc)
            for i in range(TILE_ROWS):
                for j in range(TILE_BATCH):
                    out[b0 + j, r0 + i] = _finish(bf16, w[r0 + i], x[b0 + j],
                                                  acc[i * TILE_BATCH + j], kv)
        for b in range(bt, batch):
            for i in range(TILE_ROWS):
                out[b, r0 + i] = dot_row(bf16, w[r0 + i], x[b], lanes)
    for r in range(rt, rows):
        for b in range(batch):
            out[b, r] = dot_row(bf16, w[r], x[b], lanes)


@kernel
def gemv_f16(w, x, out):
    """``out[r]`` = the canonical dot of f16 row ``w[r]`` (codes) with ``x`` (f32 values)."""
    _gemv(False, w, x, out)


@kernel
def gemv_bf16(w, x, out):
    """``out[r]`` = the canonical dot of bf16 row ``w[r]`` (codes) with ``x`` (f32 values)."""
    _gemv(True, w, x, out)


@kernel
def gemm_f16(w, x, out):
    """``out[b, r]`` = ``gemv_f16(w, x[b])[r]`` bit for bit, each weight row widened once."""
    _gemm(False, w, x, out)


@kernel
def gemm_bf16(w, x, out):
    """``out[b, r]`` = ``gemv_bf16(w, x[b])[r]`` bit for bit, each weight row widened once."""
    _gemm(True, w, x, out)
