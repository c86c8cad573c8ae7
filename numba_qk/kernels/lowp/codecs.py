"""Encode/decode kernels for the low-precision element types (spec 004, DESIGN.md §8).

Every helper is ``@njit`` (numba_qk's JIT policy) and callable from your own ``@njit`` code --
numba cannot type ml_dtypes arrays, so hold codes in ``uint8``/``uint16`` arrays and use
``decode_<t>(code) -> float32`` / ``encode_<t>(x) -> code`` (``x`` float32 or float64).

Numerics (one table, DESIGN.md §8):

* **Decode** is exact: every value of every type here is a float32 (and a float64).
* **Encode** is *one* round-to-nearest-even step from the exact source value.  A float32 or
  float64 source is widened exactly to float64 and rounded once by integer arithmetic on its
  bits (:func:`_encode_float`): no double rounding through float32.  64-bit integer sources are
  first narrowed to float64 *round-to-odd* (sticky last bit), which makes the following RNE to
  any target of <= 24 significant bits equal to one rounding of the exact integer.
* Overflow and specials, per target:

  ======================  ========================================  ===========================
  target                  finite overflow and +-inf                 NaN
  ======================  ========================================  ===========================
  f16, bf16, e5m2         +-inf (IEEE: >= max + half an ulp)        quiet NaN, sign kept
  f32                     +-inf                                     sign kept (see below)
  e4m3                    saturate to +-448                         S.1111.111 (0x7F/0xFF)
  e2m3, e3m2, e2m1        saturate to +-max                         +0
  e8m0                    2^127 (0xFE), +inf too                    0xFF (also 0, negatives)
  i8 u8 i32 i4 u4 u1      round half to even, saturate              0
  ======================  ========================================  ===========================

  e8m0 rounds to the nearest power of two with ties (exactly 1.5 * 2^k) upward; every value
  below 2^-127 (f32 subnormals included) gives code 0 (2^-127).
  Signs: negative values that round to zero keep their sign (-0 code) for float types with a
  sign bit.  f16/bf16/e5m2 NaNs are the canonical quiet NaN with the sign (payload dropped).
  Every NaN keeps its sign, on every path (vector and scalar): a negative NaN code of e4m3
  (0xFF) or e5m2 (0xFD-0xFF) decodes to the negative quiet NaN (f32 0xFFC00000) and converts
  to the negative NaN code of any float target.  f32 targets: f16 and bf16 NaNs widen exactly
  (payload and signalling bit kept, like numpy's f16 -> f32); fp8 NaNs give the canonical
  quiet NaN with the sign; f64 NaNs convert as numpy's f64 -> f32 does (quietened, the top
  payload bits kept).

Packed storage: two nibbles per byte with element 0 in the HIGH nibble (i4, u4, e2m1); u1 eight
per byte, element 0 in the most significant bit (``numpy.packbits``).  i4 codes are
two's-complement nibbles.  fp6 codes sit in the low 6 bits of their byte.
"""

import os

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import kernel
from numba_qk.formats import scalars as _scalars
from numba_qk.kernels.simd import base as _simd
from numba_qk.kernels.simd import stream as _stream
from numba_qk.kernels.f16 import HW_F16, bf16_bits_to_f32_bits, f16_to_f32
from numba_qk.kernels.f16 import f16_bits_to_f32_bits_hw as _f16_to_f32_bits_hw
from numba_qk.kernels.f16 import f32_bits_to_bf16_canonical_nan as _bf16_from_f32_bits
from numba_qk.kernels.f16 import f32_bits_to_f16_canonical_nan as _f16_from_f32_bits


# Element/source kind codes (closure constants of the conversion kernels).
K_F32, K_F16, K_BF16, K_E4M3, K_E5M2, K_E2M3, K_E3M2, K_E2M1, K_E8M0 = range(9)
K_I8, K_U8, K_I32, K_I4, K_U4, K_U1 = range(9, 15)
# source-only kinds
K_F64, K_I16, K_U16, K_U32, K_I64, K_U64, K_BOOL, K_TABLE = range(20, 28)

_FLOATS = sorted((t.spec for t in _scalars.ELEMENT_TYPES if t.spec.kind != "int"
                  and t.spec.kind != "uint"), key=lambda s: s.kernel_kind)
assert [s.kernel_kind for s in _FLOATS] == list(range(K_E8M0 + 1))
#: ``(EBITS, MBITS, BIAS, MAXMAG, OVF, NAN, NAN_SIGNED)`` of the float element types, indexed
#: by kind code (K_F32 .. K_E8M0): the arguments of :func:`_encode_float` /
#: :func:`encode_narrow_f32`, read from each type's declaration (numba_qk/formats/scalars.py).
FLOAT_ARGS = tuple((s.exponent_bits, s.mantissa_bits, s.bias, s.max_code, s.overflow_code,
                    s.nan_code, int(s.nan_signed)) for s in _FLOATS)

_FRAC52 = np.int64((1 << 52) - 1)        # f64 fraction field
_ABS64 = np.int64(0x7FFF_FFFF_FFFF_FFFF)  # f64 without its sign bit


# ---- generic float encoder: one RNE from an exact float64 -----------------------------------

@kernel
def _encode_float(v, EBITS, MBITS, BIAS, MAXMAG, OVF, NAN, NAN_SIGNED):
    """Code of float64 ``v`` in a sign/EBITS/MBITS format with bias BIAS.

    MAXMAG: largest finite magnitude code; OVF: magnitude code for overflow and +-inf (the inf
    code, or MAXMAG when the format saturates); NAN: magnitude code for NaN; NAN_SIGNED: whether
    a NaN keeps its sign (False: NaN -> the bare NAN code, i.e. +0 for fp6/fp4).
    """
    u = np.float64(v).view(np.int64)
    sign = (u >> np.int64(63)) & np.int64(1)
    a = u & _ABS64
    es = a >> np.int64(52)                       # biased f64 exponent field
    if es == np.int64(0x7FF):
        if (a & _FRAC52) != 0:                   # NaN
            if not NAN_SIGNED:
                return np.int64(NAN)
            mag = np.int64(NAN)
        else:                                    # +-inf
            mag = np.int64(OVF)
    else:
        e = max(es, np.int64(1)) - np.int64(1023)                 # exponent of the f64 grid
        m = (a & _FRAC52) | (np.int64(1 << 52) if es != 0 else np.int64(0))  # v = m * 2^(e-52)
        eq = max(e, np.int64(1 - BIAS))          # target exponent (subnormals share 1 - BIAS)
        shift = min(np.int64(52 - MBITS) + (eq - e), np.int64(62))  # bits dropped by rounding
        q = m >> shift
        rem = m & ((np.int64(1) << shift) - np.int64(1))
        half = np.int64(1) << (shift - np.int64(1))
        if rem > half or (rem == half and (q & np.int64(1)) != 0):  # round half to even
            q += np.int64(1)
        # biased exponent (eq + BIAS - 1 is 0 for subnormals) plus significand; a carry out of
        # the significand correctly bumps the exponent
        mag = ((eq + np.int64(BIAS - 1)) << np.int64(MBITS)) + q
        if mag > MAXMAG:
            mag = np.int64(OVF)
    return (sign << np.int64(EBITS + MBITS)) | mag


@kernel
def encode_narrow_f32(raw, EBITS, MBITS, BIAS, MAXMAG, OVF, NAN, NAN_SIGNED):
    """:func:`_encode_float` for a float32 source given as its bits ``raw`` (the same single RNE:
    widening f32 -> f64 is exact, so both round the same exact value), for targets whose
    smallest normal 2^(1-BIAS) is above f32's (fp8/fp6/fp4/f16), written branch-free in 32-bit
    lanes so loops over it vectorize -- both paths computed and one selected:

    * target-normal range: RNE on the f32 bit pattern -- add half an ulp minus one plus the kept
      LSB (ties to even), shift, and rebias the exponent field (a carry into it is right);
    * target-subnormal range (|x| < 2^(1-BIAS)): ``rint(|x| * 2^(MBITS+BIAS-1))`` in float32 --
      the scaling by a power of two is exact and ``rint`` is IEEE RNE -- is the code itself
      (a result of 2^MBITS is the smallest normal's code, also right).
    """
    u = np.uint32(raw)
    sign = np.int32(u >> np.uint32(31))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    sh = np.uint32(23 - MBITS)                                          # f32 bits dropped
    r = np.uint32(a + np.uint32((1 << (22 - MBITS)) - 1) + ((a >> sh) & np.uint32(1))) >> sh
    mag_n = np.int32(r) - np.int32((127 - BIAS) << MBITS)               # rebias the exponent
    y = np.float32(a.view(np.float32) * np.float32(2.0 ** (MBITS + BIAS - 1)))  # exact scaling
    mag_s = np.int32(np.rint(y)) if a < np.uint32((128 - BIAS) << 23) else np.int32(0)
    mag = mag_s if a < np.uint32((128 - BIAS) << 23) else mag_n         # below 2^(1 - BIAS)
    mag = np.int32(OVF) if mag > np.int32(MAXMAG) else mag               # overflow and +-inf
    code = np.int32((sign << np.int32(EBITS + MBITS)) | mag)
    if NAN_SIGNED:
        nan_code = np.int32((sign << np.int32(EBITS + MBITS)) | np.int32(NAN))
    else:
        nan_code = np.int32(NAN)
    return nan_code if a > np.uint32(0x7F800000) else code


@kernel
def _encode_e8m0(v):
    """e8m0 code of float64 ``v``: nearest power of two, ties (1.5 * 2^k) upward, saturating."""
    u = np.float64(v).view(np.int64)
    if u <= 0:                                   # +0, and every negative (sign bit set)
        return np.int64(0xFF)
    es = u >> np.int64(52)
    if es == np.int64(0x7FF):
        return np.int64(0xFF) if (u & _FRAC52) != 0 else np.int64(0xFE)   # NaN / +inf
    k = es - np.int64(1023)                      # 2^k <= v < 2^(k+1) (normal f64)
    if es == 0 or k < np.int64(-127):
        return np.int64(0)                       # below 2^-127: the smallest code
    if (u & _FRAC52) >= np.int64(1 << 51):       # v >= 1.5 * 2^k: rounds up
        k += np.int64(1)
    return min(k, np.int64(127)) + np.int64(127)


@kernel
def _encode_int(v, LO, HI, MASK):
    """Two's-complement code (masked to the type's width) of float64 ``v``: RNE, saturate,
    NaN -> 0."""
    if v != v:
        return np.int64(0)
    r = np.rint(min(max(v, np.float64(LO)), np.float64(HI)))
    return np.int64(r) & np.int64(MASK)


# ---- generic float decoder ------------------------------------------------------------------

def _decode_table(ebits, mbits, bias, has_inf, nan_all_ones):
    """float64 values of every code of a <= 8-bit float format (built at import, exact).
    NaN codes give the quiet NaN with the code's sign (``copysign``: ``sign * nan`` would not
    set the sign bit)."""
    n = 1 << (1 + ebits + mbits)
    out = np.empty(n, np.float64)
    for code in range(n):
        sign = -1.0 if (code >> (ebits + mbits)) & 1 else 1.0
        e = (code >> mbits) & ((1 << ebits) - 1)
        m = code & ((1 << mbits) - 1)
        if e == (1 << ebits) - 1 and has_inf:
            out[code] = sign * np.inf if m == 0 else np.copysign(np.nan, sign)
        elif e == (1 << ebits) - 1 and nan_all_ones and m == (1 << mbits) - 1:
            out[code] = np.copysign(np.nan, sign)
        elif e == 0:
            out[code] = sign * np.ldexp(float(m), 1 - bias - mbits)
        else:
            out[code] = sign * np.ldexp(float((1 << mbits) + m), e - bias - mbits)
    return out


T_E4M3, T_E5M2, T_E2M3, T_E3M2, T_E2M1 = (
    _decode_table(s.exponent_bits, s.mantissa_bits, s.bias, s.has_inf,
                  s.has_nan and not s.has_inf) for s in _FLOATS[K_E4M3:K_E2M1 + 1])
_T_E8M0 = np.array([np.ldexp(1.0, c - 127) for c in range(255)] + [np.nan], np.float64)
# The table-decoded kinds K_E4M3 .. K_E8M0 (one row each, codes past a kind's width 0): the
# values, the same values as float32 bit patterns (exact, the decode-to-f32 fast path), and every
# kind's code mask (by kind code, from the declared bits).
_T_ROWS = np.zeros((K_E8M0 - K_E4M3 + 1, 256), np.float64)
for _k, _t in enumerate((T_E4M3, T_E5M2, T_E2M3, T_E3M2, T_E2M1, _T_E8M0)):
    _T_ROWS[_k, :_t.shape[0]] = _t
_B_ROWS = _T_ROWS.astype(np.float32).view(np.uint32)
CODE_MASK = tuple((1 << s.bits) - 1 for s in _FLOATS)
_B_E4M3, _B_E5M2, _B_E2M3, _B_E3M2, _B_E2M1, _B_E8M0 = (
    _B_ROWS[k, :CODE_MASK[K_E4M3 + k] + 1] for k in range(K_E8M0 - K_E4M3 + 1))
# every NaN code of e4m3 / e5m2 decodes to the quiet NaN of its sign (0x7FC00000 / 0xFFC00000)
for _t, _nan in ((_B_E4M3, (0x7F, 0xFF)), (_B_E5M2, (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF))):
    assert all(int(_t[c]) == (0x7FC00000 | ((c & 0x80) << 24)) for c in _nan)
del _k, _t, _nan


# ---- 64-bit integers: round-to-odd to float64 -----------------------------------------------

@kernel
def _u64_to_f64_odd(a):
    """uint64 ``a`` as float64 rounded to odd (truncate to 53 bits, OR the dropped bits into the
    last kept bit): a following RNE to <= 51 significant bits equals one RNE of ``a``."""
    a = np.uint64(a)
    if a < np.uint64(1 << 53):
        return np.float64(a)
    n = np.uint64(0)                             # bit length - 53
    t = a >> np.uint64(53)
    while t != 0:
        t >>= np.uint64(1)
        n += np.uint64(1)
    kept = a >> n
    if (a & ((np.uint64(1) << n) - np.uint64(1))) != 0:
        kept |= np.uint64(1)
    return np.float64(kept) * np.float64(2.0) ** np.float64(n)   # exact: 53 bits, power of 2


@kernel
def _i64_to_f64_odd(x):
    x = np.int64(x)
    if x < 0:
        return -_u64_to_f64_odd(np.uint64(0) - np.uint64(x))
    return _u64_to_f64_odd(np.uint64(x))


# ---- dispatch by kind (closure constants fold these ladders away) ---------------------------

@kernel
def _load(S, raw, table):
    """Exact float64 value of one source element from its raw storage bits ``raw`` (int64)."""
    if S == K_F64:
        return np.int64(raw).view(np.float64)
    if S == K_F32:
        return np.float64(np.uint32(raw).view(np.float32))
    if S == K_F16:
        return np.float64(f16_to_f32(np.uint16(raw)))
    if S == K_BF16:
        return np.float64(np.uint32(bf16_bits_to_f32_bits(raw)).view(np.float32))
    if K_E4M3 <= S <= K_E8M0:                    # the table-decoded kinds
        return _T_ROWS[S - K_E4M3, raw & CODE_MASK[S]]
    if S == K_I8:
        return np.float64(np.int8(raw))
    if S == K_I16:
        return np.float64(np.int16(raw))
    if S == K_I32:
        return np.float64(np.int32(raw))
    if S == K_I64:
        return _i64_to_f64_odd(raw)
    if S == K_U64:
        return _u64_to_f64_odd(np.uint64(raw))
    if S == K_I4:
        return np.float64(((raw & 0xF) ^ 0x8) - 0x8)   # sign-extend the nibble
    if S == K_BOOL:
        return np.float64(1.0) if raw != 0 else np.float64(0.0)
    if S == K_TABLE:
        return table[raw]
    return np.float64(raw)                       # u8, u16, u32, u4, u1: the code is the value


@kernel
def _encode(D, v):
    """Code (int64) of float64 ``v`` in element type D, per the policy table."""
    if D == K_F32:
        return np.int64(np.float32(v).view(np.uint32))
    if D <= K_E2M1:                              # f16, bf16, e4m3, e5m2, e2m3, e3m2, e2m1
        return _encode_float(v, *FLOAT_ARGS[D])
    if D == K_E8M0:
        return _encode_e8m0(v)
    if D == K_I8:
        return _encode_int(v, -128, 127, 0xFF)
    if D == K_U8:
        return _encode_int(v, 0, 255, 0xFF)
    if D == K_I32:
        return _encode_int(v, -2147483648, 2147483647, 0xFFFFFFFF)
    if D == K_I4:
        return _encode_int(v, -8, 7, 0xF)
    if D == K_U4:
        return _encode_int(v, 0, 15, 0xF)
    return _encode_int(v, 0, 1, 0x1)             # K_U1


def _vec_load(context, builder, signature, args, vt):
    """Codegen of the run intrinsics ``f(src, si, dst, di)``: the vector ``vt`` at element
    ``si`` of contiguous ``src`` (an unaligned load)."""
    sp = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.load(builder.bitcast(builder.gep(sp, [args[1]]), vt.as_pointer()), align=1)


def _vec_store(context, builder, signature, args, value, nt=0):
    """... and the store of ``value`` at element ``di`` of contiguous ``dst`` (unaligned); with
    ``nt`` one aligned non-temporal store (the caller makes element ``di`` start a line)."""
    dp = context.make_array(signature.args[2])(context, builder, args[2]).data
    ptr = builder.bitcast(builder.gep(dp, [args[3]]), value.type.as_pointer())
    if not nt:
        builder.store(value, ptr, align=1)
        return context.get_dummy_value()
    st = builder.store(value, ptr, align=value.type.count * value.type.element.width // 8)
    st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
    return context.get_dummy_value()


def _nt_arg(nt):
    """The literal 0/1 ``nt`` argument of the decode intrinsics (None: not a literal)."""
    return nt.literal_value if isinstance(nt, types.IntegerLiteral) else None


def _run_sig(src, dst, src_dtype, dst_dtype, *nt):
    """Typing of a run intrinsic ``f(src, si, dst, di[, nt])``: ``src`` an array of
    ``src_dtype``, ``dst`` of ``dst_dtype`` (decoders: uint32, float32 bits), ``nt`` where the
    intrinsic takes it a literal; else None."""
    if not (isinstance(src, types.Array) and src.dtype == src_dtype
            and isinstance(dst, types.Array) and dst.dtype == dst_dtype
            and all(_nt_arg(n) is not None for n in nt)):
        return None
    return types.none(src, types.intp, dst, types.intp, *nt)


def _run_intrinsic(codegen, src_dtype, dst_dtype):
    """Intrinsic ``f(src, si, dst, di)`` typed by :func:`_run_sig` (``src`` of ``src_dtype``,
    ``dst`` of ``dst_dtype``), lowered by ``codegen(context, builder, signature, args)``."""
    @intrinsic
    def run(typingctx, src, si, dst, di):
        sig = _run_sig(src, dst, src_dtype, dst_dtype)
        return None if sig is None else (sig, codegen)

    return run


def _vec_decoder(src_dtype, body):
    """Intrinsic ``f(src, si, dst, di, nt)``: ``dst[di:di + 16] = body(builder, v)``, ``v`` the
    16 codes ``src[si:si + 16]`` (``src_dtype`` uint8 or uint16) as one vector, ``body``'s
    result the 16 float32 bit patterns (``<16 x i32>``); ``nt`` (a literal 0/1): one aligned
    non-temporal store (see :func:`_vec_store`).  The codegen of every 16-lane decoder."""
    width = 8 if src_dtype == types.uint8 else 16

    @intrinsic
    def decode16(typingctx, src, si, dst, di, nt):
        sig = _run_sig(src, dst, src_dtype, types.uint32, nt)
        if sig is None:
            return None
        NT = _nt_arg(nt)

        def codegen(context, builder, signature, args):
            v = _vec_load(context, builder, signature, args, ir.VectorType(ir.IntType(width), 16))
            return _vec_store(context, builder, signature, args, body(builder, v), NT)

        return sig, codegen

    return decode16


_VLANES = 16   # lanes of the explicit-vector f32 -> bf16/f16 encoders (one zmm with AVX-512)


def _make_vec_encode(half, lanes=_VLANES, nontemporal=False):
    """Intrinsic ``enc16(src, si, dst, di)``: the ``lanes`` (default 16) float32 bit patterns
    ``src[si:si + lanes]`` (uint32) to codes in ``dst[di:di + lanes]`` (uint16), in explicit
    vectors, with the scalar rule's steps lane by lane:

    * bf16 (:func:`_bf16_from_f32_bits`): add 0x7FFF plus the kept LSB, truncate;
    * f16 (:func:`_f16_from_f32_bits`): LLVM ``fptrunc`` to half (one RNE; F16C ``vcvtps2ph``);

    then NaN -> the canonical quiet NaN with the sign (0x7FC0 / 0x7E00).

    ``nontemporal``: the codes go out with one non-temporal store (``vmovntdq``), aligned to
    ``2 * lanes`` bytes -- the caller makes ``dst``'s element ``di`` start a 64-byte line (32
    lanes: one whole line per store; the same bits, no read-for-ownership of the line)."""
    def codegen(context, builder, signature, args):
        i32v = ir.VectorType(ir.IntType(32), lanes)
        i16v = ir.VectorType(ir.IntType(16), lanes)

        def splat(c):
            return ir.Constant(i32v, [c] * lanes)

        u = _vec_load(context, builder, signature, args, i32v)
        hi = builder.lshr(u, splat(16))
        if half:
            f = builder.bitcast(u, ir.VectorType(ir.FloatType(), lanes))
            h = builder.fptrunc(f, ir.VectorType(ir.HalfType(), lanes))
            r = builder.zext(builder.bitcast(h, i16v), i32v)
            qnan = 0x7E00
        else:
            lsb = builder.and_(hi, splat(1))
            r = builder.lshr(builder.add(builder.add(u, splat(0x7FFF)), lsb), splat(16))
            qnan = 0x7FC0
        isnan = builder.icmp_unsigned(">", builder.and_(u, splat(0x7FFFFFFF)),
                                      splat(0x7F800000))
        nan = builder.or_(builder.and_(hi, splat(0x8000)), splat(qnan))
        codes = builder.trunc(builder.select(isnan, nan, r), i16v)
        return _vec_store(context, builder, signature, args, codes, nontemporal)

    return _run_intrinsic(codegen, types.uint32, types.uint16)


_bf16_encode_vec = _make_vec_encode(False)
_f16_encode_vec = _make_vec_encode(True)


@kernel
def _encode_scalar(D, src, dst, lo, hi):
    """``dst[k]`` = code of the float32 bits ``src[k]`` in D by the scalar rule, lo <= k < hi."""
    for k in range(lo, hi):
        dst[k] = _encode_from_f32(D, np.int64(src[k]))


@kernel
def _encode_run(D, src, dst):
    """``dst[k] = code of the float32 bits src[k]`` in D (K_BF16 or K_F16, the latter only
    with hardware f16) for contiguous 1-d ``src`` (uint32) and ``dst`` (uint16) of one length:
    16-lane vectors, then the scalar rule for the tail."""
    n = src.shape[0]
    nv = n // _VLANES * _VLANES
    for k in range(0, nv, _VLANES):
        if D == K_BF16:
            _bf16_encode_vec(src, k, dst, k)
        else:
            _f16_encode_vec(src, k, dst, k)
    _encode_scalar(D, src, dst, nv, n)


_bf16_encode_nt = _make_vec_encode(False, 32, True)
_f16_encode_nt = _make_vec_encode(True, 32, True)


@kernel
def _encode_run_nt(D, src, dst):
    """:func:`_encode_run` writing every whole 64-byte line of ``dst`` with a non-temporal store
    of 32 codes computed in registers (no L1 scratch pass); the elements before the first
    aligned line and after the last whole one by the scalar rule with ordinary stores, so no
    line is written both ways.  ``dst`` is 1-d C-contiguous uint16; callers end with
    ``_stream.store_fence()``."""
    n = np.int64(src.shape[0])
    h = _stream.line_head(dst, np.int64(2))
    if h < 0 or h > n:
        h = n
    _encode_scalar(D, src, dst, 0, h)
    nv = h + (n - h) // 32 * 32
    for k in range(h, nv, 32):
        if D == K_BF16:
            _bf16_encode_nt(src, k, dst, k)
        else:
            _f16_encode_nt(src, k, dst, k)
    _encode_scalar(D, src, dst, nv, n)


# The hardware f32 -> f16 conversion (x86 F16C ``vcvtps2ph``, round to nearest even) where the
# host has it and the kernels are compiled; the integer encoder otherwise (and when interpreted).
_HW_F16 = HW_F16
# The explicit-vector f32 -> bf16/f16 loops (portable LLVM vectors; same bits as the scalar rule) when
# compiled, unless NUMBA_QK_PORTABLE=1 asks for the plain loops.
_VEC_ENC = (not numba.config.DISABLE_JIT) and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0")


@kernel
def _encode_from_f32(D, raw):
    """Code of the float32 with bits ``raw`` in element type D (fast path; same results)."""
    if D == K_F16:
        if _HW_F16:
            return _f16_from_f32_bits(raw)
        return encode_narrow_f32(raw, *FLOAT_ARGS[K_F16])
    if D == K_BF16:
        return _bf16_from_f32_bits(raw)
    if K_E4M3 <= D <= K_E2M1:                    # e4m3, e5m2, e2m3, e3m2, e2m1
        return encode_narrow_f32(raw, *FLOAT_ARGS[D])
    return _encode(D, _load(K_F32, raw, _T_E8M0))


@kernel
def _decode_to_f32_bits(S, raw):
    """float32 bits of a code (exact) for the table-decoded kinds; -1 for other kinds."""
    if K_E4M3 <= S <= K_E8M0:
        return np.int64(_B_ROWS[S - K_E4M3, raw & CODE_MASK[S]])
    if S == K_BF16:
        return np.int64(bf16_bits_to_f32_bits(raw))
    if S == K_F16:
        return _f16_to_f32_bits_hw(raw)
    return np.int64(-1)


# ---- explicit-vector f16 -> f32: 16 lanes of the hardware widening ---------------------------

def _f16_decode_body(builder, h):
    """float32 bits of 16 f16 codes ``h``: one ``fpext <16 x half>`` (F16C ``vcvtph2ps``; exact
    for every non-NaN code), then a select that gives NaN lanes :func:`_f16_to_f32_bits_hw`'s
    bits -- sign, all-ones exponent, payload shifted up, *not* quietened (the hardware would
    set the quiet bit of a signalling NaN)."""
    i32v = ir.VectorType(ir.IntType(32), _VLANES)

    def splat(c):
        return ir.Constant(i32v, [c] * _VLANES)

    f = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), _VLANES)),
                      ir.VectorType(ir.FloatType(), _VLANES))
    x = builder.bitcast(f, i32v)
    c = builder.zext(h, i32v)
    isnan = builder.icmp_unsigned(">", builder.and_(c, splat(0x7FFF)), splat(0x7C00))
    nan = builder.or_(builder.or_(builder.shl(builder.and_(c, splat(0x8000)), splat(16)),
                                  splat(0x7F800000)),
                      builder.shl(builder.and_(c, splat(0x3FF)), splat(13)))
    return builder.select(isnan, nan, x)


# ``dst[di:di + 16] = float32 bits of the f16 codes src[si:si + 16]`` (uint16 -> uint32)
_f16_decode_vec = _vec_decoder(types.uint16, _f16_decode_body)


@kernel
def _f16_decode_run(src, dst):
    """``dst[k] = float32 bits of the f16 code src[k]`` (contiguous 1-d uint16 -> uint32 of one
    length; hardware f16 only): 16-lane vectors, the scalar rule for the tail."""
    n = src.shape[0]
    nv = n // _VLANES * _VLANES
    for k in range(0, nv, _VLANES):
        _f16_decode_vec(src, k, dst, k, 0)
    for k in range(nv, n):
        dst[k] = _f16_to_f32_bits_hw(np.int64(src[k]))


# ---- explicit-vector decode of fp8/fp6 codes to float32: a register table lookup -----------
#
# The portable loop reads ``_B_<t>[code]`` per element, which compiles to a memory gather.
# With AVX-512 the magnitudes (32 for fp6, 128 for fp8) sit in 2 or 8 zmm registers and one
# ``vpermi2d`` per register pair looks 16 codes up at once; the sign is OR-ed back, NaN codes
# included (the positive half of a table holds the positive quiet NaN, so a negative NaN code
# gives the negative one).  Identical bits to the tables (checked at import below, tested on
# every code).

def _perm_spec(bits):
    """(magnitude count, sign bit, code mask, magnitude bits as 16-lane rows) of a table."""
    n = bits.size
    nmag, sbit, mask = (32, 5, 0x3F) if n == 64 else (128, 7, 0xFF)
    mags = [int(v) for v in bits[:nmag]]
    for c in range(n):                      # the rule below reproduces the table exactly
        m = mags[c & (nmag - 1)]
        expect = m | (((c >> sbit) & 1) << 31)
        assert int(bits[c]) == expect, (c, hex(int(bits[c])), hex(expect))
    return nmag, sbit, mask, [mags[i:i + 16] for i in range(0, nmag, 16)]


def _make_perm_decode(bits):
    NMAG, SBIT, MASK, ROWS = _perm_spec(bits)

    def body(builder, b):
        i32 = ir.IntType(32)
        v = ir.VectorType(i32, 16)

        def splat(c):
            return ir.Constant(v, [c] * 16)

        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v, [v, v, v]), "llvm.x86.avx512.vpermi2var.d.512")
        c = builder.and_(builder.zext(b, v), splat(MASK))
        idx = builder.and_(c, splat(NMAG - 1))
        pairs = [builder.call(perm, [ir.Constant(v, ROWS[2 * p]), idx,
                                     ir.Constant(v, ROWS[2 * p + 1])])
                 for p in range(NMAG // 32)]
        sel_bit = 32
        while len(pairs) > 1:                # pick the pair by index bit 5, then bit 6
            on = builder.icmp_unsigned("!=", builder.and_(idx, splat(sel_bit)), splat(0))
            pairs = [builder.select(on, hi, lo) for lo, hi in zip(pairs[0::2], pairs[1::2])]
            sel_bit *= 2
        mag = pairs[0]
        sign = builder.shl(builder.and_(builder.lshr(c, splat(SBIT)), splat(1)), splat(31))
        return builder.or_(mag, sign)

    return _vec_decoder(types.uint8, body)


_perm_e4m3 = _make_perm_decode(_B_E4M3)
_perm_e5m2 = _make_perm_decode(_B_E5M2)
_perm_e2m3 = _make_perm_decode(_B_E2M3)
_perm_e3m2 = _make_perm_decode(_B_E3M2)
# compiled with AVX-512 (and not NUMBA_QK_PORTABLE / NUMBA_QK_NO_AVX512): kinds using it
_PERM_KINDS = (K_E4M3, K_E5M2, K_E2M3, K_E3M2) if _simd.HAVE_AVX512 else ()


# e5m2 is the high byte of an f16 code, so with F16C its decode is a shift and one ``vcvtph2ps``
# (exact for every non-NaN code); NaN lanes get the table's quiet NaN with the lane's sign
# (0x7FC00000 / 0xFFC00000: the payload the widening would carry is dropped).  Checked against
# the table for all 256 codes here, and tested.
_E5M2_NAN = int(_B_E5M2[0x7F])
_h = (np.arange(256, dtype=np.uint16) << np.uint16(8)).view(np.float16).astype(np.float32)
_hb = _h.view(np.uint32)
_hn = (_hb & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
assert (_hb[~_hn] == _B_E5M2[~_hn]).all()
assert (_B_E5M2[_hn] == ((_hb[_hn] & np.uint32(0x80000000)) | np.uint32(_E5M2_NAN))).all()
del _h, _hb, _hn


def _e5m2_decode_body(builder, b):
    """float32 bits of 16 e5m2 codes ``b``: code << 8 as f16, ``fpext`` (``vcvtph2ps``), NaN
    lanes -> the quiet NaN of their sign."""
    i16v = ir.VectorType(ir.IntType(16), 16)
    i32v = ir.VectorType(ir.IntType(32), 16)
    h = builder.shl(builder.zext(b, i16v), ir.Constant(i16v, [8] * 16))
    f = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)),
                      ir.VectorType(ir.FloatType(), 16))
    x = builder.bitcast(f, i32v)
    isnan = builder.icmp_unsigned(">", builder.and_(x, ir.Constant(i32v, [0x7FFFFFFF] * 16)),
                                  ir.Constant(i32v, [0x7F800000] * 16))
    nan = builder.or_(builder.and_(x, ir.Constant(i32v, [0x80000000] * 16)),
                      ir.Constant(i32v, [_E5M2_NAN] * 16))
    return builder.select(isnan, nan, x)


# ``dst[di:di + 16] = float32 bits of the e5m2 codes src[si:si + 16]`` (uint8 -> uint32)
_e5m2_decode_vec = _vec_decoder(types.uint8, _e5m2_decode_body)


# e4m3 (bias 7, no infinities) with F16C: the magnitude bits (c & 0x7F) << 7 are an f16 code of
# value 2**-8 times the e4m3 value (subnormals included), so ``vcvtph2ps`` then an exact
# multiply by 256 (a power of two, every product a normal f32) gives the magnitude; the sign
# is OR-ed back and the two NaN codes get the quiet NaN of their sign (0x7F -> 0x7FC00000,
# 0xFF -> 0xFFC00000).  Checked for all 256 codes.
_E4M3_NAN = int(_B_E4M3[0x7F])
_c = np.arange(256, dtype=np.uint16)
_sg = (_c.astype(np.uint32) & np.uint32(0x80)) << 24
_hb = ((((_c & np.uint16(0x7F)) << np.uint16(7)).view(np.float16).astype(np.float32)
        * np.float32(256.0)).view(np.uint32) | _sg)
_hn = (_c & np.uint16(0x7F)) == np.uint16(0x7F)
assert (_hb[~_hn] == _B_E4M3[~_hn]).all()
assert (_B_E4M3[_hn] == (_sg[_hn] | np.uint32(_E4M3_NAN))).all()
del _sg
del _c, _hb, _hn


def _e4m3_decode_body(builder, b):
    """float32 bits of 16 e4m3 codes ``b`` (the rule above)."""
    i16v = ir.VectorType(ir.IntType(16), 16)
    i32v = ir.VectorType(ir.IntType(32), 16)
    f32v = ir.VectorType(ir.FloatType(), 16)
    c = builder.zext(b, i16v)
    mag = builder.and_(c, ir.Constant(i16v, [0x7F] * 16))
    h = builder.shl(mag, ir.Constant(i16v, [7] * 16))
    f = builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)), f32v)
    f = builder.fmul(f, ir.Constant(f32v, [256.0] * 16))       # exact: a power of two
    sign = builder.shl(builder.and_(builder.zext(b, i32v), ir.Constant(i32v, [0x80] * 16)),
                       ir.Constant(i32v, [24] * 16))
    x = builder.or_(builder.bitcast(f, i32v), sign)
    isnan = builder.icmp_unsigned("==", mag, ir.Constant(i16v, [0x7F] * 16))
    nan = builder.or_(sign, ir.Constant(i32v, [_E4M3_NAN] * 16))
    return builder.select(isnan, nan, x)


# ``dst[di:di + 16] = float32 bits of the e4m3 codes src[si:si + 16]`` (uint8 -> uint32)
_e4m3_decode_vec = _vec_decoder(types.uint8, _e4m3_decode_body)


def _make_decode16(NT):
    @kernel
    def decode16(S, src, k, dst):
        """16 uint8 codes of kind S at ``src[k]`` -> float32 bits at ``dst[k]`` (``NT``:
        one non-temporal line)."""
        if S == K_E4M3:
            if _HW_F16:
                _e4m3_decode_vec(src, k, dst, k, NT)
            else:
                _perm_e4m3(src, k, dst, k, NT)
        elif S == K_E5M2:
            if _HW_F16:
                _e5m2_decode_vec(src, k, dst, k, NT)
            else:
                _perm_e5m2(src, k, dst, k, NT)
        elif S == K_E2M3:
            _perm_e2m3(src, k, dst, k, NT)
        else:
            _perm_e3m2(src, k, dst, k, NT)
    return decode16


_decode16 = _make_decode16(0)
_decode16_nt = _make_decode16(1)


@kernel
def _decode_run(S, src, dst):
    """``dst[k] = float32 bits of code src[k]`` (uint8 codes of kind S in _PERM_KINDS; contiguous
    1-d arrays of one length): 16 codes per step -- e4m3/e5m2 through ``vcvtph2ps`` (F16C),
    e2m3/e3m2 by register table lookup --, the table for the tail."""
    n = src.shape[0]
    nv = n // 16 * 16
    for k in range(0, nv, 16):
        _decode16(S, src, k, dst)
    _decode_scalar(S, src, dst, nv, n)


def _bf16_decode_body(builder, h):
    """float32 bits of 16 bf16 codes ``h``: code << 16, every code, NaN payloads kept."""
    i32v = ir.VectorType(ir.IntType(32), 16)
    return builder.shl(builder.zext(h, i32v), ir.Constant(i32v, [16] * 16))


# ``dst[di:di + 16] = float32 bits of the bf16 codes src[si:si + 16]`` (uint16 -> uint32), for
# the streamed run below
_bf16_decode_vec = _vec_decoder(types.uint16, _bf16_decode_body)


# Streamed widening runs: the same 16-lane decoders, each 64-byte line of f32 output written
# with one non-temporal store straight from registers (no L1 scratch row); the elements before
# the first aligned line and after the last whole one by the scalar rule.  Callers end with
# ``_stream.store_fence()``.

@kernel
def _decode_scalar(S, src, dst, lo, hi):
    """``dst[k]`` = float32 bits of code ``src[k]`` by the scalar rule, for lo <= k < hi."""
    for k in range(lo, hi):
        dst[k] = _decode_to_f32_bits(S, np.int64(src[k]))


@kernel
def _nt_span(dst, n):
    """``(h, nv)`` for a streamed run of ``n`` float32 outputs into ``dst``: elements [h, nv)
    are whole aligned 64-byte lines (16 at a time); the rest goes by ordinary stores."""
    h = _stream.line_head(dst, np.int64(4))
    if h < 0 or h > n:
        h = n
    return h, h + (n - h) // 16 * 16


def _make_decode_run_nt(WIDE):
    @kernel
    def decode_run_nt(S, src, dst):
        n = np.int64(src.shape[0])
        h, nv = _nt_span(dst, n)
        _decode_scalar(S, src, dst, 0, h)
        for k in range(h, nv, 16):
            if not WIDE:
                _decode16_nt(S, src, k, dst)
            elif S == K_BF16:
                _bf16_decode_vec(src, k, dst, k, 1)
            else:
                _f16_decode_vec(src, k, dst, k, 1)
        _decode_scalar(S, src, dst, nv, n)
    return decode_run_nt


# :func:`_decode_run` with non-temporal lines: uint8 codes of kind S in _PERM_KINDS (nt8), or
# bf16 (any machine) / f16 (hardware f16) codes (nt16), to float32 bits
_decode_run_nt8 = _make_decode_run_nt(0)
_decode_run_nt16 = _make_decode_run_nt(1)


# ---- packed 4-bit codes (int4 / uint4 / e2m1, element 0 in the high nibble) -> float32 -------
#
# All 16 codes' float32 bits fit one zmm, so one ``vpermd`` looks 16 codes up: 16 packed bytes
# give 32 codes, high nibble first.  The tables are the exact values (ints are exact in f32;
# e2m1's the lowp table), checked against the scalar rule in the tests for every code.

def _nibble_table(S):
    c = np.arange(16)
    if S == K_I4:
        v = ((c ^ 8) - 8).astype(np.float32)
    elif S == K_U4:
        v = c.astype(np.float32)
    else:
        return [int(b) for b in _B_E2M1[:16]]
    return [int(b) for b in v.view(np.uint32)]


def _make_nibble_decode(S):
    ROW = _nibble_table(S)

    def codegen(context, builder, signature, args):
        """``dst[di:di + 32] = float32 bits of the 32 codes in src[si:si + 16]``."""
        i32 = ir.IntType(32)
        v = ir.VectorType(i32, 16)
        perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v, [v, v]), "llvm.x86.avx512.permvar.si.512")
        b = builder.zext(_vec_load(context, builder, signature, args,
                                   ir.VectorType(ir.IntType(8), 16)), v)
        hi = builder.lshr(b, ir.Constant(v, [4] * 16))
        lo = builder.and_(b, ir.Constant(v, [15] * 16))
        table = ir.Constant(v, ROW)
        dp = context.make_array(signature.args[2])(context, builder, args[2]).data
        for half in range(2):       # codes 16h .. 16h+15: bytes 8h .. 8h+7, hi then lo
            idx = builder.shuffle_vector(hi, lo, ir.Constant(
                ir.VectorType(i32, 16),
                [x for k in range(8 * half, 8 * half + 8) for x in (k, 16 + k)]))
            vals = builder.call(perm, [table, idx])
            at = builder.add(args[3], ir.Constant(args[3].type, 16 * half))
            builder.store(vals, builder.bitcast(builder.gep(dp, [at]), v.as_pointer()),
                          align=1)
        return context.get_dummy_value()

    return _run_intrinsic(codegen, types.uint8, types.uint32)


_nib_i4 = _make_nibble_decode(K_I4)
_nib_u4 = _make_nibble_decode(K_U4)
_nib_e2m1 = _make_nibble_decode(K_E2M1)
# compiled with AVX-512 (vpermd on zmm) and not NUMBA_QK_PORTABLE: kinds using it
_NIBBLE_KINDS = (K_I4, K_U4, K_E2M1) if _simd.HAVE_AVX512 else ()


@kernel
def _nibble_run(S, src, dst):
    """``dst[2k], dst[2k + 1]`` = float32 bits of the high / low nibble code of ``src[k]``
    (contiguous 1-d; ``dst`` twice as long): 16 bytes per lookup pair, the scalar rule for the
    tail."""
    n = src.shape[0]
    nv = n // 16 * 16
    for k in range(0, nv, 16):
        if S == K_I4:
            _nib_i4(src, k, dst, 2 * k)
        elif S == K_U4:
            _nib_u4(src, k, dst, 2 * k)
        else:
            _nib_e2m1(src, k, dst, 2 * k)
    for k in range(nv, n):
        raw = np.int64(src[k])
        dst[2 * k] = _convert_one(S, K_F32, raw >> np.int64(4), _T_E8M0)
        dst[2 * k + 1] = _convert_one(S, K_F32, raw & np.int64(15), _T_E8M0)


def register_stream(S, D) -> bool:
    """Whether the S -> D converter streams straight from registers (f32 -> bf16/f16 and
    bf16/f16/fp8/fp6 -> f32 with the vector kernels) rather than through an L1 scratch row."""
    if not _VEC_ENC:
        return False
    if S == K_F32:
        return D == K_BF16 or (D == K_F16 and _HW_F16)
    return D == K_F32 and (S == K_BF16 or (S == K_F16 and _HW_F16) or S in _PERM_KINDS)


@kernel
def _convert_one(S, D, raw, table):
    if S == K_F32:
        return np.int64(_encode_from_f32(D, raw))
    if D == K_F32 and (S == K_E4M3 or S == K_E5M2 or S == K_E2M3 or S == K_E3M2 or S == K_E2M1
                       or S == K_E8M0 or S == K_BF16 or (S == K_F16 and _HW_F16)):
        return _decode_to_f32_bits(S, raw)
    return _encode(D, _load(S, raw, table))


# ---- the one-pass conversion kernels ---------------------------------------------------------

def memoized(table, key, make):
    """``table[key]``, built once by ``make(*key)`` (the compiled kernels of each closure-
    constant combination, shared by every caller)."""
    fn = table.get(key)
    if fn is None:
        fn = table[key] = make(*key)
    return fn


_CONVERTERS = {}
_BLOCK = 1024   # elements of a strided row gathered at a time into a contiguous scratch row
_SBLOCK = 4096  # elements converted into L1 at a time before they are streamed out


def converter(S, D, SPB, DPB):
    """The compiled one-pass kernel for source kind S (SPB codes per storage unit) to element
    type D (DPB codes per byte): ``convert(src3d, dst, table, idx0, stream)``.

    ``src3d``: a 3-d view (any strides) of the source *storage* as unsigned ints;
    ``dst``: the C-contiguous destination storage, 1-d unsigned; ``idx0``: the logical flat index
    of ``src3d[0, 0, 0]``'s first code in the destination.  Packed destinations are written
    byte-wise (first code of a byte assigns it), so chunks must start on a byte boundary.
    ``stream``: write unpacked-to-unpacked rows of at least ``_BLOCK`` elements through a scratch
    row and non-temporal stores (:mod:`._stream`; the same codes, fewer memory transfers).
    """
    return memoized(_CONVERTERS, (S, D, SPB, DPB), _make_converter)


def _make_converter(S, D, SPB, DPB):
    # explicit-vector runs for contiguous unpacked rows (same bits as the portable loops):
    # 1 = f32 -> bf16/f16 (_encode_run), 2 = fp8/fp6 -> f32 (_decode_run),
    # 3 = f16 -> f32 (_f16_decode_run), 0 = none
    VEC = (1 if S == K_F32 and (D == K_BF16 or (D == K_F16 and _HW_F16)) and _VEC_ENC else
           2 if D == K_F32 and S in _PERM_KINDS else
           3 if D == K_F32 and S == K_F16 and _HW_F16 and _VEC_ENC else 0) \
        if SPB == 1 and DPB == 1 else 0
    # packed 4-bit codes -> f32 by one vpermd per 16 codes (_nibble_run)
    NIB = SPB == 2 and DPB == 1 and D == K_F32 and S in _NIBBLE_KINDS and _VEC_ENC
    # streamed decodes from registers: 1 = uint8 codes (_decode_run_nt8), 2 = bf16/f16 (nt16)
    NTDEC = (1 if S in _PERM_KINDS else 2) if (SPB == 1 and DPB == 1 and D == K_F32
                                               and register_stream(S, D)) else 0

    @kernel
    def convert(src, dst, table, idx0, stream):
        n0, n1, n2 = src.shape
        idx = np.int64(idx0)
        scratch = np.empty(_SBLOCK, src.dtype)
        sout = np.empty(_SBLOCK, dst.dtype)         # codes of one block, before streaming
        sbytes = sout.view(np.uint8)
        dbytes = dst.view(np.uint8)
        isz = np.int64(dst.itemsize)
        streamed = False
        for i in range(n0):
            for j in range(n1):
                row = src[i, j]
                if SPB == 1 and DPB == 1:
                    out = dst[idx:idx + n2]
                    cont = row.strides[0] == row.itemsize
                    h = np.int64(n2)                  # elements written by ordinary stores
                    if stream:
                        h = _stream.line_head(out, isz)   # up to the first aligned line
                        if h < 0 or h + _SBLOCK > n2:
                            h = np.int64(n2)
                    if cont and VEC == 1:
                        _encode_run(D, row[:h], out[:h])
                    elif cont and VEC == 2:
                        _decode_run(S, row[:h], out[:h])
                    elif cont and VEC == 3:
                        _f16_decode_run(row[:h], out[:h])
                    elif cont:
                        for k in range(h):
                            out[k] = _convert_one(S, D, np.int64(row[k]), table)
                    else:   # strided row: gather blocks into a scratch row, convert vectorized
                        for k0 in range(0, h, _BLOCK):
                            m = min(_BLOCK, h - k0)
                            for k in range(m):
                                scratch[k] = row[k0 + k]
                            o = out[k0:k0 + m]
                            if VEC == 1:
                                _encode_run(D, scratch[:m], o)
                            elif VEC == 2:
                                _decode_run(S, scratch[:m], o)
                            elif VEC == 3:
                                _f16_decode_run(scratch[:m], o)
                            else:
                                for k in range(m):
                                    o[k] = _convert_one(S, D, np.int64(scratch[k]), table)
                    for k0 in range(h, n2, _SBLOCK):   # the rest: whole lines streamed
                        m = min(_SBLOCK, n2 - k0)
                        if cont:
                            r = row[k0:k0 + m]     # (k0 + k would defeat vectorization)
                        else:
                            for k in range(m):
                                scratch[k] = row[k0 + k]
                            r = scratch[:m]
                        streamed = True
                        if VEC == 1:               # non-temporal stores from registers
                            _encode_run_nt(D, r, out[k0:k0 + m])
                            continue
                        if NTDEC == 1:
                            _decode_run_nt8(S, r, out[k0:k0 + m])
                            continue
                        if NTDEC == 2:
                            _decode_run_nt16(S, r, out[k0:k0 + m])
                            continue
                        if VEC == 2:
                            _decode_run(S, r, sout[:m])
                        elif VEC == 3:
                            _f16_decode_run(r, sout[:m])
                        else:
                            for k in range(m):
                                sout[k] = _convert_one(S, D, np.int64(r[k]), table)
                        _stream.stream_bytes(dbytes, (idx + k0) * isz, sbytes, m * isz)
                        streamed = True
                    idx += n2
                elif SPB == 1:
                    # packed destination: a row holds whole bytes (its length includes the last
                    # axis, a multiple of DPB) and starts on a byte boundary
                    out = dst[idx // DPB:(idx + n2) // DPB]
                    for kb in range(n2 // DPB):
                        acc = np.int64(0)
                        for s in range(DPB):                    # element 0 in the high bits
                            c = np.int64(_convert_one(S, D, np.int64(row[kb * DPB + s]), table))
                            acc = (acc << np.int64(8 // DPB)) | c
                        out[kb] = acc
                    idx += n2
                elif DPB == 1:                                  # packed source, unpacked dst
                    out = dst[idx:idx + n2 * SPB]
                    if NIB and row.strides[0] == 1:
                        _nibble_run(S, row, out)
                        idx += n2 * SPB
                        continue
                    for k in range(n2):
                        raw = np.int64(row[k])
                        for s in range(SPB):
                            code = (raw >> np.int64(8 - (8 // SPB) * (s + 1))) & \
                                np.int64((1 << (8 // SPB)) - 1)
                            out[k * SPB + s] = _convert_one(S, D, code, table)
                    idx += n2 * SPB
                else:
                    for k in range(n2):
                        raw = np.int64(row[k])
                        for s in range(SPB):
                            if SPB == 1:
                                code = raw
                            elif SPB == 2:                       # element 0: high nibble
                                code = (raw >> np.int64(4 - 4 * s)) & np.int64(0xF)
                            else:                                # u1: element 0 in the MSB
                                code = (raw >> np.int64(7 - s)) & np.int64(1)
                            c = _convert_one(S, D, code, table)
                            if DPB == 1:
                                dst[idx] = c
                            elif DPB == 2:
                                if (idx & 1) == 0:
                                    dst[idx >> 1] = c << np.int64(4)
                                else:
                                    dst[idx >> 1] |= c
                            else:
                                sh = np.int64(7) - (idx & np.int64(7))
                                if sh == 7:
                                    dst[idx >> 3] = c << np.int64(7)
                                else:
                                    dst[idx >> 3] |= c << sh
                            idx += 1
        if streamed:
            _stream.store_fence()   # order the non-temporal stores before returning
    return convert


# ---- public @njit helpers, one pair per type (for users' kernels) ----------------------------

@kernel
def decode_bf16(code):
    """float32 value of a bf16 code (exact)."""
    return np.uint32(bf16_bits_to_f32_bits(code)).view(np.float32)


@kernel
def encode_bf16(x):
    """bf16 code (uint16) of float32/float64 ``x``: one RNE, overflow -> inf, NaN -> qNaN."""
    return np.uint16(_encode(K_BF16, np.float64(x)))


@kernel
def decode_f16(code):
    """float32 value of an IEEE binary16 code (exact)."""
    return f16_to_f32(np.uint16(code))


@kernel
def encode_f16(x):
    """f16 code (uint16) of float32/float64 ``x``: one RNE (no double rounding from f64)."""
    return np.uint16(_encode(K_F16, np.float64(x)))


def _pair(kind, mask, doc):
    @kernel
    def dec(code):
        return np.float32(_load(kind, np.int64(code) & np.int64(mask), _T_E8M0))

    @kernel
    def enc(x):
        return np.uint8(_encode(kind, np.float64(x)))

    dec.__doc__ = f"float32 value of a {doc} code (exact)."
    enc.__doc__ = f"{doc} code of float32/float64 ``x`` (DESIGN.md §8 policy)."
    return dec, enc


decode_e4m3, encode_e4m3 = _pair(K_E4M3, 0xFF, "e4m3")
decode_e5m2, encode_e5m2 = _pair(K_E5M2, 0xFF, "e5m2")
decode_e2m3, encode_e2m3 = _pair(K_E2M3, 0x3F, "e2m3")
decode_e3m2, encode_e3m2 = _pair(K_E3M2, 0x3F, "e3m2")
decode_e2m1, encode_e2m1 = _pair(K_E2M1, 0xF, "e2m1 (one nibble)")
decode_e8m0, encode_e8m0 = _pair(K_E8M0, 0xFF, "e8m0")


@kernel
def decode_i4(code):
    """int8 value of an i4 nibble (two's complement)."""
    return np.int8(((np.int64(code) & 0xF) ^ 0x8) - 0x8)


@kernel
def encode_i4(x):
    """i4 nibble (uint8, 0..15) of float ``x``: RNE, saturate to -8..7, NaN -> 0."""
    return np.uint8(_encode(K_I4, np.float64(x)))


@kernel
def encode_u4(x):
    """u4 nibble of float ``x``: RNE, saturate to 0..15, NaN -> 0."""
    return np.uint8(_encode(K_U4, np.float64(x)))


@kernel
def packed_nibble(buf, i):
    """Nibble ``i`` of a packed byte buffer (element 0 in the high nibble of byte 0)."""
    return np.uint8((np.uint8(buf[i >> 1]) >> np.uint8(4 - 4 * (i & 1))) & np.uint8(0xF))


@kernel
def packed_bit(buf, i):
    """Bit ``i`` of a u1 buffer (element 0 in the most significant bit, numpy.packbits order)."""
    return np.uint8((np.uint8(buf[i >> 3]) >> np.uint8(7 - (i & 7))) & np.uint8(1))


__all__ = ["decode_bf16", "encode_bf16", "decode_f16", "encode_f16", "decode_e4m3",
           "encode_e4m3", "decode_e5m2", "encode_e5m2", "decode_e2m3", "encode_e2m3",
           "decode_e3m2", "encode_e3m2", "decode_e2m1", "encode_e2m1", "decode_e8m0",
           "encode_e8m0", "decode_i4", "encode_i4", "encode_u4", "packed_nibble", "packed_bit"]


# ---- dot products ----------------------------------------------------------------------------

_DOTS = {}


def dot_kernel(S, SPB):
    """``dot(a, b) -> (int64 sum, float64 sum)`` over two flat C-contiguous storage arrays of
    one element kind S (SPB codes per storage unit).

    Integer kinds: the exact sum of products in int64 (callers keep |sum| < 2^63: i8/u8 and
    packed types need n < 2^47).  Float kinds: each product of two decoded values is exact in
    float64 (<= 2 * 24 significant bits), summed left to right in element order, one f64
    rounding per ``+`` -- deterministic, whatever the threads or ISA.
    """
    return memoized(_DOTS, (S, SPB), _make_dot)


def _make_dot(S, SPB):
    INT = S in (K_I8, K_U8, K_I4, K_U4, K_U1)

    @kernel
    def dot(a, b):
        iacc = np.int64(0)
        facc = np.float64(0.0)
        for k in range(a.shape[0]):
            ra = np.int64(a[k])
            rb = np.int64(b[k])
            for s in range(SPB):
                if SPB == 1:
                    ca, cb = ra, rb
                elif SPB == 2:
                    ca = (ra >> np.int64(4 - 4 * s)) & np.int64(0xF)
                    cb = (rb >> np.int64(4 - 4 * s)) & np.int64(0xF)
                else:
                    ca = (ra >> np.int64(7 - s)) & np.int64(1)
                    cb = (rb >> np.int64(7 - s)) & np.int64(1)
                va = _load(S, ca, _T_E8M0)
                vb = _load(S, cb, _T_E8M0)
                if INT:
                    iacc += np.int64(va) * np.int64(vb)
                else:
                    facc = facc + va * vb          # exact product, one rounding per +
        return iacc, facc
    return dot
