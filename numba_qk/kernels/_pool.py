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

import functools

import numpy as np
from llvmlite import ir
from numba import carray, config
from numba.core import types
from numba.extending import intrinsic

from numba_qk._jit import kernel
from numba_qk.kernels.simd.stream import address_of, x86_hint

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


# -- standing helpers ---------------------------------------------------------------------------
# A decoded token runs ~120 products of 0.1-1 M weights, a few microseconds each on one core;
# a hand-off through the pool's Python workers costs ~13 us (their GIL round trip), so most of
# them stayed on one thread.  A standing helper instead stays in compiled code between products
# (``serve``): the caller posts each product in ``ctl`` (the weights, activations and output by
# address) and both claim its row chunks; nothing on either side takes the GIL.

@intrinsic
def pointer_to(typingctx, addr, dtype):
    """A typed pointer to address ``addr`` (an int64) for ``numba.carray``: ``dtype`` is a numpy
    scalar type (``np.uint8``)."""
    if not isinstance(dtype, types.NumberClass) or not isinstance(addr, types.Integer):
        return None
    sig = types.CPointer(dtype.instance_type)(addr, dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def compare_exchange(typingctx, arr, idx, expected, v):
    """``arr[idx] = v`` if it holds ``expected``, as one atomic step (sequentially consistent);
    returns the value it held.  ``arr`` is a 1-D int64 array."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        ptr = _cell(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return sig, codegen


# ``ctl`` of a helper group (int64): the posted product on the first cache line (written by the
# caller before it publishes ``SEQ``), the claim word and the done count on lines of their own,
# then one line per helper: ``AWAKE`` (1 while it is in ``serve``), then the count of its
# entries into ``serve`` and of the chunks it ran.
SEQ, KIND, W_AT, W_D0, W_D1, W_D2, X_AT, X_T, X_G, X_B, OUT_AT, OUT_N, CHUNK, PER, STOP = \
    range(15)
NEXT, DONE, AWAKE = 16, 24, 32
#: the claim word: ``seq << 32 | chunks << 16 | chunks claimed``
MAX_CHUNKS = (1 << 16) - 1


def ctl_words(helpers: int) -> int:
    return AWAKE + 8 * helpers


@kernel
def claim(ctl, seq):
    """The next unclaimed chunk of product ``seq``, or -1 once none is left (or ``seq`` is no
    longer the posted product).  The product's number and chunk count share one atomic word
    with the count claimed, so a late claim can never take a chunk of the next product."""
    while True:
        v = load_acquire(ctl, NEXT)
        if (v >> np.int64(32)) != seq:
            return np.int64(-1)
        i = v & np.int64(0xFFFF)
        if i >= ((v >> np.int64(16)) & np.int64(0xFFFF)):
            return np.int64(-1)
        if compare_exchange(ctl, NEXT, v, v + np.int64(1)) == v:
            return i


# A job: ``job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)`` runs a serial kernel
# on weight rows ``[r0, r1)`` of the C-contiguous uint8 array at ``w_at`` (2-D ``[d0, d1]`` or
# 3-D ``[d0, d1, d2]``) against the activation records at ``x_at`` (``[g, b]`` for one token,
# ``[t, g, b]`` for a batch) into the f32 output at ``out_at`` (``[n]``, or ``[t, n]``).

@functools.lru_cache(maxsize=None)
def rows_job(fn, ndim):
    """The job of a serial gemv ``fn(w, x, out)``: rows ``[r0, r1)`` write
    ``out[per * r0:per * r1]`` (``per`` outputs per weight row: 8 for an x8 tile)."""
    # two functions of their own (not one name for two codes: _jit.closure_named names a
    # closure by its qualified name and its cells, and both hold only ``fn``)
    if ndim == 3:
        def job_3d(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
            w = carray(pointer_to(w_at, np.uint8), (d0, d1, d2))
            x = carray(pointer_to(x_at, np.uint8), (g, b))
            out = carray(pointer_to(out_at, np.float32), (n,))
            fn(w[r0:r1], x, out[r0 * per:min(n, r1 * per)])
        return kernel(job_3d)
    if ndim == 2:
        def job_2d(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
            w = carray(pointer_to(w_at, np.uint8), (d0, d1))
            x = carray(pointer_to(x_at, np.uint8), (g, b))
            out = carray(pointer_to(out_at, np.float32), (n,))
            fn(w[r0:r1], x, out[r0 * per:min(n, r1 * per)])
        return kernel(job_2d)
    raise ValueError(f"rows_job: weights of {ndim} dimensions")


@functools.lru_cache(maxsize=None)
def batch_rows_job(fn):
    """The job of a serial gemm ``fn(w, x, out)`` (``out[t, rows]``) over the rows of one or
    more weights that read the same activations (q/k/v, gate/up: one product instead of one
    each), stacked in the order given.  ``w_at`` addresses an int64 table ``[n, 2]``: each
    weight's address (C-contiguous uint8 ``[rows, d1, d2]``, the same ``d1`` and ``d2`` for
    all) and rows; ``d0`` is the rows of all; the f32 output at ``out_at`` holds each weight's
    ``[t, rows]`` one after another.  Rows ``[r0, r1)`` of the stack: each weight's part is
    computed into a contiguous block (the serial gemms are compiled for contiguous outputs)
    and copied into place."""
    @kernel
    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        table = carray(pointer_to(w_at, np.int64), (n, 2))
        x = carray(pointer_to(x_at, np.uint8), (t, g, b))
        outs = carray(pointer_to(out_at, np.float32), (t * d0,))
        base = np.int64(0)
        for i in range(n):
            rows = table[i, 1]
            lo, hi = max(r0, base), min(r1, base + rows)
            if lo < hi:
                w = carray(pointer_to(table[i, 0], np.uint8), (rows, d1, d2))
                out = outs[t * base:t * (base + rows)].reshape((t, rows))
                block = np.empty((t, hi - lo), np.float32)
                fn(w[lo - base:hi - base], x, block)
                out[:, lo - base:hi - base] = block
            base += rows
    return job


@functools.lru_cache(maxsize=None)
def batch_caller_of(job):
    """``run(ctl, kind, table, d1, d2, x, out, chunks, chunk, wait_iters)``: post the product
    of ``job`` (a ``batch_rows_job``; ``kind`` its index in the helpers' ``serve``) of the
    weights in ``table`` (int64 ``[n, 2]``: address, rows) on activation records ``x``
    ``[t, g, b]`` into ``out`` (f32, each weight's ``[t, rows]`` one after another), all
    C-contiguous, in ``chunks`` chunks of ``chunk`` stacked rows; claim and run chunks
    alongside the helpers and wait for theirs (``work_of``)."""
    work = work_of(job)

    @kernel
    def run(ctl, kind, table, d1, d2, x, out, chunks, chunk, wait_iters):
        w_at, x_at, out_at = address_of(table), address_of(x), address_of(out)
        t, g, b = np.int64(x.shape[0]), np.int64(x.shape[1]), np.int64(x.shape[2])
        n = np.int64(table.shape[0])
        d0 = np.int64(0)
        for i in range(table.shape[0]):
            d0 += table[i, 1]
        one = np.int64(1)
        seq = post(ctl, kind, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, one)
        return work(ctl, seq, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, one,
                    wait_iters)

    return run


@kernel
def post(ctl, kind, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, per):
    """Publish a product in ``ctl`` (its fields, then the claim word, then ``SEQ``); returns
    its number."""
    seq = ctl[SEQ] + np.int64(1)     # only the caller writes SEQ
    ctl[KIND] = kind
    ctl[W_AT] = w_at
    ctl[W_D0] = d0
    ctl[W_D1] = d1
    ctl[W_D2] = d2
    ctl[X_AT] = x_at
    ctl[X_T] = t
    ctl[X_G] = g
    ctl[X_B] = b
    ctl[OUT_AT] = out_at
    ctl[OUT_N] = n
    ctl[CHUNK] = chunk
    ctl[PER] = per
    store_release(ctl, DONE, np.int64(0))
    store_release(ctl, NEXT, (seq << np.int64(32)) | (np.int64(chunks) << np.int64(16)))
    store_release(ctl, SEQ, seq)
    return seq


@functools.lru_cache(maxsize=None)
def work_of(job):
    """``work(ctl, seq, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, per,
    wait_iters)``: the caller's share of product ``seq`` (posted with these fields): claim and
    run chunks of ``job`` (``d0`` rows, ``chunk`` a chunk) alongside the helpers, count each
    done, then spin up to ``wait_iters`` polls until all ``chunks`` are.  Returns 1 when they
    are, else 0 (a helper still holds one: wait with ``wait_count(ctl, DONE, chunks, ...)``)."""
    @kernel
    def work(ctl, seq, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, per,
             wait_iters):
        while True:
            i = claim(ctl, seq)
            if i < 0:
                break
            r0 = i * chunk
            job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0,
                min(np.int64(d0), r0 + chunk), per)
            fetch_add(ctl, DONE, np.int64(1))
        return wait_count(ctl, DONE, chunks, wait_iters)

    return work


@functools.lru_cache(maxsize=None)
def caller_of(job):
    """``run(ctl, kind, w_at, d0, d1, d2, x, out, chunks, chunk, per, wait_iters)``: post the
    product of ``job`` (``kind``: its index in the helpers' ``serve``) on one token's
    activation records ``x`` ``[g, b]`` into ``out`` ``[n]`` (both C-contiguous), in ``chunks``
    chunks of ``chunk`` weight rows; claim and run chunks alongside the helpers and wait for
    theirs (``work_of``).  A batch: ``batch_caller_of``."""
    work = work_of(job)

    @kernel
    def run(ctl, kind, w_at, d0, d1, d2, x, out, chunks, chunk, per, wait_iters):
        x_at, out_at = address_of(x), address_of(out)
        t, g, b = np.int64(1), np.int64(x.shape[0]), np.int64(x.shape[1])
        n = np.int64(out.shape[0])
        seq = post(ctl, kind, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, per)
        return work(ctl, seq, w_at, d0, d1, d2, x_at, t, g, b, out_at, n, chunks, chunk, per,
                    wait_iters)

    return run


@functools.lru_cache(maxsize=None)
def arrays_caller_of(job):
    """``run(ctl, kind, wa, xa, oa, d0, d1, d2, chunks, chunk, per, wait_iters)``: post the
    product of ``job`` with the addresses of the C-contiguous arrays ``wa``, ``xa`` and ``oa``
    (any dtypes; the job knows what they are) as ``w_at``, ``x_at`` and ``out_at``, ``d0`` rows
    in ``chunks`` chunks of ``chunk``; then as ``caller_of``'s ``run``."""
    work = work_of(job)

    @kernel
    def run(ctl, kind, wa, xa, oa, d0, d1, d2, chunks, chunk, per, wait_iters):
        w_at, x_at, out_at = address_of(wa), address_of(xa), address_of(oa)
        zero = np.int64(0)
        seq = post(ctl, kind, w_at, d0, d1, d2, x_at, zero, zero, zero, out_at, zero, chunks,
                   chunk, per)
        return work(ctl, seq, w_at, d0, d1, d2, x_at, zero, zero, zero, out_at, zero, chunks,
                    chunk, per, wait_iters)

    return run


def _no_job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
    pass


_no_job = kernel(_no_job)
#: kinds one ``serve`` handles (a product of another kind is split another way)
KINDS = 14


@functools.lru_cache(maxsize=None)
def server_of(jobs):
    """``serve(ctl, me, idle_iters)``: helper ``me``'s loop over the products posted in
    ``ctl`` for the jobs ``jobs`` (at most ``KINDS``; a product names its job by index): claim
    and run chunks of each, count them done; return after ``idle_iters`` polls with nothing
    posted, or once ``ctl[STOP]`` is set, clearing ``ctl[AWAKE + 8 me]``."""
    if len(jobs) > KINDS:
        raise ValueError(f"server_of: {len(jobs)} kinds, at most {KINDS}")
    (j0, j1, j2, j3, j4, j5, j6, j7, j8, j9, j10, j11, j12,
     j13) = tuple(jobs) + (_no_job,) * (KINDS - len(jobs))

    @kernel
    def serve(ctl, me, idle_iters):
        mine = AWAKE + np.int64(8) * me
        fetch_add(ctl, mine + np.int64(1), np.int64(1))   # entries
        seen = load_acquire(ctl, SEQ)
        idle = np.int64(0)
        while idle < idle_iters:
            seq = load_acquire(ctl, SEQ)
            if seq == seen:
                idle += np.int64(1)
                cpu_relax()
                continue
            seen = seq
            idle = np.int64(0)
            if load_acquire(ctl, STOP):
                break
            while True:
                i = claim(ctl, seq)
                if i < 0:
                    break
                # a claim of product seq means it is not done, so ctl still describes it
                kind, chunk, d0 = ctl[KIND], ctl[CHUNK], ctl[W_D0]
                w_at, d1, d2, x_at = ctl[W_AT], ctl[W_D1], ctl[W_D2], ctl[X_AT]
                t, g, b, out_at, n = ctl[X_T], ctl[X_G], ctl[X_B], ctl[OUT_AT], ctl[OUT_N]
                r0 = i * chunk
                r1 = min(d0, r0 + chunk)
                per = ctl[PER]
                # one branch a kind, written out: ``literal_unroll`` over the tuple of jobs
                # types them as numba's experimental first-class functions
                if kind == 0:
                    j0(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 1:
                    j1(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 2:
                    j2(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 3:
                    j3(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 4:
                    j4(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 5:
                    j5(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 6:
                    j6(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 7:
                    j7(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 8:
                    j8(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 9:
                    j9(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 10:
                    j10(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 11:
                    j11(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                elif kind == 12:
                    j12(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                else:
                    j13(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per)
                fetch_add(ctl, DONE, np.int64(1))
                ctl[mine + np.int64(2)] += np.int64(1)   # chunks this helper ran
        store_release(ctl, mine, np.int64(0))
        return np.int64(0)

    return serve


# -- products by claimed bands (decision 052) ----------------------------------------------------
# Split into one fixed chunk of rows a thread, a batch's product ends when the slower thread ends,
# and with weights streamed from memory the two halves of one product differ a lot: a prompt's
# products (SmolLM2, Q4_1, 32 tokens, every layer in turn) took 1.44-1.51x less time on two
# threads than on one, though the same halves run on two threads without waiting for each other
# per product took 1.73-1.82x less.  Finer chunks did not help: each gemm call lays out the
# activations and decodes its panel anew (7-23 us a call at 32 tokens).  A *band job* (a panel
# gemm's ``band_job``: ``drive.panel_band_job``, ``legacy.kernels.legacy_band_job``) lays out
# the activations once per product and thread, then claims bands of 8 weight rows: first from the
# front of a region of its own (one contiguous stream, which the prefetch ahead serves), then
# from the back of the other threads' regions (``claim_front``, ``claim_back``: two ends of one
# atomic word).  A band is the panel gemm's own step, so every output is the same canonical dot
# whoever ran its band.  The product's chunks are its regions (one a thread): a thread still
# stealing holds its own region's chunk, so the product is done only once every thief is.

_LOW = np.int64(0xFFFFFFFF)
_ONE_HIGH = np.int64(1) << np.int64(32)

#: slots of a band product's description (int64): the weights' table (address, rows per
#: weight), its length, the bytes of a weight record, the activation records (address, batch,
#: records per row, bytes per record), the output (each weight's ``[batch, rows]`` one after
#: another) and the regions
(BA_TABLE, BA_N, BA_WB, BA_X, BA_T, BA_G, BA_B, BA_OUT, BA_REGIONS) = range(9)
BAND_ARGS = 16
#: int64 words per region (one region word a cache line)
REGION_WORDS = 8


@kernel
def claim_front(words, at):
    """The first unclaimed band of the region ``words[at]`` (``lo << 32 | hi``: bands
    ``[lo, hi)`` left), or -1 when none is left."""
    while True:
        v = load_acquire(words, at)
        lo, hi = v >> np.int64(32), v & _LOW
        if lo >= hi:
            return np.int64(-1)
        if compare_exchange(words, at, v, v + _ONE_HIGH) == v:
            return lo


@kernel
def claim_back(words, at):
    """The last unclaimed band of the region ``words[at]``, or -1 when none is left."""
    while True:
        v = load_acquire(words, at)
        lo, hi = v >> np.int64(32), v & _LOW
        if lo >= hi:
            return np.int64(-1)
        if compare_exchange(words, at, v, v - np.int64(1)) == v:
            return hi - np.int64(1)


@kernel
def next_band(table, regions, r0, tried):
    """The next band a thread that started with region ``r0`` runs: ``(i, rows before,
    band)`` -- weight ``i`` of ``table`` (``[n, 2]``: address, rows), the rows of the weights
    before it, the band within it -- or ``(-1, 0, 0)`` once every region is empty.  From the
    front of region ``r0``, then from the back of the others in turn; ``tried[0]`` (0 at the
    start) counts the regions left behind."""
    nreg = regions.shape[0] // REGION_WORDS
    while tried[0] < nreg:
        k = tried[0]
        at = ((r0 + k) % nreg) * REGION_WORDS
        band = claim_front(regions, at) if k == 0 else claim_back(regions, at)
        if band >= 0:
            rows_before = np.int64(0)
            for i in range(table.shape[0]):
                nb = (table[i, 1] + np.int64(7)) // np.int64(8)
                if band < nb:
                    return np.int64(i), rows_before, band
                band -= nb
                rows_before += table[i, 1]
        tried[0] = k + 1
    return np.int64(-1), np.int64(0), np.int64(0)


@kernel
def band_arrays(table, outs, x, wb, i, rows_before):
    """Weight ``i`` of ``table`` as records ``[rows, g, wb]`` and its output ``[t, rows]`` in
    ``outs`` (each weight's one after another), for activations ``x`` ``[t, g, b]``."""
    rows = table[i, 1]
    T, G = x.shape[0], x.shape[1]
    w = carray(pointer_to(table[i, 0], np.uint8), (rows, G, wb))
    return w, outs[T * rows_before:T * (rows_before + rows)].reshape((T, rows))


@kernel
def band_product(x_at, d0):
    """The arrays of a band product's description at ``x_at`` (``BAND_ARGS``): the weights'
    table, the bytes of a weight record, the activation records, the outputs (flat) and the
    ``d0`` regions' words."""
    a = carray(pointer_to(x_at, np.int64), (BAND_ARGS,))
    nw, T, G, B = a[BA_N], a[BA_T], a[BA_G], a[BA_B]
    table = carray(pointer_to(a[BA_TABLE], np.int64), (nw, 2))
    x = carray(pointer_to(a[BA_X], np.uint8), (T, G, B))
    total = np.int64(0)
    for i in range(nw):
        total += table[i, 1]
    outs = carray(pointer_to(a[BA_OUT], np.float32), (T * total,))
    regions = carray(pointer_to(a[BA_REGIONS], np.int64), (d0 * REGION_WORDS,))
    return table, a[BA_WB], x, outs, regions


@functools.lru_cache(maxsize=None)
def band_caller_of(job):
    """``run(ctl, kind, args, regions, table, wb, x, out, wait_iters)``: post the product of a
    band job (a panel gemm's ``band_job``; ``kind`` its index in the helpers' ``serve``) over
    the weights of ``table`` (int64 ``[n, 2]``: address, rows; C-contiguous records of ``wb``
    bytes, as many per row as ``x`` has) on activation records ``x`` ``[t, g, b]`` into
    ``out`` (f32, each weight's ``[t, rows]`` one after another), its bands split into
    ``len(regions) // REGION_WORDS`` regions (one a thread, ``regions`` int64), ``args`` int64
    ``[BAND_ARGS]`` the description; claim bands alongside the helpers and wait for theirs
    (``work_of``).  Returns as ``work_of``'s work."""
    work = work_of(job)

    @kernel
    def run(ctl, kind, args, regions, table, wb, x, out, wait_iters):
        args[BA_TABLE] = address_of(table)
        args[BA_N] = table.shape[0]
        args[BA_WB] = wb
        args[BA_X] = address_of(x)
        args[BA_T] = x.shape[0]
        args[BA_G] = x.shape[1]
        args[BA_B] = x.shape[2]
        args[BA_OUT] = address_of(out)
        args[BA_REGIONS] = address_of(regions)
        bands = np.int64(0)
        for i in range(table.shape[0]):
            bands += (table[i, 1] + np.int64(7)) // np.int64(8)
        nreg = np.int64(regions.shape[0] // REGION_WORDS)
        for k in range(nreg):    # plain stores, published by post's release
            lo, hi = bands * k // nreg, bands * (k + 1) // nreg
            regions[k * REGION_WORDS] = (lo << np.int64(32)) | hi
        a_at = address_of(args)
        zero, one = np.int64(0), np.int64(1)
        seq = post(ctl, kind, zero, nreg, zero, zero, a_at, zero, zero, zero, zero, zero, nreg,
                   one, one)
        return work(ctl, seq, zero, nreg, zero, zero, a_at, zero, zero, zero, zero, zero, nreg,
                    one, one, wait_iters)

    return run
