"""Explicit-SIMD building blocks, written as LLVM IR through numba intrinsics.

Only *exact integer* work is done here (plus two exact loads): the record statistics
``S_b`` and ``T_b`` of the Q4_K x Q8_K dot.  Integer sums are exact in any order, so the
vector organisation below gives the same integers as the readable loop in ``dot.py``; every
float rounding step stays in plain numba code, in spec order.

Per record pair (256-bit AVX2 form shown; with AVX-512BW the same steps run on 512-bit vectors,
two 32-byte chunks at a time, low and high nibbles shuffled into element order)::

    sc, m      <- 6-bit fields, unpacked from the 12 scale bytes with 32-bit SWAR masks
    for chunk j in 0..3 (32 bytes of Q4_K quants = sub-blocks 2j and 2j+1):
        lo, hi  = qs & 0x0F, qs >> 4                         (u8 x 32 each)
        plo     = pmaddubsw(lo, xq[64j : 64j+32])           (i16 x 16, |.| <= 3840: no saturation)
        phi     = pmaddubsw(hi, xq[64j+32 : 64j+64])
        acc    += pmaddwd(plo, splat(sc[2j])) + pmaddwd(phi, splat(sc[2j+1]))   (i32 x 8)
    S_b = reduce_add(acc)
    T_b = reduce_add(pmaddwd(bsum[0:16], [m0, m0, m1, m1, ..., m7, m7]))

Bounds: a pmaddubsw lane is the sum of two products u4 * i8, at most 2 * 15 * 128 = 3840 in
magnitude (the instruction saturates only beyond 32767); pmaddwd lanes stay below 2**19; all
i32 sums stay within the spec's bounds (|S_b| <= 30,965,760).  ``T_b`` uses the stored int16
``bsum`` exactly (|T_b| <= 33,030,144 for any bytes).

The intrinsics read a record's bytes from an array's data pointer plus a byte offset computed
by the caller from the array's strides; the record's own bytes must be contiguous (unit stride
along the byte axis).  ``dot.py`` checks that and falls back to the portable loop otherwise.
Working from offsets (not sub-array views) also keeps numba's reference counting out of the
hot loop.
``HAVE_AVX2`` says whether the compilation target has AVX2 and F16C; without them the
portable loops are used.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import config
from numba.core import cgutils, types
from numba.extending import intrinsic


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


_FEATURES = _target_features()
# NUMBA_QK_PORTABLE=1 forces the portable loops (they give the same bits, only slower);
# under NUMBA_DISABLE_JIT=1 the intrinsics cannot run, so the portable loops are used too.
HAVE_AVX2 = ({"avx2", "f16c"} <= _FEATURES and not config.DISABLE_JIT
             and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0"))
# 512-bit vectors: AVX-512BW (byte/word ops); NUMBA_QK_NO_AVX512=1 keeps the 256-bit code.
HAVE_AVX512 = (HAVE_AVX2 and {"avx512f", "avx512bw"} <= _FEATURES
               and os.environ.get("NUMBA_QK_NO_AVX512", "") in ("", "0"))

_i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _vec(t, n):
    return ir.VectorType(t, n)


def _decl(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _load(builder, base, offset: int, ty):
    ptr = builder.gep(base, [ir.Constant(_i64, offset)])
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def _splat_lanes(builder, v, lanes):
    """shufflevector v with constant lane indices ``lanes``."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(_vec(_i32, len(lanes)), list(lanes)))


def _unpack_scales(builder, wbase):
    """sc[0..7] and m[0..7] of a Q4_K record as two <8 x i16> vectors.

    Bytes 4..15 as little-endian words u0, u1, u2:
      sc[0..3] = u0 & 0x3f3f3f3f               m[0..3] = u1 & 0x3f3f3f3f
      sc[4..7] = (u2 & 0x0f0f0f0f) | (((u0 >> 6) & 0x03030303) << 4)
      m[4..7]  = ((u2 >> 4) & 0x0f0f0f0f) | (((u1 >> 6) & 0x03030303) << 4)
    """
    u0 = _load(builder, wbase, 4, _i32)
    u1 = _load(builder, wbase, 8, _i32)
    u2 = _load(builder, wbase, 12, _i32)
    low6 = ir.Constant(_i32, 0x3F3F3F3F)
    nib = ir.Constant(_i32, 0x0F0F0F0F)
    top2 = ir.Constant(_i32, 0x03030303)

    def shr(v, n):
        return builder.lshr(v, ir.Constant(_i32, n))

    def shl(v, n):
        return builder.shl(v, ir.Constant(_i32, n))

    sc_lo = builder.and_(u0, low6)
    m_lo = builder.and_(u1, low6)
    sc_hi = builder.or_(builder.and_(u2, nib), shl(builder.and_(shr(u0, 6), top2), 4))
    m_hi = builder.or_(builder.and_(shr(u2, 4), nib), shl(builder.and_(shr(u1, 6), top2), 4))

    def bytes8(lo, hi):
        word = builder.or_(builder.zext(lo, _i64),
                           builder.shl(builder.zext(hi, _i64), ir.Constant(_i64, 32)))
        return builder.zext(builder.bitcast(word, _vec(_i8, 8)), _vec(_i16, 8))

    return bytes8(sc_lo, sc_hi), bytes8(m_lo, m_hi)


def _byte_ptr(context, builder, arrty, arr, offset):
    """data pointer of a uint8 array plus a byte offset (the caller computed it from strides)."""
    return builder.gep(context.make_array(arrty)(context, builder, arr).data, [offset])


def _gen_sums(builder, wbase, xbases, wide: bool):
    """IR for (S_b, T_b) of one Q4_K record against each Q8_K record in ``xbases``.

    The weight record is decoded once (nibbles, scales, mins) and reused for every
    activation record -- the basis of the batched (gemm) kernels.
    ``wide``: 512-bit vectors (AVX-512BW), else 256-bit (AVX2).
    """
    sc16, m16 = _unpack_scales(builder, wbase)
    maddwd8 = _decl(builder, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8),
                    [_vec(_i16, 16), _vec(_i16, 16)])
    reduce8 = _decl(builder, "llvm.vector.reduce.add.v8i32", _i32, [_vec(_i32, 8)])
    if wide:
        lanes = 64
        maddubs = _decl(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec(_i16, 32),
                        [_vec(_i8, 64), _vec(_i8, 64)])
        maddwd = _decl(builder, "llvm.x86.avx512.pmaddw.d.512", _vec(_i32, 16),
                       [_vec(_i16, 32), _vec(_i16, 32)])
        reduce_acc = _decl(builder, "llvm.vector.reduce.add.v16i32", _i32, [_vec(_i32, 16)])
    else:
        lanes = 32
        maddubs = _decl(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_i16, 16),
                        [_vec(_i8, 32), _vec(_i8, 32)])
        maddwd, reduce_acc = maddwd8, reduce8
    low4 = ir.Constant(_vec(_i8, lanes), [0x0F] * lanes)
    four = ir.Constant(_vec(_i8, lanes), [4] * lanes)

    # Weight side, once: quants in element order, one vector per `lanes` elements, and the
    # matching vectors of sub-block scales (each scale repeated over its 16 pmaddubsw lanes).
    quants, scales = [], []
    for h in range(0, 128, lanes):  # `lanes` bytes of packed nibbles at a time
        qs = _load(builder, wbase, 16 + h, _vec(_i8, lanes))
        lo = builder.and_(qs, low4)
        hi = builder.lshr(qs, four)
        for c in range(lanes // 32):  # each 32-byte chunk: low nibbles, then high nibbles
            j = h // 32 + c
            if wide:
                order = [32 * c + k for k in range(32)] + [64 + 32 * c + k for k in range(32)]
                quants.append(builder.shuffle_vector(lo, hi, ir.Constant(_vec(_i32, 64), order)))
                scales.append(_splat_lanes(builder, sc16, [2 * j] * 16 + [2 * j + 1] * 16))
            else:
                quants += [lo, hi]
                scales += [_splat_lanes(builder, sc16, [2 * j] * 16),
                           _splat_lanes(builder, sc16, [2 * j + 1] * 16)]
    m_pairs = _splat_lanes(builder, m16, [k // 2 for k in range(16)])

    # Activation side: element e of the record lives at byte 4 + e, so vector v covers
    # elements [lanes*v, lanes*v + lanes) -- the same order as `quants`.
    results = []
    for xbase in xbases:
        acc = ir.Constant(maddwd.function_type.return_type, None)
        for v, (q, sc) in enumerate(zip(quants, scales)):
            xv = _load(builder, xbase, 4 + lanes * v, _vec(_i8, lanes))
            acc = builder.add(acc, builder.call(maddwd, [builder.call(maddubs, [q, xv]), sc]))
        s_b = builder.call(reduce_acc, [acc])
        bsum = _load(builder, xbase, 260, _vec(_i16, 16))
        t_b = builder.call(reduce8, [builder.call(maddwd8, [bsum, m_pairs])])
        results += [s_b, t_b]
    return results


def _sums_signature(n_act: int, wide: bool, w, x):
    """Typing and codegen shared by the intrinsics below."""
    if not (isinstance(w, types.Array) and isinstance(x, types.Array)):
        return None
    sig = types.UniTuple(types.int32, 2 * n_act)(w, types.intp, x, *([types.intp] * n_act))

    def codegen(context, builder, signature, args):
        wbase = _byte_ptr(context, builder, signature.args[0], args[0], args[1])
        xbases = [_byte_ptr(context, builder, signature.args[2], args[2], off) for off in args[3:]]
        return context.make_tuple(builder, signature.return_type,
                                  _gen_sums(builder, wbase, xbases, wide))

    return sig, codegen


def _make_sums(n_act: int, wide: bool):
    """An intrinsic (w, w_off, x, x_off_0, ..., x_off_{n-1}) -> (S_0, T_0, S_1, T_1, ...)."""
    if n_act == 1:
        def impl(typingctx, w, w_off, x, x_off):
            return _sums_signature(1, wide, w, x)
    elif n_act == 4:
        def impl(typingctx, w, w_off, x, x_off0, x_off1, x_off2, x_off3):
            return _sums_signature(4, wide, w, x)
    else:  # pragma: no cover
        raise ValueError(n_act)
    impl.__name__ = f"q4_k_q8_k_sums_{'avx512' if wide else 'avx2'}_x{n_act}"
    return intrinsic(impl)


q4_k_q8_k_sums_avx2 = _make_sums(1, wide=False)
q4_k_q8_k_sums_avx2.__doc__ = """(S_b, T_b) as int32 for the Q4_K record at byte ``w_off`` of uint8
array ``w`` and the Q8_K record at byte ``x_off`` of ``x`` (256-bit vectors)."""
q4_k_q8_k_sums_avx512 = _make_sums(1, wide=True)
q4_k_q8_k_sums_x4_avx2 = _make_sums(4, wide=False)
q4_k_q8_k_sums_x4_avx512 = _make_sums(4, wide=True)

# The widest available variant, used by the fast paths.
q4_k_q8_k_sums = q4_k_q8_k_sums_avx512 if HAVE_AVX512 else q4_k_q8_k_sums_avx2
q4_k_q8_k_sums_x4 = q4_k_q8_k_sums_x4_avx512 if HAVE_AVX512 else q4_k_q8_k_sums_x4_avx2


@intrinsic
def load_f16_fpext(typingctx, arr, off):
    """IEEE f16 at byte ``off`` of uint8 array ``arr``, widened to f32 by ``fpext`` (exact for
    every value; a signalling NaN may come back quiet; F16C hardware)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.HalfType().as_pointer())
        return builder.fpext(builder.load(ptr, align=1), ir.FloatType())

    return sig, codegen


@intrinsic
def load_f32_raw(typingctx, arr, off):
    """IEEE f32 at byte ``off`` of uint8 array ``arr`` (one unaligned load, bits kept)."""
    sig = types.float32(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = builder.bitcast(_byte_ptr(context, builder, signature.args[0], args[0], args[1]),
                              ir.FloatType().as_pointer())
        return builder.load(ptr, align=1)

    return sig, codegen
