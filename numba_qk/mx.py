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
``numba_qk.astype(st, numba_qk.f32)`` decodes.  ``from_name("mxfp4")`` finds them too.
"""

from __future__ import annotations

from .dtypes import e2m1, e2m3, e3m2, e4m3, e5m2, e8m0
from .formats import _TOKEN, i8
from .formats.mx import ScaledFormat

__all__ = ["ScaledFormat", "mxfp4", "mxfp6e2m3", "mxfp6e3m2", "mxfp8e4m3", "mxfp8e5m2", "mxint8",
           "nvfp4", "FORMATS", "find"]

# ScaledFormat(token, name, block, element, scale, has tensor scale, emax_elem, doc)
mxfp4 = ScaledFormat(_TOKEN, "mxfp4", 32, e2m1, e8m0, False, 2, "OCP MX FP4 (E2M1)")
mxfp6e2m3 = ScaledFormat(_TOKEN, "mxfp6e2m3", 32, e2m3, e8m0, False, 2, "OCP MX FP6 (E2M3)")
mxfp6e3m2 = ScaledFormat(_TOKEN, "mxfp6e3m2", 32, e3m2, e8m0, False, 4, "OCP MX FP6 (E3M2)")
mxfp8e4m3 = ScaledFormat(_TOKEN, "mxfp8e4m3", 32, e4m3, e8m0, False, 8, "OCP MX FP8 (E4M3)")
mxfp8e5m2 = ScaledFormat(_TOKEN, "mxfp8e5m2", 32, e5m2, e8m0, False, 15, "OCP MX FP8 (E5M2)")
mxint8 = ScaledFormat(_TOKEN, "mxint8", 32, i8, e8m0, False, 0, "OCP MX INT8 (q * 2^X / 64)")
nvfp4 = ScaledFormat(_TOKEN, "nvfp4", 16, e2m1, e4m3, True, None,
                     "NVIDIA NVFP4: e2m1, ue4m3 block scale, f32 tensor scale")

FORMATS = (mxfp4, mxfp6e2m3, mxfp6e3m2, mxfp8e4m3, mxfp8e5m2, mxint8, nvfp4)
_BY_NAME = {f.name: f for f in FORMATS}


def _lookup(attr):
    return _BY_NAME[attr]


def find(name):
    """The block-scaled format named ``name`` (``"mxfp4"``, case-insensitive), or None."""
    return _BY_NAME.get(name.lower()) if isinstance(name, str) else None


def __getattr__(name):  # ScaledTensor lives in numba_qk.scaled (imports kernels lazily)
    if name in ("from_ggml", "to_ggml"):
        raise AttributeError(f"numba_qk.mx.{name} is not implemented yet (issue 11, ggml bridge)")
    raise AttributeError(f"module 'numba_qk.mx' has no attribute {name!r}")
