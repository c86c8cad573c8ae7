"""``numba_qk.mx``: the closed block-scaled formats (spec 004 part 2; DESIGN.md §9).

==============  =====  =======  ========================  ============  ====  ===========
format          block  element  block scale               tensor scale  emax  bits/elem
==============  =====  =======  ========================  ============  ====  ===========
``mxfp4``       32     e2m1     e8m0 (2^(code-127))       --            2     4.25
``mxfp6e2m3``   32     e2m3     e8m0                      --            2     6.25
``mxfp6e3m2``   32     e3m2     e8m0                      --            4     6.25
``mxfp8e4m3``   32     e4m3     e8m0                      --            8     8.25
``mxfp8e5m2``   32     e5m2     e8m0                      --            15    8.25
``mxint8``      32     i8       e8m0 (value q*2^X/64)     --            0     8.25
``nvfp4``       16     e2m1     ue4m3 (e4m3, sign 0)      float32       --    4.5
==============  =====  =======  ========================  ============  ====  ===========

``numba_qk.astype(x, numba_qk.mx.mxfp4)`` encodes to a :class:`numba_qk.ScaledTensor`;
``numba_qk.astype(st, numba_qk.f32)`` decodes.  ``from_name("mxfp4")`` finds them too;
``numba_qk.capabilities(fmt)`` answers for each (``numba_qk.capabilities(scaled=True)`` lists
them after the record formats).
"""

from __future__ import annotations

import numpy as np

from .errors import QuantizationDomainError
from .formats.mx import (FORMATS, ScaledFormat, find_scaled, mxfp4, mxfp6e2m3,  # noqa: F401
                         mxfp6e3m2, mxfp8e4m3, mxfp8e5m2, mxint8, nvfp4)
from .formats.mx import _lookup  # noqa: F401  (pickles name numba_qk.mx._lookup)
from .scaled import ScaledTensor

__all__ = ["ScaledFormat", "mxfp4", "mxfp6e2m3", "mxfp6e3m2", "mxfp8e4m3", "mxfp8e5m2", "mxint8",
           "nvfp4", "FORMATS", "find", "from_ggml", "to_ggml"]

# The formats are declared in numba_qk.formats.mx (with the element types they are built from).
find = find_scaled   # the block-scaled format named ``name`` (case-insensitive), or None


GGML_MXFP4_BLOCK_BYTES = 17   # ggml's block_mxfp4: e8m0 byte + 16 bytes of nibbles (type 39)


def from_ggml(records):
    """ggml MXFP4 records (GGML type 39) -> an ``mxfp4`` ScaledTensor (a copy), exact by value.

    ``records``: uint8 bytes, last axis a whole number of 17-byte blocks (byte 0 the e8m0 scale,
    bytes 1..16 hold element j in the low nibble of byte j and element j+16 in the high nibble);
    the result has 32 elements per block on that axis.  ggml decodes nibble 8 as +0, so it
    becomes code 0 (+0) here.  A scale byte 0xFF (no OCP meaning; NaN in e8m0) is a
    QuantizationDomainError naming the block.
    """
    a = records if isinstance(records, np.ndarray) else np.asarray(memoryview(records))
    if a.dtype != np.uint8:
        raise TypeError(f"records: expected uint8 bytes, got dtype {a.dtype}")
    if a.ndim == 0 or a.shape[-1] % GGML_MXFP4_BLOCK_BYTES:
        raise ValueError(f"records: the last axis must be a whole number of 17-byte MXFP4 "
                         f"blocks, got shape {a.shape}")
    nb = a.shape[-1] // GGML_MXFP4_BLOCK_BYTES
    blocks = a.reshape(a.shape[:-1] + (nb, GGML_MXFP4_BLOCK_BYTES))
    scales = np.array(blocks[..., 0], dtype=np.uint8)
    _check_scales(scales, "MXFP4 record")
    qs = blocks[..., 1:]
    codes = np.concatenate([qs & np.uint8(0xF), qs >> np.uint8(4)], axis=-1)  # elements 0..31
    codes[codes == 8] = 0                                        # ggml's nibble 8 is +0
    packed = (codes[..., 0::2] << np.uint8(4)) | codes[..., 1::2]  # ours: element 0 high
    return ScaledTensor(np.ascontiguousarray(packed.reshape(a.shape[:-1] + (nb * 16,))),
                        scales, mxfp4)


def to_ggml(st):
    """An ``mxfp4`` ScaledTensor -> ggml MXFP4 records (uint8, last axis 17 bytes per block),
    exact by value (same scale bytes and element codes; ggml's nibble layout)."""
    if not isinstance(st, ScaledTensor) or st.dtype is not mxfp4:
        raise TypeError(f"to_ggml: expected an mxfp4 ScaledTensor, got {st!r}")
    scales = np.ascontiguousarray(st.block_scales.storage).view(np.uint8)
    _check_scales(scales, "mxfp4 block")
    nb = scales.shape[-1]
    codes = st.elements.codes().astype(np.uint8).reshape(scales.shape + (32,))
    out = np.empty(scales.shape + (GGML_MXFP4_BLOCK_BYTES,), np.uint8)
    out[..., 0] = scales
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    return out.reshape(scales.shape[:-1] + (nb * GGML_MXFP4_BLOCK_BYTES,))


def _check_scales(scales, what):
    bad = np.flatnonzero(scales.reshape(-1) == 0xFF)
    if bad.size:
        raise QuantizationDomainError(int(bad[0]), f"{what} scale byte 0xFF has no OCP MX "
                                      f"meaning (e8m0 NaN; ggml reads it as 2^128)")
