"""Slow, readable oracle for ggml's IQ4_NL / IQ4_XS records and their dots with Q8_0 / Q8_K.

Written from ggml's C text (``ggml-common.h``: ``block_iq4_nl``, ``block_iq4_xs``,
``kvalues_iq4nl``; ``ggml-quants.c``: ``dequantize_row_iq4_nl`` / ``_iq4_xs``,
``best_index_int8``, ``quantize_row_iq4_nl_impl`` as ``quantize_iq4_nl`` / ``quantize_iq4_xs``
call it from ``ggml_quantize_chunk``: ``ntry = 7``, no importance matrix) and numba_qk's
canonical dot numerics (docs/numerics.md, "IQ4_NL, IQ4_XS").  It shares no code with the
kernels: records are plain ``bytes``, integers Python ints, every f32 step one numpy float32
scalar operation.
"""

from __future__ import annotations

import struct

import numpy as np

from .core import left_fold

F = np.float32
# ggml-common.h kvalues_iq4nl
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
GROUP_MAX_EPS = F(1e-15)


def _f16(rec: bytes, at: int) -> np.float32:
    return F(np.frombuffer(rec[at:at + 2], "<f2")[0])


def _f16_bytes(x) -> bytes:
    return np.array(F(x), np.float32).astype("<f2").tobytes()


def _codes(qs: bytes) -> list:
    """32 codes from 16 bytes: low nibbles are elements 0..15, high nibbles 16..31."""
    return [b & 15 for b in qs] + [b >> 4 for b in qs]


def iq4_xs_ls(rec: bytes, s: int) -> int:
    """The 6-bit scale of sub-block s: low 4 bits from scales_l, high 2 from scales_h."""
    h = rec[2] | (rec[3] << 8)
    return ((rec[4 + s // 2] >> (4 * (s % 2))) & 15) | (((h >> (2 * s)) & 3) << 4)


def dequantize_iq4_nl(rec: bytes) -> list:
    d = _f16(rec, 0)
    return [F(d * F(KVALUES[c])) for c in _codes(rec[2:18])]


def dequantize_iq4_xs(rec: bytes) -> list:
    d = _f16(rec, 0)
    out = []
    for s in range(8):
        dl = F(d * F(iq4_xs_ls(rec, s) - 32))
        out += [F(dl * F(KVALUES[c])) for c in _codes(rec[8 + 16 * s:24 + 16 * s])]
    return out


def dot_iq4_nl_q8_0(w_records, x_records) -> np.float32:
    """S_b exact; v_b = R32(d_x * R32(f32(d) * f32(S_b))); left fold seeded with v_0."""
    vals = []
    for w, x in zip(w_records, x_records):
        w, x = bytes(w), bytes(x)
        q = struct.unpack("<32b", x[2:34])
        s = sum(KVALUES[c] * qi for c, qi in zip(_codes(w[2:18]), q))
        vals.append(F(_f16(x, 0) * F(_f16(w, 0) * F(s))))
    return left_fold(vals)


def dot_iq4_xs_q8_k(w_records, x_records) -> np.float32:
    """S_b = sum_s (ls_s - 32) * S_bs exact; v_b = R32(ds * R32(f32(d) * f32(S_b)))."""
    vals = []
    for w, x in zip(w_records, x_records):
        w, x = bytes(w), bytes(x)
        ds = F(np.frombuffer(x[0:4], "<f4")[0])
        q = struct.unpack("<256b", x[4:260])
        s = 0
        for sb in range(8):
            codes = _codes(w[8 + 16 * sb:24 + 16 * sb])
            s += (iq4_xs_ls(w, sb) - 32) * sum(KVALUES[c] * qi
                                               for c, qi in zip(codes, q[32 * sb:32 * sb + 32]))
        vals.append(F(ds * F(_f16(w, 0) * F(s))))
    return left_fold(vals)


def best_index_int8(x) -> int:
    """ggml's best_index_int8(16, kvalues_iq4nl, x)."""
    val = KVALUES
    if x <= val[0]:
        return 0
    if x >= val[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < val[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if F(x - F(val[mu - 1])) < F(F(val[mu]) - x) else mu


def _impl(x, super_block_size: int, ntry: int = 7):
    """quantize_row_iq4_nl_impl without quant_weights: (d as f32 for fp16, codes, scales_h,
    scales_l)."""
    block_size = 32
    x = [F(v) for v in x]
    L = [0] * super_block_size
    scales = []
    max_scale, amax_scale = F(0.0), F(0.0)
    for ib in range(super_block_size // block_size):
        xb = x[ib * block_size:(ib + 1) * block_size]
        weight = [F(v * v) for v in xb]
        amax, mx = F(0.0), F(0.0)
        for v in xb:
            if abs(v) > amax:
                amax, mx = abs(v), v
        if amax < GROUP_MAX_EPS:
            scales.append(F(0.0))
            continue
        d = F(-mx / F(KVALUES[0])) if ntry > 0 else F(mx / F(KVALUES[0]))
        idv = F(F(1.0) / d)
        sumqx = sumq2 = F(0.0)
        for j, v in enumerate(xb):
            l = best_index_int8(F(idv * v))
            L[ib * block_size + j] = l
            q = F(KVALUES[l])
            sumqx = F(sumqx + F(F(weight[j] * q) * v))
            sumq2 = F(sumq2 + F(F(weight[j] * q) * q))
        d = F(sumqx / sumq2)
        best = F(d * sumqx)
        for itry in range(-ntry, ntry + 1):
            idv = F(F(itry + KVALUES[0]) / mx)
            sumqx = sumq2 = F(0.0)
            for j, v in enumerate(xb):
                q = F(KVALUES[best_index_int8(F(idv * v))])
                sumqx = F(sumqx + F(F(weight[j] * q) * v))
                sumq2 = F(sumq2 + F(F(weight[j] * q) * q))
            if sumq2 > 0 and F(sumqx * sumqx) > F(best * sumq2):
                d = F(sumqx / sumq2)
                best = F(d * sumqx)
        scales.append(d)
        if abs(d) > amax_scale:
            amax_scale, max_scale = abs(d), d
    scales_h, scales_l = 0, [0, 0, 0, 0]
    if super_block_size > block_size:
        d = F(-max_scale / F(32.0))
        dh = d
        idv = F(F(1.0) / d) if d != 0 else F(0.0)
        for ib in range(super_block_size // block_size):
            f = F(idv * scales[ib])
            l = nearest_int(f)
            l = max(-32, min(31, l))
            dl = F(d * F(l))
            idl = F(F(1.0) / dl) if dl != 0 else F(0.0)
            for j in range(block_size):
                L[ib * block_size + j] = best_index_int8(F(idl * x[ib * block_size + j]))
            l += 32
            scales_l[ib // 2] |= (l & 15) << (4 * (ib % 2))
            scales_h |= (l >> 4) << (2 * ib)
    else:
        dh = scales[0]
        idv = F(F(1.0) / scales[0]) if scales[0] != 0 else F(0.0)
        L = [best_index_int8(F(idv * v)) for v in x]
    qs = bytes(L[32 * i + j] | (L[32 * i + 16 + j] << 4)
               for i in range(super_block_size // 32) for j in range(16))
    return dh, qs, scales_h, scales_l


def nearest_int(f) -> int:
    """ggml's nearest_int: the low 23 bits of R32(f + 12582912) less 0x400000."""
    i = int(np.array(F(F(f) + F(12582912.0)), np.float32).view(np.int32))
    return (i & 0x007FFFFF) - 0x00400000


def _check_finite(values):
    if not all(np.isfinite(F(v)) for v in values):
        raise ValueError("non-finite value: outside the quantizer's domain")


def quantize_iq4_nl(values) -> bytes:
    """One IQ4_NL record (ggml_quantize_chunk, no imatrix)."""
    _check_finite(values)
    dh, qs, _, _ = _impl(values, 32)
    return _f16_bytes(dh) + qs


def quantize_iq4_xs(values) -> bytes:
    """One IQ4_XS record (ggml_quantize_chunk, no imatrix)."""
    _check_finite(values)
    dh, qs, sh, sl = _impl(values, 256)
    return _f16_bytes(dh) + struct.pack("<H", sh) + bytes(sl) + qs


# ---- the grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M ---------------------
# Written from ggml-quants.c's dequantize_row_iq2_xxs ... dequantize_row_iq1_m (block layouts of
# ggml-common.h) and docs/numerics_iq_grid.md.  The grid and sign tables are ggml's data, read
# from numba_qk.formats.iq_grids (plain tuples; checked against ggml by tests/iq).  Each format
# is first turned into its groups: (scale factor f, sign mask, grid bytes, delta) per 8 elements,
# with f = (2 ls + 1) and a power-of-two constant c per format (x = d * c * f * q).

from numba_qk.formats import iq_grids as _G  # noqa: E402  (data only)


def _grid_bytes(table, i, n):
    return [(table[i] >> (8 * j)) & 0xFF for j in range(n)]


def _u16(rec, at):
    return rec[at] | (rec[at + 1] << 8)


def _u32(rec, at):
    return _u16(rec, at) | (_u16(rec, at + 2) << 16)


def _signed(grid, signs):
    """+-grid values from 8 sign bits (bit j: element j negative)."""
    return [-g if (signs >> j) & 1 else g for j, g in enumerate(grid)]


def grid_groups(name: str, rec: bytes):
    """``(d, c, [(ls, q[8]) for the 32 groups of 8])``: x = d * c * (2 ls + 1) * q, q the
    signed integer multiplier (IQ1: 8 grid +- 1)."""
    rec = bytes(rec)
    out = []
    if name == "IQ1_M":
        sc = [_u16(rec, 48 + 2 * t) for t in range(4)]
        bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
        d = F(np.array(bits, np.uint16).view(np.float16))
    else:
        d = _f16(rec, 0)
    for s in range(8):
        for l in range(4):
            if name == "IQ2_XXS":
                aux = _u32(rec, 2 + 8 * s + 4)
                ls = aux >> 28
                q = _signed(_grid_bytes(_G.IQ2XXS_GRID, rec[2 + 8 * s + l], 8),
                            _G.KSIGNS_IQ2XS[(aux >> (7 * l)) & 127])
            elif name == "IQ2_XS":
                v = _u16(rec, 2 + 8 * s + 2 * l)
                ls = (rec[66 + s] >> (4 * (l // 2))) & 15
                q = _signed(_grid_bytes(_G.IQ2XS_GRID, v & 511, 8), _G.KSIGNS_IQ2XS[v >> 9])
            elif name == "IQ2_S":
                idx = rec[2 + 4 * s + l] | ((rec[66 + s] << (8 - 2 * l)) & 0x300)
                ls = (rec[74 + s] >> (4 * (l // 2))) & 15
                q = _signed(_grid_bytes(_G.IQ2S_GRID, idx, 8), rec[34 + 4 * s + l])
            elif name == "IQ3_XXS":
                aux = _u32(rec, 66 + 4 * s)
                ls = aux >> 28
                grid = (_grid_bytes(_G.IQ3XXS_GRID, rec[2 + 8 * s + 2 * l], 4)
                        + _grid_bytes(_G.IQ3XXS_GRID, rec[2 + 8 * s + 2 * l + 1], 4))
                q = _signed(grid, _G.KSIGNS_IQ2XS[(aux >> (7 * l)) & 127])
            elif name == "IQ3_S":
                qh = rec[66 + s]
                i1 = rec[2 + 8 * s + 2 * l] | ((qh << (8 - 2 * l)) & 256)
                i2 = rec[2 + 8 * s + 2 * l + 1] | ((qh << (7 - 2 * l)) & 256)
                ls = (rec[106 + s // 2] >> (4 * (s % 2))) & 15
                q = _signed(_grid_bytes(_G.IQ3S_GRID, i1, 4) + _grid_bytes(_G.IQ3S_GRID, i2, 4),
                            rec[74 + 4 * s + l])
            elif name == "IQ1_S":
                qh = _u16(rec, 34 + 2 * s)
                ls = (qh >> 12) & 7
                delta = -1 if qh & 0x8000 else 1
                idx = rec[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)
                q = [8 * (g - 256 if g > 127 else g) + delta
                     for g in _grid_bytes(_G.IQ1S_GRID, idx, 8)]
            elif name == "IQ1_M":
                qh = rec[32 + 2 * s + l // 2] >> (4 * (l % 2))
                ls = (_u16(rec, 48 + 2 * (s // 2)) >> (6 * (s % 2) + 3 * (l // 2))) & 7
                delta = -1 if qh & 8 else 1
                idx = rec[4 * s + l] | ((qh & 7) << 8)
                q = [8 * (g - 256 if g > 127 else g) + delta
                     for g in _grid_bytes(_G.IQ1S_GRID, idx, 8)]
            else:
                raise KeyError(name)
            out.append((ls, q))
    c = {"IQ3_XXS": F(0.25), "IQ3_S": F(1.0)}.get(name, F(0.125))
    return d, c, out


def dequantize_grid(name: str, rec: bytes) -> list:
    """ggml's ``dequantize_row_<name>`` of one record, step by step in C order."""
    d, _, groups = grid_groups(name, rec)
    out = []
    for ls, q in groups:
        if name in ("IQ1_S", "IQ1_M"):
            dl = F(d * F(2 * ls + 1))
            for qi in q:                       # q = 8 grid + delta, delta = +-1
                delta = 1 if qi % 8 == 1 else -1
                grid = (qi - delta) // 8
                out.append(F(dl * F(F(grid) + F(delta * 0.125))))
            continue
        if name == "IQ3_S":
            db = F(d * F(1 + 2 * ls))
        elif name == "IQ3_XXS":
            db = F(F(d * F(F(0.5) + F(ls))) * F(0.5))
        else:
            db = F(F(d * F(F(0.5) + F(ls))) * F(0.25))
        out += [-F(db * F(abs(qi))) if qi < 0 else F(db * F(qi)) for qi in q]
    return out


def dot_grid(name: str, w_records, x_records) -> np.float32:
    """S_b = sum_groups (2 ls + 1) * sum_i q_i * q8_i exact; v_b = R32(ds * R32(R32(d * c) *
    f32(S_b))); left fold seeded with v_0."""
    vals = []
    for w, x in zip(w_records, x_records):
        d, c, groups = grid_groups(name, bytes(w))
        x = bytes(x)
        ds = F(np.frombuffer(x[0:4], "<f4")[0])
        q8 = struct.unpack("<256b", x[4:260])
        s = sum((2 * ls + 1) * sum(qi * q8[8 * g + j] for j, qi in enumerate(q))
                for g, (ls, q) in enumerate(groups))
        vals.append(F(ds * F(F(d * c) * F(s))))
    return left_fold(vals)
