"""A batch's legacy-format gemm shared between a model's standing helpers by bands of 8 weight
rows claimed one at a time (decision 052).

Split into one fixed chunk of rows a thread, a batch's product ends when the slower thread
ends, and with weights streamed from memory the two halves of one product differ a lot: a
prompt's products (SmolLM2, Q4_1, 32 tokens, every layer in turn) took 1.44-1.51x less time on
two threads than on one, though the same halves run on two threads without waiting for each
other per product took 1.73-1.82x less.  Finer chunks did not help: each gemm call lays out the
activations and decodes its panel anew (7-23 us a call at 32 tokens).  Here each thread lays out
the activations once per product and then claims bands: first from the front of a region of
its own (one contiguous stream, so that the prefetch ahead serves it), then from the back of
the others' regions (``claim_front``, ``claim_back``: two ends of one atomic word).  A band is
the panel gemm's step (``legacy.kernels.panel_gemm_over``): its 8 rows decoded once, then one
microtile per 16 activations folding every record of each row in order -- so every output is
the same canonical dot as in any other gemm of the format, whoever ran its band.

Only where the panel gemm runs (AVX-512 VNNI, ``HAVE_LEGACY_VNNI``); ``band_job(fmt)`` is None
elsewhere and for formats without a panel decode.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray

from numba_qk._jit import kernel
from numba_qk.kernels._pool import compare_exchange, load_acquire, pointer_to, post, work_of
from numba_qk.kernels.drive import aligned_zeros
from numba_qk.kernels.legacy.kernels import HAVE_LEGACY_VNNI, x_tiles16
from numba_qk.kernels.legacy.layout import CODES, WEIGHT_FORMATS
from numba_qk.kernels.simd.base import prefetch_lines, prefetch_plan
from numba_qk.kernels.simd.legacy import LDEC_BYTES, LXT_BYTES, legacy_microtile, legacy_panel_decode
from numba_qk.kernels.simd.stream import address_of

__all__ = ["BAND_ARGS", "REGION_WORDS", "band_job", "band_caller_of", "claim_back",
           "claim_front"]

_LANES = 16
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


@functools.lru_cache(maxsize=None)
def band_job(fmt):
    """The helpers' job (``_pool``'s signature) of a batch's gemm of legacy weight format
    ``fmt`` by claimed bands, or None where the panel gemm does not run.  ``x_at`` addresses
    the product's description (``BAND_ARGS`` int64), ``d0`` is the number of regions and
    ``r0`` the region this call starts with."""
    if not HAVE_LEGACY_VNNI or fmt not in WEIGHT_FORMATS:
        return None
    wcode = CODES[fmt]
    decode = legacy_panel_decode

    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        a = carray(pointer_to(x_at, np.int64), (BAND_ARGS,))
        nw, WB, T, G, B = a[BA_N], a[BA_WB], a[BA_T], a[BA_G], a[BA_B]
        table = carray(pointer_to(a[BA_TABLE], np.int64), (nw, 2))
        x = carray(pointer_to(a[BA_X], np.uint8), (T, G, B))
        total = np.int64(0)
        for i in range(nw):
            total += table[i, 1]
        outs = carray(pointer_to(a[BA_OUT], np.float32), (T * total,))
        regions = carray(pointer_to(a[BA_REGIONS], np.int64), (d0 * REGION_WORDS,))
        tiles = (T + _LANES - 1) // _LANES
        xt, xb = aligned_zeros(tiles * G * LXT_BYTES)
        x_tiles16(wcode, x, xt, xb)
        dec, db = aligned_zeros(8 * G * LDEC_BYTES)
        acc = np.empty(8 * _LANES, np.float32)
        ws0, ws1 = G * WB, WB
        ahead, lines = prefetch_plan(ws0, 1)
        for k in range(d0):
            region = (r0 + k) % d0
            while True:
                if k == 0:
                    band = claim_front(regions, region * REGION_WORDS)
                else:
                    band = claim_back(regions, region * REGION_WORDS)
                if band < 0:
                    break
                rows_before = np.int64(0)      # the band's weight: bands count per weight
                bands_before = np.int64(0)
                for i in range(nw):
                    rows = table[i, 1]
                    nb = (rows + np.int64(7)) // np.int64(8)
                    if band < bands_before + nb:
                        w = carray(pointer_to(table[i, 0], np.uint8), (rows, G, WB))
                        out = outs[T * rows_before:T * (rows_before + rows)].reshape((T, rows))
                        lb = band - bands_before
                        r1b = min(rows, 8 * lb + 8)
                        for r in range(8 * lb, r1b):
                            prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                            at = db + (r % 8) * LDEC_BYTES
                            for rec in range(G):
                                decode(wcode, w, r * ws0 + rec * ws1, dec,
                                       at + 8 * rec * LDEC_BYTES)
                        for tile in range(tiles):
                            na = min(_LANES, T - _LANES * tile)
                            legacy_microtile(wcode, dec, db, xt, xb + tile * G * LXT_BYTES, G,
                                             acc)
                            for row in range(r1b - 8 * lb):
                                for lane in range(na):
                                    out[_LANES * tile + lane, 8 * lb + row] = \
                                        acc[_LANES * row + lane]
                        break
                    rows_before += rows
                    bands_before += nb
    return kernel(job)


@functools.lru_cache(maxsize=None)
def band_caller_of(job):
    """``run(ctl, kind, args, regions, table, wb, x, out, wait_iters)``: post the product of a
    ``band_job`` (``kind`` its index in the helpers' ``serve``) over the weights of ``table``
    (int64 ``[n, 2]``: address, rows; C-contiguous records of ``wb`` bytes, as many per row as
    ``x`` has) on
    activation records ``x`` ``[t, g, b]`` into ``out`` (f32, each weight's ``[t, rows]`` one
    after another), its bands split into ``len(regions) // REGION_WORDS`` regions (one a
    thread, ``regions`` int64), ``args`` int64 ``[BAND_ARGS]`` the description; claim bands
    alongside the helpers and wait for theirs (``work_of``).  Returns as ``work_of``'s work."""
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
