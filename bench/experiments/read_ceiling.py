"""Single-thread read bandwidth ceiling of this core: a compiled streaming sum over a large uint8
buffer (512-bit loads through an LLVM IR loop), 1, 2, 4 or 8 independent streams (the buffer cut
into that many contiguous parts, read side by side), with and without software prefetch
(``llvm.prefetch`` at several distances and localities).  Throwaway probe for the DRAM-streamed
matvec (bench/RESULTS_iq_grid.md).

    python bench/experiments/read_ceiling.py [--mb 256] [--repeat 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from numba_qk.kernels.simd.base import byte_ptr, decl, i8, i32, i64, vec



def make_sum(streams: int, locality: int, width: int = 64, unroll: int = 1):
    """Intrinsic ``f(buf, nblocks, dist)``: sum of ``streams`` parts of ``buf`` (each
    ``nblocks * unroll * 64`` bytes, side by side), one ``width``-byte load at a time; per
    64-byte line read, one prefetch ``dist`` bytes ahead (locality ``locality``; none when
    dist == 0)."""
    vt = vec(i64, width // 8)

    @intrinsic
    def ssum(typingctx, buf, nblocks, dist):
        sig = types.int64(buf, types.intp, types.intp)

        def codegen(context, b, signature, args):
            buf_v, nb_v, dist_v = args
            base = byte_ptr(context, b, signature.args[0], buf_v, ir.Constant(i64, 0))
            part = b.mul(nb_v, ir.Constant(i64, 64 * unroll))
            accs = [cgutils.alloca_once_value(b, ir.Constant(vt, None))
                    for _ in range(streams * unroll * (64 // width))]
            pf_fn = decl(b, "llvm.prefetch.p0i8", ir.VoidType(), [i8.as_pointer(), i32, i32, i32])
            do_pf = b.icmp_signed("!=", dist_v, ir.Constant(i64, 0))
            with cgutils.for_range(b, nb_v) as loop:
                off = b.mul(loop.index, ir.Constant(i64, 64 * unroll))
                k = 0
                for s in range(streams):
                    sp = b.gep(base, [b.add(off, b.mul(part, ir.Constant(i64, s)))])
                    for u in range(unroll):
                        lp = b.gep(sp, [ir.Constant(i64, 64 * u)])
                        with b.if_then(do_pf):
                            b.call(pf_fn, [b.gep(lp, [dist_v]), ir.Constant(i32, 0),
                                           ir.Constant(i32, locality), ir.Constant(i32, 1)])
                        for h in range(64 // width):
                            p = b.bitcast(b.gep(lp, [ir.Constant(i64, width * h)]), vt.as_pointer())
                            v = b.load(p, align=64)
                            b.store(b.add(b.load(accs[k]), v), accs[k])
                            k += 1
            tot = b.load(accs[0])
            for a in accs[1:]:
                tot = b.add(tot, b.load(a))
            s = b.extract_element(tot, ir.Constant(i32, 0))
            for j in range(1, vt.count):
                s = b.add(s, b.extract_element(tot, ir.Constant(i32, j)))
            return s
        return sig, codegen

    @njit(nogil=True, cache=False)
    def run(buf, nblocks, dist):
        return ssum(buf, nblocks, dist)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    nbytes = args.mb << 20
    raw = np.empty(nbytes + 4096, np.uint8)
    at = -raw.ctypes.data % 4096
    buf = raw[at:at + nbytes]
    buf[:] = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)

    @njit(nogil=True, cache=False)
    def plain(a):            # numba's own vectorization of an int64 sum (bench/compare.py)
        s = 0
        for i in range(a.shape[0]):
            s += a[i]
        return s

    cases = []
    w64 = buf.view(np.int64)
    cases.append(("numba int64 loop", lambda: plain(w64)))
    for width in (32, 64):
        for streams in (1, 2, 4, 8):
            fn = make_sum(streams, 2, width)
            nb = nbytes // (64 * streams)
            for dist, loc in ((0, 2), (1024, 2), (4096, 2), (16384, 2), (65536, 2),
                              (4096, 3), (4096, 1), (4096, 0)):
                if width == 32 and dist not in (0,):
                    continue
                if streams == 8 and dist not in (0, 4096, 65536):
                    continue
                f = fn if loc == 2 else make_sum(streams, loc, width)
                name = f"{width * 8}b x{streams} pf{dist // 1024}K-t{ {3: '0', 2: '1', 1: '2', 0: 'nta'}[loc]}" \
                    if dist else f"{width * 8}b x{streams} no-pf"
                cases.append((name, lambda f=f, nb=nb, dist=dist: f(buf, nb, dist)))
    ref = int(w64.sum())
    for name, f in cases:
        assert f() == ref, name
    # interleaved rounds: best per case
    best = {name: float("inf") for name, _ in cases}
    for _ in range(args.repeat):
        for name, f in cases:
            t0 = time.perf_counter()
            f()
            best[name] = min(best[name], time.perf_counter() - t0)
    for name, _ in cases:
        print(f"{name:28s} {nbytes / best[name] / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
