"""Q1_0 and Q2_0 records (ggml's 1- and 2-bit scale-only formats, GGML types 41 and 42): field
decoders, ggml's dequantizers and reference quantizers, and the exact record dot against Q8_0
(one Q1_0 record spans four Q8_0 records, one Q2_0 record two).  All ``@njit``; callable from
user ``@njit`` code.  Layouts: ``numba_qk/formats/lowbit.py``.

Multipliers: Q1_0 ``t_j = bit_j ? 1 : -1`` (bit ``j % 8`` of ``qs[j // 8]``); Q2_0
``t_j = q_j - 1`` (-1..2; ``q_j`` bits ``[2 (j % 4), +2)`` of ``qs[j // 4]``).

Dequantize (ggml ``dequantize_row_q1_0`` / ``_q2_0``): Q1_0 ``y_j = bit_j ? d : -d`` (exact; a
signalling-NaN ``d`` comes back quiet, payload kept, as ggml's widening gives it); Q2_0
``y_j = R32(f32(t_j) * f32(d))``.

Record dot with the Q8_0 records ``x[S b + k]`` (``S`` = 4 for Q1_0, 2 for Q2_0; the structure
of ggml's ``ggml_vec_dot_q*_0_q8_0_generic``; docs/numerics.md, "Q1_0 and Q2_0")::

    S_k = sum_{i < 32} t_{32k + i} * xq_k[i]           exact int32
    p_k = R32(f32(d_k) * f32(S_k))                      d_k the f16 scale of x[S b + k]
    T   = R32(... R32(R32(0 + p_0) + p_1) ... + p_{S-1})  ggml's 0.0f seed
    v   = R32(f32(d) * T)
    dot = ((v_0 + v_1) + v_2) + ...                     left fold; G = 0 -> +0.0

Quantize (ggml ``quantize_row_q1_0_ref`` / ``_q2_0_ref``, what ``ggml_quantize_chunk`` calls
with or without an importance matrix, which ggml ignores): Q1_0 ``d = fp16(R32(s / 128))``,
``s`` the in-order f32 sum of ``|x_j|``; bit ``j = x_j >= 0`` (-0.0 gives 1).  Q2_0
``d = fp16(amax)``, ``id = amax > 0 ? R32(1 / amax) : 0``, ``q = clamp((int) roundf(R32(x *
id)) + 1, 0, 3)`` (halves away from zero; a non-finite product, reached only when ``1 / amax``
overflows, is x86's ``(int) NaN = INT_MIN``: code 0).
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats.lowbit import q1_0 as _FMT1
from numba_qk.formats.lowbit import q2_0 as _FMT2
from numba_qk.kernels._round import roundf
from numba_qk.kernels.drive import kernels_for, register
from numba_qk.kernels.f16 import f16_bits_to_f32_bits
from numba_qk.kernels.kquants.common import (codes2_sum, f16_at, no_scratch, portable_dot_for,
                                             quantizer_for, store_f16)
from numba_qk.kernels.simd import lowbit as _simd

Q1_0_RECORD_BYTES = _FMT1.block_bytes
Q2_0_RECORD_BYTES = _FMT2.block_bytes
_D1_AT = _FMT1.field("d").start
_QS1_AT = _FMT1.field("qs").start
_D2_AT = _FMT2.field("d").start
_QS2_AT = _FMT2.field("qs").start
_Y_D_AT = 0       # block_q8_0: f16 d, int8 qs[32]
_Y_QS_AT = 2


@kernel
def q1_0_sign(rec_byte, j):
    """``t`` (+-1, int32) of element ``j`` whose sign byte is ``rec_byte``: bit ``j % 8``."""
    return np.int32(1) if (np.uint32(rec_byte) >> np.uint32(j % 8)) & np.uint32(1) else np.int32(-1)


@kernel
def q2_0_value(rec_byte, j):
    """``t = q - 1`` (-1..2, int32) of element ``j`` whose code byte is ``rec_byte``."""
    return np.int32((np.uint32(rec_byte) >> np.uint32(2 * (j % 4))) & np.uint32(3)) - np.int32(1)


# ---- decode / dequantize --------------------------------------------------------------------

@kernel
def f16_at_quiet(a, row, off):
    """f32 of the f16 at ``a[row, off:off+2]`` as ggml widens it (F16C ``vcvtph2ps``, or its
    portable multiply): exact, a signalling NaN quietened (payload kept)."""
    h = np.uint16(np.uint16(a[row, off]) | (np.uint16(a[row, off + 1]) << np.uint16(8)))
    bits = np.uint32(f16_bits_to_f32_bits(h))
    if (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000) and (bits & np.uint32(0x7FFFFF)):
        bits |= np.uint32(0x400000)
    return np.uint32(bits).view(np.float32)



@kernel
def q1_0_decode_records(records, q):
    """``t`` (+-1) of every element of ``[G, 18]`` Q1_0 records into int8 ``q`` ``[G, 128]``."""
    for b in range(records.shape[0]):
        for j in range(128):
            q[b, j] = q1_0_sign(records[b, _QS1_AT + j // 8], j)


@kernel
def q2_0_decode_records(records, q):
    """``t`` (-1..2) of every element of ``[G, 18]`` Q2_0 records into int8 ``q`` ``[G, 64]``."""
    for b in range(records.shape[0]):
        for j in range(64):
            q[b, j] = q2_0_value(records[b, _QS2_AT + j // 4], j)


@kernel
def dequantize_q1_0(records, out):
    """ggml's ``dequantize_row_q1_0``: ``[G, 18]`` records into f32 ``out`` ``[G, 128]``."""
    for b in range(records.shape[0]):
        d = f16_at_quiet(records, b, _D1_AT)   # selected, not multiplied: quieten here
        neg = -d
        for j in range(128):
            bit = (np.uint32(records[b, _QS1_AT + j // 8]) >> np.uint32(j % 8)) & np.uint32(1)
            out[b, j] = d if bit else neg


@kernel
def dequantize_q2_0(records, out):
    """ggml's ``dequantize_row_q2_0``: ``[G, 18]`` records into f32 ``out`` ``[G, 64]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, _D2_AT)
        for j in range(64):
            t = q2_0_value(records[b, _QS2_AT + j // 4], j)
            out[b, j] = np.float32(np.float32(t) * d)


# ---- quantize (ggml quantize_row_q1_0_ref / quantize_row_q2_0_ref) ----------------------------

@kernel
def quantize_block_q1_0(values, b, out, work):
    """One finite block ``values[b]`` into Q1_0 record ``out[b]``."""
    s = np.float32(0.0)
    for j in range(128):
        s = np.float32(s + abs(np.float32(values[b, j])))
    store_f16(out, b, _D1_AT, np.float32(s / np.float32(128.0)))
    for m in range(16):
        byte = np.uint32(0)
        for k in range(8):
            if np.float32(values[b, 8 * m + k]) >= np.float32(0.0):
                byte |= np.uint32(1) << np.uint32(k)
        out[b, _QS1_AT + m] = np.uint8(byte)


@kernel
def q2_0_code(x, iscale):
    """``clamp((int) roundf(R32(x * id)) + 1, 0, 3)`` as x86 gives it (non-finite product:
    ``(int)`` gives INT_MIN, code 0)."""
    p = np.float32(np.float32(x) * iscale)
    if not (abs(p) <= np.float32(2.0 ** 30)):   # inf / NaN (|p| <= ~1 otherwise)
        return np.int32(0)
    q = np.int32(roundf(p)) + np.int32(1)
    return min(np.int32(3), max(np.int32(0), q))


@kernel
def quantize_block_q2_0(values, b, out, work):
    """One finite block ``values[b]`` into Q2_0 record ``out[b]``."""
    amax = np.float32(0.0)
    for j in range(64):
        a = abs(np.float32(values[b, j]))
        if a > amax:
            amax = a
    iscale = np.float32(np.float32(1.0) / amax) if amax > np.float32(0.0) else np.float32(0.0)
    store_f16(out, b, _D2_AT, amax)
    for m in range(16):
        byte = np.int32(0)
        for k in range(4):
            byte |= q2_0_code(values[b, 4 * m + k], iscale) << np.int32(2 * k)
        out[b, _QS2_AT + m] = np.uint8(byte)


quantize_q1_0 = quantizer_for(_FMT1, block=quantize_block_q1_0, scratch=no_scratch)
quantize_q2_0 = quantizer_for(_FMT2, block=quantize_block_q2_0, scratch=no_scratch)


# ---- record dot against Q8_0 ------------------------------------------------------------------

@inline_kernel
def q1_0_sums(w, bw, k, x, xr):
    """``S_k = sum_i t_i * q8_i`` (int32) over part ``k`` (elements 32k .. 32k + 31) of Q1_0
    record ``w[bw]`` and Q8_0 record ``x[xr]``."""
    s = np.int32(0)
    for m in range(4):
        byte = np.uint32(w[bw, _QS1_AT + 4 * k + m])
        for i in range(8):
            q = np.int32(np.int8(x[xr, _Y_QS_AT + 8 * m + i]))
            s += q if (byte >> np.uint32(i)) & np.uint32(1) else -q
    return s


@inline_kernel
def q2_0_sums(w, bw, k, x, xr):
    """``S_k`` (int32) over part ``k`` of Q2_0 record ``w[bw]`` and Q8_0 record ``x[xr]``."""
    s = np.int32(0)
    for m in range(8):
        s += codes2_sum(np.int32(w[bw, _QS2_AT + 8 * k + m]), x, xr, _Y_QS_AT + 4 * m, 1)
    return s


@inline_kernel
def _record_value(w, bw, x, bx, q1):
    """``v = R32(d * T)`` of Q1_0 (``q1``: four Q8_0 records ``x[4 bx + k]``) or Q2_0 (two,
    ``x[2 bx + k]``) record ``w[bw]``: ``T`` the fold of ``R32(d_k * S_k)`` in order of ``k``
    (the module docstring)."""
    span = 4 if q1 else 2
    t = np.float32(0.0)
    for k in range(span):
        xr = span * bx + k
        s = q1_0_sums(w, bw, k, x, xr) if q1 else q2_0_sums(w, bw, k, x, xr)
        t = np.float32(t + np.float32(f16_at(x, xr, _Y_D_AT) * np.float32(s)))
    return np.float32(f16_at(w, bw, _D1_AT if q1 else _D2_AT) * t)


@kernel
def record_value_q1_0_q8_0(w, bw, x, bx):
    """``v = R32(d * T)`` of Q1_0 record ``w[bw]`` and the four Q8_0 records ``x[4 bx + k]``
    (the module docstring)."""
    return _record_value(w, bw, x, bx, True)


@kernel
def record_value_q2_0_q8_0(w, bw, x, bx):
    """``v = R32(d * T)`` of Q2_0 record ``w[bw]`` and the two Q8_0 records ``x[2 bx + k]``."""
    return _record_value(w, bw, x, bx, False)


dot_q1_0_q8_0_portable = portable_dot_for(_FMT1, value=record_value_q1_0_q8_0)
dot_q2_0_q8_0_portable = portable_dot_for(_FMT2, value=record_value_q2_0_q8_0)


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) -----------------------------------
# The SIMD record values and 8-lane tiles (kernels/simd/lowbit.py) equal the portable
# definitions above bit for bit (tests/lowbit/test_q1q2_fast.py); strided records (or activation
# records that are not consecutive) take the portable dot, a kernel of this module
# (portable_dot_for: the driver caches the entry points under loop_dot's module, whose source
# digest then covers the SIMD module too).  span: the Q8_0 records per weight record.  No gemm tile: gemm is
# the gemv per activation (faster here than an 8-activation tile; kernels/simd/lowbit.py).
register(_FMT1.ggml_type, loop_dot=dot_q1_0_q8_0_portable, value=_simd.q1_0_q8_0_value,
         rows_x8=_simd.q1_0_rows_x8, span=4)
register(_FMT2.ggml_type, loop_dot=dot_q2_0_q8_0_portable, value=_simd.q2_0_q8_0_value,
         rows_x8=_simd.q2_0_rows_x8, span=2)
dot_q1_0_q8_0, gemv_q1_0_q8_0, gemm_q1_0_q8_0 = kernels_for(_FMT1.ggml_type)
dot_q2_0_q8_0, gemv_q2_0_q8_0, gemm_q2_0_q8_0 = kernels_for(_FMT2.ggml_type)


# ---- the registry's declarations of this module's formats (numba_qk/kernels/traits.py) --------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

_DECODED = Decoded("LowBitFields", ("d", "q"), (("q", "i1"),),
                   "Decoded Q1_0 / Q2_0 fields of ``G`` records (``x = d * q``; ``q`` int8: "
                   "Q1_0 -1 or 1, Q2_0 -1..2).")

TRAITS = (
    Traits(format=_FMT1, dequantize=dequantize_q1_0, decode=q1_0_decode_records,
           decoded=_DECODED, quantize=quantize_q1_0, domain="finite",
           quantizer="ggml quantize_row_q1_0_ref", find_invalid=None,
           dot=dot_q1_0_q8_0, gemv=gemv_q1_0_q8_0, gemm=gemm_q1_0_q8_0,
           oracle="numba_qk.testing.reference.lowbit"),
    Traits(format=_FMT2, dequantize=dequantize_q2_0, decode=q2_0_decode_records,
           decoded=_DECODED, quantize=quantize_q2_0, domain="finite",
           quantizer="ggml quantize_row_q2_0_ref", find_invalid=None,
           dot=dot_q2_0_q8_0, gemv=gemv_q2_0_q8_0, gemm=gemm_q2_0_q8_0,
           oracle="numba_qk.testing.reference.lowbit"),
)
