"""llama.cpp's quantization presets (``llama-quantize`` file types) as a pure policy.

Given a GGUF model's metadata and its tensor list, :func:`plan` says which GGML type each tensor
gets under a preset such as ``Q4_K_M``, reproducing llama.cpp's own choice: the names and aliases
of ``tools/quantize/quantize.cpp`` and the rules of ``src/llama-quant.cpp``
(``tensor_allows_quantization``, ``llama_tensor_get_type``, ``llama_tensor_get_type_impl``,
``tensor_type_fallback``, ``tensor_requires_imatrix``, ``llama_ftype_get_default_type``) as
vendored by llama-cpp-python 0.3.36 (llama.cpp commit
0c1e57098bba43ac29e6e3b677cdceebdd22334f). This module encodes nothing; no numba.

Conventions
-----------
* Shapes are ggml ``ne`` order: ``ne[0]`` is the row length (gguf-py's ``ReaderTensor.shape``
  uses the same order; a numpy array's shape is the reverse).
* Types are ``enum ggml_type`` ids (``GGML_TYPES`` maps names to ids).
* Tensors are visited in llama.cpp's order, not file order: by layer number parsed from
  ``blk.N.`` (tensors without one first), then by name, byte-wise. The per-layer counters that
  decide which ``attn_v`` / ``ffn_down`` tensors get more bits count in that order, and llama.cpp
  also writes the output file in that order; :func:`plan` returns entries in it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .errors import NumbaQKError
from .formats.ggml_types import BLOCK_SIZE, GGML_TYPE_NAMES, GGML_TYPES, NOT_QUANTIZED
from .formats.ggml_types import GGMLType as T

__all__ = [
    "GGML_TYPES", "GGML_TYPE_NAMES", "BLOCK_SIZE", "LLAMA_FTYPES", "LLAMA_CPP_COMMIT",
    "Preset", "PRESETS", "find_preset", "ModelInfo", "model_info", "Tensor", "TensorPlan",
    "Plan", "plan", "PresetError", "preset_table", "parse_ftype",
    "guess_ftype", "prune_names", "llama_order",
]

LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # vendored by llama-cpp-python 0.3.36
GGML_QNT_VERSION = 2


class PresetError(NumbaQKError, ValueError):
    """A preset cannot be applied (unknown name, needs an importance matrix, bad metadata, ...)."""


# --- ggml types: the one table in numba_qk.formats.ggml_types (ids, names, block sizes) -------

def _is_quantized(t: int) -> bool:  # ggml_is_quantized
    return t not in NOT_QUANTIZED


def _tname(t: int) -> str:
    return GGML_TYPE_NAMES.get(t, f"type {t}")


# --- llama_ftype (llama.h) and the presets of tools/quantize/quantize.cpp ----------------------

LLAMA_FTYPES = {
    "ALL_F32": 0, "MOSTLY_F16": 1, "MOSTLY_Q4_0": 2, "MOSTLY_Q4_1": 3, "MOSTLY_Q8_0": 7,
    "MOSTLY_Q5_0": 8, "MOSTLY_Q5_1": 9, "MOSTLY_Q2_K": 10, "MOSTLY_Q3_K_S": 11,
    "MOSTLY_Q3_K_M": 12, "MOSTLY_Q3_K_L": 13, "MOSTLY_Q4_K_S": 14, "MOSTLY_Q4_K_M": 15,
    "MOSTLY_Q5_K_S": 16, "MOSTLY_Q5_K_M": 17, "MOSTLY_Q6_K": 18, "MOSTLY_IQ2_XXS": 19,
    "MOSTLY_IQ2_XS": 20, "MOSTLY_Q2_K_S": 21, "MOSTLY_IQ3_XS": 22, "MOSTLY_IQ3_XXS": 23,
    "MOSTLY_IQ1_S": 24, "MOSTLY_IQ4_NL": 25, "MOSTLY_IQ3_S": 26, "MOSTLY_IQ3_M": 27,
    "MOSTLY_IQ2_S": 28, "MOSTLY_IQ2_M": 29, "MOSTLY_IQ4_XS": 30, "MOSTLY_IQ1_M": 31,
    "MOSTLY_BF16": 32, "MOSTLY_TQ1_0": 36, "MOSTLY_TQ2_0": 37, "MOSTLY_MXFP4_MOE": 38,
    "MOSTLY_NVFP4": 39, "MOSTLY_Q1_0": 40, "MOSTLY_Q2_0": 41,
}
# module-private names for the ids (LLAMA_FTYPES is the public table)
_FT_F32 = 0; _FT_F16 = 1; _FT_Q4_0 = 2; _FT_Q4_1 = 3; _FT_Q8_0 = 7; _FT_Q5_0 = 8; _FT_Q5_1 = 9
_FT_Q2_K = 10; _FT_Q3_K_S = 11; _FT_Q3_K_M = 12; _FT_Q3_K_L = 13; _FT_Q4_K_S = 14; _FT_Q4_K_M = 15
_FT_Q5_K_S = 16; _FT_Q5_K_M = 17; _FT_Q6_K = 18; _FT_IQ2_XXS = 19; _FT_IQ2_XS = 20
_FT_Q2_K_S = 21; _FT_IQ3_XS = 22; _FT_IQ3_XXS = 23; _FT_IQ1_S = 24; _FT_IQ4_NL = 25
_FT_IQ3_S = 26; _FT_IQ3_M = 27; _FT_IQ2_S = 28; _FT_IQ2_M = 29; _FT_IQ4_XS = 30; _FT_IQ1_M = 31
_FT_BF16 = 32; _FT_TQ1_0 = 36; _FT_TQ2_0 = 37; _FT_MXFP4_MOE = 38; _FT_NVFP4 = 39; _FT_Q1_0 = 40
_FT_Q2_0 = 41

# llama_ftype_get_default_type
_DEFAULT_TYPE = {
    _FT_Q4_0: T.Q4_0, _FT_Q4_1: T.Q4_1, _FT_Q5_0: T.Q5_0, _FT_Q5_1: T.Q5_1, _FT_Q8_0: T.Q8_0,
    _FT_F16: T.F16, _FT_BF16: T.BF16, _FT_F32: T.F32, _FT_Q1_0: T.Q1_0, _FT_Q2_0: T.Q2_0,
    _FT_MXFP4_MOE: T.MXFP4,
    _FT_Q2_K_S: T.Q2_K, _FT_Q2_K: T.Q2_K, _FT_IQ3_XS: T.IQ3_S,
    _FT_Q3_K_S: T.Q3_K, _FT_Q3_K_M: T.Q3_K, _FT_Q3_K_L: T.Q3_K,
    _FT_Q4_K_S: T.Q4_K, _FT_Q4_K_M: T.Q4_K, _FT_Q5_K_S: T.Q5_K, _FT_Q5_K_M: T.Q5_K,
    _FT_Q6_K: T.Q6_K, _FT_TQ1_0: T.TQ1_0, _FT_TQ2_0: T.TQ2_0,
    _FT_IQ2_XXS: T.IQ2_XXS, _FT_IQ2_XS: T.IQ2_XS, _FT_IQ2_S: T.IQ2_XS, _FT_IQ2_M: T.IQ2_S,
    _FT_IQ3_XXS: T.IQ3_XXS, _FT_IQ1_S: T.IQ1_S, _FT_IQ1_M: T.IQ1_M, _FT_IQ4_NL: T.IQ4_NL,
    _FT_IQ4_XS: T.IQ4_XS, _FT_IQ3_S: T.IQ3_S, _FT_IQ3_M: T.IQ3_S,
}


@dataclass(frozen=True)
class Preset:
    """One ``llama-quantize`` type name: ``name`` as llama-quantize spells it, its ``ftype``
    (``enum llama_ftype``, written to ``general.file_type``), the ``default_type`` most tensors
    get, llama-quantize's ``description``, ``alias_of`` (the preset this name stands for, or
    None) and ``copy_only`` (``COPY``: every tensor kept as it is)."""

    name: str
    ftype: int
    default_type: int
    description: str
    alias_of: str | None = None
    copy_only: bool = False

    @property
    def is_mix(self) -> bool:
        """True for a preset whose rules can give tensors other types than ``default_type``."""
        return _is_quantized(self.default_type) and not self.copy_only


def _p(name, desc, alias_of=None, copy_only=False):
    """The preset ``name``; its ftype is ``LLAMA_FTYPES["MOSTLY_<name>"]`` (an alias: its
    target's; ``F32`` and ``COPY``: ``ALL_F32``)."""
    ftype = (_FT_F32 if copy_only or name == "F32"
             else LLAMA_FTYPES["MOSTLY_" + (alias_of or name)])
    return Preset(name, ftype, _DEFAULT_TYPE[ftype], desc, alias_of, copy_only)


# QUANT_OPTIONS of tools/quantize/quantize.cpp, in its order (the order decides which name a
# numeric ftype means: the first with that ftype, e.g. 15 -> "Q4_K", 0 -> "F32").
PRESETS: tuple[Preset, ...] = (
    _p("Q1_0", " 1.125 bpw quantization"),
    _p("Q2_0", " 2.25 bpw quantization (group 64)"),
    _p("Q4_0", " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    _p("Q4_1", " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    _p("MXFP4_MOE", " MXFP4 MoE"),
    _p("Q5_0", " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    _p("Q5_1", " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    _p("IQ2_XXS", " 2.06 bpw quantization"),
    _p("IQ2_XS", " 2.31 bpw quantization"),
    _p("IQ2_S", " 2.5  bpw quantization"),
    _p("IQ2_M", " 2.7  bpw quantization"),
    _p("IQ1_S", " 1.56 bpw quantization"),
    _p("IQ1_M", " 1.75 bpw quantization"),
    _p("TQ1_0", " 1.69 bpw ternarization"),
    _p("TQ2_0", " 2.06 bpw ternarization"),
    _p("Q2_K", " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    _p("Q2_K_S", " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    _p("IQ3_XXS", " 3.06 bpw quantization"),
    _p("IQ3_S", " 3.44 bpw quantization"),
    _p("IQ3_M", " 3.66 bpw quantization mix"),
    _p("Q3_K", "alias for Q3_K_M", alias_of="Q3_K_M"),
    _p("IQ3_XS", " 3.3 bpw quantization"),
    _p("Q3_K_S", " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    _p("Q3_K_M", " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    _p("Q3_K_L", " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    _p("IQ4_NL", " 4.50 bpw non-linear quantization"),
    _p("IQ4_XS", " 4.25 bpw non-linear quantization"),
    _p("Q4_K", "alias for Q4_K_M", alias_of="Q4_K_M"),
    _p("Q4_K_S", " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    _p("Q4_K_M", " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    _p("Q5_K", "alias for Q5_K_M", alias_of="Q5_K_M"),
    _p("Q5_K_S", " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    _p("Q5_K_M", " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    _p("Q6_K", " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    _p("Q8_0", " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    _p("F16", "14.00G, +0.0020 ppl @ Mistral-7B"),
    _p("BF16", "14.00G, -0.0050 ppl @ Mistral-7B"),
    _p("F32", "26.00G              @ 7B"),
    _p("COPY", "only copy tensors, no quantizing", copy_only=True),
)


def find_preset(name: str | int) -> Preset:
    """The preset for a llama-quantize type name (any case; ``q4_k_m``, ``Q4_K`` …) or a numeric
    ``llama_ftype`` (``15`` or ``"15"``: the first preset with it, as llama-quantize does)."""
    text = str(name).strip()
    upper = text.upper()
    for p in PRESETS:
        if p.name == upper:
            return p
    try:
        num = int(text)
    except ValueError:
        num = None
    if num is not None:
        for p in PRESETS:
            if p.ftype == num:
                return p
    raise PresetError(f"unknown preset {text!r}; llama-quantize names: "
                      + ", ".join(p.name for p in PRESETS))


_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")


def parse_ftype(text: str) -> Preset | None:
    """llama-quantize's ``try_parse_ftype``: the preset a TYPE argument names, or None.

    A name in any case (``q4_k_m``, ``Q4_K`` …) first; else ``std::stoi`` of the text (leading
    white space, a sign and digits; anything after them is ignored, so ``"15"`` and ``"15x"``
    both mean the first preset with ftype 15, ``Q4_K``) -- exactly as llama-quantize decides
    whether a positional argument is the TYPE or the output file."""
    upper = str(text).upper()
    for p in PRESETS:
        if p.name == upper:
            return p
    m = _STOI.match(upper)
    if m is None:
        return None
    num = int(m.group(1))
    if not -2**31 <= num < 2**31:  # std::stoi throws out_of_range
        return None
    for p in PRESETS:
        if p.ftype == num:
            return p
    return None


def preset_table() -> list[tuple[str, str, str]]:
    """(name, default tensor type, description) rows for help texts, in llama-quantize's order."""
    return [(p.name, _tname(p.default_type), p.description.strip()) for p in PRESETS]


# --- the model: what llama.cpp's loader derives from the metadata ------------------------------

# architectures whose load_hparams can give LLM_TYPE_70B (the only model type the rules use),
# with the block count that does so (models/{llama,qwen2,deci,olmo,jais2}.cpp)
_TYPE_70B_LAYERS = {"llama": 80, "qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}


@dataclass(frozen=True)
class ModelInfo:
    """The hyper-parameters llama.cpp's rules read: ``arch`` (``general.architecture``),
    ``n_layer`` (``{arch}.block_count``, all blocks), ``n_layer_nextn`` (MTP blocks),
    ``n_head`` / ``n_head_kv`` (of layer 0: ``n_gqa()`` reads layer 0), ``n_expert``."""

    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int | None = None
    n_expert: int = 0
    n_layer_nextn: int = 0

    @property
    def n_gqa(self) -> int:  # llama_hparams::n_gqa(0)
        kv = self.n_head if self.n_head_kv is None else self.n_head_kv
        return 0 if kv == 0 else self.n_head // kv

    @property
    def is_70b(self) -> bool:  # model.type == LLM_TYPE_70B
        n = self.n_layer - self.n_layer_nextn
        if self.arch == "llama":
            kv = self.n_head if self.n_head_kv is None else self.n_head_kv
            return self.n_expert != 8 and n == 80 and self.n_head != kv
        return _TYPE_70B_LAYERS.get(self.arch) == n


def _first(v):
    if isinstance(v, (list, tuple)):
        if not v:
            return 0
        return int(v[0])
    try:
        import numpy as np
        if isinstance(v, np.ndarray):
            return int(v.reshape(-1)[0]) if v.size else 0
    except ImportError:  # pragma: no cover
        pass
    return int(v)


def model_info(metadata: Mapping[str, Any]) -> ModelInfo:
    """:class:`ModelInfo` from GGUF key/values (plain Python values; a per-layer array counts by
    its first element, as ``n_gqa()`` does)."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise PresetError("metadata has no general.architecture")
    key = f"{arch}.block_count"
    if key not in metadata:
        raise PresetError(f"metadata has no {key}")
    n_layer = _first(metadata[key])
    if n_layer <= 0:
        raise PresetError(f"{key} is {n_layer}; it must be positive")
    n_head = _first(metadata.get(f"{arch}.attention.head_count", 0))
    kv = metadata.get(f"{arch}.attention.head_count_kv")
    return ModelInfo(arch=arch, n_layer=n_layer, n_head=n_head,
                     n_head_kv=None if kv is None else _first(kv),
                     n_expert=_first(metadata.get(f"{arch}.expert_count", 0)),
                     n_layer_nextn=_first(metadata.get(f"{arch}.nextn_predict_layers", 0)))


# --- tensors ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    """A tensor of the input file: ``name``, ``ne`` (ggml order, row length first), ``type``."""

    name: str
    ne: tuple[int, ...]
    type: int


@dataclass(frozen=True)
class TensorPlan:
    """llama.cpp's decision for one tensor. ``target`` is the GGML type it will have; ``convert``
    is False when it is written unchanged (``target == current``); ``index`` is its position in
    the input list; ``reason`` says which rule decided; ``fallback`` is True when the row length
    forced a different type than the rules chose."""

    name: str
    ne: tuple[int, ...]
    current: int
    target: int
    convert: bool
    reason: str
    index: int
    fallback: bool = False
    requires_imatrix: bool = False

    @property
    def target_name(self) -> str:
        return _tname(self.target)


@dataclass(frozen=True)
class Plan:
    """The result of :func:`plan`: ``tensors`` in llama.cpp's processing and output order,
    ``kv`` the key/values llama.cpp sets in the output file, ``n_fallback`` (tensors whose row
    length forced a fallback type) and ``notes`` (where this model may differ from llama.cpp)."""

    preset: Preset
    tensors: tuple[TensorPlan, ...]
    kv: dict
    n_fallback: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def will_require_imatrix(self) -> bool:
        """True when a tensor llama.cpp quantizes gets a type that needs an importance matrix
        (llama.cpp's ``--dry-run`` warning; without ``dry_run`` and ``imatrix``,
        :func:`plan` refuses such a plan)."""
        return any(t.requires_imatrix for t in self.tensors)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.target_name] = counts.get(t.target_name, 0) + 1
        mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        s = f"{self.preset.name}: {len(self.tensors)} tensors ({mix})"
        if self.n_fallback:
            s += f"; {self.n_fallback} row-size fallback(s)"
        return s


def _n_dims(ne: Sequence[int]) -> int:  # ggml_n_dims: trailing 1s do not count
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


_BLK = re.compile(r"blk\.\s*([+-]?\d+)")


def _scan_layer(name: str):
    """sscanf(name, "blk.%d.", &layer) == 1 ? layer : None. sscanf counts the %d conversion
    even when the trailing "." does not match, and %d skips leading white space."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def _order_key(name: str):
    layer = _scan_layer(name)
    return (-1 if layer is None else layer, name.encode("utf-8"))


def llama_order(names: Iterable[str]) -> list[str]:
    """``names`` in llama.cpp's tensor order (its ``weights_map``): by the layer number of
    ``blk.N.`` (names without one first), then by name, byte-wise."""
    return sorted(names, key=_order_key)


_BLK_ANYWHERE = re.compile(r"blk\.(\d+)\.")


def prune_names(names: Iterable[str], prune: Iterable[int]) -> tuple[dict, int]:
    """llama-quantize ``--prune-layers``: ``({old name: new name or None}, new block count)``.

    llama-quant.cpp's ``remap_layer``, visited in llama.cpp's order: the layers in ``prune``
    are dropped (None), the layers after the first pruned one are renumbered down, the others
    keep their names. The block count is llama.cpp's ``blk_id`` (what it writes to
    ``{arch}.block_count``)."""
    prune = sorted(set(int(i) for i in prune))
    out: dict = {}
    if not prune:
        return {n: n for n in names}, -1
    mapped: dict = {}
    next_id = 0
    for name in llama_order(names):
        m = _BLK_ANYWHERE.search(name)
        if m is None:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = ""
            elif blk < prune[0]:
                mapped[blk] = str(blk)
                next_id = blk + 1
            else:
                mapped[blk] = str(next_id)
                next_id += 1
        new = mapped[blk]
        out[name] = None if not new else name[:m.start(1)] + new + name[m.end(1):]
    return out, next_id


# llama_model_loader's guess of the file type from the most common tensor type
_GUESS = {
    T.F32: _FT_F32, T.F16: _FT_F16, T.BF16: _FT_BF16, T.Q4_0: _FT_Q4_0, T.Q4_1: _FT_Q4_1,
    T.Q5_0: _FT_Q5_0, T.Q5_1: _FT_Q5_1, T.Q8_0: _FT_Q8_0, T.Q2_K: _FT_Q2_K, T.Q3_K: _FT_Q3_K_M,
    T.Q4_K: _FT_Q4_K_M, T.Q5_K: _FT_Q5_K_M, T.Q6_K: _FT_Q6_K, T.TQ1_0: _FT_TQ1_0,
    T.TQ2_0: _FT_TQ2_0, T.IQ2_XXS: _FT_IQ2_XXS, T.IQ2_XS: _FT_IQ2_XS, T.IQ2_S: _FT_IQ2_S,
    T.IQ3_XXS: _FT_IQ3_XXS, T.IQ1_S: _FT_IQ1_S, T.IQ1_M: _FT_IQ1_M, T.IQ4_NL: _FT_IQ4_NL,
    T.IQ4_XS: _FT_IQ4_XS, T.IQ3_S: _FT_IQ3_S, T.NVFP4: _FT_NVFP4, T.Q1_0: _FT_Q1_0,
    T.Q2_0: _FT_Q2_0,
}
LLAMA_FTYPE_GUESSED = 1024


def guess_ftype(metadata: Mapping[str, Any], tensors: Iterable) -> int:
    """The file type llama.cpp's loader gives a model (``ml.ftype``, what ``COPY`` writes to
    ``general.file_type``): the file's own ``general.file_type`` when it has one, else the
    ftype of the most common tensor type (the first to reach the highest count in llama.cpp's
    order) marked ``LLAMA_FTYPE_GUESSED``."""
    if "general.file_type" in metadata:
        return int(metadata["general.file_type"]) & 0xFFFFFFFF
    items = [_coerce_tensor(t) for t in tensors]
    counts: dict = {}
    best, best_n = T.F32, 0
    for t in sorted(items, key=lambda t: _order_key(t.name)):
        counts[t.type] = counts.get(t.type, 0) + 1
        if best_n < counts[t.type]:
            best, best_n = t.type, counts[t.type]
    return _GUESS.get(best, _FT_F32) | LLAMA_FTYPE_GUESSED


# tensor_category (tensor_get_category), in its test order
_CATS = (("attn_qkv.weight", "ATTENTION_QKV"), ("attn_kv_b.weight", "ATTENTION_KV_B"),
         ("attn_v.weight", "ATTENTION_V"), ("attn_k.weight", "ATTENTION_K"),
         ("attn_q.weight", "ATTENTION_Q"), ("attn_output.weight", "ATTENTION_OUTPUT"),
         ("ffn_up", "FFN_UP"), ("ffn_gate", "FFN_GATE"), ("ffn_down", "FFN_DOWN"))


def _category(name: str) -> str:
    if name == "output.weight":
        return "OUTPUT"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "TOKEN_EMBD"
    for needle, cat in _CATS:
        if needle in name:
            return cat
    return "OTHER"


def _is_attn_v(cat: str) -> bool:
    return cat in ("ATTENTION_V", "ATTENTION_QKV", "ATTENTION_KV_B")


_NO_QUANT_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_NO_QUANT_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight",
)


def _allows_quantization(name: str, ne, arch: str, copy_only: bool, quantize_output: bool):
    """tensor_allows_quantization: (allowed, reason when not)."""
    if copy_only:
        return False, "COPY: every tensor copied"
    if _n_dims(ne) < 2:
        return False, "1-D tensor kept"
    # name.rfind("weight") == name.size() - 6; for a 5-character name size()-6 wraps to npos,
    # which equals rfind's "not found", so such names count as ending with "weight".
    if not (name.endswith("weight") or len(name) == 5):
        return False, "name does not end with 'weight'"
    if "_norm.weight" in name:
        return False, "norm kept"
    if not quantize_output and name == "output.weight":
        return False, "output.weight left as it is (leave_output_tensor)"
    for s in _NO_QUANT_SUBSTRINGS:
        if s in name:
            return False, f"'{s}' tensors are not quantized"
    if name in ("position_embd.weight", "token_types.weight"):
        return False, "position/token-type embeddings are not quantized"
    if arch == "glm5-next":
        for s in _NO_QUANT_GLM5_NEXT:
            if s in name:
                return False, f"glm5-next: '{s}' tensors are not quantized"
    return True, ""


def _cdiv(a: int, b: int) -> int:  # C integer division (truncates toward zero)
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _cmod(a: int, b: int) -> int:  # C remainder (sign of the dividend)
    return a - b * _cdiv(a, b)


def _use_more_bits(i: int, n: int) -> bool:
    return i < _cdiv(n, 8) or i >= _cdiv(7 * n, 8) or _cmod(i - _cdiv(n, 8), 3) == 2


class _State:  # quantize_state_impl's counters
    def __init__(self, tensors):
        self.n_attention_wv = sum(1 for t in tensors if _is_attn_v(_category(t.name)))
        self.has_tied_embeddings = not any(_category(t.name) == "OUTPUT" for t in tensors)
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0


_IQ_LOW = {_FT_IQ2_XXS, _FT_IQ2_XS, _FT_IQ1_S, _FT_IQ2_S, _FT_IQ2_M, _FT_IQ1_M}

# The categories whose rule is one type per preset (llama_tensor_get_type_impl's attn_k -- after
# its 8-expert rule --, attn_q and attn_qkv branches; attn_qkv is also an attn_v category, whose
# branch comes first, as in llama.cpp); the reasons read ``attn_k: IQ3_XXS`` etc.
_KQ_RULE = {_FT_IQ3_XS: T.IQ3_XXS, _FT_IQ3_XXS: T.IQ2_S}
_PRESET_RULES = {
    "ATTENTION_K": _KQ_RULE, "ATTENTION_Q": _KQ_RULE,
    "ATTENTION_QKV": {_FT_Q3_K_M: T.Q4_K, _FT_Q3_K_L: T.Q4_K, _FT_IQ3_M: T.Q4_K,
                      _FT_Q4_K_M: T.Q5_K, _FT_Q5_K_M: T.Q6_K},
}


def _get_type_impl(qs: _State, m: ModelInfo, new: int, t: Tensor, ft: int, cat: str,
                   output_type, imatrix: bool):
    """llama_tensor_get_type_impl, line by line. Returns (type, reason)."""
    name, arch = t.name, m.arch
    n_layer_ffn = m.n_layer  # qs.n_ffn_down = n_ffn_gate = n_ffn_up = hparams.n_layer_all
    n_expert = max(1, m.n_expert)
    gqa = m.n_gqa

    def layer_info(i_layer, n_layer):
        if n_expert > 1:
            layer = _scan_layer(name)
            if layer is None:
                raise PresetError(f"Failed to determine layer for tensor {name}")
            if layer < 0 or layer >= n_layer:
                raise PresetError(f"Bad layer {layer} for tensor {name}. Must be in [0, {n_layer})")
            i_layer = layer
        return i_layer, n_layer

    if arch == "glm5-next" and ("attn_q_a" in name or "attn_q_b" in name or "nextn.eh_proj" in name):
        if new not in (T.F32, T.BF16, T.F16):
            return T.Q8_0, "glm5-next: attn_q_a/attn_q_b/nextn.eh_proj at least Q8_0"

    if cat == "OUTPUT" or (qs.has_tied_embeddings and cat == "TOKEN_EMBD"):
        what = "output.weight" if cat == "OUTPUT" else "tied token_embd (serves as output)"
        if output_type is not None:
            return output_type, f"{what}: output_tensor_type"
        nx = t.ne[0]
        qk = BLOCK_SIZE[new]
        if ft == _FT_MXFP4_MOE:
            return T.Q8_0, f"{what}: Q8_0 for MXFP4_MOE"
        if arch == "falcon" or nx % qk != 0:
            why = "falcon" if arch == "falcon" else f"row length {nx} not a multiple of {qk}"
            return T.Q8_0, f"{what}: Q8_0 ({why})"
        if ft in (_FT_IQ2_XXS, _FT_IQ2_XS, _FT_IQ3_XXS, _FT_IQ1_S, _FT_IQ2_S, _FT_IQ2_M, _FT_IQ1_M):
            return T.Q5_K, f"{what}: Q5_K for very low-bit presets"
        if new != T.Q8_0:
            return T.Q6_K, f"{what}: Q6_K"
        return new, f"{what}: default type"

    if ft == _FT_MXFP4_MOE:
        expert_role = cat in ("FFN_UP", "FFN_GATE", "FFN_DOWN")
        nz = t.ne[2] if len(t.ne) > 2 else 1
        if nz > 1 and (arch != "bailingmoe3" or expert_role):
            return T.MXFP4, "MXFP4_MOE: expert tensor"
        return T.Q8_0, "MXFP4_MOE: non-expert tensor"

    if cat == "TOKEN_EMBD":
        if ft in (_FT_IQ2_XXS, _FT_IQ2_XS, _FT_IQ1_S, _FT_IQ1_M):
            return T.Q2_K, "token_embd: Q2_K for IQ1/IQ2 presets"
        if ft in (_FT_IQ2_S, _FT_IQ2_M, _FT_IQ3_XXS):
            return T.IQ3_S, "token_embd: IQ3_S"
        if ft in (_FT_TQ1_0, _FT_TQ2_0, _FT_Q2_0):
            return T.Q4_K, "token_embd: Q4_K"
        return new, "token_embd: default type"

    if ft in _IQ_LOW:
        if _is_attn_v(cat):
            if gqa >= 4 or m.n_expert >= 4:
                r = T.Q4_K, "attn_v: Q4_K (n_gqa >= 4 or n_expert >= 4)"
            else:
                r = (T.IQ3_S if ft in (_FT_IQ2_S, _FT_IQ2_M) else T.Q2_K), "attn_v: low-bit preset"
            qs.i_attention_wv += 1
            return r
        if m.n_expert == 8 and cat == "ATTENTION_K":
            return T.Q4_K, "attn_k: Q4_K (8 experts)"
        if cat == "FFN_DOWN":
            r = new, "ffn_down: default type"
            if qs.i_ffn_down < _cdiv(n_layer_ffn, 8):
                r = (T.IQ3_S if ft in (_FT_IQ2_S, _FT_IQ2_M) else T.Q2_K), \
                    f"ffn_down #{qs.i_ffn_down} < n_layer/8"
            qs.i_ffn_down += 1
            return r
        if cat == "ATTENTION_OUTPUT":
            if m.n_expert == 8:
                return T.Q5_K, "attn_output: Q5_K (8 experts)"
            if ft in (_FT_IQ1_S, _FT_IQ1_M):
                return T.IQ2_XXS, "attn_output: IQ2_XXS"
            if ft in (_FT_IQ2_S, _FT_IQ2_M):
                return T.IQ3_S, "attn_output: IQ3_S"
        return new, "default type"

    if _is_attn_v(cat):
        i = qs.i_attention_wv
        reason = f"attn_v #{i}: default type"
        if ft == _FT_Q2_K:
            new = T.Q4_K if gqa >= 4 else T.Q3_K
            reason = f"attn_v #{i}: Q2_K preset, n_gqa {gqa}"
        elif ft == _FT_Q2_K_S and gqa >= 4:
            new, reason = T.Q4_K, f"attn_v #{i}: n_gqa {gqa} >= 4"
        elif ft == _FT_IQ3_XXS:
            new = T.Q4_K if gqa >= 4 else (T.IQ3_S if not imatrix else T.IQ3_XXS)
            reason = f"attn_v #{i}: IQ3_XXS preset, n_gqa {gqa}"
        elif ft in (_FT_IQ3_XS, _FT_IQ3_S) and gqa >= 4:
            new, reason = T.Q4_K, f"attn_v #{i}: n_gqa {gqa} >= 4"
        elif ft == _FT_IQ3_M:
            new, reason = T.Q4_K, f"attn_v #{i}: IQ3_M preset"
        elif ft == _FT_Q3_K_M:
            new = T.Q5_K if i < 2 else T.Q4_K
            reason = f"attn_v #{i}: Q3_K_M ({'first two' if i < 2 else 'later'})"
        elif ft == _FT_Q3_K_L:
            new, reason = T.Q5_K, f"attn_v #{i}: Q3_K_L"
        elif ft in (_FT_IQ4_NL, _FT_IQ4_XS) and gqa >= 4:
            new, reason = T.Q5_K, f"attn_v #{i}: n_gqa {gqa} >= 4"
        elif ft in (_FT_Q4_K_M, _FT_Q5_K_M) and _use_more_bits(i, qs.n_attention_wv):
            new, reason = T.Q6_K, f"attn_v #{i} of {qs.n_attention_wv}: use_more_bits"
        elif ft == _FT_Q4_K_S and i < 4:
            new, reason = T.Q5_K, f"attn_v #{i} < 4"
        if m.is_70b and new in (T.Q3_K, T.Q4_K):
            new, reason = T.Q5_K, reason + "; 70B model: Q5_K"
        if m.n_expert == 8:
            new, reason = T.Q8_0, f"attn_v #{i}: Q8_0 (8 experts)"
        qs.i_attention_wv += 1
        return new, reason

    if cat == "ATTENTION_K" and m.n_expert == 8:
        return T.Q8_0, "attn_k: Q8_0 (8 experts)"
    if cat in _PRESET_RULES:    # attn_k, attn_q, attn_qkv: one type per preset
        rule = _PRESET_RULES[cat].get(ft)
        if rule is not None:
            return rule, f"attn_{cat[len('ATTENTION_'):].lower()}: {_tname(rule)}"
        return new, "default type"

    if cat == "FFN_DOWN":
        il, nl = layer_info(qs.i_ffn_down, n_layer_ffn)
        tag = f"ffn_down layer {il} of {nl}"
        reason = f"{tag}: default type"
        more = _use_more_bits(il, nl)
        if ft == _FT_Q2_K:
            new, reason = T.Q3_K, f"{tag}: Q2_K preset"
        elif ft == _FT_Q2_K_S:
            if il < _cdiv(nl, 8):
                new, reason = T.Q4_K, f"{tag}: < n_layer/8"
        elif ft == _FT_IQ3_XXS and not imatrix:
            new = T.Q4_K if il < _cdiv(nl, 8) else T.Q3_K
            reason = f"{tag}: IQ3_XXS without imatrix"
        elif ft == _FT_Q3_K_M:
            new = (T.Q5_K if il < _cdiv(nl, 16)
                   else T.Q4_K if arch != "falcon" or more else T.Q3_K)
            reason = f"{tag}: Q3_K_M"
        elif ft == _FT_IQ3_M and (il < _cdiv(nl, 8) or (m.n_expert == 8 and more)):
            new, reason = T.Q4_K, f"{tag}: IQ3_M"
        elif ft == _FT_Q3_K_L:
            new, reason = (T.Q4_K if arch == "falcon" else T.Q5_K), f"{tag}: Q3_K_L"
        elif ft == _FT_Q4_K_M:
            if arch == "falcon":
                new = T.Q6_K if il < _cdiv(nl, 16) else T.Q5_K if more else T.Q4_K
                reason = f"{tag}: Q4_K_M falcon"
            elif more:
                new, reason = T.Q6_K, f"{tag}: use_more_bits"
        elif il < _cdiv(nl, 8) and ft in (_FT_IQ4_NL, _FT_IQ4_XS) and not imatrix:
            new, reason = T.Q5_K, f"{tag}: < n_layer/8"
        elif ft == _FT_Q5_K_M and more:
            new, reason = T.Q6_K, f"{tag}: use_more_bits"
        elif ft == _FT_Q4_K_S and arch != "falcon" and il < _cdiv(nl, 8):
            new, reason = T.Q5_K, f"{tag}: < n_layer/8"
        elif ft in (_FT_Q4_0, _FT_Q5_0) and imatrix and il < _cdiv(nl, 8):
            new = T.Q4_1 if ft == _FT_Q4_0 else T.Q5_1
            reason = f"{tag}: < n_layer/8 with imatrix"
        qs.i_ffn_down += 1
        return new, reason

    if cat == "ATTENTION_OUTPUT":
        if arch != "falcon":
            if m.n_expert == 8:
                if ft in (_FT_Q2_K, _FT_IQ3_XS, _FT_IQ3_XXS, _FT_Q3_K_S, _FT_Q3_K_M, _FT_IQ4_NL,
                          _FT_Q4_K_S, _FT_Q4_K_M, _FT_IQ3_S, _FT_IQ3_M, _FT_IQ4_XS):
                    return T.Q5_K, "attn_output: Q5_K (8 experts)"
            else:
                rule = {_FT_Q2_K: T.Q3_K, _FT_IQ3_XXS: T.IQ3_S, _FT_Q3_K_M: T.Q4_K,
                        _FT_Q3_K_L: T.Q5_K, _FT_IQ3_M: T.Q4_K}.get(ft)
                if rule is not None:
                    return rule, "attn_output: preset rule"
        elif ft == _FT_Q3_K_L:
            return T.Q4_K, "attn_output: falcon Q3_K_L"
        return new, "default type"

    if cat in ("FFN_GATE", "FFN_UP"):
        attr = "i_ffn_gate" if cat == "FFN_GATE" else "i_ffn_up"
        il, nl = layer_info(getattr(qs, attr), n_layer_ffn)
        reason = "default type"
        if ft == _FT_IQ3_XS and (il >= _cdiv(nl, 8) and il < _cdiv(7 * nl, 8)):
            new, reason = T.IQ3_XXS, f"{cat.lower()} layer {il}: IQ3_XXS"
        setattr(qs, attr, getattr(qs, attr) + 1)
        return new, reason

    return new, "default type"


# tensor_type_fallback's table
_FALLBACK = {
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL,
    T.IQ2_S: T.IQ4_NL, T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
    T.Q2_0: T.Q4_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}


def _fallback(qs: _State, t: Tensor, target: int):
    """tensor_type_fallback: (type, note or None)."""
    ncols = t.ne[0]
    qk = BLOCK_SIZE[target]
    if ncols % qk == 0:
        return target, None
    qs.n_fallback += 1
    if target in _FALLBACK:
        ret = _FALLBACK[target]
    elif qk <= 32:
        ret = target
    else:
        raise PresetError(f"no tensor type fallback is defined for type {_tname(target)} "
                          f"(tensor {t.name}, row length {ncols})")
    if ncols % BLOCK_SIZE[ret] != 0:
        ret = T.F16
    return ret, (f"row length {ncols} not a multiple of {qk} ({_tname(target)}): "
                 f"falls back to {_tname(ret)}")


def _requires_imatrix(name: str, dst: int, ft: int) -> bool:
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    if dst in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return dst == T.Q2_K and ft == _FT_Q2_K_S


def _as_type(v, what: str):
    if v is None:
        return None
    if isinstance(v, str):
        try:
            return GGML_TYPES[v.upper()]
        except KeyError:
            raise PresetError(f"{what}: unknown GGML type {v!r}") from None
    v = int(v)
    if v not in GGML_TYPE_NAMES:
        raise PresetError(f"{what}: unknown GGML type id {v}")
    return v


def _coerce_tensor(t) -> Tensor:
    if isinstance(t, Tensor):
        return t
    if isinstance(t, Mapping):
        name, ne, typ = t["name"], t["ne"], t["type"]
    else:
        name, ne, typ = t
    ne = tuple(int(x) for x in ne)
    if not ne or any(x < 0 for x in ne):
        raise PresetError(f"tensor {name}: bad shape {ne}")
    return Tensor(str(name), ne, int(typ))


def plan(preset: str | int | Preset, metadata: Mapping[str, Any] | ModelInfo,
         tensors: Iterable, *, pure: bool = False, leave_output_tensor: bool = False,
         output_tensor_type=None, token_embedding_type=None,
         tensor_types: Sequence[tuple[str, Any]] = (), imatrix: bool = False,
         allow_requantize: bool = False, dry_run: bool = False,
         keep_order: bool = False) -> Plan:
    """Each tensor's GGML type under a llama-quantize preset, as llama.cpp chooses it.

    ``metadata``: the GGUF key/values (or a :class:`ModelInfo`). ``tensors``: :class:`Tensor`
    or ``(name, ne, type)`` in any order. The options are llama-quantize's: ``pure``
    (``--pure``: no mixture rules, still the row-size fallbacks), ``leave_output_tensor``,
    ``output_tensor_type`` / ``token_embedding_type`` (names or ids), ``tensor_types``
    (``--tensor-type PATTERN=TYPE``: first regex that *searches* the name wins), ``imatrix``
    (whether an importance matrix covering every quantized tensor is used: it changes some rules
    and lifts the refusals of the low-bit presets), ``allow_requantize``, ``dry_run``
    (``--dry-run``: llama.cpp only sizes the plan, so neither refusal below is raised;
    :attr:`Plan.will_require_imatrix` says whether the real run would need an importance
    matrix), ``keep_order`` (visit the tensors in the order given rather than llama.cpp's layer
    order: llama-quantize ``--keep-split`` processes each shard's tensors in file order, and the
    per-layer counters count in that order).

    Raises :class:`PresetError` where llama.cpp refuses (a preset that needs an importance matrix
    without one, requantizing without ``allow_requantize``, a type without fallback …).
    """
    p = preset if isinstance(preset, Preset) else find_preset(preset)
    m = metadata if isinstance(metadata, ModelInfo) else model_info(metadata)
    out_t = _as_type(output_tensor_type, "output_tensor_type")
    emb_t = _as_type(token_embedding_type, "token_embedding_type")
    patterns = []
    for pat, typ in tensor_types:
        try:
            patterns.append((re.compile(pat), _as_type(typ, f"tensor type for {pat!r}")))
        except re.error as e:
            raise PresetError(f"bad tensor-type pattern {pat!r}: {e}") from None

    items = [_coerce_tensor(t) for t in tensors]
    seen = set()
    for t in items:
        if t.name in seen:
            raise PresetError(f"duplicate tensor name {t.name}")
        seen.add(t.name)
    order = (list(range(len(items))) if keep_order
             else sorted(range(len(items)), key=lambda i: _order_key(items[i].name)))
    ordered = [items[i] for i in order]

    ft = p.ftype
    default = p.default_type
    qs = _State(ordered)
    result = []
    for idx, t in zip(order, ordered):
        cat = _category(t.name)
        allowed, why = _allows_quantization(t.name, t.ne, m.arch, p.copy_only,
                                            not leave_output_tensor)
        fb = False
        if not allowed:
            target, reason = t.type, why
        elif emb_t is not None and cat == "TOKEN_EMBD" and not (
                t.name == "per_layer_token_embd.weight"
                and any(rx.search(t.name) for rx, _ in patterns)):
            target, reason = emb_t, "token_embedding_type"
        elif out_t is not None and cat == "OUTPUT":
            target, reason = out_t, "output_tensor_type"
        else:
            target, reason = default, "default type"
            if _is_quantized(default):
                manual = False
                for rx, typ in patterns:
                    if rx.search(t.name):
                        target, reason, manual = typ, f"tensor type override /{rx.pattern}/", True
                        break
                if not manual and not pure:
                    target, reason = _get_type_impl(qs, m, target, t, ft, cat, out_t, imatrix)
                elif pure and not manual:
                    reason = "pure: default type"
                target, note = _fallback(qs, t, target)
                if note:
                    reason, fb = f"{reason}; {note}", True
        needs = allowed and _requires_imatrix(t.name, target, ft)
        if needs and not imatrix and not dry_run:
            raise PresetError(f"preset {p.name} needs an importance matrix: tensor {t.name} "
                              f"would be {_tname(target)}")
        convert = target != t.type
        result.append(TensorPlan(t.name, t.ne, t.type, target, convert, reason, idx, fb, needs))

    # llama.cpp checks these while writing, after every tensor's type has been chosen
    for t in result:
        if dry_run:
            break
        if t.convert and _is_quantized(t.current) and not allow_requantize:
            raise PresetError(f"tensor {t.name} is already {_tname(t.current)}: requantizing to "
                              f"{t.target_name} is refused without --allow-requantize "
                              f"(llama-quantize's flag, also numba_qk's; "
                              f"plan(allow_requantize=True) in Python)")
        if t.convert and not (_is_quantized(t.current) or t.current in (T.F32, T.F16, T.BF16)):
            raise PresetError(f"tensor {t.name}: cannot convert from {_tname(t.current)}")

    kv = {"general.quantization_version": GGML_QNT_VERSION}
    if not p.copy_only:
        kv["general.file_type"] = ft
    return Plan(p, tuple(result), kv, qs.n_fallback, _notes(p, m, patterns))


# architectures whose files were quantized by llama.cpp and compared (tools/compare_presets.py)
_COMPARED_ARCHS = ("llama", "falcon")


def _notes(p: Preset, m: ModelInfo, patterns) -> tuple[str, ...]:
    notes = []
    if m.arch not in _COMPARED_ARCHS:
        if m.arch in ("glm5-next", "bailingmoe3"):
            notes.append(f"architecture {m.arch!r}: its special rules in llama-quant.cpp are "
                         f"transcribed but were not compared against llama.cpp's quantizer")
        else:
            notes.append(f"architecture {m.arch!r}: llama.cpp's generic rules applied (its "
                         f"quantizer names only falcon, glm5-next, bailingmoe3 and the 70B model "
                         f"type); compared against llama.cpp for llama and falcon files only")
    if p.copy_only:
        notes.append("COPY: llama.cpp writes the input's own general.file_type; kv leaves it as is")
    if patterns:
        notes.append("tensor-type patterns use Python's re.search; llama.cpp uses std::regex "
                     "(ECMAScript), which agrees on ordinary patterns")
    notes.append("not modelled by plan(): --prune-layers, kv overrides, importance-matrix data "
                 "(only whether one is used); numba_qk.gguf.quantize_file applies them")
    return tuple(notes)
