"""ggml's FP4 record formats MXFP4 (type 39) and NVFP4 (type 40): decoders, ggml's dequantizers
and reference quantizers bit for bit, and exact dots against Q8_0 activations.  All ``@njit``;
callable from user ``@njit`` code.  Layouts: ``numba_qk.formats.mxrec`` (offsets read from the
schemas here).

Element codes ``c`` (0..15) are read through ggml's doubled-e2m1 table
``k(c) = 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12``; the scales are *half* scales:

* MXFP4 ``e`` (any byte): ``h(e) = 2^(e - 128)`` (ggml's ``GGML_E8M0_TO_FP32_HALF``: 0x00 is
  2^-128, 0xFF is 2^127).
* NVFP4 ``d[s]`` (any byte): ``u(b) = 0`` for b = 0x00, 0x7F; otherwise with ``E = (b >> 3) & 15``
  and ``M = b & 7``, ``u(b) = M * 2^-10`` (E = 0) or ``(8 + M) * 2^(E - 11)`` (ggml's
  ``ggml_ue4m3_to_fp32``, bit 7 ignored; 0xFF decodes to 240).

Dequantize (ggml ``dequantize_row_mxfp4`` / ``_nvfp4``, gguf-py computes the same):
``y = R32(f32(k(c)) * h)`` -- exact except where ``|k| * h`` overflows to inf (e >= 253).

Quantize (ggml ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref``, bit for bit):

* ``amax``: the largest ``|x|`` of the block (MXFP4) or sub-block of 16 (NVFP4).
* MXFP4 scale: ``e = (uint8_t)(floorf(log2f(amax)) - 2 + 127)`` for ``amax > 0``, else 0.
  ``floorf(log2f(amax))`` is the exponent of ``amax`` (from its bits; f32 subnormals counted
  exactly), plus one where ``log2f`` -- correctly rounded to f32 -- rounds up to the next
  integer: just below a power of two, e.g. ``log2f(8 - 2^-21) = 3``.  The amaxes where that
  happens are the table ``LOG2F_UP`` (built at import from exact arithmetic, tested against
  glibc's ``log2f`` and ggml).  The conversion to ``uint8_t`` wraps modulo 256 as x86's
  ``cvttss2si`` does in ggml's build: ``amax < 2^-125`` gives bytes 232..255, whose huge
  scales make every element code 0.
* NVFP4 scale: ``ue = ggml_fp32_to_ue4m3(R32(amax / 6))``: 0 for ``<= 0``; clamp to 448; below
  2^-6 ``(int)R32(R32(v * 512) + 0.5)`` clamped to 1..7 (0 below 1); else the top 3 mantissa
  bits plus the 4th bit (round half up), carrying into the exponent; exponent >= 15 gives 0x7E
  (never 0x78..0x7D).  ``d = u(ue)``.
* Elements: ggml's ``best_index_mxfp4(x, d)``: the code ``i`` with the smallest
  ``R32(|R32(k(i) * d) - x|)``, scanning i = 0..15 with a strict ``<`` (ties keep the smaller
  index: the smaller magnitude, and +0 (code 0) for negatives that round to zero, -0.0
  included).  The errors are f32-rounded as in C, so where ``x`` dwarfs every ``k * d`` (e.g.
  an NVFP4 value above ~2^24 * 2688) all errors round to ``|x|`` and the code is 0; where
  ``k * d`` overflows (MXFP4 e = 253) that candidate's error is inf.  Equivalently (used here,
  tested equal): scan the 8 magnitudes ``i = 0..7`` against ``|x|`` and add 8 for a negative
  ``x`` when ``i > 0`` -- every positive candidate's error is ``>= |x|``, code 0's error.
* Non-finite input is outside the domain (``QuantizationDomainError`` naming the first such
  block; nothing written).  ggml would quantize it: NaN is skipped by its amax, inf gives
  ``e = 255`` (MXFP4) / ``d = 0x7E`` (NVFP4) and garbage codes.

Dots against Q8_0 (numba_qk's canonical numerics, in the spirit of spec 000 / DESIGN section 7;
Q8_0 record ``y``: f16 ``d_y``, int8 ``q``)::

    MXFP4, record b (y record b):
        S_b = sum_{j<16} k(lo(qs_j)) * q_j + k(hi(qs_j)) * q_{j+16}      exact int32 (|S| <= 49,152)
        t_b = R32(f32(d_y) * h(e_b))                                     one rounding
        v_b = R32(t_b * f32(S_b))                                        one rounding
        dot = ((v_0 + v_1) + v_2) + ...                                  left fold seeded with v_0

    NVFP4, record b, sub-block s = 0..3 (y record 2b + s // 2, lanes o = 16 * (s % 2)):
        S_bs = sum_{j<8} k(lo(qs_{8s+j})) * q_{o+j} + k(hi(qs_{8s+j})) * q_{o+j+8}   (|S| <= 24,576)
        t_bs = R32(f32(d_y) * u(d_s));  v_bs = R32(t_bs * f32(S_bs))
        dot = left fold over all 4G sub-block terms in order (b, then s), seeded with v_00

``f32(S)`` is exact (|S| < 2^24).  No FMA, no reassociation.  ``G = 0`` gives ``+0.0``.  f16
inf/NaN/subnormal ``d_y`` follow IEEE.  This is the order of ggml's generic
``ggml_vec_dot_*_q8_0`` source except for its ``+0.0`` seed (which turns an all ``-0.0`` result
into ``+0.0``), but ggml's builds differ by ulps: the compiler contracts its
``sumf += dy * d * sumi`` into an FMA (one rounding for the product and the add; seen on the
AVX2 libggml-python build for NVFP4), and its x86 MXFP4 SIMD kernel sums lane-wise with FMA.
"""

import math

import numpy as np
from numba import literally

from numba_qk._jit import inline_kernel, kernel
from numba_qk.kernels._bits import f16_to_f32
from numba_qk.formats import quant as _quant
from numba_qk.kernels.kquants.common import no_scratch, quantizer_for

from numba_qk.kernels.fp4.layout import KVALUES, KVALUES_F32, MX_BLOCK, MX_E_AT, MX_QS_AT, NV_BLOCK, NV_D_AT, NV_NSUB, NV_QS_AT, NV_SUB, Y_BLOCK, Y_D_AT, Y_QS_AT
from numba_qk.kernels.fp4.layout import LOW4 as _LOW4


def _e8m0_half_table():
    """h(e) = 2^(e - 128) for every byte (ggml_e8m0_to_fp32_half: 0x00200000 << e for e < 2)."""
    bits = np.array([(0x00200000 << e) if e < 2 else (e - 1) << 23 for e in range(256)],
                    np.uint32)
    return bits.view(np.float32)


def _ue4m3_half_table():
    """u(b) for every byte (ggml_ue4m3_to_fp32): exact dyadic values."""
    out = np.zeros(256, np.float32)
    for b in range(256):
        if b in (0x00, 0x7F):
            continue
        exp, man = (b >> 3) & 0xF, b & 0x7
        out[b] = math.ldexp(man, -10) if exp == 0 else math.ldexp(8 + man, exp - 11)
    return out


def _log2f_up_table():
    """``LOG2F_UP[n + 149]``: the f32 bits of the smallest ``x`` in ``[2^n, 2^(n+1))`` whose
    correctly rounded ``log2f`` is ``n + 1`` (0xFFFFFFFF where there is none).

    ``RN(log2 x) = n + 1`` iff ``log2 x > (n + 1) - g/2``, ``g`` the gap from ``n + 1`` to the
    next f32 below it (no ties: ``log2 x`` is irrational for non-powers of two), i.e.
    ``x >= 2^(n+1) * 2^(-g/2)``.  On the f32 grid of the binade (spacing ``2^(n+1) / M``) the
    first such ``x`` is ``ceil(M * 2^(-g/2))`` grid steps; ``M * expm1(...)`` is accurate to
    ~1e-13 and every ``q`` stays > 1e-9 from an integer (asserted)."""
    out = np.full(277, 0xFFFFFFFF, np.uint32)
    for n in range(-149, 128):
        top = n + 1
        if top == 0:
            continue  # log2 of x in [1/2, 1) is representable next to 0: never rounds to 0
        t = np.float32(top)
        g = float(t) - float(np.nextafter(t, np.float32(-np.inf)))
        m = 2 ** 24 if n >= -126 else 2 ** (n + 150)  # grid points in [2^n, 2^(n+1))
        q = m + m * math.expm1(-(g / 2) * math.log(2.0))
        assert abs(q - round(q)) > 1e-9, (n, q)
        steps = math.ceil(q)
        if steps >= m:
            continue
        # x = steps * spacing, spacing = 2^(n+1) / m
        x = np.float32(math.ldexp(steps, top) / m)
        out[n + 149] = np.float32(x).view(np.uint32)
    return out


E8M0_HALF = _e8m0_half_table()
UE4M3_HALF = _ue4m3_half_table()
LOG2F_UP = _log2f_up_table()
_F32_MIN_NORMAL_BITS = np.uint32(0x00800000)


# ---- scale rules ------------------------------------------------------------------------------

@kernel
def floor_log2f(amax):
    """``floorf(log2f(amax))`` for a positive finite f32 ``amax`` (glibc's correctly rounded
    ``log2f``), as int32, from the bits: the binade, plus one above ``LOG2F_UP``."""
    u = np.float32(amax).view(np.uint32)
    if u >= _F32_MIN_NORMAL_BITS:
        n = np.int32(u >> np.uint32(23)) - np.int32(127)
    else:  # subnormal: the highest set bit p, value in [2^(p-149), 2^(p-148))
        p = np.int32(0)
        v = u
        while v > np.uint32(1):
            v >>= np.uint32(1)
            p += np.int32(1)
        n = p - np.int32(149)
    if u >= LOG2F_UP[n + 149]:
        n += np.int32(1)
    return n


@kernel
def mxfp4_scale_code(amax):
    """ggml's MXFP4 scale byte ``(uint8_t)(floorf(log2f(amax)) - 2 + 127)`` (0 for amax == 0);
    the conversion wraps modulo 256 (x86), e.g. -1 -> 255."""
    if not (amax > np.float32(0.0)):
        return np.uint8(0)
    return np.uint8((floor_log2f(amax) + np.int32(125)) & np.int32(0xFF))


@kernel
def fp32_to_ue4m3(value):
    """ggml's ``ggml_fp32_to_ue4m3``: round half up on the 4th mantissa bit, saturate to 0x7E."""
    v = np.float32(value)
    if not (v > np.float32(0.0)):
        return np.uint8(0)
    x = np.float32(min(v, np.float32(448.0)))             # clamp (v > 448 -> 448)
    bits = np.float32(x).view(np.uint32)
    fp32_exp = np.int32((bits >> np.uint32(23)) & np.uint32(0xFF)) - np.int32(127)
    fp32_man = np.int32((bits >> np.uint32(20)) & np.uint32(0x7))
    exp = fp32_exp + np.int32(7)
    if exp <= 0:
        # (int)(x * 512.0f + 0.5f): two f32 roundings, then truncation toward zero
        man = np.int32(np.float32(np.float32(x * np.float32(512.0)) + np.float32(0.5)))
        if man > 7:
            man = np.int32(7)
        if man < 1:
            return np.uint8(0)
        return np.uint8(man)
    if exp >= 15:
        return np.uint8(0x7E)
    man = fp32_man + np.int32((bits >> np.uint32(19)) & np.uint32(1))
    if man > 7:
        man = np.int32(0)
        exp += np.int32(1)
        if exp >= 15:
            return np.uint8(0x7E)
    return np.uint8((exp << 3) | man)


@kernel
def fp4_code(value, d):
    """ggml's ``best_index_mxfp4(x, d)``: nearest ``k(i) * d`` by f32-rounded error, ties to
    the smaller index (see the module docstring for the 8-magnitude equivalence)."""
    x = np.float32(value)
    m = abs(x)
    best = 0
    best_err = m                                   # code 0: R32(|0 * d - x|) = |x|
    for i in range(1, 8):
        err = abs(np.float32(KVALUES_F32[i] * d) - m)  # R32(|R32(k * d) - |x||)
        if err < best_err:
            best = i
            best_err = err
    if best > 0 and x < np.float32(0.0):
        best += 8
    return np.uint8(best)


# ---- quantizers -------------------------------------------------------------------------------

@kernel
def quantize_block_mxfp4(values, b, out, work):
    """One 32-value block ``values[b]`` into record ``out[b]`` (ggml quantize_row_mxfp4_ref)."""
    amax = np.float32(0.0)
    for j in range(MX_BLOCK):
        a = abs(np.float32(values[b, j]))
        if amax < a:
            amax = a
    e = mxfp4_scale_code(amax)
    d = E8M0_HALF[e]
    out[b, MX_E_AT] = e
    half = MX_BLOCK // 2
    for j in range(half):
        lo = fp4_code(values[b, j], d)
        hi = fp4_code(values[b, j + half], d)
        out[b, MX_QS_AT + j] = lo | (hi << np.uint8(4))


@kernel
def quantize_block_nvfp4(values, b, out, work):
    """One 64-value block ``values[b]`` into record ``out[b]`` (ggml quantize_row_nvfp4_ref)."""
    half = NV_SUB // 2
    for s in range(NV_NSUB):
        base = s * NV_SUB
        amax = np.float32(0.0)
        for j in range(NV_SUB):
            a = abs(np.float32(values[b, base + j]))
            if amax < a:
                amax = a
        ue = fp32_to_ue4m3(np.float32(amax / np.float32(6.0)))   # R32(amax / 6)
        out[b, NV_D_AT + s] = ue
        d = UE4M3_HALF[ue]
        for j in range(half):
            lo = fp4_code(values[b, base + j], d)
            hi = fp4_code(values[b, base + half + j], d)
            out[b, NV_QS_AT + s * half + j] = lo | (hi << np.uint8(4))


# f32 ``values`` ``[G, 32]`` / ``[G, 64]`` -> records; -1, or the first block holding a
# non-finite value (nothing written then): the blocks in order, the K-quants' loop.
quantize_mxfp4 = quantizer_for(_quant.mxfp4, block=quantize_block_mxfp4, scratch=no_scratch)
quantize_nvfp4 = quantizer_for(_quant.nvfp4, block=quantize_block_nvfp4, scratch=no_scratch)


# ---- decoders and dequantizers ---------------------------------------------------------------

@kernel
def mxfp4_decode_records(records, e, q):
    """Scale bytes ``e`` [G] and element codes ``q`` [G, 32] (0..15, element order)."""
    half = MX_BLOCK // 2
    for b in range(records.shape[0]):
        e[b] = records[b, MX_E_AT]
        for j in range(half):
            byte = records[b, MX_QS_AT + j]
            q[b, j] = byte & _LOW4
            q[b, j + half] = byte >> np.uint8(4)


@kernel
def nvfp4_decode_records(records, d, q):
    """Sub-block scale bytes ``d`` [G, 4] and element codes ``q`` [G, 64] (element order)."""
    half = NV_SUB // 2
    for b in range(records.shape[0]):
        for s in range(NV_NSUB):
            d[b, s] = records[b, NV_D_AT + s]
            for j in range(half):
                byte = records[b, NV_QS_AT + s * half + j]
                q[b, s * NV_SUB + j] = byte & _LOW4
                q[b, s * NV_SUB + half + j] = byte >> np.uint8(4)


@kernel
def dequantize_mxfp4(records, out):
    """ggml's ``dequantize_row_mxfp4``: ``y = R32(f32(k(c)) * h(e))``."""
    half = MX_BLOCK // 2
    for b in range(records.shape[0]):
        d = E8M0_HALF[records[b, MX_E_AT]]
        for j in range(half):
            byte = records[b, MX_QS_AT + j]
            out[b, j] = np.float32(KVALUES_F32[byte & _LOW4] * d)
            out[b, j + half] = np.float32(KVALUES_F32[byte >> np.uint8(4)] * d)


@kernel
def dequantize_nvfp4(records, out):
    """ggml's ``dequantize_row_nvfp4``: ``y = R32(f32(k(c)) * u(d[s]))`` (exact)."""
    half = NV_SUB // 2
    for b in range(records.shape[0]):
        for s in range(NV_NSUB):
            d = UE4M3_HALF[records[b, NV_D_AT + s]]
            for j in range(half):
                byte = records[b, NV_QS_AT + s * half + j]
                out[b, s * NV_SUB + j] = np.float32(KVALUES_F32[byte & _LOW4] * d)
                out[b, s * NV_SUB + half + j] = np.float32(KVALUES_F32[byte >> np.uint8(4)] * d)


# ---- dots against Q8_0 ------------------------------------------------------------------------

@kernel
def record_sums_mxfp4_q8_0(w, bw, x, bx):
    """``S`` of MXFP4 record ``w[bw]`` and Q8_0 record ``x[bx]`` (exact int32)."""
    half = MX_BLOCK // 2
    s = np.int32(0)
    for j in range(half):
        byte = w[bw, MX_QS_AT + j]
        s += np.int32(KVALUES[byte & _LOW4]) * np.int32(np.int8(x[bx, Y_QS_AT + j]))
        s += np.int32(KVALUES[byte >> np.uint8(4)]) * np.int32(np.int8(x[bx, Y_QS_AT + half + j]))
    return s


@kernel
def record_value_mxfp4_q8_0(w, bw, x, bx):
    """``v_b = R32(R32(f32(d_y) * h(e)) * f32(S))``."""
    s = record_sums_mxfp4_q8_0(w, bw, x, bx)
    dy = f16_to_f32(np.uint16(x[bx, Y_D_AT]) | (np.uint16(x[bx, Y_D_AT + 1]) << np.uint16(8)))
    t = np.float32(dy * E8M0_HALF[w[bw, MX_E_AT]])       # t = R32(f32(d_y) * h(e))
    return np.float32(t * np.float32(s))                  # v = R32(t * f32(S))


@kernel
def record_sums_nvfp4_q8_0(w, bw, s_idx, x, bx):
    """``S`` of sub-block ``s_idx`` of NVFP4 record ``w[bw]`` and the Q8_0 record ``x[bx]``
    (= y record 2*bw + s_idx // 2 of the row), lanes ``16 * (s_idx % 2)`` on (exact int32)."""
    half = NV_SUB // 2
    o = Y_QS_AT + NV_SUB * (s_idx % 2)
    s = np.int32(0)
    for j in range(half):
        byte = w[bw, NV_QS_AT + s_idx * half + j]
        s += np.int32(KVALUES[byte & _LOW4]) * np.int32(np.int8(x[bx, o + j]))
        s += np.int32(KVALUES[byte >> np.uint8(4)]) * np.int32(np.int8(x[bx, o + half + j]))
    return s


@kernel
def subblock_value_nvfp4_q8_0(w, bw, s_idx, x, bx):
    """``v_bs = R32(R32(f32(d_y) * u(d_s)) * f32(S_bs))`` with ``x[bx]`` the Q8_0 record
    ``2*bw + s_idx // 2``."""
    s = record_sums_nvfp4_q8_0(w, bw, s_idx, x, bx)
    dy = f16_to_f32(np.uint16(x[bx, Y_D_AT]) | (np.uint16(x[bx, Y_D_AT + 1]) << np.uint16(8)))
    t = np.float32(dy * UE4M3_HALF[w[bw, NV_D_AT + s_idx]])  # t = R32(f32(d_y) * u(d_s))
    return np.float32(t * np.float32(s))                       # v = R32(t * f32(S))


@kernel
def dot_mxfp4_q8_0(w, x):
    """Canonical dot of MXFP4 records ``w`` ``[G, 17]`` and Q8_0 records ``x`` ``[G, 34]``:
    left fold seeded with ``v_0``; ``G = 0`` gives ``+0.0``."""
    acc = np.float32(0.0)
    for b in range(w.shape[0]):
        v = record_value_mxfp4_q8_0(w, b, x, b)
        acc = v if b == 0 else np.float32(acc + v)
    return acc


@kernel
def dot_nvfp4_q8_0(w, x):
    """Canonical dot of NVFP4 records ``w`` ``[G, 36]`` and Q8_0 records ``x`` ``[2G, 34]``:
    left fold over the 4G sub-block terms seeded with the first; ``G = 0`` gives ``+0.0``."""
    acc = np.float32(0.0)
    for b in range(w.shape[0]):
        for s in range(NV_NSUB):
            v = subblock_value_nvfp4_q8_0(w, b, s, x, 2 * b + s // 2)
            acc = v if (b == 0 and s == 0) else np.float32(acc + v)
    return acc


# ---- products: portable loops (the definition; the tests' reference: the driver with the row
# dot alone, below) and the SIMD tiles (simd/mxrec.py) ------------------------------------------

from numba_qk.formats.mxrec import mxfp4 as _MX_FMT, nvfp4 as _NV_FMT  # noqa: E402
from numba_qk.kernels.drive import gemv as drive_gemv, kernels_for, no_records, register, tile_loop_start, tile_loop_store  # noqa: E402
from numba_qk.kernels.simd.base import HAVE_AVX2, load_f16_fpext, prefetch_lines  # noqa: E402  (after the tables)
# (numba's own cache key is this file only; _jit.DependencyCache adds _simd_mxrec.py's source
# and every other kernel-layer module this one imports, so IR edits there recompile these.)

if HAVE_AVX2:
    from numba_qk.kernels.simd.mxrec import XT_ROWS, mxfp4_acts_x8_t, mxfp4_q8_0_s, mxfp4_rows_x8_t, nvfp4_acts_x8_t, nvfp4_rows_x8_t
else:
    XT_ROWS = 11


@kernel
def _dot_mxfp4_simd(w, x):
    """dot_mxfp4_q8_0 with S from the SIMD decoder (contiguous record bytes)."""
    if w.strides[1] != 1 or x.strides[1] != 1:
        return dot_mxfp4_q8_0(w, x)
    acc = np.float32(0.0)
    for b in range(w.shape[0]):
        xo = b * x.strides[0]
        s = mxfp4_q8_0_s(w, b * w.strides[0], x, xo)
        t = np.float32(load_f16_fpext(x, xo + Y_D_AT) * E8M0_HALF[w[b, MX_E_AT]])  # R32(d_y*h)
        v = np.float32(t * np.float32(s))                                          # R32(t*f32(S))
        acc = v if b == 0 else np.float32(acc + v)
    return acc


@kernel
def _q8_0_prep(x, dyf, half_sums):
    """Per Q8_0 record i of ``x`` (contiguous bytes): ``dyf[i]`` = f32(d_y) (exact widening) and
    ``half_sums[i, h]`` = the sum of its quants ``16h .. 16h + 16`` (exact int32), for the
    transposed gemv tiles (computed once per call, not once per tile)."""
    xs0 = x.strides[0]
    for i in range(x.shape[0]):
        dyf[i] = load_f16_fpext(x, i * xs0 + Y_D_AT)
        for h in range(2):
            s = np.int32(0)
            for j in range(NV_SUB):
                s += np.int32(np.int8(x[i, Y_QS_AT + NV_SUB * h + j]))
            half_sums[i, h] = s


@inline_kernel
def _mxfp4_prep(x):
    """Per-call tables of the MXFP4 gemv tile: f32(d_y) and ``-12 *`` the quant sum of every
    Q8_0 record of ``x``."""
    g = x.shape[0]
    dyf = np.empty(g, np.float32)
    hs = np.empty((g, 2), np.int32)
    _q8_0_prep(x, dyf, hs)
    corr = np.empty(g, np.int32)
    for b in range(g):
        corr[b] = np.int32(-12) * (hs[b, 0] + hs[b, 1])
    return dyf, corr


if HAVE_AVX2:
    @inline_kernel
    def _mxfp4_rows(w, w_off, x, x_off, w_step, acc, first, state, b):
        """The driver's gemv tile: 8 rows in the transposed layout
        (``simd.mxrec.mxfp4_rows_x8_t``; lane k = row r + k, no horizontal sums)."""
        dyf, corr = state
        mxfp4_rows_x8_t(w, w_off, w_step, x, x_off, corr[b], dyf[b], acc, first)

else:
    _mxfp4_rows = None


# MXFP4 gemv: the shared driver (kernels/drive.py: 8-row tiles with prefetch, leftover rows by
# the row dot) over the transposed tile above, with its per-call tables (``prep``).  NVFP4
# keeps its own copy of that loop (below): through the driver (tables as a prep tuple, two Q8_0
# records per record) its tile loop ran 6% slower, measured in several layouts, not found why.  gemm keeps
# its own loop below: the activations are transposed once per call (all of them, not one tile's
# records at a time) and each weight row passes over every activation group in turn.
_MX = _MX_FMT.ggml_type   # driver code (GGML type id)
register(_MX, loop_dot=_dot_mxfp4_simd if HAVE_AVX2 else dot_mxfp4_q8_0, rows_x8=_mxfp4_rows,
         prep=_mxfp4_prep)

# The portable gemv/gemm (``out[r] = dot(w[r], x)``, ``out[a, r] = dot(w[r], x[a])``, rows
# outer): the driver with the row dot alone, under driver codes of their own (1000 + GGML id).
register(1000 + _MX, loop_dot=dot_mxfp4_q8_0)
register(1000 + _NV_FMT.ggml_type, loop_dot=dot_nvfp4_q8_0)
_, gemv_mxfp4_q8_0_portable, gemm_mxfp4_q8_0_portable = kernels_for(1000 + _MX)
_, gemv_nvfp4_q8_0_portable, gemm_nvfp4_q8_0_portable = kernels_for(1000 + _NV_FMT.ggml_type)


@kernel
def _gemm_fp4_portable(nv, w, x, out):
    """``gemm_{mxfp4,nvfp4}_q8_0_portable`` (NVFP4 for ``nv``)."""
    literally(nv)
    if nv:
        gemm_nvfp4_q8_0_portable(w, x, out)
    else:
        gemm_mxfp4_q8_0_portable(w, x, out)


@kernel
def _gemv_nvfp4_t(w, x, out):
    """As ``_gemv_mxfp4_t`` for NVFP4 (``_simd_mxrec.nvfp4_rows_x8_t``)."""
    if w.strides[2] != 1 or x.strides[1] != 1:
        gemv_nvfp4_q8_0_portable(w, x, out)
        return
    rows, g = w.shape[0], w.shape[1]
    ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
    dyf = np.empty(x.shape[0], np.float32)
    hs = np.empty((x.shape[0], 2), np.int32)
    _q8_0_prep(x, dyf, hs)
    for i in range(x.shape[0]):
        for h in range(2):
            hs[i, h] = np.int32(-12) * hs[i, h]
    acc, ahead, per = tile_loop_start(w)
    r = 0
    while rows - r >= 8:
        for b in range(g):
            prefetch_lines(w, r * ws0 + ahead + b * per * 64, per, rows * ws0)
            i = 2 * b
            nvfp4_rows_x8_t(w, r * ws0 + b * ws1, ws0, x, i * xs0, xs0, hs[i, 0], hs[i, 1],
                            hs[i + 1, 0], hs[i + 1, 1], dyf[i], dyf[i + 1], acc, b == 0)
        r = tile_loop_store(out, r, acc)
    for rr in range(r, rows):
        out[rr] = dot_nvfp4_q8_0(w[rr], x)


@kernel
def _q8_0_transpose(x, groups, xt):
    """Activations ``x`` ``[batch, n, 34]`` (contiguous record bytes) in groups of 8 for the
    transposed gemm tiles: ``xt[grp, j, row, k]`` for activation ``8 * grp + k``, record j --
    rows 0..7 the little-endian i32 words of its quants, 8 and 9 ``-12 *`` the sums of quants
    0..15 and 16..31, 10 the bits of f32(d_y) (exact widening)."""
    xs0, xs1 = x.strides[0], x.strides[1]
    for grp in range(groups):
        for j in range(x.shape[1]):
            for k in range(8):
                a = 8 * grp + k
                for c in range(8):
                    at = Y_QS_AT + 4 * c
                    word = (np.uint32(x[a, j, at]) | (np.uint32(x[a, j, at + 1]) << np.uint32(8))
                            | (np.uint32(x[a, j, at + 2]) << np.uint32(16))
                            | (np.uint32(x[a, j, at + 3]) << np.uint32(24)))
                    xt[grp, j, c, k] = np.int32(word)
                for h in range(2):
                    sm = np.int32(0)
                    for i in range(NV_SUB):
                        sm += np.int32(np.int8(x[a, j, Y_QS_AT + NV_SUB * h + i]))
                    xt[grp, j, 8 + h, k] = np.int32(-12) * sm
                dy = load_f16_fpext(x, a * xs0 + j * xs1 + Y_D_AT)
                xt[grp, j, 10, k] = np.float32(dy).view(np.int32)


@kernel
def _gemm_fp4_t(nv, w, x, out):
    """Per weight row, groups of 8 activations in the transposed layout
    (``simd.mxrec.mxfp4_acts_x8_t`` / ``nvfp4_acts_x8_t`` for ``nv``, a literal; lane k =
    activation a0 + k); remainder activations by the row dot.  Not the driver's gemm: the
    activations are transposed once per call and each weight row stays in L1 while it passes
    every activation group."""
    literally(nv)
    if no_records(w.shape[1], out):
        return
    if w.strides[2] != 1 or x.strides[2] != 1:
        _gemm_fp4_portable(nv, w, x, out)
        return
    batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
    ws0, ws1 = w.strides[0], w.strides[1]
    nx = x.shape[1]                          # Q8_0 records per row: G (MXFP4), 2G (NVFP4)
    groups = batch // 8
    xt = np.empty((groups, nx, XT_ROWS, 8), np.int32)
    _q8_0_transpose(x, groups, xt)
    rec = XT_ROWS * 32                       # bytes per transposed record
    acc = np.zeros(8, np.float32)
    for r in range(rows):
        for grp in range(groups):
            for b in range(g):
                if nv:
                    nvfp4_acts_x8_t(w, r * ws0 + b * ws1, xt, (grp * nx + 2 * b) * rec, rec,
                                    acc, b == 0)
                else:
                    mxfp4_acts_x8_t(w, r * ws0 + b * ws1, xt, (grp * nx + b) * rec, acc,
                                    b == 0)
            for k in range(8):
                out[8 * grp + k, r] = acc[k]
        for a in range(8 * groups, batch):
            out[a, r] = dot_nvfp4_q8_0(w[r], x[a]) if nv else _dot_mxfp4_simd(w[r], x[a])


_dot_mx = _dot_mxfp4_simd if HAVE_AVX2 else dot_mxfp4_q8_0
_gemv_nv = _gemv_nvfp4_t if HAVE_AVX2 else gemv_nvfp4_q8_0_portable
_gemm_fp4 = _gemm_fp4_t if HAVE_AVX2 else _gemm_fp4_portable


@kernel
def dot_mxfp4_q8_0_fast(w, x):
    """``dot_mxfp4_q8_0`` through the SIMD decoder where available (bit-identical)."""
    return _dot_mx(w, x)


@kernel
def gemv_mxfp4_q8_0(w, x, out):
    """``out[r] = dot_mxfp4_q8_0(w[r], x)``: weights ``[rows, G, 17]``, x ``[G, 34]``."""
    drive_gemv(_MX, w, x, out)


@kernel
def gemm_mxfp4_q8_0(w, x, out):
    """``out[a, r] = dot_mxfp4_q8_0(w[r], x[a])``: x ``[batch, G, 34]``."""
    _gemm_fp4(False, w, x, out)


@kernel
def gemv_nvfp4_q8_0(w, x, out):
    """``out[r] = dot_nvfp4_q8_0(w[r], x)``: weights ``[rows, G, 36]``, x ``[2G, 34]``."""
    if no_records(w.shape[1], out):
        return
    _gemv_nv(w, x, out)


@kernel
def gemm_nvfp4_q8_0(w, x, out):
    """``out[a, r] = dot_nvfp4_q8_0(w[r], x[a])``: x ``[batch, 2G, 34]``."""
    _gemm_fp4(True, w, x, out)


# ---- the registry's declaration of this module's formats (numba_qk/kernels/traits.py) ---------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402


def _traits(fmt, scale, value, dequantize, decode, quantize, dot, gemv, gemm):
    """An FP4 format's declaration: fields ``(scale, q)`` (both filled as uint8), ``value`` the
    element's formula, ggml's reference quantizer."""
    return Traits(format=fmt, dequantize=dequantize, decode=decode,
                  decoded=Decoded(f"{fmt.name}Fields", (scale, "q"), ((scale, "u1"), ("q", "u1")),
                                  f"Decoded fields of ``G`` ggml {fmt.name} records "
                                  f"(``x = {value}``)."),
                  quantize=quantize, domain="finite",
                  quantizer=f"ggml quantize_row_{fmt.name.lower()}_ref", find_invalid=None,
                  dot=dot, gemv=gemv, gemm=gemm, oracle="numba_qk.testing.reference.mxrec")


TRAITS = (
    _traits(_quant.mxfp4, "e", "kvalues_fp4[q] * 2^(e - 128)", dequantize_mxfp4,
            mxfp4_decode_records, quantize_mxfp4, dot_mxfp4_q8_0_fast, gemv_mxfp4_q8_0,
            gemm_mxfp4_q8_0),
    _traits(_quant.nvfp4, "d", "kvalues_fp4[q] * ue4m3(d[i // 16]) / 2", dequantize_nvfp4,
            nvfp4_decode_records, quantize_nvfp4, dot_nvfp4_q8_0, gemv_nvfp4_q8_0,
            gemm_nvfp4_q8_0),
)
