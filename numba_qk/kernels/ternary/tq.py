"""TQ1_0 and TQ2_0 records (ggml's ternary formats): field decoders, ggml's dequantizers and
reference quantizers, and the exact record dot against Q8_K.  All ``@njit``; callable from user
``@njit`` code.  Layouts: ``numba_qk/formats/kquants.py`` (declared with the K-quants: the same
256-element super-block and Q8_K activation).

Digits (TQ1_0): digit ``n`` of a byte ``q`` is ``((u8)(q * 3^n) * 3) >> 8`` (0..2; the byte is
a fixed-point base-3 fraction), ``t = digit - 1``.  TQ2_0: ``t = ((byte >> 2g) & 3) - 1``
(-1..2).

Dequantize (ggml ``dequantize_row_tq1_0`` / ``_tq2_0``)::

    y[i] = R32(f32(t_i) * f32(d))

Record dot with Q8_K record ``x`` (docs/numerics.md, "Ternary formats")::

    S = sum_i t_i * xq[i]                         exact int32 (|S| <= 256 * 2 * 128)
    v = R32(ds * R32(f32(d) * f32(S)))            as Q3_K / Q6_K
    dot = ((v_0 + v_1) + v_2) + ...               left fold; G = 0 -> +0.0

Quantize (ggml ``quantize_row_tq1_0_ref`` / ``_tq2_0_ref``, what ``ggml_quantize_chunk``
calls): ``amax = max |x|`` (C's ``MAX``), ``d = fp16(amax)``, ``id = amax ? R32(1 / amax) :
0``; digit ``= lroundf(R32(x * id)) + 1`` (halves away from zero; an infinite or NaN product,
reached only when ``1 / amax`` overflows, gives glibc/x86's ``(int)LONG_MIN = 0``, digit 1).
TQ1_0 packs five digits most significant first, ``q = sum digit_n * 3^(4-n)``, and stores
``ceil(q * 256 / 243)``; ``qh`` packs four and multiplies by 3 first.  TQ2_0 stores
``digit & 3`` in bits ``[2g, 2g + 2)``.
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats.kquants import tq1_0 as _FMT1
from numba_qk.formats.kquants import tq2_0 as _FMT2
from numba_qk.kernels._round import roundf
from numba_qk.kernels.drive import kernels_for, register
from numba_qk.kernels.kquants.common import (codes2_sum, f16_at, no_scratch, portable_dot_for,
                                             quantizer_for, record_value_d, store_f16)
from numba_qk.kernels.kquants.common import X_Q_AT
from numba_qk.kernels.simd import ternary as _simd

TQ1_0_RECORD_BYTES = _FMT1.block_bytes
TQ2_0_RECORD_BYTES = _FMT2.block_bytes
_QS1_AT = _FMT1.field("qs").start     # 48 bytes of 5 digits
_QH1_AT = _FMT1.field("qh").start     # 4 bytes of 4 digits
_D1_AT = _FMT1.field("d").start
_QS2_AT = _FMT2.field("qs").start     # 64 bytes of 4 2-bit codes
_D2_AT = _FMT2.field("d").start
_POW3 = np.array([1, 3, 9, 27, 81, 243], np.uint8)


@kernel
def tq_digit(byte, n):
    """Digit ``n`` (0..4) of a TQ1_0 byte: ``((u8)(byte * 3^n) * 3) >> 8`` (0..2), int32."""
    q = np.uint8((np.uint32(byte) * np.uint32(_POW3[n])) & np.uint32(0xFF))
    return np.int32((np.uint32(q) * np.uint32(3)) >> np.uint32(8))


@kernel
def tq1_0_place(i):
    """``(byte offset, n)`` of element ``i`` (0..255) of a TQ1_0 record."""
    if i < 160:
        return _QS1_AT + i % 32, i // 32
    if i < 240:
        k = i - 160
        return _QS1_AT + 32 + k % 16, k // 16
    k = i - 240
    return _QH1_AT + k % 4, k // 4


@kernel
def tq1_0_ternary(rec, i):
    """``t`` (-1..1) of element ``i`` of a TQ1_0 record (1-D), int32."""
    at, n = tq1_0_place(i)
    return tq_digit(rec[at], n) - np.int32(1)


@kernel
def tq2_0_ternary(rec, i):
    """``t`` (-1..2) of element ``i`` of a TQ2_0 record (1-D), int32."""
    byte = rec[_QS2_AT + 32 * (i // 128) + i % 32]
    return np.int32((byte >> np.uint8(2 * ((i % 128) // 32))) & np.uint8(3)) - np.int32(1)


@inline_kernel
def tq1_0_ternaries(records, b, t):
    """``t[b, i] =`` ``t`` (-1..1) of every element of TQ1_0 record ``records[b]``, in ggml's
    ``dequantize_row_tq1_0`` order."""
    for n in range(5):
        for m in range(32):
            t[b, 32 * n + m] = tq_digit(records[b, _QS1_AT + m], n) - np.int32(1)
        for m in range(16):
            t[b, 160 + 16 * n + m] = tq_digit(records[b, _QS1_AT + 32 + m], n) - np.int32(1)
    for n in range(4):
        for m in range(4):
            t[b, 240 + 4 * n + m] = tq_digit(records[b, _QH1_AT + m], n) - np.int32(1)


@inline_kernel
def tq2_0_ternaries(records, b, t):
    """``t[b, i] =`` ``t`` (-1..2) of every element of TQ2_0 record ``records[b]``, in ggml's
    ``dequantize_row_tq2_0`` order."""
    for c in range(2):
        for g in range(4):
            shift = np.uint8(2 * g)
            for l in range(32):
                q = np.int32((records[b, _QS2_AT + 32 * c + l] >> shift) & np.uint8(3))
                t[b, 128 * c + 32 * g + l] = q - np.int32(1)


@inline_kernel
def tq_dequantize(records, out, d_at, ternaries):
    """ggml's ``dequantize_row_tq*``: ``R32(f32(t) * d)`` of every element of every record
    (``ternaries`` one of the above, ``d`` the f16 at ``d_at``) into f32 ``out`` [G, 256]: the
    ternaries (exact in f32) first, then scaled in place."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, d_at)
        ternaries(records, b, out)
        for i in range(256):
            out[b, i] = np.float32(out[b, i] * d)


@kernel
def tq1_0_decode_records(records, q):
    """``t`` of every element of ``[G, 54]`` TQ1_0 records into int8 ``q`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        tq1_0_ternaries(records, b, q)


@kernel
def tq2_0_decode_records(records, q):
    """``t`` of every element of ``[G, 66]`` TQ2_0 records into int8 ``q`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        tq2_0_ternaries(records, b, q)


# ---- dequantize -----------------------------------------------------------------------------

@kernel
def dequantize_tq1_0(records, out):
    """ggml's ``dequantize_row_tq1_0``: ``[G, 54]`` records into f32 ``out`` ``[G, 256]``."""
    tq_dequantize(records, out, _D1_AT, tq1_0_ternaries)


@kernel
def dequantize_tq2_0(records, out):
    """ggml's ``dequantize_row_tq2_0``: ``[G, 66]`` records into f32 ``out`` ``[G, 256]``."""
    tq_dequantize(records, out, _D2_AT, tq2_0_ternaries)


# ---- quantize (ggml quantize_row_tq1_0_ref / quantize_row_tq2_0_ref) --------------------------

@kernel
def tq_scale(values, b, out, d_at):
    """``id`` of block ``values[b]`` (``amax ? 1/amax : 0``); stores ``d = fp16(amax)``."""
    amax = np.float32(0.0)
    for j in range(256):
        a = abs(np.float32(values[b, j]))
        amax = amax if amax > a else a          # C: MAX(amax, fabsf(v))
    store_f16(out, b, d_at, amax)
    return np.float32(np.float32(1.0) / amax) if amax != np.float32(0.0) else np.float32(0.0)


@kernel
def tq_code(x, iscale):
    """``lroundf(R32(x * id)) + 1`` as x86/glibc gives it (non-finite product -> 1)."""
    p = np.float32(np.float32(x) * iscale)
    if not (abs(p) <= np.float32(2.0 ** 30)):   # inf / NaN (|p| <= 1 otherwise)
        return np.int32(1)
    return np.int32(roundf(p)) + np.int32(1)


@kernel
def quantize_block_tq1_0(values, b, out, work):
    """One finite block ``values[b]`` into TQ1_0 record ``out[b]``."""
    iscale = tq_scale(values, b, out, _D1_AT)
    for m in range(32):
        q = np.int32(0)
        for n in range(5):
            q = q * 3 + tq_code(values[b, m + 32 * n], iscale)
        out[b, _QS1_AT + m] = np.uint8((q * 256 + 242) // 243)
    for m in range(16):
        q = np.int32(0)
        for n in range(5):
            q = q * 3 + tq_code(values[b, 160 + m + 16 * n], iscale)
        out[b, _QS1_AT + 32 + m] = np.uint8((q * 256 + 242) // 243)
    for j in range(4):
        q = np.int32(0)
        for m in range(4):
            q = q * 3 + tq_code(values[b, 240 + j + 4 * m], iscale)
        q *= 3
        out[b, _QH1_AT + j] = np.uint8((q * 256 + 242) // 243)


@kernel
def quantize_block_tq2_0(values, b, out, work):
    """One finite block ``values[b]`` into TQ2_0 record ``out[b]``."""
    iscale = tq_scale(values, b, out, _D2_AT)
    for c in range(2):
        for m in range(32):
            q = np.int32(0)
            for n in range(4):
                q += (tq_code(values[b, 128 * c + m + 32 * n], iscale) & 3) << (2 * n)
            out[b, _QS2_AT + 32 * c + m] = np.uint8(q & 0xFF)


quantize_tq1_0 = quantizer_for(_FMT1, block=quantize_block_tq1_0, scratch=no_scratch)
quantize_tq2_0 = quantizer_for(_FMT2, block=quantize_block_tq2_0, scratch=no_scratch)


# ---- record dot against Q8_K ----------------------------------------------------------------

@kernel
def record_sum_tq1_0_q8_k(w, bw, x, bx):
    """``S = sum_i t_i * xq[i]`` (int32) of TQ1_0 record ``w[bw]`` and Q8_K record ``x[bx]``."""
    s = np.int32(0)
    for n in range(5):
        for m in range(32):
            t = tq_digit(w[bw, _QS1_AT + m], n) - np.int32(1)
            s += t * np.int32(np.int8(x[bx, X_Q_AT + 32 * n + m]))
        for m in range(16):
            t = tq_digit(w[bw, _QS1_AT + 32 + m], n) - np.int32(1)
            s += t * np.int32(np.int8(x[bx, X_Q_AT + 160 + 16 * n + m]))
    for n in range(4):
        for m in range(4):
            t = tq_digit(w[bw, _QH1_AT + m], n) - np.int32(1)
            s += t * np.int32(np.int8(x[bx, X_Q_AT + 240 + 4 * n + m]))
    return s


@kernel
def record_sum_tq2_0_q8_k(w, bw, x, bx):
    """``S = sum_i t_i * xq[i]`` (int32) of TQ2_0 record ``w[bw]`` and Q8_K record ``x[bx]``."""
    s = np.int32(0)
    for c in range(2):
        for l in range(32):   # one weight byte, its four codes (g = 0..3); same integer sum
            s += codes2_sum(np.int32(w[bw, _QS2_AT + 32 * c + l]), x, bx, X_Q_AT + 128 * c + l,
                            32)
    return s


@kernel
def record_value_tq1_0_q8_k(w, bw, x, bx):
    """``v = R32(ds * R32(f32(d) * f32(S)))`` of TQ1_0 ``w[bw]`` and Q8_K ``x[bx]``."""
    return record_value_d(w, bw, _D1_AT, record_sum_tq1_0_q8_k(w, bw, x, bx), x, bx)


@kernel
def record_value_tq2_0_q8_k(w, bw, x, bx):
    """``v = R32(ds * R32(f32(d) * f32(S)))`` of TQ2_0 ``w[bw]`` and Q8_K ``x[bx]``."""
    return record_value_d(w, bw, _D2_AT, record_sum_tq2_0_q8_k(w, bw, x, bx), x, bx)


dot_tq1_0_q8_k_portable = portable_dot_for(_FMT1, value=record_value_tq1_0_q8_k)
dot_tq2_0_q8_k_portable = portable_dot_for(_FMT2, value=record_value_tq2_0_q8_k)


# ---- dot / gemv / gemm: the shared driver (kernels/drive.py) -----------------------------------
# The SIMD record values and 8-lane tiles (kernels/simd/ternary.py) equal the portable
# definitions above bit for bit (tests/ternary/test_tq_fast.py); strided records take the
# portable dot, a kernel of this module (portable_dot_for: the driver caches the entry points
# under loop_dot's module, whose source digest then covers the SIMD module too).

# Records of 16 per gemm block: 5-17 % less time than 8 at batch 32 (bench/experiments/
# tq_gemm_ab.py; 1, 2, 4 no better).  TQ2_0's gemm tile is about as fast as its gemv per
# activation there, TQ1_0's takes half the time.
register(_FMT1.ggml_type, loop_dot=dot_tq1_0_q8_k_portable, value=_simd.tq1_0_q8_k_value,
         rows_x8=_simd.tq1_0_rows_x8, acts_x8=_simd.tq1_0_acts_x8, record_block=16)
register(_FMT2.ggml_type, loop_dot=dot_tq2_0_q8_k_portable, value=_simd.tq2_0_q8_k_value,
         rows_x8=_simd.tq2_0_rows_x8, acts_x8=_simd.tq2_0_acts_x8, record_block=16)
dot_tq1_0_q8_k, gemv_tq1_0_q8_k, gemm_tq1_0_q8_k = kernels_for(_FMT1.ggml_type)
dot_tq2_0_q8_k, gemv_tq2_0_q8_k, gemm_tq2_0_q8_k = kernels_for(_FMT2.ggml_type)


# ---- the registry's declarations of this module's formats (numba_qk/kernels/traits.py) --------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402

_DECODED = Decoded("TQFields", ("d", "q"), (("q", "i1"),),
                   "Decoded TQ1_0 / TQ2_0 fields of ``G`` records (``x = d * q``; ``q`` int8 "
                   "-1..1, TQ2_0's code 3 gives 2).")

TRAITS = (
    Traits(format=_FMT1, dequantize=dequantize_tq1_0, decode=tq1_0_decode_records,
           decoded=_DECODED, quantize=quantize_tq1_0, domain="finite",
           quantizer="ggml quantize_row_tq1_0_ref", find_invalid=None,
           dot=dot_tq1_0_q8_k, gemv=gemv_tq1_0_q8_k, gemm=gemm_tq1_0_q8_k,
           oracle="numba_qk.testing.reference.ternary"),
    Traits(format=_FMT2, dequantize=dequantize_tq2_0, decode=tq2_0_decode_records,
           decoded=_DECODED, quantize=quantize_tq2_0, domain="finite",
           quantizer="ggml quantize_row_tq2_0_ref", find_invalid=None,
           dot=dot_tq2_0_q8_k, gemv=gemv_tq2_0_q8_k, gemm=gemm_tq2_0_q8_k,
           oracle="numba_qk.testing.reference.ternary"),
)
