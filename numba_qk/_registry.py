"""The format registry: each block-quantized ``Format`` bound to its kernels, in one entry.

The entries come from the ``TRAITS`` declaration each kernel module ends with
(``numba_qk/kernels/traits.py``; the modules are listed in ``KERNEL_MODULES``): ``check_traits``
checks them, ``fields_types`` builds the public decoded-fields types (``Q4KFields`` ...) from
their ``decoded`` slots, and each becomes one ``Binding``.

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
format with no binding...).  ``capabilities`` is the public view of the table (and answers for
the block-scaled formats of ``numba_qk.mx`` too: astype encodes and decodes them).
"""

from __future__ import annotations

import collections
from typing import NamedTuple, Optional

import numpy as np

from .formats import Format, ScalarType, activation_format, bf16, f16, f32, quant
from .formats.mx import FORMATS as SCALED_FORMATS
from .formats.mx import ScaledFormat
from .kernels.traits import DOMAINS, SLOTS, Traits
from numba_qk.kernels.fp4 import mxrec as _kfp4
from numba_qk.kernels.kquants import dot as _k4
from numba_qk.kernels.kquants import q2_k as _k2
from numba_qk.kernels.kquants import q3_k as _k3
from numba_qk.kernels.kquants import q5_k as _k5
from numba_qk.kernels.kquants import q6_k as _k6
from numba_qk.kernels.kquants import q8_k as _k8
from numba_qk.kernels.legacy import kernels as _klegacy
from numba_qk.kernels.iq import iq4 as _kiq4
from numba_qk.kernels.ternary import tq as _ktq
from numba_qk.kernels.lowbit import q1q2 as _klowbit
from numba_qk.kernels.kquants import weighted as _kwk
from numba_qk.kernels.legacy import weighted as _kwl
from numba_qk.kernels.iq import iq4_weighted as _kwiq
from numba_qk.kernels.iq import grid as _kiqgrid
from numba_qk.kernels.iq import iq3_encode as _kiq3
from numba_qk.kernels.iq import iq2_encode as _kiq2
from numba_qk.kernels.iq import iq1_encode as _kiq1
from numba_qk.kernels.simd import ggml_cpu as _kggml_cpu

__all__ = ["Binding", "BINDINGS", "BY_FORMAT", "QUANTIZABLE", "WEIGHTS", "TRAITS", "binding",
           "WEIGHTED", "IMATRIX_IGNORED", "REQUIRES_IMATRIX", "GGML_CPU_QUANTIZERS",
           "FLOAT_WEIGHTS",
           "capabilities", "Capabilities", "ScaledCapabilities", "check_bindings", "check_traits",
           "fields_types",
           "Q4KFields", "Q8KFields", "BlockFields", "Q2KFields", "Q3KFields", "Q5KFields",
           "Q6KFields", "MXFP4Fields", "NVFP4Fields", "IQ4NLFields", "IQ4XSFields",
           "TQFields", "IQGridFields", "LowBitFields"]

# The kernel modules, each ending with its ``TRAITS`` declaration (numba_qk/kernels/traits.py).
# Order matters only for messages and listings: activation Q8_K first, then the weight formats.
KERNEL_MODULES = (_k8, _k4, _klegacy, _k2, _k3, _k5, _k6, _kfp4, _kiq4, _ktq, _kiqgrid,
                  _klowbit)


def _collect(modules) -> tuple:
    out = []
    for mod in modules:
        declared = getattr(mod, "TRAITS", None)
        if declared is None:
            raise AssertionError(f"registry: {mod.__name__} declares no TRAITS")
        out.extend(declared if isinstance(declared, tuple) else (declared,))
    return tuple(out)


TRAITS = _collect(KERNEL_MODULES)


def check_traits(traits) -> None:
    """Each declaration whole and consistent (AssertionError); ``check_bindings`` checks the
    table they make."""
    for t in traits:
        name = getattr(t.format, "name", repr(t.format))
        if not isinstance(t, Traits) or not isinstance(t.format, Format):
            raise AssertionError(f"registry: {t!r} is not the Traits of a declared Format")
        fields = {f.name: f for f in t.format.fields}
        filled = [n for n, _ in t.decoded.filled]
        for n, code in t.decoded.filled:
            np.dtype(code)
            if n not in t.decoded.fields:
                raise AssertionError(f"registry: {name} decode fills {n!r}, not a field of "
                                     f"{t.decoded.type_name}")
        for n in t.decoded.fields:
            if n not in filled and n in fields and fields[n].element != "f16":
                raise AssertionError(f"registry: {name}.{n} is neither filled by decode nor f16")
        if (t.domain is None) != (t.quantize is None) or t.domain not in (None, *DOMAINS):
            raise AssertionError(f"registry: {name}: domain {t.domain!r} does not go with "
                                 f"its quantizer")
        if bool(t.quantizer) != (t.quantize is not None):
            raise AssertionError(f"registry: {name}: quantizer text and quantize go together")
        if not (isinstance(t.oracle, str) and t.oracle.startswith("numba_qk.testing.reference")):
            raise AssertionError(f"registry: {name}: oracle must name a numba_qk.testing."
                                 f"reference module, got {t.oracle!r}")


check_traits(TRAITS)


# ----------------------------------------------------------------------------- decoded fields
# One generic builder for the public decoded-fields types (numba_qk.Q4KFields ...), from the
# ``decoded`` slot of the traits; their home module stays numba_qk.ops for repr and pickle.

def fields_types(traits) -> dict:
    """``{type name: NamedTuple class}``: one class per ``decoded.type_name``, fields in the
    declared order; a field some format sharing the type lacks (BlockFields' ``m``, ``s``)
    defaults to None."""
    groups: dict = {}
    for t in traits:
        groups.setdefault(t.decoded.type_name, []).append(t)
    out = {}
    for type_name, members in groups.items():
        d = members[0].decoded
        if any((m.decoded.fields, m.decoded.doc) != (d.fields, d.doc) for m in members):
            raise AssertionError(f"registry: {type_name} is declared two ways")
        optional = [n for n in d.fields
                    if any(n not in {f.name for f in m.format.fields}
                           and n not in {k for k, _ in m.decoded.filled} for m in members)]
        if d.fields[len(d.fields) - len(optional):] != tuple(optional):
            raise AssertionError(f"registry: {type_name}: optional fields must come last")
        cls = collections.namedtuple(type_name, d.fields, defaults=(None,) * len(optional),
                                     module="numba_qk.ops")
        cls.__annotations__ = cls.__new__.__annotations__ = {
            n: Optional[np.ndarray] if n in optional else np.ndarray for n in d.fields}
        cls.__doc__ = d.doc
        out[type_name] = cls
    return out


_FIELDS_TYPES = fields_types(TRAITS)
# The public names (Q8KFields, Q4KFields, BlockFields, ... TQFields: one per ``decoded.type_name``
# of the traits), bound here for numba_qk.ops and the package to import.
globals().update(_FIELDS_TYPES)


def _f16_field(arr: np.ndarray, field) -> np.ndarray:
    """float16 [G] from the 2-byte field of each record (bits kept)."""
    g = arr.shape[0]
    return (np.ascontiguousarray(arr[:, field.start:field.stop]).view("<f2").reshape(g)
            .astype(np.float16))


def _decoder(fmt, kernel, fields_type, filled):
    """decode() of a format: the arrays ``filled`` = ((name, dtype), ...) filled by ``kernel``
    in order (``q``: one per element; a one-element field: [G]); the other fields read as f16
    from the records, or None where the format has no such field."""
    declared = {f.name: f for f in fmt.fields}
    shapes = [(name, np.dtype(code), fmt.block_size if name == "q" else declared[name].count)
              for name, code in filled]
    # numba has no float16 arrays: an f16 field filled by the kernel is filled as its bits
    bits = {np.dtype("f2"): np.dtype("u2")}

    def decode(arr):
        g = arr.shape[0]
        arrays = {name: np.empty((g, count) if count != 1 else g, bits.get(dtype, dtype))
                  for name, dtype, count in shapes}
        if g:
            kernel(arr, *arrays.values())
        arrays = {name: a.view(dtype) for (name, dtype, _), a in zip(shapes, arrays.values())}
        return fields_type(*(arrays[name] if name in arrays
                             else _f16_field(arr, declared[name]) if name in declared else None
                             for name in fields_type._fields))
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


def grid_reason(values, b: int, element=None) -> str:
    """The grid IQ encoders (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M): a non-finite
    value, or a block on which ggml's grid search aborts the process (its float32 sums
    overflow)."""
    reason = _nonfinite(values, b, element)
    if reason is not None:
        return reason
    block = np.asarray(values[b])
    i = int(np.argmax(np.abs(block)))
    name = element(i) if element else f"values[{b}, {i}]"
    return (f"ggml's grid search aborts on this block (a GGML_ASSERT in its neighbour search "
            f"or on the scale: its float32 sums overflow; largest |value| {name} = "
            f"{float(block[i])!r}): ggml_quantize_chunk aborts the process on it, numba_qk "
            f"refuses it (the grid encoders take values up to about 1e10 in magnitude; with an "
            f"importance matrix, large weights count too; docs/numerics_iq_grid.md)")


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


_DOMAIN_REASONS = {"finite": finite_reason, "q8_k": q8_k_reason, "grid": grid_reason}
assert tuple(_DOMAIN_REASONS) == DOMAINS


# Formats ggml quantizes only with an importance matrix (``ggml_quantize_requires_imatrix``):
# {format: the domain rule of its weighted encoder}.  They have no ``Binding.quantize`` (no
# encoder without one) but a ``domain_reason`` (their weighted encoder's); ``capabilities``
# gives their weighted encoder's text; ``quantize(values, fmt)`` without ``imatrix=`` refuses
# them.
_REQUIRES_IMATRIX = {**_kiq2.REQUIRES_IMATRIX, **_kiq1.REQUIRES_IMATRIX}
_GRID_WEIGHTED = {**_kiq3.WEIGHTED, **_kiq2.WEIGHTED, **_kiq1.WEIGHTED}  # the grid IQ encoders
REQUIRES_IMATRIX = tuple(_REQUIRES_IMATRIX)


def _binding(t: Traits) -> Binding:
    domain = _REQUIRES_IMATRIX.get(t.format, t.domain)
    return Binding(t.format, dequantize=t.dequantize,
                   decode=_decoder(t.format, t.decode, _FIELDS_TYPES[t.decoded.type_name],
                                   t.decoded.filled),
                   quantize=t.quantize, domain_reason=_DOMAIN_REASONS.get(domain),
                   quantizer=t.quantizer, find_invalid=t.find_invalid,
                   dot=t.dot, gemv=t.gemv, gemm=t.gemm)


BINDINGS = tuple(_binding(t) for t in TRAITS)

BY_FORMAT = {b.format: b for b in BINDINGS}  # ops indexes this directly (no call per op)
_BY_FORMAT = BY_FORMAT
# QUANTIZABLE: formats ``quantize`` produces (those of REQUIRES_IMATRIX with ``imatrix=`` only)
QUANTIZABLE = tuple(b.format for b in BINDINGS
                    if b.quantize is not None or b.format in _REQUIRES_IMATRIX)
WEIGHTS = tuple(b.format for b in BINDINGS if b.dot is not None)

# Importance-weighted encoders (``quantize(..., imatrix=w)``): format -> (kernel ``(values, qw,
# out) -> -1 | first bad block``, what it reproduces), from the ``WEIGHTED`` tables of the
# modules of ggml's ``quantize_row_*_impl`` paths.  ``IMATRIX_IGNORED``: formats whose
# ``quantize_<t>`` in ggml takes and ignores the importance matrix (numba_qk does the same).
WEIGHTED = {**_kwk.WEIGHTED, **_kwl.WEIGHTED, **_kwiq.WEIGHTED, **_GRID_WEIGHTED}
IMATRIX_IGNORED = (quant.q8_0, quant.mxfp4, quant.nvfp4, quant.tq1_0, quant.tq2_0, quant.q1_0,
                   quant.q2_0)

# ggml's CPU activation quantizers (``quantize(..., numerics="ggml_cpu")``): what llama.cpp runs
# on activations at run time, bit for bit (numba_qk.kernels.simd.ggml_cpu).
GGML_CPU_QUANTIZERS = {quant.q8_0: _kggml_cpu.quantize_q8_0_ggml_cpu,
                       quant.q8_1: _kggml_cpu.quantize_q8_1_ggml_cpu,
                       quant.q8_k: _kggml_cpu.quantize_q8_k_ggml_cpu}
if not all(f in QUANTIZABLE for f in (*WEIGHTED, *IMATRIX_IGNORED)):
    raise AssertionError("registry: an importance-weighted encoder for a format without quantize")
if not all(f in WEIGHTED and _BY_FORMAT[f].quantize is None for f in REQUIRES_IMATRIX):
    raise AssertionError("registry: a format requiring an importance matrix needs a weighted "
                         "encoder and no other")


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
        if ((b.quantize is None) != (b.domain_reason is None)
                and not (b.quantize is None and b.format in _REQUIRES_IMATRIX)):
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
    quantize: bool                      # numba_qk.quantize(values, format=...) (with imatrix=
                                        # for _registry.REQUIRES_IMATRIX, says quantizer)
    dequantize: bool                    # numba_qk.dequantize
    decode: bool                        # numba_qk.decode
    dot_partner: Optional[Format]       # the activation format quantized_dot pairs it with
    gemv: bool                          # gemv / gemm / matmul (as weights)
    gemm: bool
    matmul: bool
    activation_of: tuple                # weight formats whose dot takes this as activations
    quantizer: str                      # what the quantizer reproduces ("" if none)


#: The element types that ``gemv``/``gemm``/``matmul`` take as weight matrices besides the block
#: formats (``lhs_format=numba_qk.f16`` / ``bf16``; numba_qk._halfmat, docs/halfmat.md).
FLOAT_WEIGHTS = (f16, bf16)


def _capabilities_of(fmt) -> Capabilities:
    if any(fmt is t for t in FLOAT_WEIGHTS):   # weight matrices of codes: products only
        return Capabilities(fmt, False, False, False, None, True, True, True, (), "")
    b = _BY_FORMAT.get(fmt) if isinstance(fmt, Format) else None
    if b is None:
        return Capabilities(fmt, False, False, False, None, False, False, False, (), "")
    weight = b.dot is not None
    quantizer = b.quantizer
    if fmt in _REQUIRES_IMATRIX:
        quantizer = f"{WEIGHTED[fmt][1]}; requires an importance matrix (imatrix=)"
    return Capabilities(fmt, fmt in QUANTIZABLE, True, True, b.activation, weight, weight,
                        weight, tuple(w for w in WEIGHTS if activation_format(w) is fmt),
                        quantizer)


class ScaledCapabilities(NamedTuple):
    """What numba_qk can do with one block-scaled format (``numba_qk.mx``;
    ``numba_qk.capabilities(numba_qk.mx.mxfp4)``).

    The first fields are ``Capabilities``' with the same meaning: the registry's operations
    (quantize, dequantize, decode, dot, gemv/gemm/matmul) take record formats only, so they are
    False/None/() here.  A block-scaled format is encoded and decoded by ``numba_qk.astype``."""

    format: ScaledFormat                # the ScaledFormat asked about
    quantize: bool                      # (the registry's operations: never, as for scalars)
    dequantize: bool
    decode: bool
    dot_partner: Optional[Format]
    gemv: bool
    gemm: bool
    matmul: bool
    activation_of: tuple
    quantizer: str
    astype_encode: bool                 # numba_qk.astype(x, fmt) -> ScaledTensor (x as float32)
    astype_decode: bool                 # numba_qk.astype(st, t) for every element type t
    block_size: int                     # elements per block, along the last axis
    element: ScalarType                 # the element codes' type
    scale: ScalarType                   # the block scales' type (one per block)
    tensor_scale: Optional[ScalarType]  # the per-tensor scale's type (NVFP4: f32), or None
    bits_per_element: float             # logical bits: element bits + scale bits / block


def _scaled_capabilities_of(fmt: ScaledFormat) -> ScaledCapabilities:
    return ScaledCapabilities(fmt, False, False, False, None, False, False, False, (), "",
                              True, True, fmt.block_size, fmt.element, fmt.scale,
                              f32 if fmt.has_tensor_scale else None,   # NVFP4's is a float32
                              fmt.bits_per_element)


def capabilities(format=None, *, scaled=False):
    """What numba_qk supports for ``format`` (a ``Capabilities`` tuple; for a block-scaled
    format of ``numba_qk.mx`` a ``ScaledCapabilities`` tuple, which adds what ``astype`` does
    with it, its block size, element, scale and tensor-scale types and bits per element), or,
    called without an argument, for every block-quantized format (a dict ``{Format:
    Capabilities}``, in ``numba_qk.quant`` order); ``scaled=True`` appends the block-scaled
    formats (``{ScaledFormat: ScaledCapabilities}``, in ``numba_qk.mx.FORMATS`` order).  Scalar
    types (``numba_qk.f32`` ...) have no registry kernels: every entry is False/None for them,
    except that ``numba_qk.f16`` and ``bf16`` weight matrices have ``gemv``/``gemm``/``matmul``
    (``FLOAT_WEIGHTS``; no ``quantized_dot``: they take activations of their own type)."""
    if format is None:
        caps = {f: _capabilities_of(f) for f in quant}
        if scaled:
            caps.update((f, _scaled_capabilities_of(f)) for f in SCALED_FORMATS)
        return caps
    if scaled:
        raise TypeError("capabilities: scaled=True lists every format; it takes no format")
    if isinstance(format, ScaledFormat):
        return _scaled_capabilities_of(format)
    if not isinstance(format, (Format, ScalarType)):
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


def markdown_scaled_table() -> str:
    """The README's table of the block-scaled formats, generated from
    ``capabilities(scaled=True)``."""
    lines = ["| block-scaled format (`numba_qk.mx`) | block | element | block scale | tensor scale "
             "| bits/element | astype encode / decode |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for fmt, c in capabilities(scaled=True).items():
        if isinstance(c, ScaledCapabilities):
            ts = c.tensor_scale.spec.attr if c.tensor_scale is not None else "-"
            lines.append(f"| {fmt.name} | {c.block_size} | {c.element.spec.attr} | "
                         f"{c.scale.spec.attr} | {ts} | {c.bits_per_element:g} | "
                         f"{'yes' if c.astype_encode else '-'} / "
                         f"{'yes' if c.astype_decode else '-'} |")
    return "\n".join(lines)

