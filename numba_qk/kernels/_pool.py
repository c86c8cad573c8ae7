"""Compiled halves of ``numba_qk._threads``: atomics, a bounded spin-wait, and row runners that
claim gemv row chunks without the GIL.

A threaded gemv through Python pieces paid, per call, one GIL round trip and one dispatch per
row chunk, a futex wake of the sleeping worker (an inter-processor interrupt on a VM) and an
``Event`` join (another one): 40-80 us around a 4096x4096 Q4_K matvec of ~160 us per thread.
Here each thread makes one call, :func:`rows_runner`'s kernel, which claims chunks with an
atomic counter, runs the format's serial gemv on each, counts it done, and -- on the caller
only -- spins until every chunk is counted.  The worker, between jobs, spins on a generation
counter (:func:`spin_until_changed`) for a bounded time before it sleeps.

Nothing here touches a value of the product: every output row is still written by exactly one
serial gemv call on the same records, so results do not depend on the thread count.

``HAVE_ATOMICS`` is False under ``NUMBA_DISABLE_JIT`` (intrinsics cannot run there): the pool
then uses its Python pieces and never spins.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import config
from numba.core import types
from numba.extending import intrinsic

from numba_qk._jit import kernel
from numba_qk.kernels.simd.stream import x86_hint

HAVE_ATOMICS = not config.DISABLE_JIT
_i64 = ir.IntType(64)


def _cell(context, builder, arrty, arr, idx):
    return builder.gep(context.make_array(arrty)(context, builder, arr).data, [idx])


def _int64_array(arr):
    return isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1


@intrinsic
def fetch_add(typingctx, arr, idx, v):
    """``arr[idx] += v`` as one atomic read-modify-write (sequentially consistent); returns the
    old value.  ``arr`` is a 1-D int64 array."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ptr = _cell(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def load_acquire(typingctx, arr, idx):
    """``arr[idx]`` read with acquire ordering (never hoisted out of a loop)."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_cell(context, builder, signature.args[0], args[0], args[1]),
                                   "acquire", 8)

    return sig, codegen


@intrinsic
def store_release(typingctx, arr, idx, v):
    """``arr[idx] = v`` with release ordering."""
    if not _int64_array(arr):
        return None
    sig = types.none(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _cell(context, builder, signature.args[0], args[0],
                                            args[1]), "release", 8)
        return context.get_dummy_value()

    return sig, codegen


# The spin-loop hint (x86 ``pause``: it yields the core's pipeline to its sibling and saves
# power); nothing elsewhere.
cpu_relax = x86_hint("sse2.pause")


@kernel
def spin_until_changed(cell, seen, iters, flags, slot, ack, ack_at, go):
    """The worker's wait for its next job.  Count ``ack[ack_at] += 1`` (the last job's caller
    waits for it: the worker is back in compiled code, so the GIL is free for the caller), then
    spin at most ``iters`` relaxed polls until ``cell[0] != seen`` (a job was posted).  If the
    poster also set ``cell[1] = g > 0``, keep spinning (at most ``iters`` polls more) until
    ``go[0] >= g``: the poster's runner counts itself there once it has released the GIL, so the
    worker then takes a free GIL instead of sleeping on it (a wake-up costs 5-30 us on a VM).
    Finally clear ``flags[slot]`` (the worker's "spinning" mark, which ``free_cores``
    discounts).  Returns 1 if a job was posted, else 0."""
    fetch_add(ack, ack_at, np.int64(1))
    changed = np.int64(0)
    for _ in range(np.int64(iters)):
        if load_acquire(cell, 0) != np.int64(seen):
            changed = np.int64(1)
            break
        cpu_relax()
    if changed:
        g = load_acquire(cell, 1)
        if g > 0:
            for _ in range(np.int64(iters)):
                if load_acquire(go, 0) >= g:
                    break
                cpu_relax()
    store_release(flags, slot, np.int64(0))
    return changed


@kernel
def wait_count(ctl, at, target, iters):
    """Spin at most ``iters`` relaxed polls until ``ctl[at] >= target``; 1 if it got there."""
    for _ in range(np.int64(iters)):
        if load_acquire(ctl, at) >= np.int64(target):
            return np.int64(1)
        cpu_relax()
    return np.int64(1) if load_acquire(ctl, at) >= np.int64(target) else np.int64(0)


_RUNNERS: dict = {}


def rows_runner(gemv, gemm=False):
    """A kernel ``run(w, x, out, ctl, chunk, wait_iters, caller, go, per)`` for the serial
    kernel ``gemv(w, x, out)`` (weights ``[rows, ...]``, ``out[per * rows]``: ``per`` outputs
    per weight row, e.g. the 16 rows of a repacked tile).  With ``gemm=True`` the serial kernel
    is a gemm ``(w, x, out)`` with ``out[batch, rows]`` (``per`` = 1): each chunk of rows
    ``[r0, r1)`` is computed into a contiguous block (the serial gemms are compiled for
    contiguous outputs) and copied to ``out[:, r0:r1]``.  ``ctl`` is an int64 array:
    ``[next chunk, chunks done, helpers back, threads entered]``; the caller counts its entry
    in ``go[0]`` too (``spin_until_changed``).  Each thread counts itself
    in ``ctl[3]``, claims row chunks ``[i * chunk, (i + 1) * chunk)`` through
    ``fetch_add(ctl, 0, 1)`` until none is left, runs ``gemv`` on each and counts it in
    ``ctl[1]``; then spins up to ``wait_iters`` polls until all chunks are counted.  Returns 1
    when they are (the product is complete), else 0.  The caller (``caller=1``) then also
    spins, within the same budget, until every helper that entered is back in its spin loop
    (``ctl[2]``, counted by the pool), so that it does not queue for the GIL behind a helper's
    Python bookkeeping; that wait changes no result.  The pool's workers pass
    ``wait_iters=0, caller=0``."""
    run = _RUNNERS.get((gemv, gemm))
    if run is None:
        @kernel
        def run(w, x, out, ctl, chunk, wait_iters, caller, go, per):
            fetch_add(ctl, 3, np.int64(1))
            if caller:
                fetch_add(go, 0, np.int64(1))   # the GIL is free now (see spin_until_changed)
            rows = np.int64(w.shape[0])
            step = max(np.int64(chunk), np.int64(1))
            n = (rows + step - np.int64(1)) // step
            while True:
                i = fetch_add(ctl, 0, np.int64(1))
                if i >= n:
                    break
                r0 = i * step
                r1 = min(rows, r0 + step)
                if gemm:   # a closure constant: numba compiles one branch only
                    block = np.empty((x.shape[0], r1 - r0), np.float32)
                    gemv(w[r0:r1], x, block)
                    out[:, r0:r1] = block
                else:
                    gemv(w[r0:r1], x, out[r0 * per:min(np.int64(out.shape[0]), r1 * per)])
                fetch_add(ctl, 1, np.int64(1))
            if wait_count(ctl, 1, n, wait_iters) == 0:
                return np.int64(0)
            if caller:
                for _ in range(np.int64(wait_iters)):
                    if load_acquire(ctl, 2) >= load_acquire(ctl, 3) - np.int64(1):
                        break
                    cpu_relax()
            return np.int64(1)

        _RUNNERS[(gemv, gemm)] = run
    return run
