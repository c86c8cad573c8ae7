"""Explicit-SIMD plumbing shared by the per-format decoders (LLVM IR through numba intrinsics).

This module holds what every explicit-SIMD fast path needs: the target's features
(``HAVE_AVX2``, ``HAVE_AVX512``, the ``NUMBA_QK_PORTABLE`` / ``NUMBA_QK_NO_AVX512`` switches),
unaligned loads from a record's byte offset, the vector-instruction declarations (``Ops``),
horizontal sums of many vectors (``reduce_many``), lane gathers of f16/f32 fields, the lane-wise
in-order fold (``fold_into``), the tile pointer helper and two exact scalar loads.  The
per-format decoders live beside it: ``_simd_q4_k.py`` (Q4_K x Q8_K) and ``_simd_legacy.py``
(ggml's legacy formats).  Only exact integer work and exact loads are done in IR; the float steps
are one IEEE instruction each, with no fast-math flags, so nothing is fused.

The intrinsics read a record's bytes from an array's data pointer plus a byte offset computed
by the caller from the array's strides; the record's own bytes must be contiguous (unit stride
along the byte axis); the kernels check that and fall back to the portable loops otherwise.
``HAVE_AVX2`` says whether the compilation target has AVX2 and F16C; without them the
portable loops are used.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm_binding
import numpy as np
from llvmlite import ir
from numba import config
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import inline_kernel, kernel


def _target_features() -> set[str]:
    """Features of the CPU numba compiles for (host unless NUMBA_CPU_NAME says otherwise)."""
    if config.CPU_NAME and config.CPU_NAME != "host":
        feats = config.CPU_FEATURES or ""
    else:
        try:
            feats = llvm_binding.get_host_cpu_features().flatten()
        except Exception:  # pragma: no cover - exotic hosts
            return set()
    return {f[1:] for f in feats.split(",") if f.startswith("+")}


FEATURES = _target_features()
# NUMBA_QK_PORTABLE=1 forces the portable loops (they give the same bits, only slower);
# under NUMBA_DISABLE_JIT=1 the intrinsics cannot run, so the portable loops are used too.
HAVE_AVX2 = ({"avx2", "f16c"} <= FEATURES and not config.DISABLE_JIT
             and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0"))
# 512-bit vectors: AVX-512BW (byte/word ops); NUMBA_QK_NO_AVX512=1 keeps the 256-bit code.
HAVE_AVX512 = (HAVE_AVX2 and {"avx512f", "avx512bw"} <= FEATURES
               and os.environ.get("NUMBA_QK_NO_AVX512", "") in ("", "0"))
# AVX-512 VNNI (with VL for the 256-bit forms): vpdpwssd / vpdpbusd fuse a multiply-add with the
# i32 accumulation (exact integer sums, so they change no value); NUMBA_QK_NO_VNNI=1 keeps
# pmaddwd + add.
HAVE_VNNI = (HAVE_AVX2 and {"avx512f", "avx512bw", "avx512vl", "avx512vnni"} <= FEATURES
             and os.environ.get("NUMBA_QK_NO_VNNI", "") in ("", "0"))

# GFNI (vgf2p8affineqb: an 8x8 bit-matrix per qword applied to every byte) moves nibbles and
# single bits in one op; NUMBA_QK_NO_GFNI=1 keeps the shift/mask/blend code.
HAVE_GFNI = (HAVE_AVX2 and "gfni" in FEATURES
             and os.environ.get("NUMBA_QK_NO_GFNI", "") in ("", "0"))

i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def vec(t, n):
    return ir.VectorType(t, n)


def decl(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def load(builder, base, offset: int, ty):
    ptr = builder.gep(base, [ir.Constant(i64, offset)])
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def splat_lanes(builder, v, lanes):
    """shufflevector v with constant lane indices ``lanes``."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(vec(i32, len(lanes)), list(lanes)))


def nibble_lookup(builder, packed16, values):
    """<32 x i8> in element order of 16 packed code bytes: the low nibbles' entries of the
    16-entry int8 table ``values`` (elements 0..15), then the high nibbles' (16..31), by one
    ``pshufb`` per half (ggml's nibble layout of Q4_0 / IQ4_NL / MXFP4 blocks)."""
    v16 = vec(i8, 16)
    pshufb = decl(builder, "llvm.x86.ssse3.pshuf.b.128", v16, [v16, v16])
    table = ir.Constant(v16, [int(v) for v in values])
    lo = builder.and_(packed16, ir.Constant(v16, [0x0F] * 16))
    hi = builder.lshr(packed16, ir.Constant(v16, [4] * 16))
    return builder.shuffle_vector(builder.call(pshufb, [table, lo]),
                                  builder.call(pshufb, [table, hi]),
                                  ir.Constant(vec(i32, 32), list(range(32))))


def byte_ptr(context, builder, arrty, arr, offset):
    """data pointer of a uint8 array plus a byte offset (the caller computed it from strides)."""
    return builder.gep(context.make_array(arrty)(context, builder, arr).data, [offset])


class Ops:
    """Declarations of the vector instructions used, for one vector width.  With ``vnni``
    (callers check ``HAVE_VNNI``) the AVX-512 VNNI forms are declared too: ``dpwssd``
    (acc + pmaddwd(a, b)) and ``dpbusd`` (acc + sums of four u8 x i8 products), at the width of
    ``maddwd``; otherwise they are None."""

    def __init__(self, builder, wide: bool, vnni: bool = False):
        self.wide = wide
        self.dpwssd = self.dpbusd = None
        if vnni:
            n = 16 if wide else 8
            w = 512 if wide else 256
            self.dpwssd = decl(builder, f"llvm.x86.avx512.vpdpwssd.{w}", vec(i32, n),
                                [vec(i32, n), vec(i16, 2 * n), vec(i16, 2 * n)])
            self.dpbusd = decl(builder, f"llvm.x86.avx512.vpdpbusd.{w}", vec(i32, n),
                                [vec(i32, n), vec(i8, 4 * n), vec(i8, 4 * n)])
        self.lanes = 64 if wide else 32  # int8 lanes per vector
        self.maddwd8 = decl(builder, "llvm.x86.avx2.pmadd.wd", vec(i32, 8),
                             [vec(i16, 16), vec(i16, 16)])
        if wide:
            self.maddubs = decl(builder, "llvm.x86.avx512.pmaddubs.w.512", vec(i16, 32),
                                 [vec(i8, 64), vec(i8, 64)])
            self.maddwd = decl(builder, "llvm.x86.avx512.pmaddw.d.512", vec(i32, 16),
                                [vec(i16, 32), vec(i16, 32)])
        else:
            self.maddubs = decl(builder, "llvm.x86.avx2.pmadd.ub.sw", vec(i16, 16),
                                 [vec(i8, 32), vec(i8, 32)])
            self.maddwd = self.maddwd8


def vcall(builder, fn, args):
    """Call ``fn`` with each vector argument bitcast to the parameter type it declares (same
    bit width): the VNNI intrinsics take <64 x i8> / <32 x i16> operands, callers often hold
    the same bits as <16 x i32>."""
    params = fn.function_type.args
    return builder.call(fn, [x if x.type == t else builder.bitcast(x, t)
                             for x, t in zip(args, params)])


def reduce_many(builder, vecs):
    """Horizontal sums of n equal-length i32 vectors as one <n x i32> vector (n a power of
    two, at most the lane count): pairwise lane sums that keep each vector's lanes together,
    so n sums cost about as much as two single reductions."""
    n = len(vecs)
    width = vecs[0].type.count
    while len(vecs) > 1:  # merge pairs: c = [a0+a1, a2+a3, ..., b0+b1, b2+b3, ...]
        merged = []
        for a, b in zip(vecs[0::2], vecs[1::2]):
            even = [2 * i for i in range(width // 2)] + [width + 2 * i for i in range(width // 2)]
            odd = [e + 1 for e in even]
            merged.append(builder.add(
                builder.shuffle_vector(a, b, ir.Constant(vec(i32, width), even)),
                builder.shuffle_vector(a, b, ir.Constant(vec(i32, width), odd))))
        vecs = merged
    v = vecs[0]
    while v.type.count > n:  # halve: lane i = v[2i] + v[2i+1]; groups keep their order
        half = v.type.count // 2
        und = ir.Constant(v.type, ir.Undefined)
        v = builder.add(
            builder.shuffle_vector(v, und, ir.Constant(vec(i32, half), [2 * i for i in range(half)])),
            builder.shuffle_vector(v, und, ir.Constant(vec(i32, half), [2 * i + 1 for i in range(half)])))
    return v


def neg_dots(b, ops, pairs):
    """The start of an accumulator that subtracts ``sum dot(a, c)`` over ``pairs`` (``dots``):
    VNNI: -(the i32 lanes); otherwise -(the i16 lanes)."""
    n = ops.lanes
    if ops.dpbusd is not None:
        acc = ir.Constant(vec(i32, n // 4), None)
        for a, c in pairs:
            acc = b.call(ops.dpbusd, [acc, a, c])
        return b.sub(ir.Constant(acc.type, None), acc)
    p = None
    for a, c in pairs:
        m = b.call(ops.maddubs, [a, c])
        p = m if p is None else b.add(p, m)
    return b.sub(ir.Constant(p.type, None), p)


def dots(b, ops, start, pairs):
    """i32 vector whose lane sum is ``sum dot(a, c)`` over ``pairs`` (u8 ``a``, i8 ``c``) plus
    the lane sum of ``start`` (``neg_dots``)."""
    if ops.dpbusd is not None:
        acc = start
        for a, c in pairs:
            acc = b.call(ops.dpbusd, [acc, a, c])
        return acc
    p = start
    for a, c in pairs:
        p = b.add(p, b.call(ops.maddubs, [a, c]))
    ones = ir.Constant(p.type, [1] * p.type.count)
    return b.call(ops.maddwd, [p, ones])


def gather_f16(builder, bases, offset):
    """<n x float> from the f16 at ``offset`` of each base (exact widening, vcvtph2ps)."""
    v = ir.Constant(vec(ir.HalfType(), len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, load(builder, b, offset, ir.HalfType()), ir.Constant(i32, i))
    return builder.fpext(v, vec(ir.FloatType(), len(bases)))


def gather_f32(builder, bases, offset):
    v = ir.Constant(vec(ir.FloatType(), len(bases)), None)
    for i, b in enumerate(bases):
        v = builder.insert_element(v, load(builder, b, offset, ir.FloatType()), ir.Constant(i32, i))
    return v


def fold_into(builder, acc_ptr, v, first):
    """acc = v if first else R32(acc + v), lane by lane (each lane its own in-order fold)."""
    ptr = builder.bitcast(acc_ptr, v.type.as_pointer())
    old = builder.load(ptr, align=4)
    new = builder.select(builder.icmp_signed("!=", first, ir.Constant(first.type, 0)),
                         v, builder.fadd(old, v))
    builder.store(new, ptr, align=4)


def _tile_bases(context, builder, wty, w_arr, w_off, xty, x_arr, x_off, step, over_rows, n):
    """Record pointers of one tile: n weight records ``step`` bytes apart against one activation
    record (over_rows, gemv), or one weight record against n activation records (gemm).  The
    shared record is the same IR value n times, so it is decoded/loaded once."""
    offs = [builder.mul(step, ir.Constant(step.type, k)) for k in range(n)]
    if over_rows:
        wbs = [byte_ptr(context, builder, wty, w_arr, builder.add(w_off, o)) for o in offs]
        xbs = [byte_ptr(context, builder, xty, x_arr, x_off)] * n
    else:
        wbs = [byte_ptr(context, builder, wty, w_arr, w_off)] * n
        xbs = [byte_ptr(context, builder, xty, x_arr, builder.add(x_off, o)) for o in offs]
    return wbs, xbs


def float_array_ptr(context, builder, arrty, arr):
    return context.make_array(arrty)(context, builder, arr).data


def tile_fold(context, builder, signature, args, at, over_rows, n, values):
    """Codegen shared by the accumulate intrinsics.  ``args[at:at + 8]`` are (w, w_off, x,
    x_off, step, acc, acc_at, first); ``values(wbs, xbs)`` builds the <n x float> record values
    of the tile, which are folded into ``acc.flat[acc_at : acc_at + n]`` lane by lane."""
    w_arr, w_off_v, x_arr, x_off_v, step_v, acc_arr, acc_at_v, first_v = args[at:at + 8]
    wbs, xbs = _tile_bases(context, builder, signature.args[at], w_arr, w_off_v,
                           signature.args[at + 2], x_arr, x_off_v, step_v, over_rows, n)
    v = values(wbs, xbs)
    acc_ptr = builder.gep(float_array_ptr(context, builder, signature.args[at + 5], acc_arr),
                          [acc_at_v])
    fold_into(builder, acc_ptr, v, first_v)
    return context.get_dummy_value()


def pmaddwd32(builder, ops, a, b):
    """pmaddwd of two <32 x i16>: one 512-bit instruction, or two 256-bit ones added."""
    if ops.wide:
        return builder.call(ops.maddwd, [a, b])
    halves = []
    for h in range(2):
        idx = ir.Constant(vec(i32, 16), list(range(16 * h, 16 * h + 16)))
        halves.append(builder.call(ops.maddwd8, [
            builder.shuffle_vector(a, ir.Constant(a.type, ir.Undefined), idx),
            builder.shuffle_vector(b, ir.Constant(b.type, ir.Undefined), idx)]))
    return builder.add(halves[0], halves[1])


def literal_int(t):
    return t.literal_value if isinstance(t, types.IntegerLiteral) else None


def fold_signature(acc, *arrays, step=False):
    """Typing of the fold intrinsics ``(a0, off0, a1, off1, ..., [step,] acc, acc_at, first)``:
    their signature for the arrays ``arrays`` (each with an intp byte offset), an intp ``step``
    where asked and an f32 array ``acc``, else None."""
    if not (all(isinstance(a, types.Array) for a in arrays)
            and isinstance(acc, types.Array) and acc.dtype == types.float32):
        return None
    args = [t for a in arrays for t in (a, types.intp)] + ([types.intp] if step else [])
    return types.none(*args, acc, types.intp, types.intp)


def tile_signature(w, x, acc):
    """``fold_signature`` of the 8-lane tiles ``(w, w_off, x, x_off, step, acc, acc_at,
    first)``."""
    return fold_signature(acc, w, x, step=True)


def record_intrinsic(value: bool, compute):
    """The intrinsic ``f(w, w_off, x, x_off)`` of the weight record at byte ``w_off`` of uint8
    array ``w`` and the activation record at byte ``x_off`` of ``x`` (each record's bytes
    contiguous): lane 0 of the vector ``compute(builder, wb, xb)`` builds from the two record
    pointers, the sum S (int32) or with ``value`` the record value v (float32)."""
    @intrinsic
    def record(typingctx, w, w_off, x, x_off):
        if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
            return None
        sig = (types.float32 if value else types.int32)(w, types.intp, x, types.intp)

        def codegen(context, builder, signature, args):
            wb = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            xb = byte_ptr(context, builder, signature.args[2], args[2], args[3])
            return builder.extract_element(compute(builder, wb, xb), ir.Constant(i32, 0))
        return sig, codegen
    return record


def tile_intrinsic(over_rows: bool, n: int, make_values):
    """The intrinsic ``accumulate(w, w_off, x, x_off, step, acc, acc_at, first)`` folding ``n``
    record values into ``acc.flat[acc_at : acc_at + n]`` (``tile_fold``): over_rows (gemv)
    pairs weight record ``w_off + k*step`` with the activation record at ``x_off``, otherwise
    (gemm) the weight record at ``w_off`` with activation record ``x_off + k*step``.
    ``make_values(builder)`` gives the ``values(wbs, xbs)`` of the format's lanes."""
    @intrinsic
    def accumulate(typingctx, w, w_off, x, x_off, step, acc, acc_at, first):
        sig = tile_signature(w, x, acc)
        if sig is None:
            return None

        def codegen(context, builder, signature, args):
            return tile_fold(context, builder, signature, args, 0, over_rows, n,
                              make_values(builder))
        return sig, codegen
    return accumulate


@intrinsic
def load_f16_fpext(typingctx, arr, off):
    """IEEE f16 at byte ``off`` of uint8 array ``arr``, widened to f32 by ``fpext`` (exact for
    every value; a signalling NaN may come back quiet; F16C hardware)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.HalfType().as_pointer())
        return builder.fpext(builder.load(ptr, align=1), ir.FloatType())

    return sig, codegen


@intrinsic
def load_f32_raw(typingctx, arr, off):
    """IEEE f32 at byte ``off`` of uint8 array ``arr`` (one unaligned load, bits kept)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.FloatType().as_pointer())
        return builder.load(ptr, align=1)

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, off):
    """Hint the cache to fetch the line holding byte ``off`` of uint8 array ``arr`` into L2
    (``llvm.prefetch`` read, locality 2: ``prefetcht1``).  Never faults and changes no value, so
    any offset is allowed -- the streaming kernels prefetch rows ahead with it.  L2, not L1: on
    AMD Zen 4 ``prefetcht0`` streams of this kind reached only ~15 GB/s from DRAM (the L1's few
    miss buffers fill up), ``prefetcht1`` 28 GB/s, the core's plain read rate (bench/experiments/stream_ab.py)."""
    sig = types.none(arr, types.intp)

    def codegen(context, builder, signature, args):
        emit_prefetch(context, builder, signature.args[0], args[0], args[1], 2)
        return context.get_dummy_value()

    return sig, codegen


def emit_prefetch(context, builder, arr_type, arr, off, locality):
    """Emit ``llvm.prefetch`` (a read into the data cache) of the line holding byte ``off`` of
    uint8 array ``arr`` (of numba type ``arr_type``), ``locality`` 3 (``prefetcht0``, L1) to 0:
    the IR of ``prefetch`` and of intrinsics that choose another cache level."""
    ptr = byte_ptr(context, builder, arr_type, arr, off)
    fn = decl(builder, "llvm.prefetch.p0i8", ir.VoidType(), [i8.as_pointer(), i32, i32, i32])
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


# A gemv tile of 8 rows lies in one contiguous block of 8 row strides.  The streaming gemv
# kernels fetch the tile about 64 KiB ahead (``prefetch_plan``) as one linear byte range, an
# equal share of its lines per record step: a single forward stream that arrives before it is
# needed (eight short interleaved row streams, as the tile reads them, defeat the hardware
# prefetcher).
_PREFETCH_BYTES = 1 << 16


@kernel
def prefetch_plan(tile_bytes, steps):
    """``(distance, lines)`` for a loop of ``steps`` record steps per tile of ``tile_bytes``:
    prefetch the tile ``distance`` bytes ahead, ``lines`` 64-byte lines per step (the tile's
    lines split evenly).  The distance is at least 2 tiles and at least 64 KiB (bench/experiments/stream_ab.py: 1 tile lost 5-10 %, 64-128 KiB was best for
    4096- and 14336-wide rows).  Computed once per call: the divisions stay out of the loop."""
    t = max(np.int64(tile_bytes), np.int64(1))
    tiles = max(np.int64(2), (np.int64(_PREFETCH_BYTES) + t - np.int64(1)) // t)
    lines = (t + np.int64(63)) // np.int64(64)   # (an unaligned tile's last partial line is
    #                                                 the next tile's first: fetched then)
    n = max(np.int64(steps), np.int64(1))
    return tiles * t, (lines + n - np.int64(1)) // n


@inline_kernel
def prefetch_lines(w, start, lines, end):
    """Prefetch ``lines`` 64-byte lines of uint8 array ``w`` from byte ``start`` on, none when
    ``start`` is at or beyond byte ``end`` (a range that starts before ``end`` may run past it:
    a prefetch never faults).  Inlined into the tile loops at numba IR level and kept free of a
    bound per line: as a call with a clipped ``range`` it cost 3 % of a hot Q4_K gemv."""
    if np.int64(start) < np.int64(end):
        for j in range(np.int64(lines)):
            prefetch(w, np.int64(start) + j * np.int64(64))