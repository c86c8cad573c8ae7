"""A tiny runnable language model for ``python -m numba_qk generate`` without a MODEL.

``write_demo_model(path)`` writes a 2-layer ``llama`` GGUF file (width 256, 4 heads of 64, GQA
2, FFN 512) with random weights (seeded: the same bytes every run): Q4_K attention and FFN
matrices, a Q6_K down projection, a tied Q8_0 token embedding, F32 norms, and a GPT-2
byte-level BPE vocabulary (the 256 byte tokens, a few merges of common English pairs, and
``<|endoftext|>`` as BOS/EOS).  It exercises the whole runner (tokenizer, K-quant and Q8_0
products, RoPE, GQA attention, SwiGLU, KV cache); the text it writes is noise, since the weights
are random.  About 0.5 MB; the quantization runs numba_qk's own encoders.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._vocab import gpt2_byte_to_unicode

__all__ = ["write_demo_model", "add_hyperparameters", "DEMO_PROMPT", "SHAPE"]

#: The prompt ``generate`` uses when it is given neither a PROMPT nor ``--tokens``.
DEMO_PROMPT = "The quick brown fox"

# merges of the vocabulary, each also a token (GPT-2's "Ġ" is the byte-level space)
_MERGES = (("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("o", "n"),
           ("Ġ", "a"), ("r", "e"), ("a", "n"), ("Ġ", "s"), ("o", "u"), ("Ġ", "w"),
           ("Ġt", "h"), ("in", "g"), ("Ġ", "b"), ("Ġ", "f"))
#: The model's shape (and its norm epsilon and RoPE base).
SHAPE = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_layer=2, eps=1e-5,
             freq_base=10000.0)


def add_hyperparameters(w, shape: dict, n_ctx: int) -> None:
    """The hyper-parameter keys every model of ``shape`` (``SHAPE``'s keys) carries, on the
    gguf-py writer ``w`` (tests/models/tiny_models.py writes its models with it too)."""
    w.add_context_length(n_ctx)
    w.add_embedding_length(shape["n_embd"])
    w.add_feed_forward_length(shape["n_ff"])
    w.add_block_count(shape["n_layer"])
    w.add_head_count(shape["n_head"])
    w.add_head_count_kv(shape["n_head_kv"])
    w.add_layer_norm_rms_eps(shape["eps"])
    w.add_rope_freq_base(shape["freq_base"])


def _vocabulary():
    byte_tokens = list(gpt2_byte_to_unicode().values())
    merged = [a + b for a, b in _MERGES]
    tokens = ["<|endoftext|>"] + byte_tokens + merged
    types = [3] + [1] * (len(tokens) - 1)      # control, then normal
    return tokens, types, [f"{a} {b}" for a, b in _MERGES]


def write_demo_model(path, seed: int = 0) -> Path:
    """Write the demo model to ``path`` (see the module docstring); returns the path."""
    import gguf

    from numba_qk.formats import quant
    from numba_qk.ops import quantize

    s = SHAPE
    tokens, types, merges = _vocabulary()
    rng = np.random.default_rng(seed)
    T = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("numba_qk demo llama (random weights)")
    add_hyperparameters(w, s, n_ctx=256)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(s["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(True)

    def mat(name, rows, cols, fmt, scale=None):
        scale = 1.0 / np.sqrt(cols) if scale is None else scale
        m = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        recs = quantize(m.reshape(-1, fmt.block_size), format=fmt).reshape(rows, -1)
        w.add_tensor(name, recs, raw_dtype=T[fmt.name])

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    d, hd, ff = s["n_embd"], s["head_dim"], s["n_ff"]
    mat("token_embd.weight", len(tokens), d, quant.q8_0, scale=0.5)
    for i in range(s["n_layer"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", s["n_head"] * hd, d, quant.q4_k)
        mat(p + "attn_k.weight", s["n_head_kv"] * hd, d, quant.q4_k)
        mat(p + "attn_v.weight", s["n_head_kv"] * hd, d, quant.q4_k)
        mat(p + "attn_output.weight", d, s["n_head"] * hd, quant.q4_k)
        norm(p + "ffn_norm.weight", d)
        mat(p + "ffn_gate.weight", ff, d, quant.q4_k)
        mat(p + "ffn_up.weight", ff, d, quant.q4_k)
        mat(p + "ffn_down.weight", d, ff, quant.q6_k)
    norm("output_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
