"""Slow, readable oracle for ggml's MXFP4 / NVFP4 records and their dots with Q8_0.

Written from ggml's C text (``ggml-common.h`` block layouts and ``kvalues_fp4``,
``ggml-impl.h`` ``ggml_e8m0_to_fp32_half`` / ``ggml_ue4m3_to_fp32`` / ``ggml_fp32_to_ue4m3``,
``ggml-quants.c`` ``best_index_mxfp4`` / ``quantize_row_*_ref`` / ``dequantize_row_*``) and
numba_qk's canonical dot numerics (``numba_qk.kernels.fp4.mxrec`` docstring, docs/numerics.md).  It shares no
code with the kernels: every record is plain ``bytes``, integers are Python ints, and every f32
step is one numpy float32 scalar operation.  ``floorf(log2f(a))`` is taken here from the
double-precision ``math.log2`` rounded to f32 (a different route from the kernels' bit table).
"""

from __future__ import annotations

import math

import numpy as np

from .core import left_fold

F = np.float32
KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # ggml's kvalues_fp4


def e8m0_half(e: int) -> np.float32:
    """ggml_e8m0_to_fp32_half: 2^(e - 128) (e = 0 and 1 are f32 subnormals)."""
    return F(math.ldexp(1.0, e - 128))


def ue4m3_half(b: int) -> np.float32:
    """ggml_ue4m3_to_fp32: unsigned E4M3 (bias 7) halved; 0x00 and 0x7F are 0; bit 7 ignored."""
    if b == 0x00 or b == 0x7F:
        return F(0.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    raw = math.ldexp(man, -9) if exp == 0 else (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return F(raw * 0.5)


def fp32_to_ue4m3(x: np.float32) -> int:
    """ggml_fp32_to_ue4m3, step by step."""
    x = F(x)
    if not (x > 0):
        return 0
    if x > F(448.0):
        x = F(448.0)
    bits = int(np.array(x, np.float32).view(np.uint32))
    fp32_exp = ((bits >> 23) & 0xFF) - 127
    fp32_man = (bits >> 20) & 0x7
    e = fp32_exp + 7
    if e <= 0:
        man = int(F(F(x * F(512.0)) + F(0.5)))  # C (int) truncates toward zero
        man = min(man, 7)
        return 0 if man < 1 else man
    if e >= 15:
        return 0x7E
    man = fp32_man + ((bits >> 19) & 1)
    if man > 7:
        man, e = 0, e + 1
        if e >= 15:
            return 0x7E
    return (e << 3) | man


def best_index(x: np.float32, d: np.float32) -> int:
    """ggml's best_index_mxfp4: all 16 table entries, f32 errors, strict < (first wins)."""
    with np.errstate(over="ignore"):
        best, best_err = 0, abs(F(F(KVALUES[0]) * d) - x)
        for i in range(1, 16):
            err = abs(F(F(KVALUES[i]) * d) - x)
            if err < best_err:
                best, best_err = i, err
    return best


def floor_log2f(a: np.float32) -> int:
    """floorf(log2f(a)) for a > 0: log2 in double, rounded once to f32, floored."""
    return math.floor(F(math.log2(float(a))))


def quantize_mxfp4(block) -> bytes:
    """quantize_row_mxfp4_ref for one block of 32 f32 values."""
    xs = [F(v) for v in block]
    amax = F(0.0)
    for v in xs:
        if amax < abs(v):
            amax = abs(v)
    e = (floor_log2f(amax) - 2 + 127) % 256 if amax > 0 else 0  # (uint8_t) wraps on x86
    d = e8m0_half(e)
    qs = [best_index(xs[j], d) | (best_index(xs[j + 16], d) << 4) for j in range(16)]
    return bytes([e, *qs])


def quantize_nvfp4(block) -> bytes:
    """quantize_row_nvfp4_ref for one block of 64 f32 values."""
    xs = [F(v) for v in block]
    scales, qs = [], []
    for s in range(4):
        sub = xs[16 * s:16 * s + 16]
        amax = F(0.0)
        for v in sub:
            if amax < abs(v):
                amax = abs(v)
        ue = fp32_to_ue4m3(F(amax / F(6.0)))
        scales.append(ue)
        d = ue4m3_half(ue)
        qs += [best_index(sub[j], d) | (best_index(sub[j + 8], d) << 4) for j in range(8)]
    return bytes(scales + qs)


def codes_mxfp4(rec: bytes) -> list[int]:
    """The 32 element codes of an MXFP4 record, in element order."""
    qs = rec[1:17]
    return [b & 15 for b in qs] + [b >> 4 for b in qs]


def codes_nvfp4(rec: bytes) -> list[int]:
    """The 64 element codes of an NVFP4 record, in element order."""
    out = []
    for s in range(4):
        qs = rec[4 + 8 * s:12 + 8 * s]
        out += [b & 15 for b in qs] + [b >> 4 for b in qs]
    return out


def dequantize_mxfp4(rec: bytes) -> list:
    d = e8m0_half(rec[0])
    with np.errstate(over="ignore"):
        return [F(F(KVALUES[c]) * d) for c in codes_mxfp4(rec)]


def dequantize_nvfp4(rec: bytes) -> list:
    codes = codes_nvfp4(rec)
    return [F(F(KVALUES[c]) * ue4m3_half(rec[i // 16])) for i, c in enumerate(codes)]


def _q8_0(rec: bytes):
    d = F(np.frombuffer(rec[0:2], "<f2")[0])
    q = [int(v) for v in np.frombuffer(rec[2:34], np.int8)]
    return d, q


def dot_mxfp4_q8_0(w, x) -> np.float32:
    """Canonical dot: v_b = R32(R32(d_y * 2^(e-128)) * f32(S_b)), left fold seeded with v_0."""
    terms = []
    with np.errstate(all="ignore"):
        for b in range(len(w)):
            rec, (dy, q) = bytes(w[b]), _q8_0(bytes(x[b]))
            s = sum(KVALUES[c] * q[i] for i, c in enumerate(codes_mxfp4(rec)))
            terms.append(F(F(dy * e8m0_half(rec[0])) * F(s)))
        return left_fold(terms)


def dot_nvfp4_q8_0(w, x) -> np.float32:
    """Canonical dot: one term per 16-value sub-block, v = R32(R32(d_y * u(d_s)) * f32(S)),
    all 4G terms folded left in order, seeded with the first."""
    terms = []
    with np.errstate(all="ignore"):
        for b in range(len(w)):
            rec = bytes(w[b])
            codes = codes_nvfp4(rec)
            for s in range(4):
                dy, q = _q8_0(bytes(x[2 * b + s // 2]))
                lanes = range(16 * (s % 2), 16 * (s % 2) + 16)
                total = sum(KVALUES[codes[16 * s + k]] * q[i] for k, i in enumerate(lanes))
                terms.append(F(F(dy * ue4m3_half(rec[s])) * F(total)))
        return left_fold(terms)
