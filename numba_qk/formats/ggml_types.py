"""ggml's type ids (``enum ggml_type`` in ggml.h) and block sizes (``type_traits`` in ggml.c):
the one GGML type table of numba_qk (declarations layer: no numba, no imports).

Read by the format declarations (each ``Format.ggml_type`` is checked against it at import),
``numba_qk.presets``, ``numba_qk.gguf``, the CLI (through both) and the ggml bridge
(``numba_qk.testing.ggml``).  Ids are plain ints.

* ``GGMLType.<NAME>`` -- the id of one type (``GGMLType.Q4_K == 12``);
* ``GGML_TYPES`` -- name -> id, in id order (public as ``numba_qk.presets.GGML_TYPES``);
* ``GGML_TYPE_NAMES`` -- id -> name;
* ``BLOCK_SIZE`` -- id -> elements per block (1 for the plain element types);
* ``NOT_QUANTIZED`` -- the plain element types (``ggml_is_quantized`` is False).
"""

from __future__ import annotations

__all__ = ["GGMLType", "GGML_TYPES", "GGML_TYPE_NAMES", "BLOCK_SIZE", "NOT_QUANTIZED", "QK_K"]

QK_K = 256  # elements of a K-quant super-block (and of the IQ / TQ types)

# name: (id, elements per block)
_TABLE = {
    "F32": (0, 1), "F16": (1, 1), "Q4_0": (2, 32), "Q4_1": (3, 32), "Q5_0": (6, 32),
    "Q5_1": (7, 32), "Q8_0": (8, 32), "Q8_1": (9, 32),
    "Q2_K": (10, QK_K), "Q3_K": (11, QK_K), "Q4_K": (12, QK_K), "Q5_K": (13, QK_K),
    "Q6_K": (14, QK_K), "Q8_K": (15, QK_K),
    "IQ2_XXS": (16, QK_K), "IQ2_XS": (17, QK_K), "IQ3_XXS": (18, QK_K), "IQ1_S": (19, QK_K),
    "IQ4_NL": (20, 32), "IQ3_S": (21, QK_K), "IQ2_S": (22, QK_K), "IQ4_XS": (23, QK_K),
    "I8": (24, 1), "I16": (25, 1), "I32": (26, 1), "I64": (27, 1), "F64": (28, 1),
    "IQ1_M": (29, QK_K), "BF16": (30, 1), "TQ1_0": (34, QK_K), "TQ2_0": (35, QK_K),
    "MXFP4": (39, 32), "NVFP4": (40, 64), "Q1_0": (41, 128), "Q2_0": (42, 64),
}

GGML_TYPES = {name: tid for name, (tid, _) in _TABLE.items()}
GGML_TYPE_NAMES = {tid: name for name, tid in GGML_TYPES.items()}
BLOCK_SIZE = {tid: bs for tid, bs in _TABLE.values()}
NOT_QUANTIZED = frozenset(GGML_TYPES[n] for n in ("F32", "F16", "BF16", "F64", "I8", "I16",
                                                  "I32", "I64"))


class GGMLType:
    """The ids as attributes (``GGMLType.Q4_K``), plain ints; generated from the table."""

    __slots__ = ()


for _name, _tid in GGML_TYPES.items():
    setattr(GGMLType, _name, _tid)
del _name, _tid
