"""Closed, typed schemas for the tensor formats numba_qk understands.

A *format* says what the bytes of a tensor mean.  Two kinds exist:

* :class:`Format` -- a block-quantized record format (``Q4_K``, ``Q8_K``): a fixed number of
  logical elements (``block_size``) packed into a fixed number of bytes (``block_bytes``), laid
  out as an ordered tuple of :class:`Field` s.
* :class:`ScalarType` -- a plain element type (``f32``, ``bf16``, ``e4m3`` ...): one element
  per "block" (two or eight per byte for the packed sub-byte types).

Both answer the same questions (spec 001): ``block_size``, ``block_bytes``, ``is_quantized``,
``is_float`` and ``storage_bytes(n)`` (``None`` when ``n`` is not a whole number of blocks).

The set of formats is *closed*: instances are created only in this package, cannot be modified,
cannot be subclassed, and there is no public way to register new ones.  Formats are compared by
identity; strings and numpy dtypes are never accepted in their place.

The field tables of the family modules are the single source of truth for record layout.  At
import time every format checks that its fields tile ``[0, block_bytes)`` exactly: each byte span
is either owned by one field or shared by fields whose bit widths fill it completely (Q4_K's
packed 6-bit ``sc``/``m``).

Layout: ``_schema`` (``Field``, ``Format``, the tiling check), one declaration module per family
(``kquants``, ``legacy``, ``mxrec``, ``iq``, ``lowbit``), ``scalars`` (``ScalarType`` and one declaration per element
type, the table every element-type lookup derives from) and ``mx`` (``ScaledFormat`` and the
block-scaled formats built from those element types); this module collects them.  No numba
anywhere in the package.
"""

from __future__ import annotations

from typing import Iterator

from . import iq, kquants, legacy, lowbit, mxrec
from ._schema import (F, TOKEN, Field, Format, check_tiling, Frozen,  # noqa: F401
                      _lookup_format, no_subclass)
from .scalars import SCALARS, ScalarType, _lookup_scalar, bf16, f16, f32, i8, i32  # noqa: F401
from .mx import ScaledFormat  # noqa: F401  (the singletons: formats.mx, presented by numba_qk.mx)
from .kquants import q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, tq1_0, tq2_0  # noqa: F401
from .legacy import q4_0, q4_1, q5_0, q5_1, q8_0, q8_1  # noqa: F401
from .mxrec import mxfp4, nvfp4  # noqa: F401
from .iq import iq4_nl, iq4_xs  # noqa: F401
from .iq import iq1_m, iq1_s, iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs  # noqa: F401
from .lowbit import q1_0, q2_0  # noqa: F401

__all__ = ["Field", "Format", "ScalarType", "ScaledFormat", "QuantNamespace", "quant", "f32", "f16", "bf16", "i8",
           "i32", "from_ggml_type", "activation_format"]

# The families, in listing order; a new family module is added here, a new format only in its
# family's FORMATS.
_FAMILIES = (kquants, legacy, mxrec, iq, lowbit)
_FORMATS = {f._attr: f for family in _FAMILIES for f in family.FORMATS}
_BY_GGML_TYPE = {t.ggml_type: t for t in (*_FORMATS.values(), *SCALARS)}

# Which activation format each weight format's dot pairs with (ggml's vec_dot_type).
_ACTIVATION_FORMAT = {w: a for family in _FAMILIES for w, a in family.ACTIVATION.items()}


def from_ggml_type(type_id: int):
    """The numba_qk format or scalar type for a GGML type id (``enum ggml_type``).

    Raises ``KeyError`` naming the id for GGML types numba_qk does not model.
    """
    import operator

    tid = operator.index(type_id)
    try:
        return _BY_GGML_TYPE[tid]
    except KeyError:
        known = ", ".join(f"{k}={v.name}" for k, v in sorted(_BY_GGML_TYPE.items()))
        raise KeyError(f"GGML type id {tid} is not modelled by numba_qk (known: {known})") from None


def activation_format(weight_format: Format) -> Format:
    """The activation format a weight format's quantized dot pairs with (Q4_K -> Q8_K, ...)."""
    try:
        return _ACTIVATION_FORMAT[weight_format]
    except (KeyError, TypeError):
        raise TypeError(f"{weight_format!r} has no quantized dot; weight formats: "
                        f"{', '.join(repr(f) for f in _ACTIVATION_FORMAT)}") from None


@no_subclass
class QuantNamespace(Frozen):
    """``numba_qk.quant``: the closed set of block-quantized formats."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Format]:
        return iter(_FORMATS.values())

    def __contains__(self, item) -> bool:
        return id(item) in _FORMAT_IDS    # identity, never the item's own __eq__ / __hash__

    def __repr__(self):
        return f"numba_qk.quant({', '.join(f.name for f in self)})"


for _attr, _fmt in _FORMATS.items():  # numba_qk.quant.<attr>, one per declared format
    setattr(QuantNamespace, _attr, _fmt)

quant = QuantNamespace()
_FORMAT_IDS = frozenset(id(f) for f in _FORMATS.values())   # the formats live as long as this
