"""A/B of prefetch / stream schemes for the DRAM-streamed x8 tile gemv (``numba_qk.repack``'s
IQ4_NL / Q4_0 tiles, and the Q4_1 / Q5_0 / Q8_0 tiles of kernels/legacy/x8.py; simd/legacy.py
``legacy_x8_rows``), the kernel called directly on
pre-quantized activations (no Python or quantization overhead).  Streamed: distinct repacked
copies totalling >= 4x L3, one global round robin shared by all variants (every call reads a copy
the previous ~13 calls did not touch), per-call times, best, median and quantiles per variant.
Every variant's result is checked bit-equal to the former kernel's (``old``) first.  ``new`` is
the committed kernel, ``new-at<m>`` its loop prefetching m records ahead; the others were the
exploration (IQ4_NL / Q4_0 / Q8_0 only): ``none`` (no software prefetch), ``lin*`` (the former
linear scheme at other distances / localities), ``st<k>`` / ``rec<m>`` (the lines a trip reads,
k tiles or m records ahead), ``two*`` (L2 far plus L1 near), ``pair*`` (two tiles' streams
interleaved: neighbours or the two halves of the matrix).

    python bench/experiments/x8_stream_ab.py [--fmt iq4_nl] [--rounds 10] [--hot]
        [--variants old,new,new-at64,none,lin64K-t1,st1-t0,rec96-nta,pair-halves-64K-t1,...|all]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

import numba_qk as qk
from numba_qk._jit import kernel
from numba_qk.kernels.legacy import x8 as X8
from numba_qk.kernels.simd.base import byte_ptr, decl, i8, i32
from numba_qk.kernels.simd.legacy import X8_IQ4_NL, legacy_x8_rows


def _make_prefetch(locality):
    @intrinsic
    def pf(typingctx, arr, off):
        sig = types.none(arr, types.intp)

        def codegen(context, builder, signature, args):
            ptr = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            fn = decl(builder, "llvm.prefetch.p0i8", ir.VoidType(),
                       [i8.as_pointer(), i32, i32, i32])
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality),
                              ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return sig, codegen
    return pf


PF = {"t0": _make_prefetch(3), "t1": _make_prefetch(2), "t2": _make_prefetch(1),
      "nta": _make_prefetch(0)}
TRIP = 8


def make_linear(pf, code):
    """The former loop's scheme (``make_old``) with run-time knobs: prefetch ``lines_mult`` x the tile's
    share of lines per record step, ``ahead`` bytes ahead (0: none), ``near`` also the next
    tile's share."""
    @kernel
    def gemv(tiles, x, out, ahead, near, lines_mult):
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        dp = (16 * g + 63) // 64 * 64
        lines = (ts0 + 63) // 64
        per = lines_mult * ((lines + g - 1) // g)
        end = t_n * ts0
        for t in range(t_n):
            base = t * ts0
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                if ahead > 0:
                    p0 = base + ahead + b * per * 64
                    if p0 < end:
                        for j in range(n * per):
                            pf(tiles, p0 + j * 64)
                    if near:
                        p1 = base + ts0 + b * per * 64
                        if p1 < end:
                            for j in range(n * per):
                                pf(tiles, p1 + j * 64)
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                b += n
            for k in range(8):
                out[8 * t + k] = acc[k]
    return gemv


def make_pair(pf, code):
    """Two tiles at once (``gap`` tiles apart: 1 = neighbours, 0 = the matrix's two halves),
    their trips interleaved: two independent read streams; prefetch as ``make_linear`` for
    both."""
    @kernel
    def gemv(tiles, x, out, ahead, gap, lines_mult):
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc0 = np.empty(8, np.float32)
        acc1 = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        dp = (16 * g + 63) // 64 * 64
        lines = (ts0 + 63) // 64
        per = lines_mult * ((lines + g - 1) // g)
        end = t_n * ts0
        half = t_n // 2
        step = gap if gap > 0 else half
        # tile order: (t, t + step) pairs covering 0 .. 2 * (t_n // 2) - 1
        done = np.zeros(t_n, np.bool_)
        todo = np.empty((t_n // 2, 2), np.int64)
        m = 0
        for t in range(t_n):
            if not done[t] and t + step < t_n and not done[t + step] and m < t_n // 2:
                todo[m, 0] = t
                todo[m, 1] = t + step
                done[t] = True
                done[t + step] = True
                m += 1
        for i in range(m):
            ta, tb_ = todo[i, 0], todo[i, 1]
            ba, bb = ta * ts0, tb_ * ts0
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                if ahead > 0:
                    for base in (ba, bb):
                        p0 = base + ahead + b * per * 64
                        if p0 < end:
                            for j in range(n * per):
                                pf(tiles, p0 + j * 64)
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, ba + 16 * b, ba + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc0, b == 0, ba, sx8)
                    legacy_x8_rows(code, TRIP, tiles, bb + 16 * b, bb + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc1, b == 0, bb, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, ba + 16 * b, ba + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc0, b == 0, ba, sx8)
                    legacy_x8_rows(code, 1, tiles, bb + 16 * b, bb + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc1, b == 0, bb, sx8)
                b += n
            for k in range(8):
                out[8 * ta + k] = acc0[k]
                out[8 * tb_ + k] = acc1[k]
        for t in range(t_n):     # leftover (odd count)
            if not done[t]:
                base = t * ts0
                for b in range(g):
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc0, b == 0, base, sx8)
                for k in range(8):
                    out[8 * t + k] = acc0[k]
    return gemv


def make_struct(pf, code):
    """Prefetch exactly the lines a trip reads (its qs lines and its scales' line), in the tile
    ``k`` tiles ahead (one prefetch per line read, no repeats)."""
    @kernel
    def gemv(tiles, x, out, k, dlines, unused):
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        dp = (16 * g + 63) // 64 * 64
        for t in range(t_n):
            base = t * ts0
            nb = base + k * ts0
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                if k > 0 and t + k < t_n:
                    q0 = nb + dp + qb * b
                    for j in range(0, n * qb, 64):
                        pf(tiles, q0 + j)
                    if dlines:
                        for j in range(0, n * 16, 64):
                            pf(tiles, nb + 16 * b + j)
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                b += n
            for kk in range(8):
                out[8 * t + kk] = acc[kk]
    return gemv


def make_rec(pf, code):
    """Prefetch the lines of the trip ``m`` records ahead in the row of tiles (into the next
    tile past the end of this one): its qs lines and its scales' lines."""
    @kernel
    def gemv(tiles, x, out, m, dlines, unused):
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        dp = (16 * g + 63) // 64 * 64
        # the tile and record m records ahead of (0, 0)
        tt = m // g
        bb = m - tt * g
        for t in range(t_n):
            base = t * ts0
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                if tt < t_n:
                    nb = tt * ts0
                    q0 = nb + dp + qb * bb
                    for j in range(0, n * qb, 64):
                        pf(tiles, q0 + j)
                    if dlines:
                        for j in range(0, n * 16, 64):
                            pf(tiles, nb + 16 * bb + j)
                bb += n
                if bb >= g:
                    bb -= g
                    tt += 1
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                b += n
            for kk in range(8):
                out[8 * t + kk] = acc[kk]
    return gemv


def make_two(pf_far, pf_near, code):
    """Two prefetch levels: the trip ``m_far`` records ahead by ``pf_far`` (into L2) and the
    trip ``m_near`` records ahead by ``pf_near`` (into L1)."""
    @kernel
    def gemv(tiles, x, out, m_far, m_near, unused):
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        dp = (16 * g + 63) // 64 * 64
        ft = m_far // g
        fb = m_far - ft * g
        nt = m_near // g
        nbb = m_near - nt * g
        for t in range(t_n):
            base = t * ts0
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                if ft < t_n:
                    q0 = ft * ts0 + dp + qb * fb
                    for j in range(0, n * qb, 64):
                        pf_far(tiles, q0 + j)
                    for j in range(0, n * 16, 64):
                        pf_far(tiles, ft * ts0 + 16 * fb + j)
                fb += n
                if fb >= g:
                    fb -= g
                    ft += 1
                if nt < t_n:
                    q0 = nt * ts0 + dp + qb * nbb
                    for j in range(0, n * qb, 64):
                        pf_near(tiles, q0 + j)
                    for j in range(0, n * 16, 64):
                        pf_near(tiles, nt * ts0 + 16 * nbb + j)
                nbb += n
                if nbb >= g:
                    nbb -= g
                    nt += 1
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0, base, sx8)
                b += n
            for kk in range(8):
                out[8 * t + kk] = acc[kk]
    return gemv


def make_old(code):
    """The x8 gemv loop before this experiment (git 1d32c80 ``_gemv_x8_simd``): the tile ~64 KiB
    ahead prefetched into L2 (``prefetcht1``) as one linear range, ceil(lines / G) lines per
    record, and the same share of the next tile again."""
    from numba_qk.kernels.simd.base import prefetch, prefetch_plan

    @kernel
    def gemv(tiles, x, out):
        ts0 = max(np.int64(tiles.strides[0]), np.int64(1))
        tiles_ahead = prefetch_plan(ts0, 1)[0] // ts0
        t_n, g = tiles.shape[0], x.shape[0]
        ts0, xs0 = tiles.strides[0], x.strides[0]
        xc8 = np.empty(8 * g, np.int32)
        dx8 = np.empty(8 * g, np.float32)
        sx8 = np.empty(8 * g if X8._X_S_AT[code] >= 0 else 0, np.float32)
        X8._x8_prepare(code, x, xc8, dx8, sx8)
        acc = np.empty(8, np.float32)
        qb = X8.X8_QS_BYTES_T[code]
        ab = X8.X8_AUX_BYTES_T[code]
        dp = ((16 + ab) * g + 63) // 64 * 64
        lines = (ts0 + 63) // 64 if tiles_ahead > 0 else 0
        per = (lines + g - 1) // max(g, 1)
        last = (t_n - 1) * ts0
        for t in range(t_n):
            base = t * ts0
            far = min(base + tiles_ahead * ts0, last)
            near = min(base + ts0, last) if tiles_ahead > 1 else far
            b = 0
            while b < g:
                n = TRIP if g - b >= TRIP else 1
                for j in range(b * per, min((b + n) * per, lines)):
                    prefetch(tiles, far + j * 64)
                if near != far:
                    for j in range(b * per, min((b + n) * per, lines)):
                        prefetch(tiles, near + j * 64)
                if n == TRIP:
                    legacy_x8_rows(code, TRIP, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0,
                                   base + 16 * g + ab * b, sx8)
                else:
                    legacy_x8_rows(code, 1, tiles, base + 16 * b, base + dp + qb * b, x,
                                   b * xs0, xc8, dx8, 8 * b, acc, b == 0,
                                   base + 16 * g + ab * b, sx8)
                b += n
            for k in range(8):
                out[8 * t + k] = acc[k]
    return gemv


def make_new(code, ahead=None):
    """The committed kernel (``ahead`` None: its own distance), or its loop at ``ahead``
    records."""
    if ahead is None:
        @kernel
        def gemv(tiles, x, out):
            X8.gemv_x8_simd(code, tiles, x, out)
    else:
        @kernel
        def gemv(tiles, x, out):
            X8._gemv_x8_simd_ahead(code, tiles, x, out, TRIP, ahead)
    return gemv


def variants(fmt, code, ts0):
    """name -> f(tiles, xq, out)."""
    LIN = {k: make_linear(v, code) for k, v in PF.items()}
    PAIR = {k: make_pair(v, code) for k, v in PF.items()}
    ST = {k: make_struct(v, code) for k, v in PF.items()}
    RC = {k: make_rec(v, code) for k, v in PF.items()}
    v = {"old": make_old(code), "new": make_new(code)}
    for m in (0, 32, 64, 96, 128):
        v[f"new-at{m}"] = make_new(code, m)
    if X8.X8_AUX_BYTES_T[code]:
        return v       # the exploration kernels below know no aux plane
    v["none"] = lambda t, x, o: LIN["t1"](t, x, o, 0, False, 1)
    TWO = make_two(PF["t1"], PF["t0"], code)
    TWO2 = make_two(PF["t2"], PF["t0"], code)
    for mf in (256, 384, 512):
        for mn in (64, 96):
            v[f"two{mf}-{mn}"] = (lambda mf=mf, mn=mn: lambda t, x, o: TWO(t, x, o, mf, mn, 0))()
            v[f"two{mf}-{mn}-t2"] = (lambda mf=mf, mn=mn: lambda t, x, o: TWO2(t, x, o, mf, mn, 0))()
    for kb in (16, 32, 64, 128, 256):
        d = -(-(kb << 10) // ts0) * ts0
        for loc in ("t1", "t0", "t2", "nta"):
            v[f"lin{kb}K-{loc}"] = (lambda d=d, loc=loc:
                                   lambda t, x, o: LIN[loc](t, x, o, d, False, 1))()
        v[f"lin{kb}K-t1-near"] = (lambda d=d: lambda t, x, o: LIN["t1"](t, x, o, d, True, 1))()
        v[f"lin{kb}K-t1-x2"] = (lambda d=d: lambda t, x, o: LIN["t1"](t, x, o, d, False, 2))()
    for k in (1, 2, 3, 4, 6, 8):
        for loc in ("t0", "t1", "t2", "nta"):
            v[f"st{k}-{loc}"] = (lambda k=k, loc=loc: lambda t, x, o: ST[loc](t, x, o, k, True, 0))()
        v[f"st{k}-t0-nod"] = (lambda k=k: lambda t, x, o: ST["t0"](t, x, o, k, False, 0))()
    for m in (8, 16, 32, 48, 64, 80, 96, 112, 128, 192, 256):
        for loc in ("t0", "t1", "nta"):
            v[f"rec{m}-{loc}"] = (lambda m=m, loc=loc: lambda t, x, o: RC[loc](t, x, o, m, True, 0))()
    for kb in (0, 32, 64, 128):
        d = -(-(kb << 10) // ts0) * ts0
        for gap, gname in ((1, "nb"), (0, "halves")):
            for loc in ("t1", "t0"):
                v[f"pair-{gname}-{kb}K-{loc}"] = (lambda d=d, gap=gap, loc=loc:
                                                 lambda t, x, o: PAIR[loc](t, x, o, d, gap, 1))()
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", default="iq4_nl")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--stream-mb", type=int, default=128)
    ap.add_argument("--variants", default="old,new", help="comma-separated names or 'all'")
    ap.add_argument("--hot", action="store_true", help="also time each variant hot")
    args = ap.parse_args()
    fmt = getattr(qk.quant, args.fmt)
    from numba_qk.kernels.legacy import layout as LL
    code = X8_IQ4_NL if fmt is qk.quant.iq4_nl else LL.CODES[fmt]
    rng = np.random.default_rng(3)
    rows, cols = args.rows, args.cols
    wm = qk.quantize(rng.standard_normal((rows * cols // 32, 32)).astype(np.float32),
                     format=fmt).reshape(rows, cols // 32, -1)
    xv = rng.standard_normal(cols).astype(np.float32)
    xq = qk.quantize(xv.reshape(-1, 32), format=qk.activation_format(fmt))
    tiles0 = X8.repack_x8(code, wm)[0]
    n = max(2, -(-(args.stream_mb << 20) // tiles0.nbytes))
    tiles = [X8.repack_x8(code, wm.copy())[0] for _ in range(n)]
    ts0 = tiles[0].strides[0]
    vs = variants(fmt, code, ts0)
    if args.variants != "all":
        vs = {k: vs[k] for k in args.variants.split(",")}
    ref = np.empty(8 * tiles[0].shape[0], np.float32)
    make_old(code)(tiles[0], xq, ref)
    out = np.empty_like(ref)
    for name, f in vs.items():
        out[:] = np.nan
        f(tiles[0], xq, out)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), name
    print(f"{fmt.name} {rows}x{cols}: {n} copies of {tiles[0].nbytes / 1e6:.2f} MB; "
          f"load {__import__('os').getloadavg()[0]:.2f}", flush=True)
    times = {k: [] for k in vs}
    hot = {k: [] for k in vs}
    i = 0
    for _ in range(args.rounds):
        for name, f in vs.items():
            for _ in range(n):   # one full cycle per variant per round
                tl = tiles[i % n]
                i += 1
                t0 = time.perf_counter()
                f(tl, xq, out)
                times[name].append(time.perf_counter() - t0)
            if args.hot:
                for _ in range(4):
                    t0 = time.perf_counter()
                    f(tiles[0], xq, out)
                    hot[name].append(time.perf_counter() - t0)
    nb = tiles[0].nbytes
    for name in vs:
        ts = sorted(times[name])
        med = ts[len(ts) // 2]
        q = [ts[int(p * (len(ts) - 1))] * 1e3 for p in (0.1, 0.25, 0.75, 0.9)]
        line = (f"{name:24s} best {ts[0] * 1e3:.3f}  median {med * 1e3:.3f} ms  "
                f"({nb / med / 1e9:5.1f} GB/s median; p10/25/75/90 "
                f"{q[0]:.3f}/{q[1]:.3f}/{q[2]:.3f}/{q[3]:.3f})")
        if args.hot:
            h = sorted(hot[name])
            line += f"  hot best {h[0] * 1e3:.3f} median {h[len(h) // 2] * 1e3:.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
