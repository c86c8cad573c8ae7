"""The public layer of F16/BF16 weight matrices (``matmul``/``gemv``/``gemm`` with
``lhs_format=numba_qk.f16`` or ``numba_qk.bf16``): validation, the activation conversion of
docs/halfmat.md step 1, and dispatch to ``kernels/lowp/halfmat.py`` over row chunks.

Accepted weights / activations: f16 -- numpy ``float16`` arrays (native byte order) or a
``numba_qk.Tensor`` of f16; bf16 -- ``ml_dtypes.bfloat16`` arrays or a ``numba_qk.Tensor`` of
bf16.  Anything else (a float32 or uint16 array, the other type) is a TypeError: nothing is
converted silently.  Non-contiguous weights are copied once to C order.
"""

from __future__ import annotations

import numpy as np

from . import _threads
from ._validate import as_array, check_f32, check_slot, prepare_out
from .dtypes import dtype_lookup
from ._registry import FLOAT_WEIGHTS
from .formats import bf16, f16
from .kernels.lowp import halfmat as _k
from .tensor import Tensor

__all__ = ["FLOAT_WEIGHTS", "is_float_weight", "codes", "convert_activations", "matmul", "product"]


def is_float_weight(fmt) -> bool:
    return fmt is FLOAT_WEIGHTS[0] or fmt is FLOAT_WEIGHTS[1]


_KERNELS = {f16: (_k.gemv_f16, _k.gemm_f16), bf16: (_k.gemv_bf16, _k.gemm_bf16)}
_HOW = {f16: "numpy float16 or a numba_qk.Tensor of f16",
        bf16: "ml_dtypes.bfloat16 or a numba_qk.Tensor of bf16"}


def codes(obj, t, name: str, what: str) -> np.ndarray:
    """uint16 codes (a view) of ``obj``, which must hold elements of type ``t``."""
    if isinstance(obj, Tensor):
        if obj.dtype is not t:
            raise TypeError(f"{name}: {what} with lhs_format={t.name} expects {_HOW[t]}, got a "
                            f"numba_qk.Tensor of {obj.dtype.name}; no cast is made")
        return obj.storage.view(np.uint16)
    arr = as_array(obj, name)
    et, _ = dtype_lookup(arr.dtype)
    if et is not t:
        raise TypeError(f"{name}: {what} with lhs_format={t.name} expects {_HOW[t]}, got dtype "
                        f"{arr.dtype.str} ({arr.dtype.name}); no cast is made")
    return arr.view(np.uint16)


def convert_activations(t, x: np.ndarray) -> np.ndarray:
    """float32 values of ``x`` (f32) rounded to ``t`` the way ggml converts ``mul_mat``'s
    activations (docs/halfmat.md step 1), widened back exactly: a new C-contiguous array."""
    if t is f16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    u = np.ascontiguousarray(x).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    r = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), r)
    return (r << np.uint32(16)).view(np.float32)


def _widened(t, xc: np.ndarray) -> np.ndarray:
    """Exact f32 values of codes (for ``gemv``/``gemm``'s converted activations)."""
    if t is f16:
        return xc.view(np.float16).astype(np.float32)
    return (xc.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _weights(w, t, what):
    wc = codes(w, t, "w", f"{what}'s weights")
    if wc.ndim != 2:
        raise ValueError(f"w: {what} expects {t.name} weights of shape [rows, K], got "
                         f"{tuple(wc.shape)}")
    return wc


def _run(t, wc, x, target, nthreads):
    """gemv (1-d ``x``) or gemm of the kernels over row chunks; ``x`` f32 values."""
    gemv_k, gemm_k = _KERNELS[t]
    wc = np.ascontiguousarray(wc)
    rows = wc.shape[0]
    if rows == 0 or target.size == 0:
        return
    if not target.flags.c_contiguous:     # the kernels write contiguous rows
        block = np.empty(target.shape, np.float32)
        _run(t, wc, x, block, nthreads)
        target[...] = block
        return
    n = _threads.effective_threads(nthreads, -(-rows // 8)) if nthreads > 1 else 1
    if x.ndim == 1:
        if n == 1:
            gemv_k(wc, x, target)
        else:
            _threads.run_rows(gemv_k, wc, x, target, n)
        return
    if n == 1:
        gemm_k(wc, x, target)
        return

    def piece(r0, r1):
        block = np.empty((x.shape[0], r1 - r0), np.float32)
        gemm_k(wc[r0:r1], x, block)
        target[:, r0:r1] = block
    _threads.run([(piece, (r0, r1)) for r0, r1 in _threads.row_chunks(rows, n, per_thread=2)],
                 n)


def matmul(w, x, t, out, nthreads):
    """``numba_qk.matmul`` for ``lhs_format`` ``t`` in ``FLOAT_WEIGHTS``."""
    wc = _weights(w, t, "matmul")
    rows, k = wc.shape
    xa = check_f32(as_array(x, "x"), "x", "activations")
    if xa.ndim not in (1, 2) or xa.shape[-1] != k:
        raise ValueError(f"x: expected shape [{k}] or [batch, {k}] (K={k}, the {t.name} "
                         f"weights' row length), got {tuple(xa.shape)}")
    out_shape = (rows,) if xa.ndim == 1 else (xa.shape[0], rows)
    target, user_out = prepare_out(out, out_shape, np.float32, (wc, xa), "matmul's result")
    _run(t, wc, convert_activations(t, xa), target, nthreads)
    return target if user_out is None else user_out


def product(kind, w, xq, t, rhs_format, out, nthreads):
    """``numba_qk.gemv`` (``kind='gemv'``, ``xq`` [K]) / ``gemm`` (``xq`` [batch, K]) for
    ``lhs_format`` ``t``: ``xq`` holds activations already of type ``t`` (``rhs_format`` is
    ``t`` too)."""
    if rhs_format is not t:
        check_slot(rhs_format, "rhs_format", t, kind, f" to pair with {t.name} weights")
    wc = _weights(w, t, kind)
    rows, k = wc.shape
    xc = codes(xq, t, "xq", f"{kind}'s activations")
    nd = 1 if kind == "gemv" else 2
    if xc.ndim != nd or xc.shape[-1] != k:
        want = f"[{k}]" if nd == 1 else f"[batch, {k}]"
        raise ValueError(f"xq: {kind} expects {t.name} activations of shape {want} (K={k}, "
                         f"the weights' row length), got {tuple(xc.shape)}")
    out_shape = (rows,) if nd == 1 else (xc.shape[0], rows)
    target, user_out = prepare_out(out, out_shape, np.float32, (wc, xc), f"{kind}'s result")
    _run(t, wc, _widened(t, xc), target, nthreads)
    return target if user_out is None else user_out

