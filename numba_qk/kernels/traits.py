"""What one kernel module says about one record format: its ``TRAITS`` declaration (no numba).

Every kernel module that implements a record format ends with one grep-able declaration::

    TRAITS = Traits(format=..., dequantize=..., decode=..., decoded=Decoded(...), quantize=...,
                    domain=..., quantizer=..., find_invalid=..., dot=..., gemv=..., gemm=...,
                    oracle=...)

(a tuple of them where one module serves several formats).  Every slot is spelled out; ``None``
says "not supported".  ``numba_qk._registry`` collects the declarations of the kernel modules,
checks them (``check_traits``) and builds its bindings and the public decoded-fields types from
them; nothing else lists kernels per format.

Slots
-----
format        the declared ``Format``
dequantize    ``(records [G, bytes], out f32 [G, block])``
decode        ``(records, *arrays)``: fills the arrays named by ``decoded.filled``, in order
decoded       ``Decoded``: the public decoded-fields type (name, field order, docstring) and the
              arrays ``decode`` fills; every other field is read from the record (f16) or absent
quantize      ``(values f32 [G, block], out) -> -1 | first out-of-domain block``, or None
domain        the quantizer's domain rule, for error messages: ``"finite"`` (finite values),
              ``"q8_k"`` (finite values whose extreme can be inverted) or ``"grid"`` (finite
              values on which ggml's grid search does not abort); None without quantize
quantizer     what the quantizer reproduces (``"ggml quantize_row_q4_K_ref"``); "" without
find_invalid  ``(records, bad) -> count`` for a data contract beyond "any bytes", else None
dot, gemv, gemm  the weight-format products against ``formats.activation_format(format)``
              (``dot(w, x) -> f32``, ``gemv(w, x, out)``, ``gemm(w, x, out)``), or all None
oracle        the ``numba_qk.testing.reference`` module holding the slow oracle (a dotted path,
              not an import: production code never imports numba_qk.testing)
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Traits", "Decoded", "DOMAINS", "SLOTS"]

DOMAINS = ("finite", "q8_k", "grid")


class Decoded(NamedTuple):
    """The decoded-fields type of a format: ``type_name`` (public, e.g. ``"Q4KFields"``),
    ``fields`` (its field order), ``filled`` (``(name, numpy dtype code)`` of the arrays the
    decode kernel fills, in its argument order) and ``doc`` (the type's docstring)."""

    type_name: str
    fields: tuple
    filled: tuple
    doc: str


SLOTS = ("format", "dequantize", "decode", "decoded", "quantize", "domain", "quantizer",
         "find_invalid", "dot", "gemv", "gemm", "oracle")


class Traits:
    """One format's kernels and facts (see the module docstring); every slot is required."""

    __slots__ = SLOTS

    def __init__(self, *, format, dequantize, decode, decoded, quantize, domain, quantizer,
                 find_invalid, dot, gemv, gemm, oracle):
        values = dict(format=format, dequantize=dequantize, decode=decode, decoded=decoded,
                      quantize=quantize, domain=domain, quantizer=quantizer,
                      find_invalid=find_invalid, dot=dot, gemv=gemv, gemm=gemm, oracle=oracle)
        for slot in SLOTS:
            object.__setattr__(self, slot, values[slot])

    def __setattr__(self, name, value):
        raise AttributeError("Traits are immutable")

    def __repr__(self):
        return f"Traits({getattr(self.format, 'name', self.format)})"
