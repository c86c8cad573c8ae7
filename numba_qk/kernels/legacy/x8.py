"""Row-interleaved ("x8") weights of ggml's Q4_0, Q4_1, Q5_0, Q8_0 and IQ4_NL and their gemv
(AVX-512 VNNI).

``repack_x8`` turns weight records ``[rows, G, bytes]`` into tiles of 8 rows, each one
contiguous, 64-byte aligned uint8 row (``x8_planes``: both planes start on a cache line)::

    d plane : record b at bytes [16 b, 16 b + 16): the f16 scale of rows 0..7
    aux     : (Q4_1) record b at bytes [16 G + 16 b, ...): the f16 min of rows 0..7;
              (Q5_0) record b at [16 G + 32 b, ...): byte 8 c + k = byte c of row k's qh
    qs plane: record b at D + qs_bytes * b (D = 16 G + the aux plane, rounded up to 64):
              chunk c (64 bytes) =
              bytes 8c .. 8c+7 of the qs field of rows 0..7, in row order (ggml's CPU_REPACK
              interleave of 8 bytes); qs_bytes = 128 (Q4_0) or 256 (Q8_0)

The rows past the last full tile (``rows % 8``) stay plain records (the "tail").  The kernel
``gemv_x8`` computes, bit for bit, what the plain ``gemv`` computes: per record
``v_b = R32(dx_b * R32(dw_b * f32(S_b)))`` (Q4_1: ``+ R32(mw_b * sx_b)``), folded left in
record order per row (legacy.py).
``numba_qk.repack`` offers Q4_0 and IQ4_NL of these: Q8_0 tiles were ~1.5x faster than the plain kernel with
the weights in cache but 5-10 % slower streamed from DRAM on Zen 4 (bench/experiments/legacy_x8_ab.py).
Q4_1 and Q5_0 tiles are the kernels' too (numba_qk.models repacks such weights for decoding).
"""

import numpy as np

import llvmlite.binding as llvm_binding
from numba import config, literally, types
from numba.extending import intrinsic

from numba_qk._jit import kernel
from numba_qk.kernels.legacy.layout import FORMATS, D_AT, M_AT, QH_AT, QS_AT, X_D_AT, X_QS_AT, X_S_AT, Q4_0, Q4_1, Q5_0, Q8_0
from numba_qk.kernels.simd.base import HAVE_AVX2, HAVE_AVX512, HAVE_VNNI, emit_prefetch
from numba_qk.kernels.simd.legacy import (U8_BIAS, X8_AUX_BYTES, X8_IQ4_NL, X8_LAYOUT,
                                          X8_QS_BYTES, legacy_x8_rows)
from numba_qk.kernels.drive import no_records
from numba_qk.kernels.legacy.kernels import f16, gemv_loop, simd_dot_at

HAVE_X8 = HAVE_VNNI and HAVE_AVX512
#: x8 codes: the legacy codes of the formats above and ``X8_IQ4_NL`` (IQ4_NL's records have
#: Q4_0's layout, so its tiles are Q4_0's bytes; its product, with the tail rows and the portable
#: path, is kernels/iq/iq4.py's ``gemv_x8_iq4_nl_q8_0``)
X8_LEGACY = (Q4_0, Q4_1, Q5_0, Q8_0)
X8_CODES = X8_LEGACY + (X8_IQ4_NL,)


def _by_x8_code(table):
    """The legacy layout ``table`` indexed by x8 code (the layout each code's records have)."""
    return tuple(table[X8_LAYOUT[c]] if c in X8_LAYOUT else -1
                 for c in range(max(X8_CODES) + 1))


_D_AT, _M_AT, _QH_AT, _QS_AT = (_by_x8_code(t) for t in (D_AT, M_AT, QH_AT, QS_AT))
_X_D_AT, _X_S_AT, _X_QS_AT = (_by_x8_code(t) for t in (X_D_AT, X_S_AT, X_QS_AT))
_TRIP = 8   # records per intrinsic call (4 was ~10 % faster hot, ~10 % slower streamed)


def _up64(n):
    return -(-n // 64) * 64


def x8_planes(code, g):
    """(qs plane offset, tile bytes) of a tile of G records: the scale and qs planes start on a
    64-byte boundary (a tile's 64-byte chunks are then whole cache lines)."""
    dp = _up64((16 + X8_AUX_BYTES[code]) * g)
    return dp, _up64(dp + X8_QS_BYTES[code] * g)


def repack_x8(code, w):
    """(tiles, tail) of weight records ``w`` ``[rows, G, bytes]`` (any strides), see above;
    ``tiles`` starts on a 64-byte boundary."""
    rows, g, nb = w.shape
    t = rows // 8
    qs_at, d_at = _QS_AT[code], _D_AT[code]
    qs_n = nb - qs_at
    dp, tb = x8_planes(code, g)
    buf = np.zeros(t * tb + 64, np.uint8)
    at = -buf.ctypes.data % 64
    tiles = buf[at:at + t * tb].reshape(t, tb)
    body = np.asarray(w[:8 * t]).reshape(t, 8, g, nb)
    tiles[:, :16 * g] = body[..., d_at:d_at + 2].transpose(0, 2, 1, 3).reshape(t, 16 * g)
    aux = X8_AUX_BYTES[code] * g
    if _M_AT[code] >= 0:
        m_at = _M_AT[code]
        tiles[:, 16 * g:16 * g + aux] = (body[..., m_at:m_at + 2].transpose(0, 2, 1, 3)
                                         .reshape(t, aux))
    elif _QH_AT[code] >= 0:
        h_at = _QH_AT[code]
        tiles[:, 16 * g:16 * g + aux] = (body[..., h_at:h_at + 4].transpose(0, 2, 3, 1)
                                         .reshape(t, aux))
    tiles[:, dp:dp + 8 * qs_n * g] = (body[..., qs_at:].reshape(t, 8, g, qs_n // 8, 8)
                                      .transpose(0, 2, 3, 1, 4).reshape(t, 8 * qs_n * g))
    tail = np.ascontiguousarray(w[8 * t:])
    return tiles, tail


def unpack_x8(code, tiles, tail, g, nb):
    """The plain records ``[rows, G, bytes]`` of (tiles, tail) (inverse of ``repack_x8``)."""
    t = tiles.shape[0]
    qs_at, d_at = _QS_AT[code], _D_AT[code]
    qs_n = nb - qs_at
    dp = x8_planes(code, g)[0]
    out = np.empty((8 * t + tail.shape[0], g, nb), np.uint8)
    body = out[:8 * t].reshape(t, 8, g, nb)
    body[..., d_at:d_at + 2] = tiles[:, :16 * g].reshape(t, g, 8, 2).transpose(0, 2, 1, 3)
    aux = X8_AUX_BYTES[code] * g
    if _M_AT[code] >= 0:
        m_at = _M_AT[code]
        body[..., m_at:m_at + 2] = (tiles[:, 16 * g:16 * g + aux].reshape(t, g, 8, 2)
                                    .transpose(0, 2, 1, 3))
    elif _QH_AT[code] >= 0:
        h_at = _QH_AT[code]
        body[..., h_at:h_at + 4] = (tiles[:, 16 * g:16 * g + aux].reshape(t, g, 4, 8)
                                    .transpose(0, 3, 1, 2))
    body[..., qs_at:] = (tiles[:, dp:dp + 8 * qs_n * g].reshape(t, g, qs_n // 8, 8, 8)
                         .transpose(0, 3, 1, 2, 4).reshape(t, 8, g, qs_n))
    out[8 * t:] = tail
    return out


@kernel
def _x8_prepare(code, x, xc8, dx8, sx8):
    """Per activation record b: z * sum(x quants) into xc8[8b:8b+8], f32(dx) into dx8, f32(sx)
    into sx8 (Q8_1 activations; left alone otherwise)."""
    for b in range(x.shape[0]):
        s = np.int32(0)
        for j in range(32):
            s += np.int32(np.int8(x[b, _X_QS_AT[code] + j]))
        cz = np.int32(_U8_BIAS_T[code] * s)
        dx = f16(x, b, _X_D_AT[code])
        for k in range(8):
            xc8[8 * b + k] = cz
            dx8[8 * b + k] = dx
        if _X_S_AT[code] >= 0:
            sx = f16(x, b, _X_S_AT[code])
            for k in range(8):
                sx8[8 * b + k] = sx


# the dot's integer is u - bias of the u8 in the tile (IQ4_NL: u = k + 128, simd/legacy.py)
_U8_BIAS_T = tuple(U8_BIAS.get(c, 0) for c in range(max(X8_CODES) + 1))


# Software prefetch of the streamed tiles (DRAM-bound matvecs): each trip of records prefetches
# exactly the lines it reads (its qs lines, its scale and aux lines) of the trip ``_AHEAD_BYTES``
# of record columns further on in the row of tiles (into the next tile past the end of this
# one): one prefetch per line read, none repeated.  On Zen 5 (4096x4096 IQ4_NL / Q4_0, 9.4 MB)
# that read 30-32 GB/s against 20-22 GB/s for the former scheme (the tile ~64 KiB ahead as one
# linear range into L2, 3 lines per record, and the next tile's share again: 2.7x as many
# prefetches); without software prefetch the tile loop read only ~9 GB/s (the hardware
# prefetchers alone keep too few lines in flight with this much work per line), a plain 512-bit
# read on the same core 38-40 GB/s (bench/experiments/x8_stream_ab.py, read_ceiling.py).
# Distances of 64-128 records (9-18 KiB for Q4_0) measured alike, 8-32 records slower.
# Into L1 (``prefetcht0``; ``prefetchnta`` measured alike) where the compile target is AMD Zen 5
# or later: into L2 (``prefetcht1``) was 5-15 % slower there.  Elsewhere into L2, as the other
# streaming kernels do (simd/base.py ``prefetch``: on Zen 4, L1 prefetches of the former scheme
# stalled on the L1's miss buffers; this scheme is not measured there).
_AHEAD_BYTES = 12 << 10


def _target_cpu() -> str:
    """The CPU numba compiles for (part of numba's cache key, so cached code follows it)."""
    if config.CPU_NAME and config.CPU_NAME != "host":
        return config.CPU_NAME
    try:
        return llvm_binding.get_host_cpu_name()
    except Exception:  # pragma: no cover - exotic hosts
        return ""


def _l1_prefetch(cpu: str) -> bool:
    """Whether ``cpu`` (an LLVM CPU name) is AMD Zen 5 or later (``znver5``, ``znver6``, ...)."""
    return cpu.startswith("znver") and cpu[5:].isdigit() and int(cpu[5:]) >= 5


#: ``llvm.prefetch`` locality of the tile prefetch: 3 (``prefetcht0``) or 2 (``prefetcht1``)
PREFETCH_LOCALITY = 3 if _l1_prefetch(_target_cpu()) else 2


@intrinsic
def _prefetch_tile(typingctx, arr, off):
    """Prefetch the line holding byte ``off`` of uint8 array ``arr`` (``llvm.prefetch`` read,
    locality ``PREFETCH_LOCALITY``): never faults, changes no value."""
    sig = types.none(arr, types.intp)

    def codegen(context, builder, signature, args):
        emit_prefetch(context, builder, signature.args[0], args[0], args[1], PREFETCH_LOCALITY)
        return context.get_dummy_value()

    return sig, codegen


@kernel
def _gemv_x8_simd(code, tiles, x, out, trip):
    """Tiles only (``out`` has 8 entries per tile); ``x`` contiguous records."""
    literally(code)
    literally(trip)
    col = 16 + X8_AUX_BYTES_T[code] + X8_QS_BYTES_T[code]   # tile bytes per record column
    ahead = (_AHEAD_BYTES + col - 1) // col
    _gemv_x8_simd_ahead(code, tiles, x, out, trip, (ahead + trip - 1) // trip * trip)


@kernel
def _gemv_x8_simd_ahead(code, tiles, x, out, trip, ahead):
    """As ``_gemv_x8_simd``, each trip prefetching (``_prefetch_tile``) the lines of the trip
    ``ahead`` records further on in the row of tiles (0: no prefetch); see ``_AHEAD_BYTES``."""
    literally(code)
    literally(trip)
    t_n, g = tiles.shape[0], x.shape[0]
    ts0, xs0 = tiles.strides[0], x.strides[0]
    xc8 = np.empty(8 * g, np.int32)
    dx8 = np.empty(8 * g, np.float32)
    sx8 = np.empty(8 * g if _X_S_AT[code] >= 0 else 0, np.float32)
    _x8_prepare(code, x, xc8, dx8, sx8)
    acc = np.empty(8, np.float32)
    qb = X8_QS_BYTES_T[code]
    ab = X8_AUX_BYTES_T[code]
    dp = ((16 + ab) * g + 63) // 64 * 64
    # the record prefetched: record pb of tile pt (pt == t_n: none left)
    pt = np.int64(ahead) // np.int64(g) if ahead > 0 else np.int64(t_n)
    pb = np.int64(ahead) - pt * np.int64(g) if ahead > 0 else np.int64(0)
    for t in range(t_n):
        base = t * ts0
        b = 0
        while b < g:
            n = trip if g - b >= trip else 1
            if pt < t_n:
                pbase = pt * ts0
                for j in range(0, n * qb, 64):
                    _prefetch_tile(tiles, pbase + dp + qb * pb + j)
                for j in range(0, n * 16, 64):
                    _prefetch_tile(tiles, pbase + 16 * pb + j)
                for j in range(0, n * ab, 64):
                    _prefetch_tile(tiles, pbase + 16 * g + ab * pb + j)
                pb += n
                if pb >= g:
                    pb -= g
                    pt += 1
            if n == trip:
                legacy_x8_rows(code, trip, tiles, base + 16 * b, base + dp + qb * b, x,
                               b * xs0, xc8, dx8, 8 * b, acc, b == 0,
                               base + 16 * g + ab * b, sx8)
            else:
                legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x, b * xs0,
                               xc8, dx8, 8 * b, acc, b == 0, base + 16 * g + ab * b, sx8)
            b += n
        for k in range(8):
            out[8 * t + k] = acc[k]


X8_QS_BYTES_T = tuple(X8_QS_BYTES.get(c, 0) for c in range(max(X8_CODES) + 1))
X8_AUX_BYTES_T = tuple(X8_AUX_BYTES.get(c, 0) for c in range(max(X8_CODES) + 1))


@kernel
def x8_row_records(code, tiles, t, k, rec):
    """Row ``k`` of tile ``t`` of x8 ``tiles`` as plain records in ``rec`` ``[G, bytes]`` (the
    portable loops' view of a tile)."""
    g = rec.shape[0]
    qs_n = rec.shape[1] - _QS_AT[code]
    ab = X8_AUX_BYTES_T[code]
    q0 = ((16 + ab) * g + 63) // 64 * 64
    for b in range(g):
        rec[b, _D_AT[code]] = tiles[t, 16 * b + 2 * k]
        rec[b, _D_AT[code] + 1] = tiles[t, 16 * b + 2 * k + 1]
        if _M_AT[code] >= 0:
            rec[b, _M_AT[code]] = tiles[t, 16 * g + ab * b + 2 * k]
            rec[b, _M_AT[code] + 1] = tiles[t, 16 * g + ab * b + 2 * k + 1]
        if _QH_AT[code] >= 0:
            for c in range(4):
                rec[b, _QH_AT[code] + c] = tiles[t, 16 * g + ab * b + 8 * c + k]
        for c in range(qs_n // 8):
            for j in range(8):
                rec[b, _QS_AT[code] + 8 * c + j] = tiles[t, q0 + 8 * qs_n * b + 64 * c + 8 * k + j]


@kernel
def _tile_rows_portable(code, tiles, x, out, rec):
    """The portable loops on tiles (targets without AVX-512 VNNI): rebuild each row's record
    in ``rec`` ``[G, bytes]`` and fold it as ``legacy.gemv_loop`` does (legacy codes)."""
    one = np.empty(1, np.float32)
    for t in range(tiles.shape[0]):
        for k in range(8):
            x8_row_records(code, tiles, t, k, rec)
            gemv_loop(code, rec.reshape(1, rec.shape[0], rec.shape[1]), x, one)
            out[8 * t + k] = one[0]


@kernel
def gemv_x8_simd(code, tiles, x, out):
    """``out[:8 T]`` of x8 ``tiles`` [T, bytes] (whole tiles only) against activation records
    ``x`` [G, bytes] (contiguous, C order, G >= 1); AVX-512 VNNI only (``HAVE_X8``)."""
    _gemv_x8_simd(code, tiles, x, out, _TRIP)


@kernel
def gemv_x8(code, tiles, tail, x, out):
    """``out`` [8 T + tail rows] of x8 ``tiles`` [T, bytes] and plain ``tail`` [n, G, bytes]
    against activation records ``x`` [G, bytes] (contiguous, C order); a legacy ``code``."""
    literally(code)
    g = x.shape[0]
    t_n = tiles.shape[0]
    if no_records(g, out):
        return
    if HAVE_X8:
        _gemv_x8_simd(code, tiles, x, out, _TRIP)
    else:
        rec = np.empty((g, tail.shape[2]), np.uint8)
        _tile_rows_portable(code, tiles, x, out, rec)
    for r in range(tail.shape[0]):
        if HAVE_AVX2:
            out[8 * t_n + r] = simd_dot_at(code, tail, r * tail.strides[0], tail.strides[1], x,
                                            x.strides[0], g)
        else:
            gemv_loop(code, tail[r:r + 1], x, out[8 * t_n + r:8 * t_n + r + 1])


def _bind_gemv(code):
    @kernel
    def gemv(tiles, tail, x, out):
        """``gemv_x8`` of this format (the code a compile-time constant: no literal dispatch
        when called from Python)."""
        gemv_x8(code, tiles, tail, x, out)
    return gemv


#: code -> the x8 gemv ``(tiles, tail, x, out)`` of that format, callable from Python
GEMV_X8 = {code: _bind_gemv(code) for code in X8_LEGACY}


def _bind_tiles(code, nb):
    @kernel
    def gemv_tiles(tiles, x, out):
        """``gemv_x8`` of this format over whole tiles only (``out`` [8 T]): the ``(w, x,
        out)`` row kernel that ``numba_qk._threads.run_rows`` splits over tiles (``per=8``)."""
        gemv_x8(code, tiles, np.empty((0, x.shape[0], nb), np.uint8), x, out)
    return gemv_tiles


#: code -> the x8 gemv of whole tiles ``(tiles, x, out)`` (threaded decoding)
GEMV_X8_TILES = {code: _bind_tiles(code, FORMATS[code].block_bytes) for code in X8_LEGACY}
