"""Record builders for the tests: encode fields into Q4_K / Q8_K bytes (the inverse of spec 000
section 2), random legal records, and records with chosen exact statistics S_b and T_b."""

from __future__ import annotations

import struct

import numpy as np

from numba_qk.testing.asserts import assert_same_f32

F16_SPECIALS = {
    "+0": 0x0000, "-0": 0x8000, "min_sub": 0x0001, "max_sub": 0x03FF, "-min_sub": 0x8001,
    "min_normal": 0x0400, "one": 0x3C00, "-one": 0xBC00, "max": 0x7BFF, "-max": 0xFBFF,
    "+inf": 0x7C00, "-inf": 0xFC00, "qnan": 0x7E00, "snan": 0x7C01, "-nan": 0xFE00,
}

F32_SPECIALS = {
    "+0": 0x00000000, "-0": 0x80000000, "min_sub": 0x00000001, "max_sub": 0x007FFFFF,
    "min_normal": 0x00800000, "one": 0x3F800000, "-one": 0xBF800000, "max": 0x7F7FFFFF,
    "-max": 0xFF7FFFFF, "+inf": 0x7F800000, "-inf": 0xFF800000, "qnan": 0x7FC00000,
    "snan": 0x7F800001, "-nan": 0xFFC00000, "huge": 0x7E000000, "tiny": 0x01000000,
}


def pack_q4_k(d_bits: int, dmin_bits: int, sc, m, q) -> np.ndarray:
    """One Q4_K record from its fields (d/dmin as f16 bit patterns)."""
    a = np.zeros(144, dtype=np.uint8)
    a[0:2] = [d_bits & 0xFF, d_bits >> 8]
    a[2:4] = [dmin_bits & 0xFF, dmin_bits >> 8]
    for i in range(4):
        assert 0 <= sc[i] < 64 and 0 <= m[i] < 64 and 0 <= sc[4 + i] < 64 and 0 <= m[4 + i] < 64
        a[4 + i] = (sc[i] & 63) | ((sc[4 + i] >> 4) << 6)
        a[8 + i] = (m[i] & 63) | ((m[4 + i] >> 4) << 6)
        a[12 + i] = (sc[4 + i] & 15) | ((m[4 + i] & 15) << 4)
    for i in range(256):
        assert 0 <= q[i] < 16
        pos = 16 + 32 * (i // 64) + (i % 32)
        a[pos] |= q[i] << (0 if i % 64 < 32 else 4)
    return a


def pack_q8_k(ds_bits: int, q, bsum=None) -> np.ndarray:
    """One Q8_K record; ``bsum`` defaults to the legal group sums of ``q``."""
    q = [int(v) for v in q]
    if bsum is None:
        bsum = [sum(q[16 * j:16 * j + 16]) for j in range(16)]
    raw = struct.pack("<I", ds_bits) + struct.pack("<256b", *q) + struct.pack("<16h", *bsum)
    return np.frombuffer(raw, dtype=np.uint8).copy()


def f32_bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def f16_bits(x) -> int:
    return int(np.float16(x).view(np.uint16))


def random_q4_k(rng, g: int, scale=0.01) -> np.ndarray:
    """Random Q4_K records: arbitrary scale/quant bytes, d/dmin like real weights."""
    w = rng.integers(0, 256, size=(g, 144), dtype=np.uint8)
    d = (np.abs(rng.standard_normal(g)) * scale).astype(np.float16)
    dmin = (np.abs(rng.standard_normal(g)) * scale).astype(np.float16)
    w[:, 0:2] = d.view(np.uint8).reshape(g, 2)
    w[:, 2:4] = dmin.view(np.uint8).reshape(g, 2)
    return w


def random_q8_k(rng, g: int) -> np.ndarray:
    """Random legal Q8_K records (bsum consistent with q), ds like real activations."""
    out = np.empty((g, 292), dtype=np.uint8)
    for b in range(g):
        q = rng.integers(-128, 128, size=256)
        ds = np.float32(abs(rng.standard_normal()) * 0.05 + 1e-4)
        out[b] = pack_q8_k(f32_bits(ds), q)
    return out


def _inner(target: int):
    """32 (wq, xq) pairs whose products sum to ``target`` exactly."""
    wq, xq = [0] * 32, [0] * 32
    rem = target
    for i in range(31):
        v = max(-128, min(127, int(rem / 15)))
        wq[i], xq[i] = 15, v
        rem -= 15 * v
    assert -128 <= rem <= 127, target
    wq[31], xq[31] = 1, rem
    return wq, xq


def pair_with_sums(S: int, T: int, d_bits=0x3C00, dmin_bits=0x3C00, ds_bits=0x3F800000):
    """A (Q4_K, Q8_K) record pair with exactly the statistics S_b = S and T_b = T.

    sc = [63]*7 + [1]; T is carried by m[0] = 1 and an (illegal, used-as-stored) bsum[0].
    """
    a, b = divmod(S, 63)
    inners = [0] * 8
    for s in range(7):
        part = max(-59000, min(59000, a))
        inners[s] = part
        a -= part
    assert a == 0, "S out of range for this builder"
    inners[7] = b
    sc = [63] * 7 + [1]
    wq, xq = [], []
    for s in range(8):
        w_, x_ = _inner(inners[s])
        wq += w_
        xq += x_
    m = [1] + [0] * 7
    bsum = [T] + [0] * 15 if -32768 <= T <= 32767 else None
    if bsum is None:  # spread T over m[0..7] * bsum pairs
        raise ValueError("T out of range for this builder")
    w = pack_q4_k(d_bits, dmin_bits, sc, m, wq)
    x = pack_q8_k(ds_bits, xq, bsum)
    return w, x


def extreme_q4_k_q8_k(rng):
    """Q4_K weights [20, 3, 144] and Q8_K activations [18, 3, 292] at the extremes of every
    field: all-0xFF weights (q = 15, sc = m = 63), max codes with zero scales, q = -128 / 127,
    bsum = -32768 / 32767 / -1 and random bytes, and ±0, inf, NaN and subnormal d / dmin / ds,
    mixed with random records (the gemm kernels' shared adversarial case)."""
    g = 3
    w = np.zeros((20, g, 144), np.uint8)
    w[0:4] = 0xFF
    w[4:8] = random_q4_k(rng, 4 * g).reshape(4, g, 144)
    w[6:8, :, 4:144] = 0xFF            # max scales and codes with finite d
    w[8:10, :, 16:] = 0xFF             # max codes, zero scales
    w[10:20] = random_q4_k(rng, 10 * g).reshape(10, g, 144)
    x = np.zeros((18, g, 292), np.uint8)
    x[:] = random_q8_k(rng, g)[None]
    x[0:3, :, 4:260] = 0x80            # q = -128
    x[3:6, :, 4:260] = 0x7F            # q = 127
    x[6:8, :, 260:292:2] = 0x00
    x[6:8, :, 261:292:2] = 0x80        # bsum = -32768 (illegal but used as stored)
    x[8:10, :, 260:292:2] = 0xFF
    x[8:10, :, 261:292:2] = 0x7F       # bsum = 32767
    x[10:12, :, 260:292:2] = 0xFF
    x[10:12, :, 261:292:2] = 0xFF      # bsum = -1 (low byte 255, high byte -1)
    x[12:14, :, 260:292] = rng.integers(0, 256, (2, g, 32), dtype=np.uint8)
    for a, bits in enumerate([0x80000000, 0x7F800000, 0x7FC00001, 0x00000001, 0x3F800000,
                              0xFF800000, 0x00000000]):
        x[a + 11, 0, 0:4] = np.frombuffer(np.uint32(bits).tobytes(), np.uint8)
    for r, bits in enumerate([0x8000, 0x0000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF]):
        w[r + 4, 1, 0:2] = [bits & 0xFF, bits >> 8]
        w[r + 4, 2, 2:4] = [bits & 0xFF, bits >> 8]
        w[r + 12, 0, 0:2] = [bits & 0xFF, bits >> 8]
    return w, x


def legacy_extremes(f, act, rows, g, rng):
    """Legacy weight and activation records (``f``, ``act``): every quant at its extremes (0x00 / 0xFF / 0x80 bytes, all fifth bits set or clear),
    activations at -128 / 127, scales from +-0, subnormal, 1, max, inf and NaN patterns."""
    scales = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                       0x7E00, 0x7C01], np.uint16)
    w = np.empty((rows, g, f.block_bytes), np.uint8)
    x = np.empty((g, act.block_bytes), np.uint8)
    fill = np.array([0x00, 0xFF, 0x80, 0x7F, 0x0F, 0xF0], np.uint8)
    w[...] = fill[rng.integers(0, len(fill), (rows, g, 1))]
    x[...] = np.array([0x80, 0x7F], np.uint8)[rng.integers(0, 2, (g, 1))]
    sw = scales[rng.integers(0, len(scales), (rows, g, 2))]
    sx = scales[rng.integers(0, len(scales), (g, 2))]
    # mostly finite scales so the integer sums show through the float steps
    sw[rng.random(sw.shape) < 0.6] = 0x3C00
    sx[rng.random(sx.shape) < 0.6] = 0x3C00
    w[..., 0:4] = sw.view(np.uint8).reshape(rows, g, 4)
    x[..., 0:4] = sx.view(np.uint8).reshape(g, 4)
    return w, x


def random_iq_grid(rng, fmt, g: int) -> np.ndarray:
    """``g`` random records of a grid IQ format (IQ2_XXS ... IQ1_M) with finite f16 scales
    d in [1e-3, 1e-2] (IQ1_M: written into the scales' top nibbles)."""
    rec = rng.integers(0, 256, (g, fmt.block_bytes), dtype=np.uint8)
    bits = rng.uniform(1e-3, 1e-2, g).astype(np.float16).view(np.uint16).astype(np.int64)
    if fmt.name == "IQ1_M":
        for t in range(4):
            rec[:, 49 + 2 * t] = (rec[:, 49 + 2 * t] & 0x0F) | (((bits >> (4 * t)) & 0xF) << 4)
    else:
        rec[:, 0], rec[:, 1] = bits & 0xFF, bits >> 8
    return rec


def unaligned(a):
    """A copy of ``a`` whose data starts one byte past an aligned address."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = buf[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


_KEEP = []   # the guarded mappings stay mapped for the life of the process


def before_a_guard_page(nbytes):
    """A writable uint8 array of ``nbytes`` that ends where a PROT_NONE page begins (Linux;
    elsewhere a plain array)."""
    import ctypes
    import mmap
    import sys

    if not sys.platform.startswith("linux"):
        return np.zeros(nbytes, np.uint8)
    page = mmap.PAGESIZE
    pages = -(-nbytes // page) + 1
    m = mmap.mmap(-1, pages * page)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(addr + (pages - 1) * page, page, 0) == 0   # PROT_NONE
    _KEEP.append(m)
    return np.frombuffer(m, np.uint8, count=nbytes, offset=(pages - 1) * page - nbytes)


def carrier_views(w, x, carriers):
    """``(label, weights, activations)`` views of one product case's records ``w`` ``[rows, G,
    B]`` and ``x`` ``[batch, ...]``: ``"each"`` strided weights (bytes 2 apart), read-only and
    unaligned copies, one property at a time; ``"combined"`` one strided, read-only, unaligned
    view of the weights with unaligned activations (one compiled specialisation for all)."""
    if carriers == "each":
        ws = np.zeros(w.shape[:2] + (2 * w.shape[2],), np.uint8)
        ws[:, :, ::2] = w
        wro, xro = w.copy(), x.copy()
        wro.flags.writeable = xro.flags.writeable = False
        return [("strided", ws[:, :, ::2], xro), ("read-only", wro, xro),
                ("unaligned", unaligned(w), unaligned(x))]
    wall = unaligned(np.zeros(w.shape[:2] + (2 * w.shape[2],), np.uint8))[:, :, ::2]
    wall[...] = w
    wall.flags.writeable = False
    return [("strided read-only unaligned", wall, unaligned(x))]


def products_on(views, gemv, gemm, dot=None):
    """``{"<label> gemm" / "gemv" (/ "dot"): [batch, rows] float32}`` of each view."""
    got = {}
    for label, ww, xx in views:
        batch, rows = xx.shape[0], ww.shape[0]
        got[f"{label} gemm"] = np.empty((batch, rows), np.float32)
        gemm(ww, xx, got[f"{label} gemm"])
        got[f"{label} gemv"] = np.empty((batch, rows), np.float32)
        for a in range(batch):
            gemv(ww, xx[a], got[f"{label} gemv"][a])
        if dot is not None:
            got[f"{label} dot"] = np.array([[dot(ww[r], xx[a]) for r in range(rows)]
                                            for a in range(batch)], np.float32)
    return got


def panel_reference(gemv, dot, w, x, label):
    """The reference of a panel-gemm test: ``gemv(w, x[a])`` per activation (f32 ``[A, rows]``),
    after checking it against the portable ``dot`` on every 7th row of every 4th activation."""
    rows = w.shape[0]
    want = np.empty((x.shape[0], rows), np.float32)
    for a in range(x.shape[0]):
        gemv(w, x[a], want[a])
    some = np.array([[dot(w[r], x[a]) for r in range(0, rows, 7)]
                     for a in range(0, x.shape[0], 4)], np.float32)
    with np.errstate(all="ignore"):
        assert_same_f32(want[::4, ::7], some, f"{label} gemv = portable dot")
    return want
