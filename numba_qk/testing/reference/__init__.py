"""The oracles behind one entry point: for every record format, by ``Format`` or name,

* ``dequantize(fmt, record) -> list`` -- the values of one record (f32 scalars), in the step
  order the canonical dequantizer uses;
* ``dot(fmt, w_records, x_records) -> np.float32`` -- the exact dot of weight records with
  their activation records (None-free: weight formats only);
* ``quantize(fmt, values) -> bytes | None`` -- one record from one block of f32 values, where
  the quantizer is transcribed here (None for Q4_K and Q2_K..Q6_K, whose quantizers are checked
  against ggml's own bytes: tests/golden).

``oracle(fmt)`` returns the ``Oracle`` row; ``ORACLES`` is the table (format name -> row).
The family modules keep their own conventions and more detail (fields, record terms):
``core`` (spec 000's Q4_K/Q8_K, ggml's legacy formats), ``kquants`` (Q2_K..Q6_K), ``mxrec``
(ggml's MXFP4/NVFP4 records), ``iq`` (IQ4_NL, IQ4_XS and the grid IQ formats), ``ternary``
(TQ1_0/TQ2_0), ``lowbit`` (Q1_0/Q2_0), ``lowp`` (element types: ``decode(t, code)``,
``encode(t, value)``) and ``mx`` (OCP MX / NVFP4 block-scaled tensors).

Nothing here imports numba_qk's kernels, registry or declarations: a format is looked up by
its name (``fmt.name`` of a ``Format``).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional

from . import core, iq, kquants, lowbit, lowp, mx, mxrec, ternary

__all__ = ["Oracle", "ORACLES", "oracle", "dequantize", "dot", "quantize",
           "core", "kquants", "lowp", "mx", "mxrec", "iq", "ternary", "lowbit"]


class Oracle(NamedTuple):
    """One record format's oracles (see the module docstring)."""

    dequantize: Callable             # record bytes -> list of f32 values
    dot: Optional[Callable]          # (w_records, x_records) -> f32; None: not a weight format
    quantize: Optional[Callable]     # block of f32 values -> record bytes; None: not transcribed
    source: str                      # what the oracle is written from


def _legacy(name: str, activation: Optional[str]) -> Oracle:
    dot = None if activation is None else (
        lambda w, x: core.legacy_dot(name, w, activation, x))
    return Oracle(partial(core.legacy_dequantize, name), dot,
                  partial(core.legacy_quantize_block, name),
                  f"ggml dequantize_row/quantize_row_{name.lower()}_ref, docs/numerics.md")


def _kquant(name: str) -> Oracle:
    return Oracle(partial(kquants.dequantize, name), partial(kquants.quantized_dot, name), None,
                  "DESIGN.md section 7, ggml dequantize_row_" + name[:2].lower() + name[2:])


ORACLES = {
    "Q8_K": Oracle(core.dequantize_q8_k, None, core.quantize_block, "spec 000"),
    "Q4_K": Oracle(core.dequantize_q4_k, core.quantized_dot, None, "spec 000"),
    "Q4_0": _legacy("Q4_0", "Q8_0"),
    "Q4_1": _legacy("Q4_1", "Q8_1"),
    "Q5_0": _legacy("Q5_0", "Q8_0"),
    "Q5_1": _legacy("Q5_1", "Q8_1"),
    "Q8_0": _legacy("Q8_0", "Q8_0"),
    "Q8_1": _legacy("Q8_1", None),
    "Q2_K": _kquant("Q2_K"),
    "Q3_K": _kquant("Q3_K"),
    "Q5_K": _kquant("Q5_K"),
    "Q6_K": _kquant("Q6_K"),
    "MXFP4": Oracle(mxrec.dequantize_mxfp4, mxrec.dot_mxfp4_q8_0, mxrec.quantize_mxfp4,
                    "ggml-common.h / ggml-quants.c (MXFP4), numba_qk.kernels.fp4.mxrec"),
    "NVFP4": Oracle(mxrec.dequantize_nvfp4, mxrec.dot_nvfp4_q8_0, mxrec.quantize_nvfp4,
                    "ggml-common.h / ggml-quants.c (NVFP4), numba_qk.kernels.fp4.mxrec"),
    "IQ4_NL": Oracle(iq.dequantize_iq4_nl, iq.dot_iq4_nl_q8_0, iq.quantize_iq4_nl,
                     "ggml-common.h / ggml-quants.c (IQ4_NL), docs/numerics.md"),
    "IQ4_XS": Oracle(iq.dequantize_iq4_xs, iq.dot_iq4_xs_q8_k, iq.quantize_iq4_xs,
                     "ggml-common.h / ggml-quants.c (IQ4_XS), docs/numerics.md"),
}
for _name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"):
    ORACLES[_name] = Oracle(partial(iq.dequantize_grid, _name), partial(iq.dot_grid, _name), None,
                            "ggml-common.h / ggml-quants.c (" + _name
                            + "), docs/numerics_iq_grid.md")
for _module, _name in ((ternary, "TQ1_0"), (ternary, "TQ2_0"), (lowbit, "Q1_0"),
                       (lowbit, "Q2_0")):
    ORACLES[_name] = Oracle(partial(_module.dequantize, _name),
                            partial(_module.quantized_dot, _name),
                            partial(_module.quantize_block, _name),
                            "ggml dequantize_row/quantize_row_" + _name.lower()
                            + "_ref, docs/numerics.md")
del _module, _name


def oracle(fmt) -> Oracle:
    """The oracles of a record format (a ``Format`` or its name); KeyError for others."""
    name = fmt if isinstance(fmt, str) else fmt.name
    try:
        return ORACLES[name]
    except KeyError:
        raise KeyError(f"no oracle for {name!r}; record formats: {', '.join(ORACLES)}") from None


def dequantize(fmt, record) -> list:
    """The values of one record (``bytes``) of ``fmt``."""
    return oracle(fmt).dequantize(bytes(record))


def dot(fmt, w_records, x_records):
    """The exact dot of weight records of ``fmt`` [G, bytes] with their activation records."""
    o = oracle(fmt)
    if o.dot is None:
        raise TypeError(f"{fmt!r} has no dot oracle: not a weight format")
    return o.dot(w_records, x_records)


def quantize(fmt, values):
    """One record of ``fmt`` from one block of f32 values, or None where no quantizer is
    transcribed here."""
    q = oracle(fmt).quantize
    return None if q is None else q(values)
