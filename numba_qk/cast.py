"""``numba_qk.astype``: buffer-first, one-pass casts between element types (spec 004).

``astype(a, dtype, *, out=None, threads=1)`` reads ``a`` -- a numpy array of any rank and
strides (f64, f32, f16, ints, bool), an ml_dtypes array (by value), a :class:`Tensor` or any
buffer -- and writes every element once, converted by the kernels of
:mod:`numba_qk.kernels.lowp.codecs` (DESIGN.md §8's policy: one RNE from the exact source value).
The result is C-contiguous with the same logical shape: a numpy array where numpy has the
target dtype (f32, f16, i8, u8, i32), else a Tensor; or ``out`` when given.

The kernels run without the GIL; ``threads=N`` splits the work over up to N threads (fewer when
other processes keep cores busy: ``numba_qk._threads``); ``threads=None`` means every core, as
for the products.

This module is ``astype``'s dispatch, above both halves: the element types
(:mod:`numba_qk._convert`) and the block-scaled formats (:mod:`numba_qk.scaled`).  Arguments
are checked by :mod:`numba_qk._validate`, the products' validation module.
"""

from __future__ import annotations

from . import tensor as _tensor
from ._convert import convert, dot
from ._validate import check_threads
from .scaled import ScaledTensor, as_scaled_format, decode, encode
from .tensor import astype_codes

__all__ = ["astype", "astype_codes"]

# casts validate ``threads`` exactly as the products do (one copy: ``_validate.check_threads``;
# None = every core this process may run on)
_check_threads = check_threads


def astype(a, dtype, *, out=None, threads=1, tensor_scale=None):
    """Convert ``a`` to element type ``dtype`` in one native pass (GIL released).

    ``dtype``: a numba_qk element type (``numba_qk.bf16``) or a NumKong/ml_dtypes/ggml name.
    Returns a new C-contiguous numpy array (f32, f16, i8, u8, i32) or Tensor (other types) of
    ``a``'s logical shape, or ``out`` -- any writable, C-contiguous buffer of exactly that shape
    and type (ndarray, memoryview, Tensor; an ml_dtypes array for bf16/fp8/fp6/e8m0, a Tensor for
    packed types) that does not overlap ``a``; on error ``out`` is untouched.
    Same type: an independent copy of the codes (NaN payloads kept).

    Block-scaled formats (spec 004 part 2, DESIGN.md §9): ``dtype=numba_qk.mx.mxfp4`` (or its
    name) encodes ``a`` -- as float32 -- along its last axis to a :class:`numba_qk.ScaledTensor`
    (``tensor_scale=`` sets NVFP4's tensor scale; ``out`` a ScaledTensor or a tuple (elements,
    block_scales)); a ScaledTensor ``a`` is decoded to ``dtype``.
    """
    fmt = as_scaled_format(dtype)
    if fmt is not None:                                 # block-scaled encode -> ScaledTensor
        return encode(a, fmt, out=out, threads=threads, tensor_scale=tensor_scale)
    if tensor_scale is not None:
        raise TypeError("tensor_scale: only for encoding to a format with a tensor scale "
                        "(numba_qk.mx.nvfp4)")
    if isinstance(a, ScaledTensor):                     # block-scaled decode
        return decode(a, dtype, out=out, threads=threads)
    return convert(a, dtype, out=out, threads=threads)


# Tensor.astype / ScaledTensor.astype reach this function through the array types' table
_tensor.OPERATIONS["astype"] = astype
