"""One dot / gemv / gemm driver for the K-quants against Q8_K (Q2_K, Q3_K, Q5_K, Q6_K).

Each format module registers its record-level pieces under an int code (its GGML type id) and
gets its three entry points from ``kernels_for(code)``::

    register(code, value=..., rows_x8=..., acts_x8=..., loop_dot=...)
    dot_<t>_q8_k, gemv_<t>_q8_k, gemm_<t>_q8_k = kernels_for(code)

* ``value(w, w_off, x, x_off)``: the record value v (DESIGN.md section 7) from byte offsets
  (records contiguous), ``_simd_kquants.<t>_q8_k_value``;
* ``rows_x8`` / ``acts_x8``: the 8-lane tile folds (``_simd_kquants.<t>_rows_x8`` / ``_acts_x8``);
* ``loop_dot(w, x)``: the portable dot of one row (any strides), used for strided records and
  when the target has no AVX2.

The drivers are the Q4_K ones of ``dot.py``: gemv in tiles of 8 rows (one lane per row, each
lane its own in-order fold) with a software prefetch of the next tile's records, leftover rows
folded one record at a time; gemm in tiles of 8 activations (each weight record decoded once per
tile) over blocks of 8 records, leftover activations through gemv.  Every output is the left
fold of the record values in record order, seeded with v_0 (G = 0 gives +0.0), so the results
equal ``dot_<t>_q8_k_portable`` bit for bit (tests/test_kquants_fast.py).

The entry points are closures over the int code only, and the per-format pieces are picked at
typing time by the ``@overload``s below from the table ``_IMPL``: numba's cache keys a closure by
its pickled cell values, so an int keeps each entry point cached across processes (a closure
over a dispatcher would carry a fresh uuid each process and compile again).
"""

import numpy as np
from numba.core import types
from numba.extending import overload

from numba_qk._jit import JIT_OPTIONS, kernel
from numba_qk.kernels.simd.base import HAVE_AVX2, prefetch_lines, prefetch_plan

_IMPL = {}  # code -> dict(value, rows_x8, acts_x8, loop_dot)
_GEMM_RECORD_BLOCK = 8  # records per pass: 8 activations x 8 records x 292 B stay in L1


def register(code: int, *, value, rows_x8, acts_x8, loop_dot) -> None:
    """Bind a format's record-level pieces to ``code`` (see the module docstring)."""
    impl = dict(value=value, rows_x8=rows_x8, acts_x8=acts_x8, loop_dot=loop_dot)
    if code in _IMPL and _IMPL[code] != impl:
        raise AssertionError(f"K-quant driver code {code} bound twice")
    _IMPL[code] = impl


def _lookup(code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    return _IMPL[code.literal_value]


# Placeholders resolved by the overloads below.  Called as plain Python (only under
# NUMBA_DISABLE_JIT=1, where HAVE_AVX2 is False) they run the portable loops, as the overloads do.
def _fold(code, w, w_at, w_step, x, x_at, x_step, g):
    raise NotImplementedError  # only reached through the SIMD drivers


def _dot(code, w, x):
    if w.shape[0] == 0:
        return np.float32(0.0)
    return _IMPL[code]["loop_dot"](w, x)


def _gemv(code, w, x, out):
    for r in range(w.shape[0]):
        out[r] = _dot(code, w[r], x)


def _gemm(code, w, x, out):
    for a in range(x.shape[0]):
        _gemv(code, w, x[a], out[a])


@overload(_fold, jit_options=JIT_OPTIONS)
def _fold_overload(code, w, w_at, w_step, x, x_at, x_step, g):
    impl = _lookup(code)
    if impl is None:
        return None
    value = impl["value"]

    def fold(code, w, w_at, w_step, x, x_at, x_step, g):
        """Left fold of the g record values at bytes w_at + b*w_step of w, x_at + b*x_step of x."""
        acc = np.float32(0.0)
        for b in range(g):
            v = value(w, w_at + b * w_step, x, x_at + b * x_step)
            acc = v if b == 0 else np.float32(acc + v)
        return acc
    return fold


@overload(_dot, jit_options=JIT_OPTIONS)
def _dot_overload(code, w, x):
    impl = _lookup(code)
    if impl is None:
        return None
    loop_dot = impl["loop_dot"]
    if not HAVE_AVX2:
        def dot_loop(code, w, x):
            if w.shape[0] == 0:
                return np.float32(0.0)
            return loop_dot(w, x)
        return dot_loop

    def dot(code, w, x):
        if w.shape[0] == 0:
            return np.float32(0.0)
        if w.strides[1] != 1 or x.strides[1] != 1:
            return loop_dot(w, x)
        return _fold(code, w, 0, w.strides[0], x, 0, x.strides[0], w.shape[0])
    return dot


@overload(_gemv, jit_options=JIT_OPTIONS)
def _gemv_overload(code, w, x, out):
    impl = _lookup(code)
    if impl is None:
        return None
    loop_dot, rows_x8 = impl["loop_dot"], impl["rows_x8"]
    if not HAVE_AVX2:
        def gemv_loop(code, w, x, out):
            for r in range(w.shape[0]):
                out[r] = np.float32(0.0) if w.shape[1] == 0 else loop_dot(w[r], x)
        return gemv_loop

    def gemv(code, w, x, out):
        rows, g = w.shape[0], w.shape[1]
        if g == 0:
            out[:] = np.float32(0.0)
            return
        if w.strides[2] != 1 or x.strides[1] != 1:
            for r in range(rows):
                out[r] = loop_dot(w[r], x)
            return
        ws0, ws1, xs0 = w.strides[0], w.strides[1], x.strides[0]
        acc = np.empty(8, np.float32)
        ahead, per = prefetch_plan(8 * ws0, g)
        prefetch_lines(w, 0, ahead // 64, rows * ws0)   # the first tiles, before the loop
        r = 0
        while rows - r >= 8:
            for b in range(g):
                # DRAM-streamed weights: prefetch share b of g of a tile ~64 KiB ahead, one
                # linear range (_simd.prefetch_plan; eight interleaved short row streams
                # defeat the hardware prefetcher)
                prefetch_lines(w, r * ws0 + ahead + b * per * 64, per, rows * ws0)
                rows_x8(w, r * ws0 + b * ws1, x, b * xs0, ws0, acc, 0, b == 0)
            for k in range(8):
                out[r + k] = acc[k]
            r += 8
        for rr in range(r, rows):
            out[rr] = _fold(code, w, rr * ws0, ws1, x, 0, xs0, g)
    return gemv


@overload(_gemm, jit_options=JIT_OPTIONS)
def _gemm_overload(code, w, x, out):
    impl = _lookup(code)
    if impl is None:
        return None
    loop_dot, acts_x8 = impl["loop_dot"], impl["acts_x8"]
    if not HAVE_AVX2:
        def gemm_loop(code, w, x, out):
            if w.shape[1] == 0:
                out[:, :] = np.float32(0.0)
                return
            for r in range(w.shape[0]):
                for a in range(x.shape[0]):
                    out[a, r] = loop_dot(w[r], x[a])
        return gemm_loop

    def gemm(code, w, x, out):
        batch, rows, g = x.shape[0], w.shape[0], w.shape[1]
        if g == 0:
            out[:, :] = np.float32(0.0)
            return
        if w.strides[2] != 1 or x.strides[2] != 1:
            for r in range(rows):
                for a in range(batch):
                    out[a, r] = loop_dot(w[r], x[a])
            return
        ws0, ws1, xs0, xs1 = w.strides[0], w.strides[1], x.strides[0], x.strides[1]
        acc = np.empty((rows, 8), np.float32)
        a0 = 0
        while batch - a0 >= 8:
            for b0 in range(0, g, _GEMM_RECORD_BLOCK):
                b1 = min(b0 + _GEMM_RECORD_BLOCK, g)
                for r in range(rows):
                    for b in range(b0, b1):
                        acts_x8(w, r * ws0 + b * ws1, x, a0 * xs0 + b * xs1, xs0,
                                acc, 8 * r, b == 0)
            for r in range(rows):
                for k in range(8):
                    out[a0 + k, r] = acc[r, k]
            a0 += 8
        for a in range(a0, batch):
            _gemv(code, w, x[a], out[a])
    return gemm


def kernels_for(code: int):
    """``(dot, gemv, gemm)`` entry points of the pieces registered under ``code``."""
    if code not in _IMPL:
        raise KeyError(f"no K-quant pieces registered under code {code}")

    @kernel
    def dot(w, x):
        """Canonical dot of weight records ``w`` ``[G, B]`` and Q8_K records ``x``
        ``[G, 292]``: left fold seeded with ``v_0``; ``G = 0`` gives ``+0.0``.  ``G`` must
        agree (not checked)."""
        return _dot(code, w, x)

    @kernel
    def gemv(w, x, out):
        """``out[r] = dot(w[r], x)`` for weights ``[rows, G, B]`` and one Q8_K activation
        ``[G, 292]``."""
        _gemv(code, w, x, out)

    @kernel
    def gemm(w, x, out):
        """``out[a, r] = dot(w[r], x[a])`` for weights ``[rows, G, B]`` and Q8_K activations
        ``[batch, G, 292]``."""
        _gemm(code, w, x, out)

    return dot, gemv, gemm
