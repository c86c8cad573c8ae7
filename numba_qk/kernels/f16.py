"""The kernels' f32 <-> f16 / bf16 conversions, in one place, each named for what it does with
rounding and NaN (all ``@njit`` or numba intrinsics; callable from user ``@njit`` code).

Every finite value converts the same way everywhere: widening is exact (every f16 and bf16 is
an f32), narrowing is one IEEE round to nearest, ties to even, with overflow to +-inf and
gradual underflow to subnormals.  The variants differ only in what they do with NaN -- on
purpose, because each copies a different reference:

* **ggml** (``GGML_FP32_TO_FP16``, the hardware ``vcvtps2ph``, numpy's ``astype(float16)``)
  keeps a NaN's sign and top 10 payload bits and sets the quiet bit: ``sign | 0x7E00 |
  mant >> 13``.  The K-quant and legacy records store their scales this way, so a record built
  here is byte-identical to ggml's.
* **spec 004** (the low-precision element types, DESIGN.md section 8) gives *the* canonical
  quiet NaN with the sign: ``sign | 0x7E00`` (f16), ``sign | 0x7FC0`` (bf16), payload dropped.
* **exact widening** keeps every bit of a NaN (sign, payload, a signalling NaN stays
  signalling, like numpy's f16 -> f32); the **hardware widening** (``fpext``, ``vcvtph2ps``)
  quietens a signalling NaN, so it is used alone only where the value feeds arithmetic.

========================================  =========  =======================================  ====================================
name (module)                             direction  NaN                                      used by
========================================  =========  =======================================  ====================================
``f16_bits_to_f32_bits``, ``f16_to_f32``  f16->f32   every bit kept (exact, integer code)     record fields (``d``, ``dmin``),
                                                                                               lowp scalar decode, ``_bits.load_f16``
``f16_bits_to_f32_bits_hw``               f16->f32   every bit kept (``fpext`` + a NaN        lowp decode with F16C
                                                     select; same bits as the row above)
``fpext_f16_bits_to_f32``                 f16->f32   signalling NaN quietened (hardware)      building block of the row above
``simd.base.load_f16_fpext``              f16->f32   signalling NaN may come back quiet       SIMD record tiles (values only)
``lowp.codecs._f16_decode_vec``           f16->f32   every bit kept (16 lanes of ``_hw``)     lowp vector decode
``f32_to_f16_bits_ggml``                  f32->f16   ggml: ``sign|0x7E00|mant>>13``           K-quant encoders (``common.store_f16``,
  (alias ``_round.f32_to_f16_bits``)                 (integer code)                           ``q4_k_encode``); the portable path
``f32_to_f16_bits_ggml_hw``               f32->f16   ggml (F16C ``vcvtps2ph`` where           legacy and K-quant lane encoders
  (alias ``encode_lanes.f16_bits``)                  ``HAVE_F16C``, else the row above)
``fptrunc_f32_to_f16_bits``               f32->f16   ggml (the hardware's quietening)         building block of the rows around it
``f32_bits_to_f16_canonical_nan``         f32->f16   spec 004: ``sign|0x7E00``                lowp ``astype`` with F16C
``lowp.codecs._encode_narrow_f32`` /      f32/f64    spec 004: ``sign|0x7E00``                lowp ``astype`` without F16C, and
  ``_encode_float`` with f16 parameters   ->f16      (generic integer RNE, every fp format)   from f64 / integer sources
``lowp.codecs._make_vec_encode(True)``    f32->f16   spec 004 (16/32 lanes of ``fptrunc``)    lowp vector encode
``bf16_bits_to_f32_bits``                 bf16->f32  every bit kept (``bits << 16``)          reference for lowp's inline ``<< 16``
``f32_bits_to_bf16_canonical_nan``        f32->bf16  spec 004: ``sign|0x7FC0``                lowp scalar encode; its 16/32-lane
                                                                                               form ``_make_vec_encode(False)``
``reference.f16_bits`` / ``f16_value``    both       ``sign|0x7E00`` / any NaN                the Fraction oracles (tests)
========================================  =========  =======================================  ====================================

The ggml and spec-004 narrowings agree on every non-NaN f32 (tests/package/test_encode_rounding.py,
tests/package/test_rounding.py, tests/lowp/test_lowp_fast_paths.py check each row against its oracle).
"""

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from numba_qk._jit import kernel
from numba_qk.kernels.simd.base import HAVE_AVX2

# IEEE binary16: 1 sign bit | 5 exponent bits | 10 mantissa bits.
_F16_SIGN = np.uint32(0b1000_0000_0000_0000)
_F16_EXP_MASK = np.uint32(0b11111)
_F16_MANT_MASK = np.uint32(0b11_1111_1111)
_F16_IMPLICIT = np.uint32(0b100_0000_0000)  # the hidden leading 1 of a normal f16
_F32_EXP_ALL_ONES = np.uint32(0xFF << 23)   # f32 exponent field of inf/NaN
_EXP_REBIAS = np.uint32(127 - 15)           # f32 bias minus f16 bias
_SUBNORMAL_EXP = np.uint32(127 - 15 + 1)    # f32 biased exponent of 2**-14 (f16's smallest normal)


def _host_has_f16c() -> bool:
    try:
        import llvmlite.binding as llvm
        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except Exception:  # pragma: no cover - feature query unavailable
        return False


# The host converts f32 <-> f16 in hardware (x86 F16C) and the kernels are compiled: the lowp
# codecs then use ``fptrunc``/``fpext`` (they ignore NUMBA_QK_PORTABLE: the same bits).
HW_F16 = (not numba.config.DISABLE_JIT) and _host_has_f16c()
# simd.base's flag (AVX2 and F16C, JIT on, NUMBA_QK_PORTABLE unset): the encoders' F16C path.
HAVE_F16C = HAVE_AVX2


# ---- f16 -> f32 ------------------------------------------------------------------------------

@kernel
def f16_bits_to_f32_bits(h):
    """Widen an IEEE binary16 bit pattern to the binary32 bit pattern of the same value."""
    h = np.uint32(h)
    sign = np.uint32((h & _F16_SIGN) << np.uint32(16))
    exp = np.uint32((h >> np.uint32(10)) & _F16_EXP_MASK)
    mant = np.uint32(h & _F16_MANT_MASK)
    if exp == _F16_EXP_MASK:  # inf or NaN: all-ones exponent, payload shifted up, sign kept
        return np.uint32(sign | _F32_EXP_ALL_ONES | (mant << np.uint32(13)))
    if exp != 0:  # normal
        return np.uint32(sign | ((exp + _EXP_REBIAS) << np.uint32(23)) | (mant << np.uint32(13)))
    if mant == 0:  # +-0
        return sign
    # subnormal: value = mant * 2**-24; normalise so the leading 1 becomes the implicit bit
    e = _SUBNORMAL_EXP
    while (mant & _F16_IMPLICIT) == 0:
        mant = np.uint32(mant << np.uint32(1))
        e = np.uint32(e - np.uint32(1))
    mant = np.uint32(mant & _F16_MANT_MASK)
    return np.uint32(sign | (e << np.uint32(23)) | (mant << np.uint32(13)))


@kernel
def f16_to_f32(h):
    """The float32 value of an IEEE binary16 bit pattern (exact, NaN bits kept)."""
    return np.uint32(f16_bits_to_f32_bits(h)).view(np.float32)


@intrinsic
def fpext_f16_bits_to_f32(typingctx, h):
    """float32 value of binary16 bits ``h`` by LLVM ``fpext`` (exact; F16C on x86; a signalling
    NaN comes back quiet)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@kernel
def f16_bits_to_f32_bits_hw(raw):
    """float32 bits (int64) of an f16 code: the hardware widening, except NaNs, which keep their
    bits exactly as :func:`f16_to_f32` does (the hardware would quieten a signalling NaN)."""
    h = np.uint16(raw)
    x = np.int64(np.float32(fpext_f16_bits_to_f32(h)).view(np.uint32))
    hi = np.int64(h)
    nan = ((hi & 0x8000) << 16) | np.int64(0x7F800000) | ((hi & 0x3FF) << 13)
    return nan if (hi & 0x7C00) == 0x7C00 and (hi & 0x3FF) != 0 else x


# ---- f32 -> f16 ------------------------------------------------------------------------------

@kernel
def f32_to_f16_bits_ggml(x):
    """IEEE binary16 bits of float32 ``x``, rounded to nearest, ties to even (overflow -> inf,
    gradual underflow to subnormals, NaN -> a quiet NaN with the sign and top payload bits kept)
    -- the conversion of ggml's ``GGML_FP32_TO_FP16`` and numpy's ``astype(float16)`` for every
    non-NaN value."""
    bits = np.float32(x).view(np.uint32)
    sign = np.uint32((bits >> np.uint32(16)) & np.uint32(0x8000))
    exp = np.int32((bits >> np.uint32(23)) & np.uint32(0xFF))
    mant = np.uint32(bits & np.uint32(0x7FFFFF))
    if exp == 0xFF:  # inf or NaN
        if mant == 0:
            return np.uint16(sign | np.uint32(0x7C00))
        return np.uint16(sign | np.uint32(0x7E00) | (mant >> np.uint32(13)))
    e = np.int32(exp - 127 + 15)  # f16 biased exponent
    if e <= 0:  # f16 subnormal (or zero): value = m * 2**-24, rounded
        if e < -10:  # below half the smallest subnormal: rounds to zero
            return np.uint16(sign)
        m = np.uint32(mant | np.uint32(0x800000))  # implicit bit (f32 subnormals land above)
        shift = np.uint32(14 - e)
        r = np.uint32(m >> shift)
        rem = np.uint32(m & ((np.uint32(1) << shift) - np.uint32(1)))
        half = np.uint32(np.uint32(1) << (shift - np.uint32(1)))
        if rem > half or (rem == half and (r & np.uint32(1)) != 0):
            r += np.uint32(1)  # may become 0x400: the smallest normal, correctly encoded
        return np.uint16(sign | r)
    if e >= 31:
        return np.uint16(sign | np.uint32(0x7C00))
    val = np.uint32((np.uint32(e) << np.uint32(10)) | (mant >> np.uint32(13)))
    rem = np.uint32(mant & np.uint32(0x1FFF))
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (val & np.uint32(1)) != 0):
        val += np.uint32(1)  # a carry into the exponent is right; 0x7C00 is inf
    return np.uint16(sign | val)


@intrinsic
def fptrunc_f32_to_f16_bits(typingctx, x):
    """IEEE binary16 bits of float32 ``x`` by LLVM ``fptrunc`` (one RNE, overflow to inf,
    gradual underflow; F16C ``vcvtps2ph`` on x86): a NaN keeps its sign and top payload bits,
    quietened -- ggml's bits."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


@kernel
def f32_to_f16_bits_ggml_hw(x):
    """The bits of :func:`f32_to_f16_bits_ggml` (ggml's ``GGML_FP32_TO_FP16``), by the F16C
    instruction where the target has it (``HAVE_F16C``)."""
    if HAVE_F16C:
        return fptrunc_f32_to_f16_bits(np.float32(x))
    return f32_to_f16_bits_ggml(np.float32(x))


@kernel
def f32_bits_to_f16_canonical_nan(raw):
    """f16 code (int32) of the float32 with bits ``raw``: the hardware conversion (same RNE,
    overflow to inf, gradual underflow), with NaN replaced by the canonical quiet NaN and its
    sign (spec 004).  Only where ``HW_F16``."""
    u = np.uint32(raw)
    h = np.int32(fptrunc_f32_to_f16_bits(u.view(np.float32)))
    nan = np.int32(((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7E00))
    return nan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else h


# ---- bf16 ------------------------------------------------------------------------------------

@kernel
def bf16_bits_to_f32_bits(raw):
    """float32 bits of a bf16 code (exact, every NaN bit kept): bf16 is f32's top half."""
    return np.uint32(np.uint32(raw) << np.uint32(16))


@kernel
def f32_bits_to_bf16_canonical_nan(raw):
    """bf16 code (int32) of the float32 with bits ``raw``: bf16 is f32's top half, so RNE is
    adding 0x7FFF plus the kept LSB (the tie-breaker) to the bits and truncating; a carry into
    the exponent is right (overflow gives 0x7F80, inf).  NaN -> quiet NaN with the sign
    (spec 004)."""
    u = np.uint32(raw)
    r = np.uint32(np.uint32(u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                  >> np.uint32(16))
    nan = np.uint32(((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0))
    return np.int32(nan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)
