"""Repacked ("x16") Q4_K weights and their gemv (AVX-512 VNNI): ``numba_qk.repack(w, q4_k)``.

``repack_x16`` turns Q4_K weight records ``[rows, G, 144]`` into tiles of 16 rows, one
contiguous, 64-byte aligned uint8 row per tile: record b of the 16 rows at ``X16_BYTES * b``
(2304 bytes, layout in ``_simd_q4_k.py``: the 16 plain records' bytes transposed to one dword
per row and 64-byte line -- packed quants, scale words, d and dmin -- so a tile is exactly as
large as the plain records).
The rows past the last full tile (``rows % 16``) stay plain records (the "tail").

``gemv_x16`` computes, bit for bit, what the plain Q4_K gemv computes (dot.py): per record
S_b, T_b exact, ``v_b = R32(ds * R32(R32(d * f32(S_b)) - R32(dmin * f32(T_b))))`` folded left
in record order per row -- one i32/f32 lane per row, no horizontal reductions.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.simd.base import HAVE_AVX512, HAVE_VNNI, prefetch
from numba_qk.kernels.simd.q4_k import X16_BYTES, X16_D_AT, X16_DMIN_AT, X16_Q_AT, X16_ROWS, X16_U_AT, q4_k_x16_rows_p16, q4_k_x16_rows_p32
from numba_qk.kernels.kquants.common import x_bsum
from numba_qk.kernels.drive import no_records
from numba_qk.kernels.kquants.dot import dot_loop, gemv_q4_k_q8_k

HAVE_X16 = HAVE_VNNI and HAVE_AVX512
_REC = 144


def repack_x16(w):
    """(tiles, tail) of Q4_K records ``w`` ``[rows, G, 144]`` (any strides), see above;
    ``tiles`` (uint8 ``[rows // 16, G * X16_BYTES]``) starts on a 64-byte boundary."""
    rows, g, _ = w.shape
    t = rows // X16_ROWS
    tb = g * X16_BYTES
    buf = np.zeros(t * tb + 64, np.uint8)
    at = -buf.ctypes.data % 64
    tiles = buf[at:at + t * tb].reshape(t, tb)
    v = tiles.reshape(t, g, X16_BYTES)
    body = np.asarray(w[:X16_ROWS * t]).reshape(t, X16_ROWS, g, _REC)
    v[..., X16_Q_AT:X16_Q_AT + 2048] = (body[..., 16:144].reshape(t, X16_ROWS, g, 32, 4)
                                        .transpose(0, 2, 3, 1, 4).reshape(t, g, 2048))
    v[..., X16_U_AT:X16_U_AT + 192] = (body[..., 4:16].reshape(t, X16_ROWS, g, 3, 4)
                                       .transpose(0, 2, 3, 1, 4).reshape(t, g, 192))
    v[..., X16_D_AT:X16_D_AT + 32] = body[..., 0:2].transpose(0, 2, 1, 3).reshape(t, g, 32)
    v[..., X16_DMIN_AT:X16_DMIN_AT + 32] = body[..., 2:4].transpose(0, 2, 1, 3).reshape(t, g, 32)
    tail = np.ascontiguousarray(w[X16_ROWS * t:])
    return tiles, tail


def unpack_x16(tiles, tail, g):
    """The plain records ``[rows, G, 144]`` of (tiles, tail) (inverse of ``repack_x16``)."""
    t = tiles.shape[0]
    out = np.empty((X16_ROWS * t + tail.shape[0], g, _REC), np.uint8)
    body = out[:X16_ROWS * t].reshape(t, X16_ROWS, g, _REC)
    v = tiles.reshape(t, g, X16_BYTES)
    body[..., 16:144] = (v[..., X16_Q_AT:X16_Q_AT + 2048].reshape(t, g, 32, X16_ROWS, 4)
                         .transpose(0, 3, 1, 2, 4).reshape(t, X16_ROWS, g, 128))
    body[..., 4:16] = (v[..., X16_U_AT:X16_U_AT + 192].reshape(t, g, 3, X16_ROWS, 4)
                       .transpose(0, 3, 1, 2, 4).reshape(t, X16_ROWS, g, 12))
    body[..., 0:2] = v[..., X16_D_AT:X16_D_AT + 32].reshape(t, g, X16_ROWS, 2).transpose(0, 2, 1, 3)
    body[..., 2:4] = (v[..., X16_DMIN_AT:X16_DMIN_AT + 32].reshape(t, g, X16_ROWS, 2)
                      .transpose(0, 2, 1, 3))
    out[X16_ROWS * t:] = tail
    return out


@kernel
def _pair_sums(x, p16, p32):
    """bsum[2s] + bsum[2s+1] of activation record b into p32[8b + s] (int32) and p16[8b + s]
    (int16, wrapped); returns whether every one fits an int16."""
    fits = True
    for b in range(x.shape[0]):
        for s in range(8):
            v = x_bsum(x, b, 2 * s) + x_bsum(x, b, 2 * s + 1)
            if v < -32768 or v > 32767:
                fits = False
            p32[8 * b + s] = v
            p16[8 * b + s] = np.int16(np.uint16(v & 0xFFFF))
    return fits


_STREAMS = 2   # runs of tiles read at once (Zen 4, 4096x4096 / 14336x4096 streamed from DRAM:
#                1 run ~1.2x the time of 2, 3 runs ~1.5x, 4 runs ~2x; hot: 2 within 5 % of 1)
_SMALL_BYTES = 1 << 20   # tiles of at most this many bytes: one run with software prefetch
_SMALL_AHEAD = 1 << 15   # bytes ahead that the small plan prefetches (each record once)


@kernel
def _gemv_x16_simd(tiles, x, out):
    """Tiles only (``out`` has 16 entries per tile); ``x`` contiguous Q8_K records; each
    tile's 16 rows folded in record order.  Two read plans, by the size of the tiles:

    - large (more than ``_SMALL_BYTES``): the tiles read as ``_STREAMS`` runs at once (tile t
      of each equal run, record by record), linear byte streams which the hardware prefetcher
      follows, no software prefetch: the plain gemv's plan (``simd.base.prefetch_plan``: the
      tile ~64 KiB ahead, a share per record step) measured 1.2-1.45x slower streamed from DRAM
      and ~1.2x slower hot on Zen 4 with one run (4096x4096 and 14336x4096;
      bench/experiments/legacy_x8_ab.py), other distances (37 KiB .. 1 MiB) and shares no
      better; Zen 5 likewise (4096x4096 streamed: 2 runs without prefetch 171-229 us, with
      it 286-434 us).
    - small (a model's per-layer matrices, read once per token from DRAM and so always
      cold): one run, each record's bytes prefetched ``_SMALL_AHEAD`` ahead -- the hardware
      prefetcher has no time to ramp up on a few hundred KiB (Zen 5, evicted before each
      call: 640x1024 Q4_K 40-60 -> 28-33 us, 640x2048 66-85 -> 37-40 us, against 20 and
      36 us to merely read the bytes; hot 4.0 -> 4.9 us and 9.0 -> 9.6 us)."""
    t_n, g = tiles.shape[0], x.shape[0]
    ts0, xs0 = tiles.strides[0], x.strides[0]
    p16 = np.empty(8 * g, np.int16)
    p32 = np.empty(8 * g, np.int32)
    fits = _pair_sums(x, p16, p32)
    acc = np.empty(_STREAMS * X16_ROWS, np.float32)
    small = t_n * ts0 <= _SMALL_BYTES
    runs = 1 if small else _STREAMS
    end = t_n * ts0
    h = (t_n + runs - 1) // runs
    for t in range(h):
        m = runs
        while m > 1 and t + (m - 1) * h >= t_n:
            m -= 1
        for b in range(g):
            for k in range(m):
                o = (t + k * h) * ts0 + b * X16_BYTES
                if small and o + _SMALL_AHEAD < end:
                    for j in range(0, X16_BYTES, 64):
                        prefetch(tiles, o + _SMALL_AHEAD + j)
                if fits:
                    q4_k_x16_rows_p16(tiles, o, x, b * xs0, p16, 16 * b, acc, X16_ROWS * k,
                                      b == 0)
                else:
                    q4_k_x16_rows_p32(tiles, o, x, b * xs0, p32, 32 * b, acc, X16_ROWS * k,
                                      b == 0)
        for k in range(m):
            for r in range(X16_ROWS):
                out[X16_ROWS * (t + k * h) + r] = acc[X16_ROWS * k + r]


@kernel
def _tile_rows_portable(tiles, x, out, rec):
    """The portable loops on tiles (targets without AVX-512 VNNI): rebuild each row's record
    in ``rec`` ``[G, 144]`` and fold it as ``dot.dot_loop`` does."""
    g = x.shape[0]
    for t in range(tiles.shape[0]):
        for r in range(X16_ROWS):
            for b in range(g):
                o = b * X16_BYTES
                for q in range(32):
                    for e in range(4):
                        rec[b, 16 + 4 * q + e] = tiles[t, o + X16_Q_AT + 64 * q + 4 * r + e]
                for e in range(2):
                    rec[b, e] = tiles[t, o + X16_D_AT + 2 * r + e]
                    rec[b, 2 + e] = tiles[t, o + X16_DMIN_AT + 2 * r + e]
                for k in range(3):
                    for e in range(4):
                        rec[b, 4 + 4 * k + e] = tiles[t, o + X16_U_AT + 64 * k + 4 * r + e]
            out[X16_ROWS * t + r] = dot_loop(rec, x)


@kernel
def gemv_x16(tiles, tail, x, out):
    """``out`` [16 T + tail rows] of x16 ``tiles`` [T, bytes] and plain ``tail`` [n, G, 144]
    against Q8_K activation records ``x`` [G, 292] (contiguous, C order)."""
    g = x.shape[0]
    t_n = tiles.shape[0]
    if no_records(g, out):
        return
    if HAVE_X16:
        _gemv_x16_simd(tiles, x, out)
    else:
        rec = np.empty((g, _REC), np.uint8)
        _tile_rows_portable(tiles, x, out, rec)
    if tail.shape[0]:                     # the plain records after the last full tile
        gemv_q4_k_q8_k(tail, x, out[X16_ROWS * t_n:])


@kernel
def gemv_x16_tiles(tiles, x, out):
    """``gemv_x16`` over whole tiles only (``out`` [16 T]): the ``(w, x, out)`` row kernel that
    ``numba_qk._threads.run_rows`` splits over tiles (``per=16``)."""
    gemv_x16(tiles, np.empty((0, x.shape[0], _REC), np.uint8), x, out)
