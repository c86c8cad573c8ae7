"""The one dot / gemv / gemm driver of the record formats (the loops, the fold, prefetch and
leftover rows), for any format that brings a portable record dot; SIMD tiles are optional.

A format module registers its pieces under an int code (its GGML type id; a variant of a format,
e.g. a second tile for the same records, takes another unused int) and gets its three entry
points from ``kernels_for(code)``::

    register(code, loop_dot=..., value=..., rows_x8=..., acts_x8=..., prep=..., record_block=8,
             span=1)
    dot_<t>_<a>, gemv_<t>_<a>, gemm_<t>_<a> = kernels_for(code)

* ``loop_dot(w, x)`` (required): the dot of one row of records, any strides (the generic tier;
  with it alone the three entry points are complete: gemv and gemm call it per output);
* ``value(w, w_off, x, x_off)`` (optional): the record value v (DESIGN.md section 7) from byte
  offsets, records contiguous; the dot and the leftover rows of gemv fold it in record order;
* ``rows_x8(w, w_off, x, x_off, w_step, acc, at, first)`` (optional): the 8-row tile fold of
  gemv (lane k: the record ``w_step`` bytes further per row); with ``prep``, the tile is called
  ``rows_x8(w, w_off, x, x_off, w_step, acc, first, state, b)`` instead, ``state = prep(x)``
  computed once per gemv call (per-activation tables such as the FP4 formats' scale/sum rows);
* ``acts_x8(w, w_off, x, x_off, x_step, acc, at, first)`` (optional): the 8-activation tile of
  gemm (each weight record decoded once per tile of activations), blocks of ``record_block``
  records so that the tile's activation records stay in L1 while every row passes;
* ``span``: activation records per weight record (Q1_0: 4 Q8_0 records, Q2_0: 2): the SIMD
  pieces get the offset of the first, the others follow it (the SIMD paths are taken only where
  the activation records are consecutive, stride = their byte count; else ``loop_dot``).

The SIMD slots are used where the target has AVX2 (``simd.base.HAVE_AVX2``); a format whose
tile needs more (VNNI) registers the tile that its target has.  The loops:

* dot: with ``value``, the left fold of the record values (strided records: ``loop_dot``);
* gemv: with ``rows_x8``, tiles of 8 rows (one lane per row, each lane its own in-order fold)
  with a software prefetch of a tile ~64 KiB ahead (one linear share per record step:
  ``simd.base.prefetch_plan``; eight interleaved short row streams defeat the hardware
  prefetcher), leftover rows folded one record at a time (``value``) or by ``loop_dot``;
  without ``rows_x8``, every row that way;
* gemm: with ``acts_x8``, tiles of 8 activations over blocks of ``record_block`` records,
  leftover activations through gemv; without it, gemv per activation.

Every output is the left fold of the record values in record order, seeded with v_0 (G = 0 gives
+0.0), so all paths equal the portable dot bit for bit.

The per-record helpers are inlined at numba's IR level (``fold`` an ``inline="always"``
overload, the tile call and ``prep`` ``inline_kernel``s: the same as an overload, the NVFP4 gemv
ran 7% slower), the leftover row is not (inlined, its fold made the Q4_K gemv's tile loop 5%
slower), and SIMD pieces that wrap an intrinsic should be ``_jit.inline_kernel``s: a call per
record that passes arrays costs reference-count updates that LLVM's inlining does not always
remove (measured: NVFP4's gemv tile through a plain wrapper ran 1.5x the time of the tile
called in the loop).

The entry points are closures over the int code only, and the per-format pieces are picked at
typing time by the ``@overload``s below from the table ``_IMPL`` (closures over kernels are
cached too, ``_jit.DependencyCache``; one entry point per code keeps one compiled driver per
format and lets ``@njit`` code pick a format by a literal).  The placeholders
``fold``, ``dot``, ``gemv``, ``gemm`` may be called from ``@njit`` code with a literal code.
"""

import functools

import numpy as np
from numba.core import types
from numba.extending import overload

from numba_qk._jit import OVERLOAD_OPTIONS, closure_named, inline_kernel, kernel
from numba_qk.formats import quant as _quant
from numba_qk.kernels._pool import band_arrays, band_product, next_band
from numba_qk.kernels.simd import iq_grid as _panel
from numba_qk.kernels.simd.base import HAVE_AVX2, prefetch_lines, prefetch_plan
from numba_qk.kernels.simd.q4_k import array_address

_Q8K = _quant.q8_k

_IMPL = {}  # code -> dict of the pieces (see register)


def register(code: int, *, loop_dot, value=None, rows_x8=None, acts_x8=None, prep=None,
             record_block: int = 8, span: int = 1) -> None:
    """Bind a format's record-level pieces to ``code`` (see the module docstring)."""
    impl = dict(loop_dot=loop_dot, value=value, rows_x8=rows_x8, acts_x8=acts_x8, prep=prep,
                record_block=int(record_block), span=int(span))
    if code in _IMPL and _IMPL[code] != impl:
        raise AssertionError(f"driver code {code} bound twice")
    _IMPL[code] = impl


def _lookup(code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    return _IMPL[code.literal_value]


def _simd(impl, slot):
    """The SIMD piece in ``slot`` where the target runs it, else None."""
    return impl[slot] if HAVE_AVX2 else None


# Placeholders resolved by the overloads below.  Called as plain Python (only under
# NUMBA_DISABLE_JIT=1, where HAVE_AVX2 is False) they run the portable loops, as the overloads do.
def fold(code, w, w_at, w_step, x, x_at, x_step, g):
    """Left fold of the g record values at bytes w_at + b*w_step of w, x_at + b*x_step of x."""
    raise NotImplementedError  # only reached through the SIMD drivers


def dot(code, w, x):
    if w.shape[0] == 0:
        return np.float32(0.0)
    return _IMPL[code]["loop_dot"](w, x)


def gemv(code, w, x, out):
    for r in range(w.shape[0]):
        out[r] = dot(code, w[r], x)


def gemm(code, w, x, out):
    for a in range(x.shape[0]):
        gemv(code, w, x[a], out[a])


def _row(code, w, r, x, x_step, g):
    raise NotImplementedError


_MADE = {}


def _once(key, make):
    """One function per key in a process: an overload resolved again (another signature, or
    the gemv and gemm paths sharing a tile) returns the same function, so no two compiled
    functions share a qualified name (tests/package/test_jit_policy.py)."""
    fn = _MADE.get(key)
    if fn is None:
        fn = _MADE[key] = make()
    return fn


def _one_per_format(overload_fn):
    """An overload's implementation made once per format code (it depends on nothing else) and
    named by its cells' values (``closure_named``): the same function object for every
    signature, a name of its own per format."""
    @functools.wraps(overload_fn)
    def resolve(code, *args):
        if _lookup(code) is None:
            return None

        def make():
            fn = overload_fn(code, *args)
            if fn is None:
                return None
            if not fn.__closure__:   # no per-format values: one function for every format
                return _once((overload_fn.__name__, fn.__code__), lambda: fn)
            return closure_named(fn)
        return _once((overload_fn.__name__, code.literal_value), make)
    return resolve


@overload(fold, jit_options=OVERLOAD_OPTIONS, inline="always")
@_one_per_format
def _fold_overload(code, w, w_at, w_step, x, x_at, x_step, g):
    impl = _lookup(code)
    if impl is None or impl["value"] is None:
        return None
    value = impl["value"]

    def fold_impl(code, w, w_at, w_step, x, x_at, x_step, g):
        acc = np.float32(0.0)
        for b in range(g):
            v = value(w, w_at + b * w_step, x, x_at + b * x_step)
            acc = v if b == 0 else np.float32(acc + v)
        return acc
    return fold_impl


@inline_kernel
def no_records(g, out):
    """Whether the records are ``g = 0``, every output of ``out`` then set to +0.0 (the empty
    fold): the guard at the top of each gemv / gemm."""
    if g == 0:
        out[...] = np.float32(0.0)
        return True
    return False


@inline_kernel
def tile_loop_start(w):
    """``(acc, ahead, per)`` to start an 8-row gemv tile loop over the weights ``w`` ``[rows, G,
    B]`` (records contiguous): the tile's f32 lanes, the prefetch plan
    (``simd.base.prefetch_plan`` for tiles of 8 rows) and the first tiles prefetched."""
    rows, ws0 = w.shape[0], w.strides[0]
    acc = np.empty(8, np.float32)
    ahead, per = prefetch_plan(8 * ws0, w.shape[1])
    prefetch_lines(w, 0, ahead // 64, rows * ws0)   # the first tiles, before the loop
    return acc, ahead, per


@inline_kernel
def tile_loop_store(out, r, acc):
    """``out[r:r + 8] = acc``: the 8 rows of a finished gemv tile; returns the next tile's
    first row."""
    for k in range(8):
        out[r + k] = acc[k]
    return r + 8


@inline_kernel
def _no_prep(x):
    return 0


@inline_kernel
def _no_tile(w, w_off, x, x_off, w_step, acc, first, state, b):
    pass   # never called (gemv checks has_tile); typed all the same


def _tile(impl):
    """The gemv tile of ``impl`` with the driver's calling convention ``(w, w_off, x, x_off,
    w_step, acc, first, state, b)``, inlined at numba's IR level (an inlined overload here cost
    the NVFP4 gemv 7%)."""
    rows_x8 = impl["rows_x8"]
    if rows_x8 is None:
        return _no_tile
    if impl["prep"] is not None:
        return rows_x8
    return _once(("tile", id(rows_x8)), lambda: _make_tile(rows_x8))


def _make_tile(rows_x8):
    @inline_kernel
    def tile(w, w_off, x, x_off, w_step, acc, first, state, b):
        rows_x8(w, w_off, x, x_off, w_step, acc, 0, first)
    return tile


@overload(_row, jit_options=OVERLOAD_OPTIONS)
@_one_per_format
def _row_overload(code, w, r, x, x_step, g):
    """Row ``r`` of gemv (records contiguous): the fold of ``value`` where there is one,
    else ``loop_dot`` of the row's view."""
    impl = _lookup(code)
    if impl is None:
        return None
    if _simd(impl, "value") is not None:
        def row_fold(code, w, r, x, x_step, g):
            return fold(code, w, r * w.strides[0], w.strides[1], x, 0, x_step, g)
        return row_fold
    loop_dot = impl["loop_dot"]

    def row_loop(code, w, r, x, x_step, g):
        return loop_dot(w[r], x)
    return row_loop


@overload(dot, jit_options=OVERLOAD_OPTIONS)
@_one_per_format
def _dot_overload(code, w, x):
    impl = _lookup(code)
    if impl is None:
        return None
    loop_dot, span = impl["loop_dot"], impl["span"]
    if _simd(impl, "value") is None:
        def dot_loop(code, w, x):
            if w.shape[0] == 0:
                return np.float32(0.0)
            return loop_dot(w, x)
        return dot_loop
    def dot_fold(code, w, x):
        if w.shape[0] == 0:
            return np.float32(0.0)
        if w.strides[1] != 1 or x.strides[1] != 1 or (span > 1 and x.strides[0] != x.shape[1]):
            return loop_dot(w, x)
        return fold(code, w, 0, w.strides[0], x, 0, span * x.strides[0], w.shape[0])
    return dot_fold


@overload(gemv, jit_options=OVERLOAD_OPTIONS)
@_one_per_format
def _gemv_overload(code, w, x, out):
    impl = _lookup(code)
    loop_dot, span = impl["loop_dot"], impl["span"]
    has_tile, has_value = _simd(impl, "rows_x8") is not None, _simd(impl, "value") is not None
    if not has_tile and not has_value:
        def gemv_loop(code, w, x, out):
            for r in range(w.shape[0]):
                out[r] = np.float32(0.0) if w.shape[1] == 0 else loop_dot(w[r], x)
        return gemv_loop

    tile = _tile(impl)
    prep = impl["prep"] if impl["prep"] is not None else _no_prep

    def gemv_tiles(code, w, x, out):
        rows, g = w.shape[0], w.shape[1]
        if no_records(g, out):
            return
        if w.strides[2] != 1 or x.strides[1] != 1 or (span > 1 and x.strides[0] != x.shape[1]):
            for r in range(rows):
                out[r] = loop_dot(w[r], x)
            return
        ws0, ws1, xs = w.strides[0], w.strides[1], span * x.strides[0]
        r = 0
        if has_tile:
            state = prep(x)
            acc, ahead, per = tile_loop_start(w)
            while rows - r >= 8:
                for b in range(g):
                    # DRAM-streamed weights: prefetch share b of g of a tile ~64 KiB ahead,
                    # one linear range
                    prefetch_lines(w, r * ws0 + ahead + b * per * 64, per, rows * ws0)
                    tile(w, r * ws0 + b * ws1, x, b * xs, ws0, acc, b == 0, state, b)
                r = tile_loop_store(out, r, acc)
        for rr in range(r, rows):
            out[rr] = _row(code, w, rr, x, xs, g)
    return gemv_tiles


@overload(gemm, jit_options=OVERLOAD_OPTIONS)
@_one_per_format
def _gemm_overload(code, w, x, out):
    impl = _lookup(code)
    if impl is None:
        return None
    loop_dot, acts_x8 = impl["loop_dot"], _simd(impl, "acts_x8")
    record_block, span = impl["record_block"], impl["span"]
    if acts_x8 is None:
        if _simd(impl, "rows_x8") is None and _simd(impl, "value") is None:
            def gemm_loop(code, w, x, out):
                if no_records(w.shape[1], out):
                    return
                for r in range(w.shape[0]):
                    for a in range(x.shape[0]):
                        out[a, r] = loop_dot(w[r], x[a])
            return gemm_loop

        def gemm_rows(code, w, x, out):
            for a in range(x.shape[0]):
                gemv(code, w, x[a], out[a])
        return gemm_rows

    def gemm_tiles(code, w, x, out):
        batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
        if no_records(g, out):
            return
        if w.strides[2] != 1 or x.strides[2] != 1 or (span > 1 and x.strides[1] != x.shape[2]):
            for r in range(rows):
                for a in range(batch):
                    out[a, r] = loop_dot(w[r], x[a])
            return
        ws0, ws1, xs0, xs1 = w.strides[0], w.strides[1], x.strides[0], span * x.strides[1]
        acc = np.empty((rows, 8), np.float32)
        a0 = 0
        while batch - a0 >= 8:
            for b0 in range(0, g, record_block):
                b1 = min(b0 + record_block, g)
                for r in range(rows):
                    for b in range(b0, b1):
                        acts_x8(w, r * ws0 + b * ws1, x, a0 * xs0 + b * xs1, xs0,
                                acc, 8 * r, b == 0)
            for r in range(rows):
                for k in range(8):
                    out[a0 + k, r] = acc[r, k]
            a0 += 8
        for a in range(a0, batch):
            gemv(code, w, x[a], out[a])
    return gemm_tiles


def kernels_for(code: int):
    """``(dot, gemv, gemm)`` entry points of the pieces registered under ``code``."""
    if code not in _IMPL:
        raise KeyError(f"no driver pieces registered under code {code}")
    loop_dot = _IMPL[code]["loop_dot"]
    home = getattr(loop_dot, "py_func", loop_dot).__module__

    def dot_entry(w, x):
        """Canonical dot of weight records ``w`` ``[G, B]`` and activation records ``x``:
        left fold seeded with ``v_0``; ``G = 0`` gives ``+0.0``.  ``G`` must agree (not
        checked)."""
        return dot(code, w, x)

    def gemv_entry(w, x, out):
        """``out[r] = dot(w[r], x)`` for weights ``[rows, G, B]`` and one activation."""
        gemv(code, w, x, out)

    def gemm_entry(w, x, out):
        """``out[a, r] = dot(w[r], x[a])`` for weights ``[rows, G, B]`` and activations
        ``[batch, ...]``."""
        gemm(code, w, x, out)

    # Cached under the format's module: the cache key's dependency digest
    # (_jit.DependencyCache) is then that of the module holding the pieces (which imports this
    # one), so an edit of either recompiles the entry points.
    entries = []
    for f in (dot_entry, gemv_entry, gemm_entry):
        f.__module__ = home
        entries.append(kernel(f))
    return tuple(entries)


# ---- gemm by decoded records (AVX-512 VNNI; simd/iq_grid.py "gemm by decoded records") ------
#
# For formats whose record value is R32(ds * R32(dc * f32(S))) with S = sum_s scale_s * sum_{i in
# s} q_i x_i (int8 q, int32 scales per 16 or 32 elements): the grid IQ formats, Q3_K and Q6_K;
# and, with a min term T = sum_j m_j bsum_j, R32(ds * R32(R32(d S) - R32(dmin T))): Q2_K, Q5_K.
# A ``decode(w, w_off, dec, d_off)`` intrinsic writes a record's q, scales, dc and the bias term
# C (``DEC_BYTES``, layout in simd/iq_grid.py), a ``microtile`` folds 8 decoded rows against
# 16 activations per record step.

_XT, _DEC = _panel.XT_BYTES, _panel.DEC_BYTES
_XQ_AT, _XDS_AT, _XBS_AT = (_Q8K.field(n).start for n in ("q", "ds", "bsum"))
# Below this batch the driver's gemm (gemv per activation) runs: a tile has 16 lanes.
GEMM_TILE_MIN_BATCH = 3
_PANEL_BYTES = 384 << 10   # decoded weight bytes per panel (64 rows of 4096 columns)


@inline_kernel
def aligned_zeros(nbytes):
    """``(buf, at)``: a zeroed uint8 buffer of ``nbytes + 64`` and the offset of its first
    64-byte aligned byte (a panel gemm's activation tiles and decoded records)."""
    buf = np.zeros(nbytes + 64, np.uint8)
    return buf, (64 - array_address(buf) % 64) % 64


@inline_kernel
def panel_prefetch_start(w):
    """``(ahead, lines)`` of a panel decode loop that prefetches each row ~64 KiB ahead
    (``prefetch_lines(w, r * ws0 + ahead, lines, ...)``: the hardware prefetcher alone left the
    decode at ~1/3 of the read rate), the first ~64 KiB prefetched now (a threaded gemm's row
    chunk is often shorter than the distance; decision 041)."""
    rows, ws0 = w.shape[0], w.strides[0]
    ahead, lines = prefetch_plan(ws0, 1)
    prefetch_lines(w, 0, ahead // 64, rows * ws0)
    return ahead, lines


@inline_kernel
def panel_start(w, band_bytes):
    """``(bands, panel, dec, db, ahead, lines)`` of a panel gemm over the rows of ``w``, each
    band of 8 rows ``band_bytes`` decoded: the number of bands, the bands per panel (about
    ``_PANEL_BYTES`` decoded, at least one), the zeroed decode buffer of one panel and its first
    aligned byte (``aligned_zeros``), and the row prefetch of ``panel_prefetch_start``."""
    bands = (w.shape[0] + 7) // 8
    panel = min(bands, max(1, _PANEL_BYTES // band_bytes))
    dec, db = aligned_zeros(panel * band_bytes)
    ahead, lines = panel_prefetch_start(w)
    return bands, panel, dec, db, ahead, lines


@inline_kernel
def quad_at(x, a, b, at):
    """Bytes ``at .. at+3`` of record ``x[a, b]`` as one little-endian uint32 (any alignment)."""
    return (np.uint32(x[a, b, at]) | (np.uint32(x[a, b, at + 1]) << np.uint32(8))
            | (np.uint32(x[a, b, at + 2]) << np.uint32(16))
            | (np.uint32(x[a, b, at + 3]) << np.uint32(24)))


@kernel
def x_tiles16(x, xt, base):
    """Q8_K activations ``x`` ``[batch, G, 292]`` (contiguous record bytes) into tiles of 16 at
    byte ``base`` of the zeroed uint8 ``xt``, ``XT_BYTES`` per tile and record
    (simd/iq_grid.py): the quants plus BIAS as u8 in quads, then ds, then the bsum pairs."""
    batch, g = x.shape[0], x.shape[1]
    xw = xt.view(np.uint32)     # every entry is one dword of a tile (``base`` 4-byte aligned)
    for a in range(batch):
        tile, lane = a // 16, a % 16
        for b in range(g):
            at = (base + (tile * g + b) * _XT) // 4 + lane
            for k in range(64):
                xw[at + 16 * k] = quad_at(x, a, b, _XQ_AT + 4 * k) ^ np.uint32(0x80808080)
            xw[at + _panel.XT_DS_AT // 4] = quad_at(x, a, b, _XDS_AT)
            for k in range(8):
                xw[at + (_panel.XT_BS_AT + 64 * k) // 4] = quad_at(x, a, b, _XBS_AT + 4 * k)


def panel_gemm(decode, microtile, fallback):
    """The gemm of one such format: weight records decoded once per call (``decode``) a panel
    of bands of 8 rows at a time (about ``_PANEL_BYTES`` decoded, kept in L2 while every
    activation tile passes), the activations laid out once in tiles of 16 (``x_tiles16``), and
    per (tile, band) the records in order through ``microtile``; ``fallback`` (the driver's
    gemm) for strided records and batches under ``GEMM_TILE_MIN_BATCH``.  Each output is the
    fold of its record values in record order, as on every path (the microtile keeps one lane
    per row and activation)."""
    def gemm_tiles(w, x, out):
        batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
        if rows == 0 or batch == 0:                      # an empty result (and no panel)
            return
        if no_records(g, out):
            return
        if batch < GEMM_TILE_MIN_BATCH or w.strides[2] != 1 or x.strides[2] != 1:
            fallback(w, x, out)
            return
        tiles = (batch + 15) // 16
        xt, xb = aligned_zeros(tiles * g * _XT)
        x_tiles16(x, xt, xb)
        step = g * _DEC                                  # bytes per decoded row
        bands, panel, dec, db, ahead, lines = panel_start(w, 8 * step)
        acc = np.empty(8 * 16, np.float32)
        ws0, ws1 = w.strides[0], w.strides[1]
        for p0 in range(0, bands, panel):
            p1 = min(bands, p0 + panel)
            for r in range(8 * p0, min(rows, 8 * p1)):
                prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                for b in range(g):
                    decode(w, r * ws0 + b * ws1, dec, db + (r - 8 * p0) * step + b * _DEC)
            for tile in range(tiles):
                na = min(16, batch - 16 * tile)
                for band in range(p0, p1):
                    at = db + (band - p0) * 8 * step
                    for b in range(g):
                        microtile(dec, at + b * _DEC, step, xt, xb + (tile * g + b) * _XT,
                                  acc, b == 0)
                    for t in range(min(8, rows - 8 * band)):
                        for k in range(na):
                            out[16 * tile + k, 8 * band + t] = acc[16 * t + k]
    gemm = kernel(gemm_tiles)
    gemm.band_job = panel_band_job(decode, microtile)   # the same gemm by claimed bands
    return gemm


@functools.lru_cache(maxsize=None)
def panel_band_job(decode, microtile):
    """The helpers' job (``_pool``'s signature) of ``panel_gemm(decode, microtile)``'s gemm by
    claimed bands (``_pool.band_caller_of``, decision 052): ``x_at`` addresses the product's
    description (``_pool.BAND_ARGS``), ``d0`` is the number of regions, ``r0`` the region the
    call starts with; each band is the panel gemm's step."""

    def job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        table, wb, x, outs, regions = band_product(x_at, d0)
        T, G = x.shape[0], x.shape[1]
        tiles = (T + 15) // 16
        xt, xb = aligned_zeros(tiles * G * _XT)
        x_tiles16(x, xt, xb)
        step = G * _DEC                                  # bytes per decoded row
        dec, db = aligned_zeros(8 * step)
        acc = np.empty(8 * 16, np.float32)
        ws0 = G * wb
        ahead, lines = prefetch_plan(ws0, 1)
        tried = np.zeros(1, np.int64)
        while True:
            i, rows_before, lb = next_band(table, regions, r0, tried)
            if i < 0:
                break
            w, out = band_arrays(table, outs, x, wb, i, rows_before)
            rows = w.shape[0]
            r1b = min(rows, 8 * lb + 8)
            for r in range(8 * lb, r1b):
                prefetch_lines(w, r * ws0 + ahead, lines, rows * ws0)
                for rec in range(G):
                    decode(w, r * ws0 + rec * wb, dec, db + (r % 8) * step + rec * _DEC)
            for tile in range(tiles):
                na = min(16, T - 16 * tile)
                for rec in range(G):
                    microtile(dec, db + rec * _DEC, step, xt, xb + (tile * G + rec) * _XT,
                              acc, rec == 0)
                for row in range(r1b - 8 * lb):
                    for lane in range(na):
                        out[16 * tile + lane, 8 * lb + row] = acc[16 * row + lane]
    return kernel(job)



# ----------------------------------------------------------------------------- quantize + gemv
# ``matmul``'s common case, one activation row on one thread, is two kernels: the activation
# quantizer of the weight format's paired format, then the format's gemv.  Called from Python
# one after the other they cost two trips through numba's dispatcher and a scratch array made in
# Python (issue 23: ~3.3 us per small call, ~1.1 us for the two in one compiled call).

@functools.lru_cache(maxsize=None)
def quantize_then_gemv(quantize, gemv, block: int, nbytes: int):
    """The compiled composition ``matvec(w, x, out) -> int`` of ``quantize`` (``(values
    [n, block] f32, records [n, nbytes] u8) -> -1 | first bad block``) and ``gemv(w, records,
    out)``: ``w`` uint8 ``[rows, G, bytes]``, ``x`` float32 ``[K]`` C-contiguous (``K`` a
    multiple of ``block``), ``out`` float32 ``[rows]``.  Returns -1 after writing ``out``, else
    the first out-of-domain activation block, and then ``out`` is untouched (the quantizer
    writes nothing, the gemv does not run).  The same kernels, so the bits of the two calls;
    one cached closure per pair, named by them (``_jit.closure_named``)."""

    def matvec(w, x, out):
        n = x.shape[0] // block
        xq = np.empty((n, nbytes), np.uint8)
        bad = quantize(x.reshape(n, block), xq)
        if bad >= 0:
            return bad
        gemv(w, xq, out)
        return -1

    return kernel(matvec)


@kernel
def _byte_span(a):
    """``(lo, hi)``: the byte addresses from ``a``'s lowest element to just past its highest
    (``(0, 0)`` when it is empty), as ``np.may_share_memory`` bounds an array."""
    if a.size == 0:
        return np.int64(0), np.int64(0)
    lo = hi = np.int64(array_address(a))
    for i in range(a.ndim):
        step = np.int64(a.strides[i]) * np.int64(a.shape[i] - 1)
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + np.int64(a.itemsize)


@kernel
def may_overlap(a, b):
    """Whether the byte spans of ``a`` and ``b`` overlap (``np.may_share_memory``'s test)."""
    alo, ahi = _byte_span(a)
    blo, bhi = _byte_span(b)
    return alo < bhi and blo < ahi


@functools.lru_cache(maxsize=None)
def gemv_apart(gemv):
    """``run(w, x, out) -> 1 | 0``: ``gemv(w, x, out)`` in one compiled call with the check
    that ``out`` shares no memory with ``w`` or ``x`` (``may_overlap``): 0, and ``out``
    untouched, when it may."""

    def run(w, x, out):
        if may_overlap(out, w) or may_overlap(out, x):
            return 0
        gemv(w, x, out)
        return 1

    return kernel(run)
