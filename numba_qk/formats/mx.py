"""``ScaledFormat``: the closed block-scaled composite formats (spec 004; DESIGN.md §9).

A block-scaled format stores a tensor as *element codes* of a low-precision element type, one
*block scale* per ``block_size`` consecutive elements along the last axis, and -- NVFP4 only -- a
float32 *tensor scale*.  The singletons (``numba_qk.mx.mxfp4`` ...) are declared here, after
the element types they are built from (:mod:`.scalars`); :mod:`numba_qk.mx` presents them.

Spec 001's questions, answered for numba_qk's storage of a ``ScaledTensor``:

* ``block_size``: elements per block (32 for MX, 16 for NVFP4);
* ``block_bytes``: bytes one block occupies in our layout -- element storage (fp6 codes and
  int8 one per byte, e2m1 two per byte, fp8 one per byte) plus its one scale byte (the NVFP4
  tensor scale is per tensor, not per block);
* ``bits_per_element``: *logical* bits: element bits + scale bits / block (MXFP4 4.25, MXFP6
  6.25, MXFP8/MXINT8 8.25, NVFP4 4.5) -- the OCP figure, independent of our fp6 padding;
* ``is_quantized`` True; ``is_float``: whether the elements are floats (MXINT8: False);
* ``storage_bytes(n)``: ``n // block_size * block_bytes``, None unless ``n`` is a whole number of
  blocks; ``ggml_type`` None (ggml's MXFP4/NVFP4 *record* formats are different layouts).
"""

from __future__ import annotations

from typing import Optional

from ._schema import TOKEN, Singleton, check_count, no_subclass
from .scalars import e2m1, e2m3, e3m2, e4m3, e5m2, e8m0, i8

__all__ = ["ScaledFormat", "find_scaled", "mxfp4", "mxfp6e2m3", "mxfp6e3m2", "mxfp8e4m3",
           "mxfp8e5m2", "mxint8", "nvfp4", "FORMATS"]

_SCALED_BY_NAME: dict = {}   # every ScaledFormat (declared below), by name


def _lookup(attr):
    """The ScaledFormat named ``attr`` (what a pickled ScaledFormat refers to)."""
    return _SCALED_BY_NAME[attr]


_lookup.__module__ = "numba_qk.mx"   # pickles name numba_qk.mx._lookup, as they always did


def find_scaled(name):
    """The block-scaled format named ``name`` (``"mxfp4"``, case-insensitive), or None."""
    return _SCALED_BY_NAME.get(name.lower()) if isinstance(name, str) else None


@no_subclass
class ScaledFormat(Singleton):
    """A block-scaled composite format (closed singleton): ``numba_qk.mx.mxfp4`` ..."""

    __slots__ = ("name", "_attr", "block_size", "element", "scale", "has_tensor_scale", "emax",
                 "doc")

    is_quantized = True
    ggml_type = None
    _path, _lookup = "numba_qk.mx.", _lookup

    def __init__(self, token, name, block_size, element, scale, has_tensor_scale, emax, doc):
        if token is not TOKEN:
            raise TypeError("ScaledFormat objects are created by numba_qk only; use "
                            "numba_qk.mx.mxfp4 ...")
        self._init(name=name, _attr=name, block_size=block_size, element=element, scale=scale,
                   has_tensor_scale=has_tensor_scale, emax=emax, doc=doc)
        _SCALED_BY_NAME[name] = self

    @property
    def is_float(self) -> bool:
        return self.element.is_float

    @property
    def element_bits(self) -> int:
        return self.element.bits

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in numba_qk's layout: the element storage plus one scale byte."""
        return self.block_size // self.element.block_size * self.element.block_bytes + 1

    @property
    def bits_per_element(self) -> float:
        """Logical bits per element: element bits + scale bits / block (OCP's figure)."""
        return self.element.bits + 8 / self.block_size

    def storage_bytes(self, n: int) -> Optional[int]:
        n = check_count(n)
        return None if n % self.block_size else n // self.block_size * self.block_bytes



ScaledFormat.__module__ = "numba_qk.formats"


# ---- the declarations, one per format (the table in numba_qk.mx's docstring) ------------------
# ScaledFormat(token, name, block, element, scale, has tensor scale, emax_elem, doc)
mxfp4 = ScaledFormat(TOKEN, "mxfp4", 32, e2m1, e8m0, False, 2, "OCP MX FP4 (E2M1)")
mxfp6e2m3 = ScaledFormat(TOKEN, "mxfp6e2m3", 32, e2m3, e8m0, False, 2, "OCP MX FP6 (E2M3)")
mxfp6e3m2 = ScaledFormat(TOKEN, "mxfp6e3m2", 32, e3m2, e8m0, False, 4, "OCP MX FP6 (E3M2)")
mxfp8e4m3 = ScaledFormat(TOKEN, "mxfp8e4m3", 32, e4m3, e8m0, False, 8, "OCP MX FP8 (E4M3)")
mxfp8e5m2 = ScaledFormat(TOKEN, "mxfp8e5m2", 32, e5m2, e8m0, False, 15, "OCP MX FP8 (E5M2)")
mxint8 = ScaledFormat(TOKEN, "mxint8", 32, i8, e8m0, False, 0, "OCP MX INT8 (q * 2^X / 64)")
nvfp4 = ScaledFormat(TOKEN, "nvfp4", 16, e2m1, e4m3, True, None,
                     "NVIDIA NVFP4: e2m1, ue4m3 block scale, f32 tensor scale")

#: Every block-scaled format, in declaration (= listing) order.
FORMATS = tuple(_SCALED_BY_NAME.values())
