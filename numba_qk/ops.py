"""Public operations: validation, carrier handling and dispatch to the ``@njit`` kernels.

Everything a user can get wrong is checked here, before any kernel runs; the kernels themselves
never raise for user error.  Inputs may be any numpy array or buffer-protocol object (read-only
memory maps, unaligned or strided views, ``memoryview``): the kernels read records byte by byte,
so results never depend on alignment or layout.  Nothing is ever converted silently: a wrong
dtype is an error, not a cast.  The products recognise the common valid call in one pass
(``_plain_records`` / ``_plain_matmul``) and run the full checks for everything else.
"""

from __future__ import annotations

import numpy as np

from . import _registry as registry
from . import _threads
from ._registry import (BlockFields, MXFP4Fields, NVFP4Fields, Q2KFields, Q3KFields,  # noqa: F401
                        Q4KFields, Q5KFields, Q6KFields, Q8KFields, TQFields)
from ._registry import IQ4NLFields, IQ4XSFields  # noqa: F401
from ._registry import IQGridFields, LowBitFields  # noqa: F401
from ._validate import (as_array, check_f32, check_out, check_records, check_slot, check_slot_in,
                        check_threads, describe, prepare_out)
from .errors import QuantizationDomainError
from .formats import Format, activation_format, f32, quant
from . import repack as _repack
from . import _halfmat
from .kernels.drive import gemv_apart, quantize_then_gemv

__all__ = [
    "quantize", "quantized_dot", "decode", "dequantize", "find_invalid_records",
    "gemv", "gemm", "matmul", "Q4KFields", "Q8KFields", "BlockFields", "Q2KFields", "Q3KFields",
    "Q5KFields", "Q6KFields", "MXFP4Fields", "NVFP4Fields",
    "IQ4NLFields", "IQ4XSFields", "TQFields", "matmul_many", "get_rows",
]


def _span(lhs_format) -> int:
    """Activation records per weight record: 1, except NVFP4 (64 values) x Q8_0 (32): 2."""
    return lhs_format.block_size // activation_format(lhs_format).block_size


def _count_mismatch(wg: int, xg: int, span: int, lhs: str, rhs: str, per_row: bool) -> str:
    """The message for ``xg`` activation records against ``wg`` weight records (per row)."""
    if span == 1:
        return (f"{lhs} and {rhs} must hold the same number of records G"
                f"{' per row' if per_row else ''}: {lhs} has {wg}, {rhs} has {xg}")
    per, has = ("weight record", f"G={wg} per row") if per_row else ("lhs record", f"{wg}")
    return (f"{rhs} must hold {span} records per {per}: {lhs} has {has}, so {rhs} "
            f"needs {span * wg}, has {xg}")


def _g_mismatch(wg: int, xg: int, span: int) -> str:
    return _count_mismatch(wg, xg, span, "lhs", "rhs", False)


def _per_row_mismatch(wg: int, xg: int, span: int) -> str:
    return _count_mismatch(wg, xg, span, "w", "xq", True)


def _check_pair(lhs_format, rhs_format, what: str) -> None:
    """lhs_format must be a weight format and rhs_format the activation format it pairs with."""
    check_slot_in(lhs_format, "lhs_format", registry.WEIGHTS, what)
    act = activation_format(lhs_format)
    if rhs_format is not act:
        check_slot(rhs_format, "rhs_format", act, what, f" to pair with {lhs_format.name} weights")


# ----------------------------------------------------------------------------- operations

def _check_imatrix(imatrix, format, arr) -> np.ndarray:
    """The importance matrix as contiguous f32 ``[n_per_row]`` (see ``quantize``)."""
    if format not in registry.WEIGHTED and format not in registry.IMATRIX_IGNORED:
        raise ValueError(f"imatrix: {format.name} takes no importance matrix (ggml's "
                         f"ggml_quantize_chunk does not produce {format.name})")
    w = np.asarray(imatrix) if isinstance(imatrix, (list, tuple)) else as_array(imatrix, "imatrix")
    kind = w.dtype.kind
    if w.dtype == np.float32:
        w32 = w
    elif kind in "fiu" and w.dtype.itemsize <= 8:
        with np.errstate(all="ignore"):
            w32 = w.astype(np.float32)
            if kind == "f":   # exact when the float64 values agree (NaN is left to the check below)
                lossy = (w32.astype(np.float64) != w.astype(np.float64)) & ~np.isnan(w32)
            else:             # integers up to 2**24 in magnitude are exact float32 values
                lossy = (w > (1 << 24)) | ((w < -(1 << 24)) if kind == "i" else False)
        lossy = np.flatnonzero(lossy)
        if lossy.size:
            i = int(lossy[0])
            raise TypeError(f"imatrix: expected float32 weights (or values exactly representable "
                            f"in float32), got dtype {w.dtype.name} with imatrix[{i}] = "
                            f"{w.reshape(-1)[i]!r}, which float32 would round; no lossy cast is made")
    else:
        raise TypeError(f"imatrix: expected float32 weights, got dtype {w.dtype.str} "
                        f"({w.dtype.name})")
    if w32.ndim != 1:
        raise ValueError(f"imatrix: expected a 1-D array of one weight per column of a row, got "
                         f"shape {tuple(w32.shape)}")
    n, bs = w32.shape[0], format.block_size
    if n == 0 or n % bs:
        raise ValueError(f"imatrix: expected one weight per column of a row, a positive multiple "
                         f"of {bs} ({format.name} blocks), got {n} weights")
    if (arr.shape[0] * bs) % n:
        raise ValueError(f"values: {arr.shape[0]} blocks of {bs} do not make whole rows of {n} "
                         f"values (the imatrix length)")
    bad = np.flatnonzero(~(np.isfinite(w32) & (w32 >= 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"imatrix: weights must be finite and >= 0; imatrix[{i}] is "
                         f"{float(w32[i])!r}")
    return np.ascontiguousarray(w32)


def quantize(values, format, *, imatrix=None, out=None, numerics="canonical"):
    """Quantize float32 ``values`` ``[G, block]`` into records uint8 ``[G, block_bytes]``.

    ``format``: ``numba_qk.quant.q8_k`` (blocks of 256, the canonical numerics of spec 000
    section 4), ``numba_qk.quant.q4_k`` (blocks of 256, bit-identical to ggml's
    ``quantize_row_q4_K_ref``, no importance matrix) or one of ggml's legacy formats ``q4_0``,
    ``q4_1``, ``q5_0``, ``q5_1``, ``q8_0``, ``q8_1`` (blocks of 32, bit-identical to ggml's
    reference quantizers), the other K-quants, or ggml's FP4 records ``mxfp4`` / ``nvfp4``
    (blocks of 32 / 64, bit-identical to ``quantize_row_mxfp4_ref`` / ``_nvfp4_ref``);
    ``numba_qk.capabilities()`` lists them.  Returns a new
    C-contiguous array, or ``out`` (any writable uint8 buffer of that shape) filled in place.

    ``imatrix``: an importance matrix, llama.cpp's ``quant_weights``: one weight per column of
    a row, a 1-D float32 array (float16, float64 or integer arrays and lists are accepted when
    every value is exactly a float32; nothing is rounded), finite and >= 0, of length
    ``n_per_row`` a multiple of the block size; ``values`` then hold whole rows of that length
    (``G * block_size`` a multiple of ``n_per_row``), blocks in row order.  The records are
    byte-identical to ggml's ``ggml_quantize_chunk(type, values, dst, 0, nrows, n_per_row,
    imatrix)`` -- the ``quantize_row_<t>_impl`` paths of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0,
    Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M
    (Q4_0 ... Q5_1 weight each block by statistics of its whole row, hence whole rows).
    IQ2_XXS, IQ2_XS and IQ1_S need it (ggml quantizes them only with one:
    ``ggml_quantize_requires_imatrix``; ``ValueError`` without it); IQ3_XXS, IQ3_S, IQ2_S and
    IQ1_M take it or not.  Q8_0, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0 and Q2_0 accept and ignore
    it, as ggml does (it is still checked); Q8_K and Q8_1, which ggml_quantize_chunk does not
    produce, refuse it.  None of these ggml paths aborts on large values but the grid searches (IQ3_XXS,
    IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, with or without an importance matrix): where
    ggml's search would abort the process (its float32 sums overflow: for normal data from
    about 1e13 .. 1e16 in magnitude, docs/numerics_iq_grid.md) ``QuantizationDomainError``
    names the block; elsewhere finite values are the whole domain.

    Raises ``QuantizationDomainError`` (a ``ValueError``) naming the first block that holds a
    non-finite value (or, for Q8_K, whose extreme is too small to invert; for the grid IQ
    formats, on which ggml's grid search aborts the process); ``out`` is then left untouched,
    as on every other error.  (ggml's quantizers do not check; they turn NaN and inf into
    garbage.)

    ``numerics="ggml_cpu"`` (activation formats ``q8_0``, ``q8_1``, ``q8_k`` only) gives instead
    the records of ggml's CPU quantizers, the ``from_float`` llama.cpp runs on activations at
    run time (``quantize_row_q8_0`` / ``_q8_1`` / ``_q8_K`` of ggml-cpu/arch/x86/quants.c, the
    AVX path), bit for bit; they differ from the reference ones in a few blocks (ties rounded
    to even, ``id = 127 / amax``; Q8_K: the first extreme wins a ``+a``/``-a`` tie); see
    ``numba_qk.kernels.simd.ggml_cpu``.  Same domain and errors as the default ``"canonical"``.
    """
    check_slot_in(format, "format", registry.QUANTIZABLE, "quantize")
    if numerics != "canonical":
        if numerics != "ggml_cpu":
            raise ValueError(f"quantize: numerics must be 'canonical' or 'ggml_cpu', "
                             f"not {numerics!r}")
        if format not in registry.GGML_CPU_QUANTIZERS:
            raise ValueError(f"quantize: numerics='ggml_cpu' is offered for q8_0, q8_1 and "
                             f"q8_k (ggml's run-time activation formats), not {format.name}")
    if imatrix is None and format in registry.REQUIRES_IMATRIX:
        raise ValueError(f"quantize: {format.name} needs an importance matrix (imatrix=...): "
                         f"ggml quantizes it only with one (ggml_quantize_requires_imatrix)")
    arr = check_f32(as_array(values, "values"), "values", "values", format.block_size)
    qw = None if imatrix is None else _check_imatrix(imatrix, format, arr)
    g = arr.shape[0]
    shape = (g, format.block_bytes)
    if out is None:
        target = np.empty(shape, dtype=np.uint8)
    else:
        target = check_out(out, shape, np.uint8, (arr,), f"{format.name} records")
    if g:
        b = registry.BY_FORMAT[format]
        if numerics == "ggml_cpu":
            bad = registry.GGML_CPU_QUANTIZERS[format](arr.reshape(-1), target)
        else:
            weighted = None if qw is None else registry.WEIGHTED.get(format)
            bad = b.quantize(arr, target) if weighted is None else weighted[0](arr, qw, target)
        if bad >= 0:
            raise QuantizationDomainError(int(bad), b.domain_reason(arr, int(bad)))
    return target if out is None else out


def quantized_dot(lhs, rhs, *, lhs_format, rhs_format, acc_dtype=f32, out=None):
    """Canonical quantized dot of weight records ``lhs`` and activation records ``rhs``.

    Pairs: Q4_K x Q8_K (``[G, 144]`` x ``[G, 292]``, spec 000 section 3, bit for bit), and
    ggml's legacy pairs Q4_0/Q5_0/Q8_0 x Q8_0 and Q4_1/Q5_1 x Q8_1 (``[G, bytes]`` records of 32
    elements; numba_qk's canonical numerics, see docs/numerics.md), the K-quants x Q8_K, and ggml's
    MXFP4 x Q8_0 (``[G, 17]`` x ``[G, 34]``) and NVFP4 x Q8_0 (``[G, 36]`` x ``[2G, 34]``: one
    NVFP4 record of 64 values spans two Q8_0 records).  Returns a 0-d float32 ndarray (or
    writes into ``out``, a writable 0-d float32 array, and returns it); ``acc_dtype`` must be
    ``numba_qk.f32``.  ``G = 0`` gives ``+0.0``.  Stored sums (Q8_K ``bsum``, Q8_1 ``s``) are
    used as stored.
    """
    _check_pair(lhs_format, rhs_format, "quantized_dot")
    check_slot(acc_dtype, "acc_dtype", f32, "quantized_dot")
    w = check_records(as_array(lhs, "lhs"), "lhs", lhs_format)
    x = check_records(as_array(rhs, "rhs"), "rhs", rhs_format)
    span = _span(lhs_format)
    if span * w.shape[0] != x.shape[0]:
        raise ValueError(_g_mismatch(w.shape[0], x.shape[0], span))
    target = None if out is None else check_out(out, (), np.float32, (), "the result")
    value = np.float32(0.0) if w.shape[0] == 0 else registry.BY_FORMAT[lhs_format].dot(w, x)
    if target is None:
        return np.array(value, dtype=np.float32)
    target[()] = value
    return out


def _records_and_format(records, format, what: str):
    if not (isinstance(format, Format) and format in quant):
        raise TypeError(f"format: {what} expects one of {', '.join(repr(f) for f in quant)}, "
                        f"got {describe(format)}")
    return check_records(as_array(records, "records"), "records", format)


def decode(records, format):
    """Decode records into their named fields (explicit decoding; never used by the dot).

    Q4_K -> ``Q4KFields(d, dmin, sc, m, q)``; Q8_K -> ``Q8KFields(ds, q, bsum)``; the legacy
    formats -> ``BlockFields(d, q, m, s)`` (``m``: Q4_1/Q5_1, ``s``: Q8_1, else None; ``q`` the
    stored quants: uint8 0..15 / 0..31 without the -8/-16 offset, int8 for Q8_0/Q8_1);
    MXFP4 -> ``MXFP4Fields(e, q)``, NVFP4 -> ``NVFP4Fields(d, q)`` (scale bytes as stored, ``q``
    the e2m1 codes 0..15 in element order);
    Q2_K -> ``Q2KFields(d, dmin, sc, m, q)``; Q3_K -> ``Q3KFields(d, sc, q)`` (``sc`` stored
    0..63, used as sc - 32; ``q`` -4..3); Q5_K -> ``Q5KFields(d, dmin, sc, m, q)``; Q6_K ->
    ``Q6KFields(d, sc, q)`` (``sc`` int8; ``q`` stored 0..63, used as q - 32).
    Float fields keep their stored type (f16 / f32) and bits.
    """
    arr = _records_and_format(records, format, "decode")
    return registry.BY_FORMAT[format].decode(arr)


def dequantize(records, format, *, out=None):
    """Dequantize records ``[G, block_bytes]`` to float32 ``[G, block_size]`` (``[G, 256]`` for
    Q4_K/Q8_K, ``[G, 32]`` for the legacy formats); explicit, never used by ``quantized_dot``.

    Q4_K: ``y = R32(R32(R32(d * sc[s]) * q) - R32(dmin * m[s]))``; Q8_K: ``y = R32(ds * q)``;
    legacy formats: ggml's ``dequantize_row_*`` (``R32(q' * d)``, or ``R32(R32(q * d) + m)``).
    """
    arr = _records_and_format(records, format, "dequantize")
    shape = (arr.shape[0], format.block_size)
    if out is None:
        target = np.empty(shape, dtype=np.float32)
    else:
        target = check_out(out, shape, np.float32, (arr,), "dequantized values")
    if arr.shape[0]:
        registry.BY_FORMAT[format].dequantize(arr, target)
    return target if out is None else out


def find_invalid_records(records, format) -> np.ndarray:
    """Indices (int64, ascending) of records that break their format's data contract.

    Q8_K: records whose stored ``bsum[j]`` differs from ``sum(q[16j:16j+16])``.  Every other
    format accepts every bit pattern (Q8_1's ``s`` is derived by ggml from the unrounded scale,
    so it cannot be re-checked from the record), so the result is empty.  This is an explicit
    check; no other operation calls it or repairs records.
    """
    arr = _records_and_format(records, format, "find_invalid_records")
    check = registry.BY_FORMAT[format].find_invalid
    if check is None or arr.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    bad = np.empty(arr.shape[0], dtype=np.int64)
    n = check(arr, bad)
    return bad[:n].copy()


# ----------------------------------------------------------------------------- composed products

def _product(fmt, kind: str, wa, xa, target, nthreads):
    """gemv (``kind='gemv'``) or gemm of ``fmt``'s kernels, on row chunks over up to
    ``nthreads`` threads (``numba_qk._threads``: dynamic claiming, caller included)."""
    b = registry.BY_FORMAT[fmt]
    n = 1 if nthreads == 1 else _threads.effective_threads(nthreads, -(-wa.shape[0] // 8))
    if n == 1:
        (b.gemv if kind == "gemv" else b.gemm)(wa, xa, target)
        return
    # chunks claimed in compiled code, one call per thread; a gemm chunk re-tiles the
    # activations, so fewer, larger chunks there
    if kind == "gemv":
        _threads.run_rows(b.gemv, wa, xa, target, n)
    else:
        _threads.run_rows(b.gemm, wa, xa, target, n, per_thread=2, gemm=True)


def _repacked(w, lhs_format, what):
    """``w`` if it is a ``numba_qk.repack`` result (of ``lhs_format``), else None."""
    if not isinstance(w, _repack.Repacked):
        return None
    if w.format is not lhs_format:
        raise ValueError(f"w: {what} got weights repacked as {w.format.name}, but "
                         f"lhs_format={lhs_format.name}")
    w.check()   # before any kernel reads the tiles by the shape it claims
    return w


def _product_operands(op, w, xq, lhs_format, rhs_format, threads, xq_layout):
    """The checked operands of ``gemv`` / ``gemm`` (``op``): ``(nthreads, repacked or None,
    weight records or tiles, rows, activation records)``; ``xq`` ``[G', bytes]``
    (``xq_layout`` ``records``) or ``[batch, G', bytes]`` (``batch``), ``G'`` matching ``w``."""
    _check_pair(lhs_format, rhs_format, op)
    nthreads = check_threads(threads)
    rp = _repacked(w, lhs_format, op)
    wa = rp.tiles if rp else check_records(as_array(w, "w"), "w", lhs_format, "weights")
    rows, g = rp.shape[:2] if rp else wa.shape[:2]
    xa = check_records(as_array(xq, "xq"), "xq", rhs_format, xq_layout)
    span = _span(lhs_format)
    if xa.shape[-2] != span * g:
        raise ValueError(_per_row_mismatch(g, xa.shape[-2], span))
    return nthreads, rp, wa, rows, xa


# ----------------------------------------------------------------------------- the common case
# A call from a loader's forward pass is small and valid: numpy uint8 records of the right
# shapes, the paired activation format, a thread count.  ``_plain_*`` recognise exactly that in
# one pass over a per-format ``_Plan`` made at import (about 0.3 us instead of the ~2.5 us of
# the full checks, issue 23's fixed cost per call); anything else -- a memoryview, a repack
# result, a wrong shape, f16 weights -- takes the full checks, which say what is wrong.  Every
# condition below is one the full checks require, so the shortcut never admits what they refuse.

_U8 = np.dtype(np.uint8)
_F32 = np.dtype(np.float32)


class _Plan:
    """What the products need of one block weight format: ``act`` (the paired activation
    format's binding), ``gemv`` (the format's), record bytes ``wbytes`` / ``xbytes``, ``span``
    (activation records per weight record), ``block`` (values per weight record) and, once
    ``matvec()`` made it, the quantize + gemv in one call
    (``kernels.drive.quantize_then_gemv``)."""

    __slots__ = ("act", "gemv", "wbytes", "xbytes", "span", "block", "_matvec", "_apart")

    def __init__(self, fmt):
        self.act = registry.BY_FORMAT[activation_format(fmt)]
        self.gemv = registry.BY_FORMAT[fmt].gemv
        self.wbytes, self.block = fmt.block_bytes, fmt.block_size
        self.xbytes, self.span = self.act.format.block_bytes, _span(fmt)
        self._matvec = None
        self._apart = None

    def matvec(self):
        """``matvec(w, x, out) -> -1 | bad block``: the activation quantizer and the gemv in
        one compiled call (made on first use; compiled on first call)."""
        if self._matvec is None:
            act = self.act.format
            self._matvec = quantize_then_gemv(self.act.quantize, self.gemv,
                                              act.block_size, act.block_bytes)
        return self._matvec

    def gemv_apart(self):
        """``run(w, xq, out) -> 1 | 0``: the gemv with the check that ``out`` shares no memory
        with ``w`` or ``xq`` in one compiled call (``kernels.drive.gemv_apart``)."""
        if self._apart is None:
            self._apart = gemv_apart(self.gemv)
        return self._apart


_PLANS = {f: _Plan(f) for f in registry.WEIGHTS}


def _plain_records(w, xq, lhs_format, rhs_format, threads, xq_ndim):
    """The plan when ``gemv`` (``xq_ndim`` 2) / ``gemm`` (3) got numpy uint8 records of
    ``lhs_format`` and its pair with matching record counts, ``threads`` a positive int, else
    None."""
    p = _PLANS.get(lhs_format) if lhs_format.__class__ is Format else None
    if (p is not None and rhs_format is p.act.format and type(threads) is int and threads >= 1
            and isinstance(w, np.ndarray)
            and isinstance(xq, np.ndarray) and w.dtype is _U8 and xq.dtype is _U8
            and w.ndim == 3 and xq.ndim == xq_ndim):
        ws, xs = w.shape, xq.shape
        if ws[2] == p.wbytes and xs[-1] == p.xbytes and xs[-2] == p.span * ws[1]:
            return p
    return None


def _plain_matmul(w, x, lhs_format, threads):
    """The plan when ``matmul`` got numpy uint8 records of ``lhs_format`` and float32
    activations ``[K]`` / ``[batch, K]`` of the weights' row length, else None."""
    p = _PLANS.get(lhs_format) if lhs_format.__class__ is Format else None
    if (p is not None and type(threads) is int and threads >= 1
            and isinstance(w, np.ndarray) and isinstance(x, np.ndarray)
            and w.dtype is _U8 and x.dtype is _F32 and w.ndim == 3 and 1 <= x.ndim <= 2):
        ws = w.shape
        if ws[2] == p.wbytes and x.shape[-1] == ws[1] * p.block:
            return p
    return None


def _plain_out(out, rows) -> bool:
    """Whether ``out`` is a writeable numpy float32 ``[rows]``: what ``check_out`` accepts but
    the overlap with the inputs, which the caller's compiled call tests (``_Plan.gemv_apart``);
    anything else takes ``check_out``, which says what is wrong."""
    return (type(out) is np.ndarray and out.dtype is _F32 and out.shape == (rows,)
            and out.flags.writeable)


def gemv(w, xq, *, lhs_format, rhs_format, out=None, threads=1):
    """Matrix-vector product of quantized weight rows and one quantized activation.

    ``w``: uint8 ``[rows, G, bytes]`` weight records; ``xq``: uint8 ``[G, bytes]`` activation
    records of the paired format (Q4_K -> Q8_K, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1;
    MXFP4 -> Q8_0; NVFP4 -> Q8_0 with ``2G`` records) ->
    float32 ``[rows]``, where element ``r`` equals ``quantized_dot(w[r], xq, ...)`` bit for bit.
    ``threads`` splits the rows over up to that many threads (``None``: every core; fewer when
    other processes keep cores busy, see ``numba_qk._threads``); results do not depend on it.
    ``w`` may also be ``numba_qk.repack(w, lhs_format)`` (Q4_0): same bits, faster on
    AVX-512 VNNI.

    ``lhs_format=numba_qk.f16`` / ``numba_qk.bf16``: ``w`` an f16 / bf16 matrix ``[rows, K]``
    (numpy float16, ml_dtypes.bfloat16 or a ``numba_qk.Tensor``) and ``xq`` ``[K]`` of the same
    type (``rhs_format`` the same type); numerics in docs/halfmat.md.
    """
    p = _plain_records(w, xq, lhs_format, rhs_format, threads, 2)
    if p and threads == 1:   # the small call of a forward pass
        if out is None:
            target = np.empty(w.shape[0], np.float32)
            p.gemv(w, xq, target)
            return target
        if _plain_out(out, w.shape[0]) and p.gemv_apart()(w, xq, out):
            return out
    if p:
        nthreads, rp, wa, rows, xa = threads, None, w, w.shape[0], xq
    elif _halfmat.is_float_weight(lhs_format):
        return _halfmat.product("gemv", w, xq, lhs_format, rhs_format, out,
                                check_threads(threads))
    else:
        nthreads, rp, wa, rows, xa = _product_operands("gemv", w, xq, lhs_format, rhs_format,
                                                       threads, "records")
    target = (np.empty(rows, np.float32) if out is None
              else check_out(out, (rows,), np.float32, (wa, xa), "gemv's result"))
    if rp:
        _repack.product(rp, "gemv", xa, target, nthreads)
    else:
        _product(lhs_format, "gemv", wa, xa, target, nthreads)
    return target if out is None else out


def gemm(w, xq, *, lhs_format, rhs_format, out=None, threads=1):
    """Matrix product of quantized weight rows and a batch of quantized activations.

    ``w``: uint8 ``[rows, G, bytes]``; ``xq``: uint8 ``[batch, G, bytes]`` of the paired format
    -> float32 ``[batch, rows]`` with ``out[a, r] == quantized_dot(w[r], xq[a], ...)`` bit for
    bit.  For Q4_K each weight record is decoded once per tile of 8 activations.  ``w`` may
    be a ``numba_qk.repack`` result (then each activation runs the repacked gemv).
    ``lhs_format=numba_qk.f16`` / ``numba_qk.bf16``: as ``gemv``, ``xq`` ``[batch, K]``.
    """
    if _plain_records(w, xq, lhs_format, rhs_format, threads, 3):
        nthreads, rp, wa, rows, xa = threads, None, w, w.shape[0], xq
    elif _halfmat.is_float_weight(lhs_format):
        return _halfmat.product("gemm", w, xq, lhs_format, rhs_format, out,
                                check_threads(threads))
    else:
        nthreads, rp, wa, rows, xa = _product_operands("gemm", w, xq, lhs_format, rhs_format,
                                                       threads, "batch")
    target, user_out = prepare_out(out, (xa.shape[0], rows), np.float32, (wa, xa),
                                   "gemm's result")
    if xa.shape[0]:
        if rp:
            _repack.product(rp, "gemm", xa, target, nthreads)
        else:
            _product(lhs_format, "gemm", wa, xa, target, nthreads)
    return target if user_out is None else user_out


def matmul(w, x, *, lhs_format, out=None, threads=1):
    """Quantized weights times float32 activations, the way llama.cpp runs a quantized layer.

    ``w``: uint8 ``[rows, G, bytes]`` records of a weight format; ``x``: float32 ``[K]`` or
    ``[batch, K]`` with ``K = G * block_size``.  Each activation row is quantized once to the
    format paired with ``lhs_format`` (Q4_K -> Q8_K, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1),
    shared by every weight row, then ``gemv``/``gemm`` run.  Returns float32 ``[rows]`` or
    ``[batch, rows]``.  A non-finite activation raises ``QuantizationDomainError`` naming the
    row and block.  ``w`` may be ``numba_qk.repack(w, lhs_format)`` (Q4_0): same bits;
    on AVX-512 VNNI its 8-row interleaved tiles make the matvec faster.

    ``lhs_format=numba_qk.f16`` / ``numba_qk.bf16``: ``w`` an f16 / bf16 weight matrix
    ``[rows, K]`` (numpy float16, ml_dtypes.bfloat16 or a ``numba_qk.Tensor`` of that type;
    no other dtype is accepted) and ``x`` float32 ``[K]`` / ``[batch, K]``, converted to the
    weight's type as ggml does (f16: IEEE nearest even; bf16: ggml's ``fp32_to_bf16``), then
    summed in 32 f32 lanes and a fixed tree: one bit pattern per element, whatever the
    threads or batch (docs/halfmat.md).  Non-finite activations are not an error here.
    """
    p = _plain_matmul(w, x, lhs_format, threads)
    if p and threads == 1 and out is None and x.ndim == 1 and x.flags.c_contiguous and w.shape[1]:
        # the small call of a forward pass: one activation, one thread; the quantizer and the
        # gemv in one compiled call (kernels.drive.quantize_then_gemv)
        target = np.empty(w.shape[0], np.float32)
        bad = (p._matvec or p.matvec())(w, x, target)
        if bad >= 0:
            raise _domain_error(x, p.act, w.shape[1] * p.span, bad)
        return target
    if p:
        nthreads, rp, wa, xa = threads, None, w, x
        rows, g = w.shape[:2]
    elif _halfmat.is_float_weight(lhs_format):
        return _halfmat.matmul(w, x, lhs_format, out, check_threads(threads))
    else:
        check_slot_in(lhs_format, "lhs_format", registry.WEIGHTS, "matmul")
        p = _PLANS[lhs_format]
        nthreads = check_threads(threads)
        rp = _repacked(w, lhs_format, "matmul")
        wa = rp.tiles if rp else check_records(as_array(w, "w"), "w", lhs_format, "weights")
        rows, g = rp.shape[:2] if rp else wa.shape[:2]
        xa = check_f32(as_array(x, "x"), "x", "activations")
        k = g * lhs_format.block_size
        if xa.ndim not in (1, 2) or xa.shape[-1] != k:
            raise ValueError(f"x: expected shape [{k}] or [batch, {k}] (G={g} records of "
                             f"{lhs_format.block_size} per weight row), got {tuple(xa.shape)}")
    batch = 1 if xa.ndim == 1 else xa.shape[0]
    out_shape = (rows,) if xa.ndim == 1 else (batch, rows)
    target = (np.empty(out_shape, np.float32) if out is None
              else check_out(out, out_shape, np.float32, (wa, xa), "matmul's result"))
    nbytes = p.xbytes
    gx = g * p.span  # activation records per row
    if nthreads == 1 and xa.ndim == 1 and g and rp is None and xa.flags.c_contiguous:
        # as above, other arrays (out=, a memmap, ...)
        bad = p.matvec()(wa, xa, target)
        if bad >= 0:
            raise _domain_error(xa, p.act, gx, bad)
        return target if out is None else out
    xq = _quantize_activations(xa, p.act, gx, "canonical")
    if rp:
        _repack.product(rp, "gemv" if xa.ndim == 1 else "gemm",
                        xq if xa.ndim == 1 else xq.reshape(batch, gx, nbytes), target, nthreads)
    elif xa.ndim == 1:
        _product(lhs_format, "gemv", wa, xq, target, nthreads)
    else:
        _product(lhs_format, "gemm", wa, xq.reshape(batch, gx, nbytes), target, nthreads)
    return target if out is None else out


def _quantize_activations(xa, act, gx, numerics):
    """Activation records ``[batch * gx, bytes]`` of f32 ``xa`` ``[K]`` or ``[batch, K]`` (``gx``
    records per row) in binding ``act``'s format; a domain error names the row and block."""
    batch = 1 if xa.ndim == 1 else xa.shape[0]
    n, nbytes = act.format.block_size, act.format.block_bytes
    blocks = xa.reshape(batch * gx, n)
    xq = np.empty((batch * gx, nbytes), np.uint8)
    if blocks.shape[0]:
        if numerics == "ggml_cpu":
            bad = registry.GGML_CPU_QUANTIZERS[act.format](np.ascontiguousarray(blocks).reshape(-1), xq)
        else:
            bad = act.quantize(blocks, xq)
        if bad >= 0:
            raise _domain_error(xa, act, gx, bad)
    return xq


def _domain_error(xa, act, gx, bad):
    """The error for activations ``xa`` (``[K]`` or ``[batch, K]``, ``gx`` records of ``act``'s
    format per row) whose quantizer refused block ``bad`` of the flattened rows."""
    n = act.format.block_size
    row, blk = divmod(int(bad), gx)
    name = ((lambda i: f"x[{blk * n + i}]") if xa.ndim == 1
            else (lambda i: f"x[{row}, {blk * n + i}]"))
    return QuantizationDomainError(blk, act.domain_reason(xa.reshape(-1, n), int(bad), name),
                                   row=row if xa.ndim == 2 else None)


def matmul_many(weights, x, *, lhs_formats, threads=1, numerics="canonical"):
    """``[matmul(w, x, lhs_format=f) for w, f in zip(weights, lhs_formats)]``, quantizing ``x``
    once per activation format instead of once per weight (a layer's q/k/v or gate/up share one
    activation): same bits as those ``matmul`` calls.

    ``weights``: a sequence of uint8 ``[rows_i, G_i, bytes_i]`` records (or ``repack`` results),
    all with ``K = G_i * block_size`` columns; ``lhs_formats``: one weight format for all, or
    one per weight; ``x``: float32 ``[K]`` or ``[batch, K]``.  Returns a list of float32
    ``[rows_i]`` or ``[batch, rows_i]``.  ``numerics="ggml_cpu"`` quantizes the activations as
    llama.cpp does at run time (``quantize``'s option of that name) instead of with the
    canonical quantizers.
    """
    weights = list(weights)
    fmts = (list(lhs_formats) if isinstance(lhs_formats, (list, tuple))
            else [lhs_formats] * len(weights))
    if len(fmts) != len(weights):
        raise ValueError(f"matmul_many: {len(weights)} weights but {len(fmts)} lhs_formats")
    if numerics not in ("canonical", "ggml_cpu"):
        raise ValueError(f"matmul_many: numerics must be 'canonical' or 'ggml_cpu', "
                         f"not {numerics!r}")
    nthreads = check_threads(threads)
    xa = check_f32(as_array(x, "x"), "x", "activations")
    shared = {}
    outs = []
    for i, (w, f) in enumerate(zip(weights, fmts)):
        check_slot_in(f, "lhs_format", registry.WEIGHTS, "matmul_many")
        act = registry.BY_FORMAT[activation_format(f)]
        rp = _repacked(w, f, "matmul_many")
        wa = rp.tiles if rp else check_records(as_array(w, f"weights[{i}]"), f"weights[{i}]",
                                               f, "weights")
        rows, g = rp.shape[:2] if rp else wa.shape[:2]
        k = g * f.block_size
        if xa.ndim not in (1, 2) or xa.shape[-1] != k:
            raise ValueError(f"x: expected shape [{k}] or [batch, {k}] (G={g} records of "
                             f"{f.block_size} per row of weights[{i}]), got {tuple(xa.shape)}")
        batch = 1 if xa.ndim == 1 else xa.shape[0]
        gx = g * _span(f)
        if act.format not in shared:
            shared[act.format] = _quantize_activations(xa, act, gx, numerics)
        xq = shared[act.format]
        nbytes = act.format.block_bytes
        target = np.empty((rows,) if xa.ndim == 1 else (batch, rows), np.float32)
        if rp:
            _repack.product(rp, "gemv" if xa.ndim == 1 else "gemm",
                            xq if xa.ndim == 1 else xq.reshape(batch, gx, nbytes), target,
                            nthreads)
        elif xa.ndim == 1:
            _product(f, "gemv", wa, xq, target, nthreads)
        else:
            _product(f, "gemm", wa, xq.reshape(batch, gx, nbytes), target, nthreads)
        outs.append(target)
    return outs


def get_rows(records, ids, format, *, out=None):
    """float32 ``[len(ids), G * block_size]``: rows ``ids`` of the weight matrix ``records``
    (uint8 ``[rows, G, bytes]`` of any record format) dequantized, row ``i`` equal bit for bit
    to ``dequantize(records[ids[i]], format).reshape(-1)`` (ggml's ``get_rows``: an embedding
    lookup); only the selected rows are read.  ``ids``: integers in ``[0, rows)``."""
    w = check_records(as_array(records, "records"), "records", format, "weights")
    idx = np.asarray(ids)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ValueError("ids: expected a 1-D sequence of integers")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= w.shape[0]):
        raise IndexError(f"ids: row {int(idx[(idx < 0) | (idx >= w.shape[0])][0])} out of "
                         f"range for {w.shape[0]} rows")
    n = idx.size
    k = w.shape[1] * format.block_size
    target, user_out = prepare_out(out, (n, k), np.float32, (w,), "get_rows' result")
    if n and k:
        rows = w[idx].reshape(-1, w.shape[-1])
        dequantize(rows, format, out=target.reshape(-1, format.block_size))
    return target if user_out is None else user_out
