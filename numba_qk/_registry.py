"""The format registry: each block-quantized ``Format`` bound to its kernels, in one entry.

One ``Binding`` per format says everything the public operations need to know about it:

* ``dequantize(records, out)`` and ``decode(records) -> fields``  (every format)
* ``quantize(values, out) -> -1 | first bad block`` and ``domain_reason(values, b, element)``
  (formats numba_qk can produce)
* ``find_invalid(records, bad) -> count`` (formats with a data contract beyond "any bytes")
* ``dot(w, x)``, ``gemv(w, x, out)``, ``gemm(w, x, out)`` (weight formats; the activation
  format is the one the declaration pairs it with, ``formats.activation_format``); threads
  split gemv/gemm by rows outside the kernels (``numba_qk._threads``).

``ops``, ``gguf``, the CLI and the tests iterate over ``BINDINGS``; nothing else lists formats.
At import ``check_bindings`` fails on a half-bound format (a quantizer without a domain reason,
a dot without gemv/gemm, a weight format whose activation cannot be quantized, a declared
format with no binding...).  ``capabilities`` is the public view of the table.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from .formats import Format, ScalarType, activation_format, quant
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.kquants.dot import dot_q4_k_q8_k, gemm_q4_k_q8_k, gemv_q4_k_q8_k
from numba_qk.kernels.kquants.q4_k import q4_k_decode_records, q4_k_dequantize_records
from numba_qk.kernels.kquants.q4_k_encode import quantize_q4_k
from numba_qk.kernels.kquants.q8_k import q8_k_decode_records, q8_k_dequantize_records, q8_k_invalid_records, quantize_q8_k
from numba_qk.kernels.kquants import q2_k as _k2
from numba_qk.kernels.kquants import q3_k as _k3
from numba_qk.kernels.kquants import q5_k as _k5
from numba_qk.kernels.kquants import q6_k as _k6
from numba_qk.kernels.fp4 import mxrec as _kfp4

__all__ = ["Binding", "BINDINGS", "BY_FORMAT", "QUANTIZABLE", "WEIGHTS", "binding", "capabilities",
           "Capabilities", "check_bindings", "Q4KFields", "Q8KFields", "BlockFields", "Q2KFields", "Q3KFields",
           "Q5KFields", "Q6KFields", "MXFP4Fields", "NVFP4Fields"]


# ----------------------------------------------------------------------------- decoded fields
# (public as numba_qk.Q4KFields ...; their home module stays numba_qk.ops for repr and pickle)

class Q4KFields(NamedTuple):
    """Decoded Q4_K fields of ``G`` records."""

    d: np.ndarray     # float16 [G]
    dmin: np.ndarray  # float16 [G]
    sc: np.ndarray    # uint8 [G, 8]   (6-bit values)
    m: np.ndarray     # uint8 [G, 8]   (6-bit values)
    q: np.ndarray     # uint8 [G, 256] (4-bit values)


class Q8KFields(NamedTuple):
    """Decoded Q8_K fields of ``G`` records."""

    ds: np.ndarray    # float32 [G]
    q: np.ndarray     # int8 [G, 256]
    bsum: np.ndarray  # int16 [G, 16]


class BlockFields(NamedTuple):
    """Decoded fields of ``G`` records of a legacy 32-element format."""

    d: np.ndarray                  # float16 [G]
    q: np.ndarray                  # [G, 32]: uint8 stored quants (Q4: 0..15, Q5: 0..31), int8 (Q8)
    m: Optional[np.ndarray] = None  # float16 [G] (Q4_1, Q5_1)
    s: Optional[np.ndarray] = None  # float16 [G] (Q8_1)


class Q2KFields(NamedTuple):
    """Decoded Q2_K fields of ``G`` records (``x = d*sc[j]*q - dmin*m[j]``, ``j = i // 16``)."""

    d: np.ndarray     # float16 [G]
    dmin: np.ndarray  # float16 [G]
    sc: np.ndarray    # uint8 [G, 16]  (4-bit values)
    m: np.ndarray     # uint8 [G, 16]  (4-bit values)
    q: np.ndarray     # uint8 [G, 256] (2-bit values)


class Q3KFields(NamedTuple):
    """Decoded Q3_K fields of ``G`` records (``x = d*(sc[j] - 32)*q``, ``j = i // 16``)."""

    d: np.ndarray     # float16 [G]
    sc: np.ndarray    # uint8 [G, 16]  (stored 6-bit scales, used as sc - 32)
    q: np.ndarray     # int8 [G, 256]  (-4..3: low 2 bits, minus 4 where the hmask bit is clear)


class Q5KFields(NamedTuple):
    """Decoded Q5_K fields of ``G`` records (``x = d*sc[s]*q - dmin*m[s]``, ``s = i // 32``)."""

    d: np.ndarray     # float16 [G]
    dmin: np.ndarray  # float16 [G]
    sc: np.ndarray    # uint8 [G, 8]   (6-bit values)
    m: np.ndarray     # uint8 [G, 8]   (6-bit values)
    q: np.ndarray     # uint8 [G, 256] (5-bit values)


class Q6KFields(NamedTuple):
    """Decoded Q6_K fields of ``G`` records (``x = d*sc[j]*(q - 32)``, ``j = i // 16``)."""

    d: np.ndarray     # float16 [G]
    sc: np.ndarray    # int8 [G, 16]
    q: np.ndarray     # uint8 [G, 256] (stored 6-bit values, used as q - 32)


class MXFP4Fields(NamedTuple):
    """Decoded fields of ``G`` ggml MXFP4 records (``x = kvalues_fp4[q] * 2^(e - 128)``)."""

    e: np.ndarray     # uint8 [G]      (e8m0 scale bytes)
    q: np.ndarray     # uint8 [G, 32]  (e2m1 codes 0..15, in element order)


class NVFP4Fields(NamedTuple):
    """Decoded fields of ``G`` ggml NVFP4 records (``x = kvalues_fp4[q] * ue4m3(d[i // 16]) / 2``)."""

    d: np.ndarray     # uint8 [G, 4]   (ue4m3 sub-block scale bytes)
    q: np.ndarray     # uint8 [G, 64]  (e2m1 codes 0..15, in element order)


for _cls in (Q4KFields, Q8KFields, BlockFields, Q2KFields, Q3KFields, Q5KFields, Q6KFields,
             MXFP4Fields, NVFP4Fields):
    _cls.__module__ = "numba_qk.ops"


def _f16_field(arr: np.ndarray, field) -> np.ndarray:
    """float16 [G] from the 2-byte field of each record (bits kept)."""
    g = arr.shape[0]
    return (np.ascontiguousarray(arr[:, field.start:field.stop]).view("<f2").reshape(g)
            .astype(np.float16))


def _decode_q4_k(arr):
    fmt = quant.q4_k
    g = arr.shape[0]
    sc = np.empty((g, fmt.field("sc").count), np.uint8)
    m = np.empty((g, fmt.field("m").count), np.uint8)
    q = np.empty((g, fmt.field("q").count), np.uint8)
    if g:
        q4_k_decode_records(arr, sc, m, q)
    return Q4KFields(_f16_field(arr, fmt.field("d")), _f16_field(arr, fmt.field("dmin")), sc, m, q)


def _decode_q8_k(arr):
    fmt = quant.q8_k
    g = arr.shape[0]
    ds = np.empty(g, np.float32)
    q = np.empty((g, fmt.field("q").count), np.int8)
    bsum = np.empty((g, fmt.field("bsum").count), np.int16)
    if g:
        q8_k_decode_records(arr, ds, q, bsum)
    return Q8KFields(ds, q, bsum)


def _kquant_decoder(fmt, kernel, fields, arrays):
    """decode() of a K-quant: ``arrays`` = (field name, dtype) filled by ``kernel`` in order;
    ``q`` holds one quant per element; the f16 fields (``d``, ``dmin``) read straight from the
    records."""
    def decode(arr):
        g = arr.shape[0]
        filled = [np.empty((g, fmt.block_size if name == "q" else fmt.field(name).count), dtype)
                  for name, dtype in arrays]
        if g:
            kernel(arr, *filled)
        by_name = dict(zip((name for name, _ in arrays), filled))
        return fields(*(by_name[name] if name in by_name else _f16_field(arr, fmt.field(name))
                        for name in fields._fields))
    return decode


def _decode_mxfp4(arr):
    g = arr.shape[0]
    e = np.empty(g, np.uint8)
    q = np.empty((g, quant.mxfp4.block_size), np.uint8)
    if g:
        _kfp4.mxfp4_decode_records(arr, e, q)
    return MXFP4Fields(e, q)


def _decode_nvfp4(arr):
    g = arr.shape[0]
    d = np.empty((g, quant.nvfp4.field("d").count), np.uint8)
    q = np.empty((g, quant.nvfp4.block_size), np.uint8)
    if g:
        _kfp4.nvfp4_decode_records(arr, d, q)
    return NVFP4Fields(d, q)


def _legacy_decoder(entry):
    """decode() of a legacy format, from its fields: d, q (stored quants), m and s if declared."""
    fmt = entry.format
    names = {f.name for f in fmt.fields}
    qs = fmt.field("qs")

    def decode(arr):
        g = arr.shape[0]
        q = np.empty((g, qs.count), np.int8 if qs.signed else np.uint8)
        if g:
            entry.decode(arr, q)
        return BlockFields(_f16_field(arr, fmt.field("d")), q,
                           _f16_field(arr, fmt.field("m")) if "m" in names else None,
                           _f16_field(arr, fmt.field("s")) if "s" in names else None)
    return decode


# ----------------------------------------------------------------------------- domain reasons

def _nonfinite(values, b, element):
    block = np.asarray(values[b])
    nonfinite = np.flatnonzero(~np.isfinite(block))
    if not nonfinite.size:
        return None
    i = int(nonfinite[0])
    name = element(i) if element else f"values[{b}, {i}]"
    return f"{name} is {float(block[i])!r}; quantize needs finite float32 values"


def finite_reason(values, b: int, element=None) -> str:
    """Why block ``b`` failed a quantizer whose only domain rule is "finite values";
    ``element(i)`` names the block's i-th value (default ``values[b, i]``)."""
    reason = _nonfinite(values, b, element)
    if reason is None:  # the kernel and this check disagree: a bug, not a user error
        raise AssertionError(f"block {b} was rejected but holds only finite values")
    return reason


def q8_k_reason(values, b: int, element=None) -> str:
    """Q8_K: a non-finite value, or an extreme too small in magnitude to invert."""
    reason = _nonfinite(values, b, element)
    if reason is not None:
        return reason
    block = np.asarray(values[b])
    mx, mn = block.max(), block.min()
    extreme = mx if abs(mx) > abs(mn) else mn
    with np.errstate(all="ignore"):
        inverse = np.float32(-127.0) / extreme
    return (f"extreme {float(extreme)!r} is too small in magnitude: inverse = R32(-127 / extreme) "
            f"= {float(inverse)!r} is not finite")


# ----------------------------------------------------------------------------- the table

class Binding:
    """One format's kernels and facts (see the module docstring); ``None`` = not supported."""

    __slots__ = ("format", "dequantize", "decode", "quantize", "domain_reason", "quantizer",
                 "find_invalid", "dot", "gemv", "gemm")

    def __init__(self, format, *, dequantize, decode, quantize=None, domain_reason=None,
                 quantizer="", find_invalid=None, dot=None, gemv=None, gemm=None):
        self.format = format
        self.dequantize, self.decode = dequantize, decode
        self.quantize, self.domain_reason, self.quantizer = quantize, domain_reason, quantizer
        self.find_invalid = find_invalid
        self.dot, self.gemv, self.gemm = dot, gemv, gemm

    @property
    def activation(self) -> Optional[Format]:
        return activation_format(self.format) if self.dot is not None else None

    def __repr__(self):
        return f"Binding({self.format.name})"


def _legacy_binding(fmt, quantizer):
    e = legacy.ENTRIES[fmt]
    return Binding(fmt, dequantize=e.dequantize, decode=_legacy_decoder(e), quantize=e.quantize,
                   domain_reason=finite_reason, quantizer=quantizer,
                   dot=e.dot, gemv=e.gemv, gemm=e.gemm)


# Order matters only for messages and listings: activation Q8_K first, then the weight formats.
BINDINGS = (
    Binding(quant.q8_k, dequantize=q8_k_dequantize_records, decode=_decode_q8_k,
            quantize=quantize_q8_k, domain_reason=q8_k_reason,
            quantizer="spec 000 section 4 (canonical)", find_invalid=q8_k_invalid_records),
    Binding(quant.q4_k, dequantize=q4_k_dequantize_records, decode=_decode_q4_k,
            quantize=quantize_q4_k, domain_reason=finite_reason,
            quantizer="ggml quantize_row_q4_K_ref", dot=dot_q4_k_q8_k, gemv=gemv_q4_k_q8_k,
            gemm=gemm_q4_k_q8_k),
    *(_legacy_binding(fmt, f"ggml quantize_row_{fmt.name.lower()}_ref") for fmt in legacy.FORMATS),
    *(Binding(fmt, dequantize=getattr(mod, f"dequantize_{fmt._attr}"),
              decode=_kquant_decoder(fmt, getattr(mod, f"{fmt._attr}_decode_records"), fields,
                                     arrays),
              quantize=getattr(mod, f"quantize_{fmt._attr}"), domain_reason=finite_reason,
              quantizer=f"ggml quantize_row_{fmt.name[:2].lower()}{fmt.name[2:]}_ref",
              dot=getattr(mod, f"dot_{fmt._attr}_q8_k"), gemv=getattr(mod, f"gemv_{fmt._attr}_q8_k"),
              gemm=getattr(mod, f"gemm_{fmt._attr}_q8_k"))
      for fmt, mod, fields, arrays in (
          (quant.q2_k, _k2, Q2KFields, (("sc", np.uint8), ("m", np.uint8), ("q", np.uint8))),
          (quant.q3_k, _k3, Q3KFields, (("sc", np.uint8), ("q", np.int8))),
          (quant.q5_k, _k5, Q5KFields, (("sc", np.uint8), ("m", np.uint8), ("q", np.uint8))),
          (quant.q6_k, _k6, Q6KFields, (("sc", np.int8), ("q", np.uint8))))),
    *(Binding(fmt, dequantize=getattr(_kfp4, f"dequantize_{fmt._attr}"), decode=decode,
              quantize=getattr(_kfp4, f"quantize_{fmt._attr}"), domain_reason=finite_reason,
              quantizer=f"ggml quantize_row_{fmt._attr}_ref",
              dot=getattr(_kfp4, f"dot_{fmt._attr}_q8_0_fast", None)
              or getattr(_kfp4, f"dot_{fmt._attr}_q8_0"),
              gemv=getattr(_kfp4, f"gemv_{fmt._attr}_q8_0"),
              gemm=getattr(_kfp4, f"gemm_{fmt._attr}_q8_0"))
      for fmt, decode in ((quant.mxfp4, _decode_mxfp4), (quant.nvfp4, _decode_nvfp4))),
)

BY_FORMAT = {b.format: b for b in BINDINGS}  # ops indexes this directly (no call per op)
_BY_FORMAT = BY_FORMAT
QUANTIZABLE = tuple(b.format for b in BINDINGS if b.quantize is not None)
WEIGHTS = tuple(b.format for b in BINDINGS if b.dot is not None)


def binding(fmt) -> Binding:
    """The binding of a declared block-quantized format (KeyError for anything else)."""
    return _BY_FORMAT[fmt]


def check_bindings(bindings, formats) -> None:
    """Every declared format bound exactly once, and each binding whole (AssertionError)."""
    by_format = {}
    for b in bindings:
        name = getattr(b.format, "name", repr(b.format))
        if not any(b.format is f for f in formats):
            raise AssertionError(f"registry: {name} is bound but not a declared format")
        if b.format in by_format:
            raise AssertionError(f"registry: {name} is bound twice")
        by_format[b.format] = b
        if b.dequantize is None or b.decode is None:
            raise AssertionError(f"registry: {name} is half-bound: every format needs "
                                 f"dequantize and decode")
        if (b.quantize is None) != (b.domain_reason is None):
            raise AssertionError(f"registry: {name} is half-bound: quantize and domain_reason "
                                 f"go together")
        products = (b.dot, b.gemv, b.gemm)
        if any(k is not None for k in products) and any(k is None for k in products):
            raise AssertionError(f"registry: {name} is half-bound: dot, gemv and gemm go together")
        try:
            act = activation_format(b.format)
        except TypeError:
            act = None
        if (act is None) != (b.dot is None):
            raise AssertionError(f"registry: {name} is half-bound: a declared activation pairing "
                                 f"and a bound dot go together")
    for f in formats:
        if f not in by_format:
            raise AssertionError(f"registry: {f.name} is declared but has no kernels bound")
    for b in by_format.values():
        if b.dot is not None:
            act = by_format[activation_format(b.format)]
            if act.quantize is None:
                raise AssertionError(f"registry: {b.format.name}'s activation {act.format.name} "
                                     f"has no quantizer (matmul needs one)")


check_bindings(BINDINGS, tuple(quant))


# ----------------------------------------------------------------------------- capabilities

class Capabilities(NamedTuple):
    """What numba_qk can do with one format (``numba_qk.capabilities``)."""

    format: object                      # the Format or ScalarType asked about
    quantize: bool                      # numba_qk.quantize(values, format=...)
    dequantize: bool                    # numba_qk.dequantize
    decode: bool                        # numba_qk.decode
    dot_partner: Optional[Format]       # the activation format quantized_dot pairs it with
    gemv: bool                          # gemv / gemm / matmul (as weights)
    gemm: bool
    matmul: bool
    activation_of: tuple                # weight formats whose dot takes this as activations
    quantizer: str                      # what the quantizer reproduces ("" if none)


def _capabilities_of(fmt) -> Capabilities:
    b = _BY_FORMAT.get(fmt) if isinstance(fmt, Format) else None
    if b is None:
        return Capabilities(fmt, False, False, False, None, False, False, False, (), "")
    weight = b.dot is not None
    return Capabilities(fmt, b.quantize is not None, True, True, b.activation, weight, weight,
                        weight, tuple(w for w in WEIGHTS if activation_format(w) is fmt),
                        b.quantizer)


def capabilities(format=None):
    """What numba_qk supports for ``format`` (a ``Capabilities`` tuple), or for every
    block-quantized format (a dict ``{Format: Capabilities}``, in ``numba_qk.quant`` order)
    when called without an argument.  Scalar types (``numba_qk.f32`` ...) and the block-scaled
    formats (``numba_qk.mx``, reached through ``astype``) have no registry kernels: every entry
    is False/None for them."""
    if format is None:
        return {f: _capabilities_of(f) for f in quant}
    from .formats.mx import ScaledFormat

    if not isinstance(format, (Format, ScalarType, ScaledFormat)):
        from ._validate import describe

        raise TypeError(f"format: capabilities expects a numba_qk Format or ScalarType, "
                        f"got {describe(format)}")
    return _capabilities_of(format)


def markdown_table() -> str:
    """The README's capability table, generated from ``capabilities()``."""
    def yes(flag):
        return "yes" if flag else "-"

    lines = ["| format | bits/weight | quantize | dequantize / decode | dot partner | "
             "gemv / gemm / matmul |",
             "| --- | --- | --- | --- | --- | --- |"]
    for fmt, c in capabilities().items():
        partner = c.dot_partner.name if c.dot_partner else (
            "activations of " + ", ".join(w.name for w in c.activation_of) if c.activation_of
            else "-")
        lines.append(f"| {fmt.name} | {fmt.bits_per_element:g} | "
                     f"{c.quantizer if c.quantize else '-'} | {yes(c.dequantize)} | {partner} | "
                     f"{yes(c.gemv and c.gemm and c.matmul)} |")
    return "\n".join(lines)
