"""A batch's gemm shared between a model's standing helpers by bands of 8 weight rows claimed
one at a time (decision 052), for the formats whose batches run a panel gemm.

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

Two families of panel gemm: the legacy formats' (``legacy.kernels.panel_gemm_over``, Q8_0/Q8_1
activations) and the driver's (``drive.panel_gemm``: Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS and the grid
IQ formats, Q8_K activations; the gemm carries its decoder and microtile as ``band_parts``).
Only where those run (AVX-512 VNNI); ``band_job(fmt, gemm)`` is None elsewhere and for the
other formats (Q4_K's gemm is its own, AMX-INT8 where the host has it).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray

from numba_qk._jit import kernel
from numba_qk.kernels._pool import compare_exchange, load_acquire, pointer_to, post, work_of
from numba_qk.kernels import drive
from numba_qk.kernels.drive import aligned_zeros
from numba_qk.kernels.legacy import kernels as _legacy
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


@kernel
def _claim(regions, region, own):
    """The next band of ``region``: from its front for its owner, from its back for another
    thread; -1 when none is left."""
    if own:
        return claim_front(regions, region * REGION_WORDS)
    return claim_back(regions, region * REGION_WORDS)


@kernel
def _locate(table, band):
    """``(i, rows before, bands before)``: the weight of ``table`` (``[n, 2]``: address, rows)
    holding global band ``band`` of the stack, with the rows and bands of the weights before
    it."""
    rows_before = np.int64(0)
    bands_before = np.int64(0)
    for i in range(table.shape[0]):
        nb = (table[i, 1] + np.int64(7)) // np.int64(8)
        if band < bands_before + nb:
            return i, rows_before, bands_before
        rows_before += table[i, 1]
        bands_before += nb
    return np.int64(-1), rows_before, bands_before


@kernel
def _described(x_at, d0):
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
def _legacy_job(wcode):
    """The band job of legacy weight format ``wcode`` (``legacy.kernels.panel_gemm_over``'s
    band step: Q8_0 / Q8_1 activations in the legacy tiles)."""
    decode = legacy_panel_decode

    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        table, wb, x, outs, regions = _described(x_at, d0)
        T, G = x.shape[0], x.shape[1]
        tiles = (T + _LANES - 1) // _LANES
        xt, xb = aligned_zeros(tiles * G * LXT_BYTES)
        _legacy.x_tiles16(wcode, x, xt, xb)
        dec, db = aligned_zeros(8 * G * LDEC_BYTES)
        acc = np.empty(8 * _LANES, np.float32)
        ws0 = G * wb
        ahead, lines = prefetch_plan(ws0, 1)
        for k in range(d0):
            region = (r0 + k) % d0
            while True:
                band = _claim(regions, region, k == 0)
                if band < 0:
                    break
                i, rows_before, bands_before = _locate(table, band)
                rows = table[i, 1]
                w = carray(pointer_to(table[i, 0], np.uint8), (rows, G, wb))
                out = outs[T * rows_before:T * (rows_before + rows)].reshape((T, rows))
                lb = band - bands_before
                r1b = min(rows, 8 * lb + 8)
                for r in range(8 * lb, r1b):
                    prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                    at = db + (r % 8) * LDEC_BYTES
                    for rec in range(G):
                        decode(wcode, w, r * ws0 + rec * wb, dec, at + 8 * rec * LDEC_BYTES)
                for tile in range(tiles):
                    na = min(_LANES, T - _LANES * tile)
                    legacy_microtile(wcode, dec, db, xt, xb + tile * G * LXT_BYTES, G, acc)
                    for row in range(r1b - 8 * lb):
                        for lane in range(na):
                            out[_LANES * tile + lane, 8 * lb + row] = acc[_LANES * row + lane]
    return kernel(job)


@functools.lru_cache(maxsize=None)
def _panel_job(decode, microtile):
    """The band job of a ``drive.panel_gemm`` format (its record ``decode`` and
    ``microtile``: Q8_K activations in the driver's tiles)."""
    XT, DEC = drive.PANEL_XT_BYTES, drive.PANEL_DEC_BYTES

    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        table, wb, x, outs, regions = _described(x_at, d0)
        T, G = x.shape[0], x.shape[1]
        tiles = (T + _LANES - 1) // _LANES
        xt, xb = aligned_zeros(tiles * G * XT)
        drive.x_tiles16(x, xt, xb)
        step = G * DEC                                  # bytes per decoded row
        dec, db = aligned_zeros(8 * step)
        acc = np.empty(8 * _LANES, np.float32)
        ws0 = G * wb
        ahead, lines = prefetch_plan(ws0, 1)
        for k in range(d0):
            region = (r0 + k) % d0
            while True:
                band = _claim(regions, region, k == 0)
                if band < 0:
                    break
                i, rows_before, bands_before = _locate(table, band)
                rows = table[i, 1]
                w = carray(pointer_to(table[i, 0], np.uint8), (rows, G, wb))
                out = outs[T * rows_before:T * (rows_before + rows)].reshape((T, rows))
                lb = band - bands_before
                r1b = min(rows, 8 * lb + 8)
                for r in range(8 * lb, r1b):
                    prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                    for rec in range(G):
                        decode(w, r * ws0 + rec * wb, dec, db + (r % 8) * step + rec * DEC)
                for tile in range(tiles):
                    na = min(_LANES, T - _LANES * tile)
                    for rec in range(G):
                        microtile(dec, db + rec * DEC, step, xt, xb + (tile * G + rec) * XT,
                                  acc, rec == 0)
                    for row in range(r1b - 8 * lb):
                        for lane in range(na):
                            out[_LANES * tile + lane, 8 * lb + row] = acc[_LANES * row + lane]
    return kernel(job)


def band_job(fmt, gemm):
    """The helpers' job (``_pool``'s signature) of a batch's gemm of weight format ``fmt`` (its
    serial gemm ``gemm``) by claimed bands, or None where no panel gemm runs for it.  ``x_at``
    addresses the product's description (``BAND_ARGS`` int64), ``d0`` is the number of regions
    and ``r0`` the region the call starts with."""
    if fmt in WEIGHT_FORMATS:
        return _legacy_job(CODES[fmt]) if _legacy.HAVE_LEGACY_VNNI else None
    parts = getattr(gemm, "band_parts", None)
    return _panel_job(*parts) if parts is not None else None


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
