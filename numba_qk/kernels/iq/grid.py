"""ggml's grid IQ record formats IQ2_XXS (16), IQ2_XS (17), IQ3_XXS (18), IQ1_S (19), IQ3_S (21),
IQ2_S (22), IQ1_M (29): decoders, ggml's dequantizers bit for bit, and exact dots against Q8_K.
All ``@njit``; callable from user ``@njit`` code.  Layouts: ``numba_qk.formats.iq``; the grid
and sign tables: ``numba_qk.formats.iq_grids`` (ggml's data).

Every element is ``x = d * c * (2 ls + 1) * q`` with ``q`` an integer: ``q = +-grid`` for the
IQ2/IQ3 formats, ``q = 8 grid +- 1`` for IQ1 (``grid + delta``, ``delta = +-1/8``), ``c = 1/8``
(IQ2_*, IQ1_*), ``1/4`` (IQ3_XXS), ``1`` (IQ3_S).

Dequantize (ggml ``dequantize_row_<t>``; every float step one f32 rounding, C order)::

    IQ2_*:    db = R32(R32(f32(d) * f32(0.5 + ls)) * 0.25);  y = +-R32(db * f32(grid))
    IQ3_XXS:  db = R32(R32(f32(d) * f32(0.5 + ls)) * 0.5);   y = +-R32(db * f32(grid))
    IQ3_S:    db = R32(f32(d) * f32(1 + 2 ls));              y = +-R32(db * f32(grid))
    IQ1_*:    dl = R32(f32(d) * f32(2 ls + 1));              y = R32(dl * (f32(grid) +- 0.125))

Dots with Q8_K (``ds``, ``q8``), docs/numerics_iq_grid.md; exact integer sums, one f32 rounding
per named step, the left fold seeded with v_0 (``G = 0`` gives ``+0.0``)::

    S_b = sum_u (2 ls_u + 1) * sum_{i in u} q_i * q8_i       exact int32 (u: the scale's span)
    v_b = R32(ds * R32(R32(f32(d) * c) * f32(S_b)))          (R32(f32(d) * c) is exact)
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.formats import iq as _iq
from numba_qk.formats import iq_grids as _g
from numba_qk.kernels._bits import f16_to_f32
from numba_qk.kernels.drive import kernels_for, panel_gemm, register
from numba_qk.kernels.kquants.common import X_Q_AT, f16_at, portable_dot_for, x_ds
from numba_qk.kernels.simd import iq_grid as _simd

_XXS2, _XS2, _S2 = _iq.iq2_xxs, _iq.iq2_xs, _iq.iq2_s
_XXS3, _S3 = _iq.iq3_xxs, _iq.iq3_s
_S1, _M1 = _iq.iq1_s, _iq.iq1_m


def _bytes_of(table, n):
    """``[len(table), n]`` uint8: byte ``j`` of each entry (little-endian)."""
    t = np.array(table, np.uint64)
    return np.stack([(t >> np.uint64(8 * j)) & np.uint64(0xFF) for j in range(n)],
                    axis=1).astype(np.uint8)


KSIGNS = np.array(_g.KSIGNS_IQ2XS, np.uint8)
IQ2XXS = _bytes_of(_g.IQ2XXS_GRID, 8)
IQ2XS = _bytes_of(_g.IQ2XS_GRID, 8)
IQ2S = _bytes_of(_g.IQ2S_GRID, 8)
IQ3XXS = _bytes_of(_g.IQ3XXS_GRID, 4)
IQ3S = _bytes_of(_g.IQ3S_GRID, 4)
IQ1S = _bytes_of(_g.IQ1S_GRID, 8).view(np.int8)          # -1, 0, 1
IQ1S_Q = (np.int8(8) * IQ1S).astype(np.int8)              # 8 * grid (q = 8 grid +- 1)
IQ1S_F = IQ1S.astype(np.float32)
_DELTA = np.float32(_g.IQ1S_DELTA)
assert _g.IQ1S_DELTA == _g.IQ1M_DELTA == 0.125

_QS2 = 2        # IQ2_*, IQ3_*, IQ1_S: the grid bytes follow the f16 d
_XS2_SC = _XS2.field("ls").start
_S2_SIGNS, _S2_QH, _S2_SC = _S2.field("signs").start, _S2.field("qh").start, _S2.field("ls").start
_XXS3_AUX = _XXS3.field("signs").start
_S3_QH, _S3_SIGNS, _S3_SC = _S3.field("qh").start, _S3.field("signs").start, _S3.field("ls").start
_S1_QH = _S1.field("qh").start
_M1_QH, _M1_SC = _M1.field("qh").start, _M1.field("ls").start
_F_HALF, _F_QUARTER, _F_EIGHTH = np.float32(0.5), np.float32(0.25), np.float32(0.125)


# ---- field readers (record rec[b], int32 / int64 results) -------------------------------------

@kernel
def u16_at(rec, b, off):
    """Little-endian u16 at bytes ``rec[b, off:off+2]`` as int32."""
    return np.int32(rec[b, off]) | (np.int32(rec[b, off + 1]) << np.int32(8))


@kernel
def u32_at(rec, b, off):
    """Little-endian u32 at bytes ``rec[b, off:off+4]`` as int64."""
    return (np.int64(rec[b, off]) | (np.int64(rec[b, off + 1]) << 8)
            | (np.int64(rec[b, off + 2]) << 16) | (np.int64(rec[b, off + 3]) << 24))


@kernel
def nibble(rec, b, at, k):
    """Nibble ``k`` of the bytes from ``rec[b, at]`` (low nibble first), as int32."""
    return (np.int32(rec[b, at + k // 2]) >> np.int32(4 * (k % 2))) & np.int32(15)


# The 4-bit scale codes of IQ2_XS, IQ2_S (16, one per 16 elements) and IQ3_S (8, one per
# sub-block) are read as ``nibble(rec, b, <the format's ls field start>, k)``.

@kernel
def qh_index(rec, b, qh_at, n, bits, s, l):
    """Grid index of group ``l`` of sub-block ``s`` (``n`` groups a sub-block): byte
    ``rec[b, 2 + n * s + l]``, and as bits 8 and up bits ``bits * l .. bits * l + bits - 1`` of
    the sub-block's qh byte ``rec[b, qh_at + s]`` (IQ2_S: 4 groups, 2 bits; IQ3_S: 8, 1)."""
    return (np.int32(rec[b, _QS2 + n * s + l])
            | ((np.int32(rec[b, qh_at + s]) << np.int32(8 - bits * l))
               & np.int32(((1 << bits) - 1) << 8)))


@kernel
def iq2_s_index(rec, b, s, l):
    """10-bit iq2s_grid index of group ``l`` of sub-block ``s`` of an IQ2_S record."""
    return qh_index(rec, b, _S2_QH, 4, 2, s, l)


@kernel
def iq3_s_index(rec, b, s, h):
    """9-bit iq3s_grid index of half-group ``h`` (0..7) of sub-block ``s`` of an IQ3_S record."""
    return qh_index(rec, b, _S3_QH, 8, 1, s, h)


@kernel
def iq1_s_index(rec, b, s, l, qh):
    """11-bit iq1s_grid index of group ``l`` of sub-block ``s`` (``qh``: its u16)."""
    return (np.int32(rec[b, _QS2 + 4 * s + l])
            | (((qh >> np.int32(3 * l)) & np.int32(7)) << np.int32(8)))


@kernel
def iq1_m_d_bits(rec, b):
    """The f16 bits of an IQ1_M record's super-block scale (the scales' top nibbles)."""
    s0 = u16_at(rec, b, _M1_SC)
    s1 = u16_at(rec, b, _M1_SC + 2)
    s2 = u16_at(rec, b, _M1_SC + 4)
    s3 = u16_at(rec, b, _M1_SC + 6)
    return (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)


@kernel
def iq1_m_ls(rec, b, k):
    """3-bit scale ``k`` (0..15, one per 16 elements) of an IQ1_M record."""
    sc = u16_at(rec, b, _M1_SC + 2 * (k // 4))
    return (sc >> np.int32(3 * (k % 4))) & np.int32(7)


@kernel
def iq1_m_index(rec, b, s, l):
    """11-bit iq1s_grid index of group ``l`` of sub-block ``s`` of an IQ1_M record."""
    qh = np.int32(rec[b, _M1_QH + 2 * s + l // 2])
    return (np.int32(rec[b, 4 * s + l])
            | (((qh >> np.int32(4 * (l % 2))) & np.int32(7)) << np.int32(8)))


@kernel
def iq1_m_delta_neg(rec, b, s, l):
    """True where group ``l`` of sub-block ``s`` of an IQ1_M record has delta -1/8."""
    qh = np.int32(rec[b, _M1_QH + 2 * s + l // 2])
    return ((qh >> np.int32(3 + 4 * (l % 2))) & np.int32(1)) != 0


# ---- the signed integer element multipliers q (x = d * c * (2 ls + 1) * q) ----------------------

@kernel
def decode_groups(rec, b, fmt_code, q):
    """Fill ``q[b, :]`` (int8, x = d * c * (2 ls + 1) * q) of record ``rec[b]`` of the grid
    format whose GGML type id is ``fmt_code``."""
    if fmt_code == 16:      # IQ2_XXS
        for s in range(8):
            aux = u32_at(rec, b, _QS2 + 8 * s + 4)
            for l in range(4):
                sg = KSIGNS[(aux >> (7 * l)) & 127]
                idx = rec[b, _QS2 + 8 * s + l]
                for j in range(8):
                    g = np.int8(IQ2XXS[idx, j])
                    q[b, 32 * s + 8 * l + j] = -g if (sg >> j) & 1 else g
    elif fmt_code == 17:    # IQ2_XS
        for k in range(32):
            v = u16_at(rec, b, _QS2 + 2 * k)
            sg = KSIGNS[v >> 9]
            for j in range(8):
                g = np.int8(IQ2XS[v & 511, j])
                q[b, 8 * k + j] = -g if (sg >> j) & 1 else g
    elif fmt_code == 22:    # IQ2_S
        for s in range(8):
            for l in range(4):
                idx = iq2_s_index(rec, b, s, l)
                sg = rec[b, _S2_SIGNS + 4 * s + l]
                for j in range(8):
                    g = np.int8(IQ2S[idx, j])
                    q[b, 32 * s + 8 * l + j] = -g if (sg >> j) & 1 else g
    elif fmt_code == 18:    # IQ3_XXS
        for s in range(8):
            aux = u32_at(rec, b, _XXS3_AUX + 4 * s)
            for l in range(4):
                sg = KSIGNS[(aux >> (7 * l)) & 127]
                for h in range(2):
                    idx = rec[b, _QS2 + 8 * s + 2 * l + h]
                    for j in range(4):
                        g = np.int8(IQ3XXS[idx, j])
                        q[b, 32 * s + 8 * l + 4 * h + j] = -g if (sg >> (4 * h + j)) & 1 else g
    elif fmt_code == 21:    # IQ3_S
        for s in range(8):
            for l in range(4):
                sg = rec[b, _S3_SIGNS + 4 * s + l]
                for h in range(2):
                    idx = iq3_s_index(rec, b, s, 2 * l + h)
                    for j in range(4):
                        g = np.int8(IQ3S[idx, j])
                        q[b, 32 * s + 8 * l + 4 * h + j] = -g if (sg >> (4 * h + j)) & 1 else g
    elif fmt_code == 19:    # IQ1_S
        for s in range(8):
            qh = u16_at(rec, b, _S1_QH + 2 * s)
            dl = np.int8(-1) if qh & 0x8000 else np.int8(1)
            for l in range(4):
                idx = iq1_s_index(rec, b, s, l, qh)
                for j in range(8):
                    q[b, 32 * s + 8 * l + j] = np.int8(IQ1S_Q[idx, j] + dl)
    else:                   # IQ1_M
        for s in range(8):
            for l in range(4):
                idx = iq1_m_index(rec, b, s, l)
                dl = np.int8(-1) if iq1_m_delta_neg(rec, b, s, l) else np.int8(1)
                for j in range(8):
                    q[b, 32 * s + 8 * l + j] = np.int8(IQ1S_Q[idx, j] + dl)


@kernel
def ls_of(rec, b, fmt_code, k):
    """Scale code ``k`` of record ``rec[b]`` (per 32 elements: IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S;
    per 16: IQ2_XS, IQ2_S, IQ1_M)."""
    if fmt_code == 16:
        return np.int32(rec[b, _QS2 + 8 * k + 7] >> 4)
    if fmt_code == 17:
        return nibble(rec, b, _XS2_SC, k)
    if fmt_code == 22:
        return nibble(rec, b, _S2_SC, k)
    if fmt_code == 18:
        return np.int32(rec[b, _XXS3_AUX + 4 * k + 3] >> 4)
    if fmt_code == 21:
        return nibble(rec, b, _S3_SC, k)
    if fmt_code == 19:
        return (u16_at(rec, b, _S1_QH + 2 * k) >> 12) & 7
    return iq1_m_ls(rec, b, k)


def _decoder(fmt):
    code, n_ls = fmt.ggml_type, fmt.field("ls").count

    def decode(records, ls, q):
        for b in range(records.shape[0]):
            for k in range(n_ls):
                ls[b, k] = np.uint8(ls_of(records, b, code, k))
            decode_groups(records, b, code, q)
    decode.__doc__ = (f"Scale codes ``ls`` [G, {n_ls}] (uint8) and element multipliers ``q`` "
                      f"[G, 256] (int8) of {fmt.name} records.")
    return kernel(decode)


iq2_xxs_decode_records = _decoder(_XXS2)
iq2_xs_decode_records = _decoder(_XS2)
iq2_s_decode_records = _decoder(_S2)
iq3_xxs_decode_records = _decoder(_XXS3)
iq3_s_decode_records = _decoder(_S3)
iq1_s_decode_records = _decoder(_S1)


@kernel
def iq1_m_decode_records(records, d_bits, ls, q):
    """The f16 scale's bits ``d_bits`` [G] (uint16), scale codes ``ls`` [G, 16] and element
    multipliers ``q`` [G, 256] of IQ1_M records."""
    for b in range(records.shape[0]):
        d_bits[b] = np.uint16(iq1_m_d_bits(records, b))
        for k in range(16):
            ls[b, k] = np.uint8(iq1_m_ls(records, b, k))
        decode_groups(records, b, 29, q)


# ---- dequantizers (ggml dequantize_row_<t>) ----------------------------------------------------

@kernel
def db_iq2(d, ls):
    """``R32(R32(d * R32(0.5 + ls)) * 0.25)`` (IQ2_*)."""
    return np.float32(np.float32(d * np.float32(_F_HALF + np.float32(ls))) * _F_QUARTER)


@kernel
def put_group(out, b, at, db, grid, idx, sg, n):
    """``out[b, at + j] = +-R32(db * f32(grid[idx, j]))`` for j < n, minus where bit j of
    ``sg`` is set."""
    for j in range(n):
        v = np.float32(db * np.float32(grid[idx, j]))
        out[b, at + j] = -v if (sg >> j) & 1 else v


@kernel
def dequantize_iq2_xxs(records, out):
    """ggml's ``dequantize_row_iq2_xxs``: ``[G, 66]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for s in range(8):
            aux = u32_at(records, b, _QS2 + 8 * s + 4)
            db = db_iq2(d, aux >> 28)
            for l in range(4):
                sg = KSIGNS[(aux >> (7 * l)) & 127]
                put_group(out, b, 32 * s + 8 * l, db, IQ2XXS, records[b, _QS2 + 8 * s + l], sg, 8)


@kernel
def dequantize_iq2_xs(records, out):
    """ggml's ``dequantize_row_iq2_xs``: ``[G, 74]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for k in range(32):
            db = db_iq2(d, nibble(records, b, _XS2_SC, k // 2))
            v = u16_at(records, b, _QS2 + 2 * k)
            put_group(out, b, 8 * k, db, IQ2XS, v & 511, KSIGNS[v >> 9], 8)


@kernel
def dequantize_iq2_s(records, out):
    """ggml's ``dequantize_row_iq2_s``: ``[G, 82]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for s in range(8):
            for l in range(4):
                db = db_iq2(d, nibble(records, b, _S2_SC, 2 * s + l // 2))
                put_group(out, b, 32 * s + 8 * l, db, IQ2S, iq2_s_index(records, b, s, l),
                          records[b, _S2_SIGNS + 4 * s + l], 8)


@kernel
def dequantize_iq3_xxs(records, out):
    """ggml's ``dequantize_row_iq3_xxs``: ``[G, 98]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for s in range(8):
            aux = u32_at(records, b, _XXS3_AUX + 4 * s)
            db = np.float32(np.float32(d * np.float32(_F_HALF + np.float32(aux >> 28))) * _F_HALF)
            for l in range(4):
                sg = KSIGNS[(aux >> (7 * l)) & 127]
                for h in range(2):
                    put_group(out, b, 32 * s + 8 * l + 4 * h, db, IQ3XXS,
                              records[b, _QS2 + 8 * s + 2 * l + h], sg >> (4 * h), 4)


@kernel
def dequantize_iq3_s(records, out):
    """ggml's ``dequantize_row_iq3_s``: ``[G, 110]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for s in range(8):
            db = np.float32(d * np.float32(1 + 2 * nibble(records, b, _S3_SC, s)))
            for l in range(4):
                sg = records[b, _S3_SIGNS + 4 * s + l]
                for h in range(2):
                    put_group(out, b, 32 * s + 8 * l + 4 * h, db, IQ3S,
                              iq3_s_index(records, b, s, 2 * l + h), sg >> (4 * h), 4)


@kernel
def dequantize_iq1_s(records, out):
    """ggml's ``dequantize_row_iq1_s``: ``[G, 50]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_at(records, b, 0)
        for s in range(8):
            qh = u16_at(records, b, _S1_QH + 2 * s)
            dl = np.float32(d * np.float32(2 * ((qh >> 12) & 7) + 1))
            delta = -_DELTA if qh & 0x8000 else _DELTA
            for l in range(4):
                idx = iq1_s_index(records, b, s, l, qh)
                for j in range(8):
                    out[b, 32 * s + 8 * l + j] = np.float32(dl * np.float32(IQ1S_F[idx, j] + delta))


@kernel
def dequantize_iq1_m(records, out):
    """ggml's ``dequantize_row_iq1_m``: ``[G, 56]`` records into f32 ``out`` ``[G, 256]``."""
    for b in range(records.shape[0]):
        d = f16_to_f32(np.uint16(iq1_m_d_bits(records, b)))
        for s in range(8):
            for l in range(4):
                dl = np.float32(d * np.float32(2 * iq1_m_ls(records, b, 2 * s + l // 2) + 1))
                delta = -_DELTA if iq1_m_delta_neg(records, b, s, l) else _DELTA
                idx = iq1_m_index(records, b, s, l)
                for j in range(8):
                    out[b, 32 * s + 8 * l + j] = np.float32(dl * np.float32(IQ1S_F[idx, j] + delta))


# ---- record sums S_b against Q8_K (exact int32) and record values -----------------------------

@kernel
def signed_sum(grid, idx, sg, x, bx, at, n):
    """``sum_{j < n} (+-grid[idx, j]) * q8[at + j]`` (exact int32), minus where bit j of ``sg``
    is set."""
    t = np.int32(0)
    for j in range(n):
        p = np.int32(grid[idx, j]) * np.int32(np.int8(x[bx, at + j]))
        t += -p if (sg >> j) & 1 else p
    return t


@kernel
def iq1_sum8(idx, delta, x, bx, at):
    """``sum_j (8 grid[idx, j] + delta) * q8[at + j]`` over 8 elements (IQ1_S, IQ1_M)."""
    t = np.int32(0)
    for j in range(8):
        t += (np.int32(IQ1S_Q[idx, j]) + delta) * np.int32(np.int8(x[bx, at + j]))
    return t


@kernel
def record_sums_iq2_xxs_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        aux = u32_at(w, bw, _QS2 + 8 * s + 4)
        t = np.int32(0)
        for l in range(4):
            t += signed_sum(IQ2XXS, w[bw, _QS2 + 8 * s + l], KSIGNS[(aux >> (7 * l)) & 127],
                            x, bx, X_Q_AT + 32 * s + 8 * l, 8)
        total += np.int32(2 * (aux >> 28) + 1) * t
    return total


@kernel
def record_sums_iq2_xs_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for k in range(16):
        t = np.int32(0)
        for l in range(2):
            v = u16_at(w, bw, _QS2 + 4 * k + 2 * l)
            t += signed_sum(IQ2XS, v & 511, KSIGNS[v >> 9], x, bx, X_Q_AT + 16 * k + 8 * l, 8)
        total += (2 * nibble(w, bw, _XS2_SC, k) + np.int32(1)) * t
    return total


@kernel
def record_sums_iq2_s_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        for h in range(2):
            t = np.int32(0)
            for l in range(2 * h, 2 * h + 2):
                t += signed_sum(IQ2S, iq2_s_index(w, bw, s, l), w[bw, _S2_SIGNS + 4 * s + l],
                                x, bx, X_Q_AT + 32 * s + 8 * l, 8)
            total += (2 * nibble(w, bw, _S2_SC, 2 * s + h) + np.int32(1)) * t
    return total


@kernel
def record_sums_iq3_xxs_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        aux = u32_at(w, bw, _XXS3_AUX + 4 * s)
        t = np.int32(0)
        for l in range(4):
            sg = KSIGNS[(aux >> (7 * l)) & 127]
            at = X_Q_AT + 32 * s + 8 * l
            t += signed_sum(IQ3XXS, w[bw, _QS2 + 8 * s + 2 * l], sg, x, bx, at, 4)
            t += signed_sum(IQ3XXS, w[bw, _QS2 + 8 * s + 2 * l + 1], sg >> 4, x, bx, at + 4, 4)
        total += np.int32(2 * (aux >> 28) + 1) * t
    return total


@kernel
def record_sums_iq3_s_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        t = np.int32(0)
        for l in range(4):
            sg = w[bw, _S3_SIGNS + 4 * s + l]
            at = X_Q_AT + 32 * s + 8 * l
            t += signed_sum(IQ3S, iq3_s_index(w, bw, s, 2 * l), sg, x, bx, at, 4)
            t += signed_sum(IQ3S, iq3_s_index(w, bw, s, 2 * l + 1), sg >> 4, x, bx, at + 4, 4)
        total += (2 * nibble(w, bw, _S3_SC, s) + np.int32(1)) * t
    return total


@kernel
def record_sums_iq1_s_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        qh = u16_at(w, bw, _S1_QH + 2 * s)
        delta = np.int32(-1) if qh & 0x8000 else np.int32(1)
        t = np.int32(0)
        for l in range(4):
            t += iq1_sum8(iq1_s_index(w, bw, s, l, qh), delta, x, bx, X_Q_AT + 32 * s + 8 * l)
        total += (2 * ((qh >> 12) & 7) + np.int32(1)) * t
    return total


@kernel
def record_sums_iq1_m_q8_k(w, bw, x, bx):
    total = np.int32(0)
    for s in range(8):
        for h in range(2):
            t = np.int32(0)
            for l in range(2 * h, 2 * h + 2):
                delta = np.int32(-1) if iq1_m_delta_neg(w, bw, s, l) else np.int32(1)
                t += iq1_sum8(iq1_m_index(w, bw, s, l), delta, x, bx, X_Q_AT + 32 * s + 8 * l)
            total += (2 * iq1_m_ls(w, bw, 2 * s + h) + np.int32(1)) * t
    return total


@kernel
def record_value(d, c, s, x, bx):
    """``v = R32(ds * R32(R32(d * c) * f32(S)))`` (``R32(d * c)`` exact: c a power of two)."""
    p = np.float32(np.float32(d * c) * np.float32(s))
    return np.float32(x_ds(x, bx) * p)


@kernel
def record_value_iq2_xxs_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), _F_EIGHTH, record_sums_iq2_xxs_q8_k(w, bw, x, bx), x, bx)


@kernel
def record_value_iq2_xs_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), _F_EIGHTH, record_sums_iq2_xs_q8_k(w, bw, x, bx), x, bx)


@kernel
def record_value_iq2_s_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), _F_EIGHTH, record_sums_iq2_s_q8_k(w, bw, x, bx), x, bx)


@kernel
def record_value_iq3_xxs_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), _F_QUARTER, record_sums_iq3_xxs_q8_k(w, bw, x, bx),
                        x, bx)


@kernel
def record_value_iq3_s_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), np.float32(1.0), record_sums_iq3_s_q8_k(w, bw, x, bx),
                        x, bx)


@kernel
def record_value_iq1_s_q8_k(w, bw, x, bx):
    return record_value(f16_at(w, bw, 0), _F_EIGHTH, record_sums_iq1_s_q8_k(w, bw, x, bx), x, bx)


@kernel
def record_value_iq1_m_q8_k(w, bw, x, bx):
    d = f16_to_f32(np.uint16(iq1_m_d_bits(w, bw)))
    return record_value(d, _F_EIGHTH, record_sums_iq1_m_q8_k(w, bw, x, bx), x, bx)


# The portable row dots (left fold of the record values seeded with v_0, G = 0 gives +0.0) and
# dot / gemv / gemm from the shared driver (kernels/drive.py).
dot_iq2_xxs_q8_k_portable = portable_dot_for(_XXS2, value=record_value_iq2_xxs_q8_k)
dot_iq2_xs_q8_k_portable = portable_dot_for(_XS2, value=record_value_iq2_xs_q8_k)
dot_iq2_s_q8_k_portable = portable_dot_for(_S2, value=record_value_iq2_s_q8_k)
dot_iq3_xxs_q8_k_portable = portable_dot_for(_XXS3, value=record_value_iq3_xxs_q8_k)
dot_iq3_s_q8_k_portable = portable_dot_for(_S3, value=record_value_iq3_s_q8_k)
dot_iq1_s_q8_k_portable = portable_dot_for(_S1, value=record_value_iq1_s_q8_k)
dot_iq1_m_q8_k_portable = portable_dot_for(_M1, value=record_value_iq1_m_q8_k)

# The SIMD record values and 8-lane tiles (kernels/simd/iq_grid.py) equal these portable
# definitions bit for bit (tests/iq/test_iq_grid_fast.py); strided records take the portable
# dot, a kernel of this module (portable_dot_for: the driver caches the entry points under
# loop_dot's module, whose source digest must cover this module and the SIMD one).

for _fmt, _dot in ((_XXS2, dot_iq2_xxs_q8_k_portable), (_XS2, dot_iq2_xs_q8_k_portable),
                   (_S2, dot_iq2_s_q8_k_portable), (_XXS3, dot_iq3_xxs_q8_k_portable),
                   (_S3, dot_iq3_s_q8_k_portable), (_S1, dot_iq1_s_q8_k_portable),
                   (_M1, dot_iq1_m_q8_k_portable)):
    _t = _fmt.name.lower()
    # with the gemm microtiles (below) the driver's gemm only takes batches under
    # GEMM_TILE_MIN_BATCH (1, 2: gemv per activation) and strided records: no 8-activation tile
    register(_fmt.ggml_type, loop_dot=_dot, value=getattr(_simd, f"{_t}_q8_k_value"),
             rows_x8=getattr(_simd, f"{_t}_rows_x8", None),
             acts_x8=None if _simd.HAVE_GEMM_TILES else getattr(_simd, f"{_t}_acts_x8"))
del _fmt, _dot, _t
dot_iq2_xxs_q8_k, gemv_iq2_xxs_q8_k, gemm_iq2_xxs_q8_k = kernels_for(_XXS2.ggml_type)
dot_iq2_xs_q8_k, gemv_iq2_xs_q8_k, gemm_iq2_xs_q8_k = kernels_for(_XS2.ggml_type)
dot_iq2_s_q8_k, gemv_iq2_s_q8_k, gemm_iq2_s_q8_k = kernels_for(_S2.ggml_type)
dot_iq3_xxs_q8_k, gemv_iq3_xxs_q8_k, gemm_iq3_xxs_q8_k = kernels_for(_XXS3.ggml_type)
dot_iq3_s_q8_k, gemv_iq3_s_q8_k, gemm_iq3_s_q8_k = kernels_for(_S3.ggml_type)
dot_iq1_s_q8_k, gemv_iq1_s_q8_k, gemm_iq1_s_q8_k = kernels_for(_S1.ggml_type)
dot_iq1_m_q8_k, gemv_iq1_m_q8_k, gemm_iq1_m_q8_k = kernels_for(_M1.ggml_type)



# ---- gemm by decoded records (AVX-512 VNNI; simd/iq_grid.py "gemm by decoded records") ------

if _simd.HAVE_GEMM_TILES:
    def _tiled(fmt, fallback):
        t = fmt.name.lower()
        sub = _simd.FORMATS[t].sub
        mk = _simd.microtile_sub16 if sub == 16 else _simd.microtile_sub32
        return panel_gemm(getattr(_simd, f"{t}_decode"), mk, fallback)

    gemm_iq2_xxs_q8_k = _tiled(_XXS2, gemm_iq2_xxs_q8_k)
    gemm_iq2_xs_q8_k = _tiled(_XS2, gemm_iq2_xs_q8_k)
    gemm_iq2_s_q8_k = _tiled(_S2, gemm_iq2_s_q8_k)
    gemm_iq3_xxs_q8_k = _tiled(_XXS3, gemm_iq3_xxs_q8_k)
    gemm_iq3_s_q8_k = _tiled(_S3, gemm_iq3_s_q8_k)
    gemm_iq1_s_q8_k = _tiled(_S1, gemm_iq1_s_q8_k)
    gemm_iq1_m_q8_k = _tiled(_M1, gemm_iq1_m_q8_k)

# ---- the registry's declarations of this module's formats (numba_qk/kernels/traits.py) ----------
from numba_qk.kernels.traits import Decoded, Traits  # noqa: E402
from numba_qk.kernels.iq import iq3_encode as _iq3_encode  # noqa: E402
from numba_qk.kernels.iq import iq2_encode as _iq2_encode  # noqa: E402
from numba_qk.kernels.iq import iq1_encode as _iq1_encode  # noqa: E402

_DECODED_DOC = ("Decoded fields of ``G`` ggml grid IQ records (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, "
                "IQ3_S, IQ1_S, IQ1_M): ``d`` the f16 super-block scale [G], ``ls`` the scale "
                "codes [G, 8] (one per 32 elements) or [G, 16] (one per 16: IQ2_XS, IQ2_S, "
                "IQ1_M), ``q`` the signed element multipliers [G, 256] (int8: the signed grid "
                "value, IQ1: 8 * grid +- 1); ``x = d * c * (2 * ls + 1) * q`` with c = 1/8 "
                "(IQ2, IQ1), 1/4 (IQ3_XXS), 1 (IQ3_S) (ggml's rounding: numba_qk.dequantize).")
_FILLED = (("ls", "u1"), ("q", "i1"))


def _traits(fmt, dequantize, decode, dot, gemv, gemm, filled=_FILLED, quantize=None,
            domain=None, quantizer=""):
    return Traits(format=fmt, dequantize=dequantize, decode=decode,
                  decoded=Decoded("IQGridFields", ("d", "ls", "q"), filled, _DECODED_DOC),
                  quantize=quantize, domain=domain, quantizer=quantizer, find_invalid=None,
                  dot=dot, gemv=gemv, gemm=gemm, oracle="numba_qk.testing.reference.iq")


TRAITS = (
    _traits(_XXS2, dequantize_iq2_xxs, iq2_xxs_decode_records,
            dot_iq2_xxs_q8_k, gemv_iq2_xxs_q8_k, gemm_iq2_xxs_q8_k),
    _traits(_XS2, dequantize_iq2_xs, iq2_xs_decode_records,
            dot_iq2_xs_q8_k, gemv_iq2_xs_q8_k, gemm_iq2_xs_q8_k),
    _traits(_XXS3, dequantize_iq3_xxs, iq3_xxs_decode_records,
            dot_iq3_xxs_q8_k, gemv_iq3_xxs_q8_k, gemm_iq3_xxs_q8_k,
            quantize=_iq3_encode.quantize_iq3_xxs, domain="grid",
            quantizer="ggml ggml_quantize_chunk (quantize_iq3_xxs, no imatrix)"),
    _traits(_S1, dequantize_iq1_s, iq1_s_decode_records,
            dot_iq1_s_q8_k, gemv_iq1_s_q8_k, gemm_iq1_s_q8_k),
    _traits(_S3, dequantize_iq3_s, iq3_s_decode_records,
            dot_iq3_s_q8_k, gemv_iq3_s_q8_k, gemm_iq3_s_q8_k,
            quantize=_iq3_encode.quantize_iq3_s, domain="grid",
            quantizer="ggml ggml_quantize_chunk (quantize_iq3_s, no imatrix)"),
    _traits(_S2, dequantize_iq2_s, iq2_s_decode_records,
            dot_iq2_s_q8_k, gemv_iq2_s_q8_k, gemm_iq2_s_q8_k,
            quantize=_iq2_encode.quantize_iq2_s, domain="grid", quantizer=_iq2_encode.QUANTIZER_S),
    _traits(_M1, dequantize_iq1_m, iq1_m_decode_records,
            dot_iq1_m_q8_k, gemv_iq1_m_q8_k, gemm_iq1_m_q8_k, filled=(("d", "f2"), *_FILLED),
            quantize=_iq1_encode.quantize_iq1_m, domain="grid", quantizer=_iq1_encode.QUANTIZER_M),
)
