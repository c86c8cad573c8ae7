"""ggml's CPU activation quantizers on x86 (what llama.cpp runs), as ``@njit`` kernels.

llama.cpp quantizes a matmul's f32 activations at run time with the CPU backend's
``type_traits_cpu[vec_dot_type].from_float``: ``quantize_row_q8_0`` / ``quantize_row_q8_1`` /
``quantize_row_q8_K`` of ``ggml-cpu/arch/x86/quants.c`` (exported by ``libggml-cpu.so``).
On an AVX/AVX2/AVX-512 build these are not ggml's ``quantize_row_*_ref`` (which numba_qk's
canonical ``quantize`` reproduces); per block ``v[0..31]`` (all steps f32):

* Q8_0 (AVX path): ``amax = max |v|``; ``d = amax / 127`` stored as ``fp16(d)`` (RNE);
  ``id = 127 / amax`` (0 if ``amax == 0``; the _ref uses ``1 / d``);
  ``q = cvtps_epi32(round_ps(R32(v * id), nearest))``: ties to **even** (the _ref's ``roundf``
  rounds halves away from zero), then saturated to int8 by ``packs``; a NaN/inf product
  (``id`` overflows when ``amax`` < about 3.7e-37) converts to INT_MIN, i.e. -128.
* Q8_1: as Q8_0, plus ``s = fp16(R32(d * f32(sum)))`` where ``sum`` is the int32 sum of the
  *unsaturated* converted values (``hsum_i32_8``, wrapping).
* Q8_K: x86's ``quantize_row_q8_K`` is ``quantize_row_q8_K_ref``: ``max`` = the *first* value
  of largest magnitude, ``iscale = -127 / max``, ``q = min(127, nearest_int(iscale * v))``,
  ``bsums`` of the stored q, ``d = 1 / iscale``.  It differs from numba_qk's canonical Q8_K
  (spec 000 section 4) only when a block holds ``+a`` and ``-a`` as its extremes (the
  canonical picks the minimum); ggml leaves ``bsums`` of an all-zero block unwritten, here
  they are 0.

Signatures follow ``kernels/blocks.py``: ``quantize_<a>_ggml_cpu(x, out) -> int`` with ``x``
float32 ``[G * block]`` C-contiguous and ``out`` uint8 ``[G, bytes]``; -1 on success, else the
first block holding a non-finite value (for Q8_K also one whose ``iscale`` is not finite), and
then nothing is written (the domain of the canonical quantizers; ggml does not check).
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.kquants.encode_lanes import f16_bits
from numba_qk.kernels.kquants.q8_k import q8_k_write_block
from numba_qk.kernels.legacy.kernels import first_absmax, first_nonfinite_block

__all__ = ["quantize_q8_0_ggml_cpu", "quantize_q8_1_ggml_cpu", "quantize_q8_k_ggml_cpu"]

_MAGNITUDE = np.int32(0x7FFFFFFF)


@kernel
def _store_f16(out, row, off, x):
    h = f16_bits(np.float32(x))
    out[row, off] = np.uint8(h & np.uint16(0xFF))
    out[row, off + 1] = np.uint8(h >> np.uint16(8))


@kernel
def _cvtps_epi32(r):
    """x86 ``cvtps2dq`` of an integral f32 (after ``round_ps``): INT_MIN for NaN/out of range."""
    ok = (r >= np.float32(-2147483648.0)) & (r < np.float32(2147483648.0))
    i = np.int32(r if ok else np.float32(0.0))
    return i if ok else np.int32(-2147483648)


@kernel
def _q8_x86(values, out, qs_at, s_at):
    """Q8_0 (``s_at < 0``) or Q8_1 records of ``values`` f32 [G, 32], the AVX path."""
    for b in range(values.shape[0]):
        m = np.int32(0)
        for j in range(32):
            m = max(m, np.int32(np.float32(values[b, j]).view(np.int32) & _MAGNITUDE))
        amax = np.int32(m).view(np.float32)
        d = np.float32(amax / np.float32(127.0))
        _store_f16(out, b, 0, d)
        inv = np.float32(np.float32(127.0) / amax) if amax != np.float32(0.0) else np.float32(0.0)
        total = np.int64(0)
        for j in range(32):
            i = _cvtps_epi32(np.float32(np.rint(np.float32(np.float32(values[b, j]) * inv))))
            total += np.int64(i)
            out[b, qs_at + j] = np.uint8(np.int32(min(max(i, np.int32(-128)), np.int32(127)))
                                         & np.int32(0xFF))
        if s_at >= 0:
            t32 = np.int32(np.int64(total << np.int64(32)) >> np.int64(32))  # int32 wrap
            _store_f16(out, b, s_at, np.float32(d * np.float32(t32)))


@kernel
def _q8_x86_checked(x, out, qs_at, s_at):
    values = x.reshape(out.shape[0], 32)
    bad = first_nonfinite_block(values)
    if bad < 0:
        _q8_x86(values, out, qs_at, s_at)
    return bad


@kernel
def quantize_q8_0_ggml_cpu(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q8_0 records out uint8 [G, 34], bit-identical to
    libggml-cpu's ``quantize_row_q8_0`` (x86 AVX); -1, or the first non-finite block."""
    return _q8_x86_checked(x, out, 2, -1)


@kernel
def quantize_q8_1_ggml_cpu(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q8_1 records out uint8 [G, 36], bit-identical to
    libggml-cpu's ``quantize_row_q8_1`` (x86 AVX2); -1, or the first non-finite block."""
    return _q8_x86_checked(x, out, 4, 2)


@kernel
def _first_absmax(values, b):
    """ggml's ``if (ax > amax) { amax = ax; max = x[j]; }`` loop: the first value of largest
    magnitude, or 0.0 (on int64 keys ``magnitude << 9 | (511 - j)``, which vectorizes)."""
    return first_absmax(values, b, 256, 9)


@kernel
def quantize_q8_k_ggml_cpu(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q8_K records out uint8 [G, 292], bit-identical to
    libggml-cpu's ``quantize_row_q8_K`` (= ``quantize_row_q8_K_ref`` on x86; an all-zero
    block's bsums written as 0); -1, or the first out-of-domain block."""
    values = x.reshape(out.shape[0], 256)
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    for b in range(values.shape[0]):
        mx = _first_absmax(values, b)
        if mx != np.float32(0.0):
            iscale = np.float32(np.float32(-127.0) / mx)
            if (iscale - iscale) != np.float32(0.0):
                return b
    for b in range(values.shape[0]):
        mx = _first_absmax(values, b)
        inverse = np.float32(0.0)
        if mx != np.float32(0.0):
            inverse = np.float32(np.float32(-127.0) / mx)
        # q8_k_write_block: ds = 1 / inverse, q = saturate_i8(rint(x * inverse)), bsums; equal
        # to ggml's min(127, nearest_int(...)) for |x * inverse| <= 127 (always, here)
        q8_k_write_block(values, b, inverse, out, b)
    return -1
