"""Table tests for numba_qk.presets, each expectation read off llama.cpp's src/llama-quant.cpp
(llama-cpp-python 0.3.36's vendored copy) and tools/quantize/quantize.cpp by hand.

The whole-file cross-check against llama.cpp's own quantizer is tools/compare_presets.py.
"""

import pytest

from numba_qk import presets as P
from numba_qk.presets import GGML_TYPES as T

F32, F16, BF16 = T["F32"], T["F16"], T["BF16"]


def llama_tensors(n_layer, n_embd=256, n_ff=256, n_kv=256, vocab=512, tied=False, dtype=F16,
                  experts=0, skip=()):
    ts = [P.Tensor("token_embd.weight", (n_embd, vocab), dtype),
          P.Tensor("output_norm.weight", (n_embd,), F32)]
    if not tied:
        ts.append(P.Tensor("output.weight", (n_embd, vocab), dtype))
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [P.Tensor(b + "attn_norm.weight", (n_embd,), F32),
               P.Tensor(b + "attn_q.weight", (n_embd, n_embd), dtype),
               P.Tensor(b + "attn_k.weight", (n_embd, n_kv), dtype),
               P.Tensor(b + "attn_v.weight", (n_embd, n_kv), dtype),
               P.Tensor(b + "attn_output.weight", (n_embd, n_embd), dtype),
               P.Tensor(b + "ffn_norm.weight", (n_embd,), F32)]
        if experts:
            ts += [P.Tensor(b + "ffn_gate_inp.weight", (n_embd, experts), F32),
                   P.Tensor(b + "ffn_gate_exps.weight", (n_embd, n_ff, experts), dtype),
                   P.Tensor(b + "ffn_up_exps.weight", (n_embd, n_ff, experts), dtype),
                   P.Tensor(b + "ffn_down_exps.weight", (n_ff, n_embd, experts), dtype)]
        else:
            ts += [P.Tensor(b + "ffn_gate.weight", (n_embd, n_ff), dtype),
                   P.Tensor(b + "ffn_up.weight", (n_embd, n_ff), dtype),
                   P.Tensor(b + "ffn_down.weight", (n_ff, n_embd), dtype)]
    return [t for t in ts if t.name not in skip]


def meta(n_layer, n_head=8, n_head_kv=None, n_expert=0, arch="llama"):
    m = {"general.architecture": arch, f"{arch}.block_count": n_layer,
         f"{arch}.attention.head_count": n_head}
    if n_head_kv is not None:
        m[f"{arch}.attention.head_count_kv"] = n_head_kv
    if n_expert:
        m[f"{arch}.expert_count"] = n_expert
    return m


def types(pl):
    return {t.name: P.GGML_TYPE_NAMES[t.target] for t in pl.tensors}


def layers_with(pl, suffix, type_name):
    return sorted(int(t.name.split(".")[1]) for t in pl.tensors
                  if t.name.endswith(suffix) and t.target_name == type_name)


# --- names, aliases, default types ---------------------------------------------------------------

@pytest.mark.parametrize("name,ftype,canonical", [
    ("q4_k_m", 15, "Q4_K_M"), ("Q4_K", 15, "Q4_K"), ("q5_k", 17, "Q5_K"), ("Q3_K", 12, "Q3_K"),
    ("q2_k", 10, "Q2_K"), ("Q4_K_S", 14, "Q4_K_S"), ("q5_k_s", 16, "Q5_K_S"), ("q3_k_s", 11, "Q3_K_S"),
    ("q3_k_l", 13, "Q3_K_L"), ("q6_k", 18, "Q6_K"), ("q8_0", 7, "Q8_0"), ("Q4_0", 2, "Q4_0"),
    ("q4_1", 3, "Q4_1"), ("q5_0", 8, "Q5_0"), ("q5_1", 9, "Q5_1"), ("f16", 1, "F16"),
    ("bf16", 32, "BF16"), ("copy", 0, "COPY"),
    # numeric ftypes mean the first QUANT_OPTIONS entry with that value
    ("15", 15, "Q4_K"), ("17", 17, "Q5_K"), ("12", 12, "Q3_K"), ("0", 0, "F32"), (7, 7, "Q8_0"),
])
def test_find_preset(name, ftype, canonical):
    p = P.find_preset(name)
    assert (p.ftype, p.name) == (ftype, canonical)


def test_aliases_and_defaults():
    assert P.find_preset("Q4_K").alias_of == "Q4_K_M"
    assert P.find_preset("Q5_K").alias_of == "Q5_K_M"
    assert P.find_preset("Q3_K").alias_of == "Q3_K_M"
    d = {p.name: P.GGML_TYPE_NAMES[p.default_type] for p in P.PRESETS}
    assert d["Q2_K"] == d["Q2_K_S"] == "Q2_K"
    assert d["Q3_K_S"] == d["Q3_K_M"] == d["Q3_K_L"] == "Q3_K"
    assert d["Q4_K_S"] == d["Q4_K_M"] == "Q4_K" and d["Q5_K_S"] == "Q5_K" and d["Q6_K"] == "Q6_K"
    assert d["IQ2_S"] == "IQ2_XS" and d["IQ2_M"] == "IQ2_S" and d["IQ3_XS"] == "IQ3_S"
    assert d["IQ3_M"] == "IQ3_S" and d["MXFP4_MOE"] == "MXFP4" and d["COPY"] == "F32"
    assert P.find_preset("COPY").copy_only and not P.find_preset("F32").copy_only
    assert len({p.name for p in P.PRESETS}) == len(P.PRESETS) == 39


@pytest.mark.parametrize("bad", ["q4_k_x", "", "q4km", "99", "Q4_K_M "[:-2]])
def test_unknown_preset(bad):
    with pytest.raises(P.PresetError, match="unknown preset"):
        P.find_preset(bad)


# --- which tensors are quantized at all ----------------------------------------------------------

def test_eligibility():
    ts = [P.Tensor("output_norm.weight", (256,), F32),
          P.Tensor("blk.0.attn_q.weight", (256, 256), F16),
          P.Tensor("blk.0.attn_q.bias", (256, 256), F16),          # does not end with 'weight'
          P.Tensor("blk.0.ffn_norm.weight", (256, 256), F16),      # norms kept even when 2-D
          P.Tensor("blk.0.attn_k.weight", (256, 1), F16),          # ggml_n_dims == 1
          P.Tensor("blk.0.ffn_gate_inp.weight", (256, 8), F16),    # expert router
          P.Tensor("position_embd.weight", (256, 256), F16),
          P.Tensor("token_types.weight", (256, 256), F16),
          P.Tensor("blk.0.ssm_conv1d.weight", (256, 256), F16),
          P.Tensor("v.blk.0.attn_rel_b.weight", (256, 256), F16),
          P.Tensor("abcde", (256, 256), F16),   # 5-character name: size()-6 wraps to npos
          P.Tensor("abcd", (256, 256), F16),    # 4 characters: no wrap-around match
          P.Tensor("output.weight", (256, 512), F16)]
    got = types(P.plan("Q4_K_M", meta(1), ts))
    assert got == {"output_norm.weight": "F32", "blk.0.attn_q.weight": "Q4_K",
                   "blk.0.attn_q.bias": "F16", "blk.0.ffn_norm.weight": "F16",
                   "blk.0.attn_k.weight": "F16", "blk.0.ffn_gate_inp.weight": "F16",
                   "position_embd.weight": "F16", "token_types.weight": "F16",
                   "blk.0.ssm_conv1d.weight": "F16", "v.blk.0.attn_rel_b.weight": "F16",
                   "abcde": "Q4_K", "abcd": "F16", "output.weight": "Q6_K"}
    kept = [t for t in P.plan("Q4_K_M", meta(1), ts).tensors if not t.convert]
    assert {t.name for t in kept} == {"output_norm.weight", "blk.0.attn_q.bias",
                                      "blk.0.ffn_norm.weight", "blk.0.attn_k.weight",
                                      "blk.0.ffn_gate_inp.weight", "position_embd.weight",
                                      "token_types.weight", "blk.0.ssm_conv1d.weight",
                                      "v.blk.0.attn_rel_b.weight", "abcd"}


def test_order_is_llama_cpp_order_not_file_order():
    ts = sorted(llama_tensors(16), key=lambda t: t.name)  # string order: blk.10 before blk.2
    pl = P.plan("Q4_K_M", meta(16), ts)
    names = [t.name for t in pl.tensors]
    assert names[:4] == ["output.weight", "output_norm.weight", "token_embd.weight",
                         "blk.0.attn_k.weight"]
    layers = [int(n.split(".")[1]) for n in names if n.startswith("blk.")]
    assert layers == sorted(layers)
    # use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2
    expect = [0, 1, 4, 7, 10, 13, 14, 15]
    assert layers_with(pl, "attn_v.weight", "Q6_K") == expect
    assert layers_with(pl, "ffn_down.weight", "Q6_K") == expect
    assert [ts[t.index].name for t in pl.tensors] == names


@pytest.mark.parametrize("n,expect", [
    (8, [0, 3, 6, 7]),
    (32, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]),
    (1, [0]),            # n/8 == 0, 7n/8 == 0: every layer is >= 7n/8
    (3, [2]),            # n/8 == 0, 7n/8 == 2
    (10, [0, 3, 6, 8, 9]),  # n/8 == 1, 7n/8 == 8, (i - 1) % 3 == 2 -> 3, 6, 9
])
def test_use_more_bits_layers(n, expect):
    for preset in ("Q4_K_M", "Q5_K_M"):
        pl = P.plan(preset, meta(n), llama_tensors(n))
        hi = "Q6_K"
        assert layers_with(pl, "attn_v.weight", hi) == expect
        assert layers_with(pl, "ffn_down.weight", hi) == expect
        assert layers_with(pl, "attn_q.weight", hi) == []


def test_ffn_down_counts_tensors_not_names_without_experts():
    # no ffn_down in layer 0: the counter, not the name, gives the layer index
    pl = P.plan("Q4_K_M", meta(8), llama_tensors(8, skip={"blk.0.ffn_down.weight"}))
    # counter 0..6 on blk.1..blk.7; use_more_bits(i, 8) for i in {0, 3, 6}
    assert layers_with(pl, "ffn_down.weight", "Q6_K") == [1, 4, 7]
    # attn_v counts against n_attention_wv = number of attn_v tensors (7 here)
    pl = P.plan("Q4_K_M", meta(8), llama_tensors(8, skip={"blk.0.attn_v.weight"}))
    # counters 0..6 over 7 tensors (blk.1..7): 7/8 = 0, 49/8 = 6 -> counter 6, and counter % 3 == 2
    # -> 2, 5; counter c is blk.(c + 1)
    assert layers_with(pl, "attn_v.weight", "Q6_K") == [3, 6, 7]


def test_experts_take_the_layer_from_the_name():
    ts = llama_tensors(8, experts=8, skip={"blk.0.ffn_down_exps.weight"})
    pl = P.plan("Q4_K_M", meta(8, n_expert=8), ts)
    assert layers_with(pl, "ffn_down_exps.weight", "Q6_K") == [3, 6, 7]
    got = types(pl)
    assert got["blk.2.attn_v.weight"] == "Q8_0" and got["blk.2.attn_k.weight"] == "Q8_0"
    assert got["blk.2.attn_output.weight"] == "Q5_K"
    assert got["blk.2.ffn_gate_inp.weight"] == "F32"
    bad = ts + [P.Tensor("blk.9.ffn_down_exps.weight", (256, 256, 8), F16)]
    with pytest.raises(P.PresetError, match="Bad layer 9"):
        P.plan("Q4_K_M", meta(8, n_expert=8), bad)


# --- per-preset rules -----------------------------------------------------------------------------

def test_q3_k_m():
    pl = P.plan("q3_k", meta(32), llama_tensors(32))
    assert layers_with(pl, "attn_v.weight", "Q5_K") == [0, 1]
    assert layers_with(pl, "attn_v.weight", "Q4_K") == list(range(2, 32))
    assert layers_with(pl, "ffn_down.weight", "Q5_K") == [0, 1]     # i < 32/16
    assert layers_with(pl, "ffn_down.weight", "Q4_K") == list(range(2, 32))
    g = types(pl)
    assert g["blk.5.attn_output.weight"] == "Q4_K" and g["blk.5.attn_q.weight"] == "Q3_K"
    assert g["output.weight"] == "Q6_K" and g["token_embd.weight"] == "Q3_K"
    # falcon: ffn_down Q3_K except use_more_bits layers
    fal = P.plan("Q3_K_M", meta(16, arch="falcon"), llama_tensors(16))
    assert layers_with(fal, "ffn_down.weight", "Q5_K") == [0]
    assert layers_with(fal, "ffn_down.weight", "Q4_K") == [1, 4, 7, 10, 13, 14, 15]
    assert types(fal)["output.weight"] == "Q8_0"   # falcon output always Q8_0


def test_q4_k_s_q3_k_l_q3_k_s_q5_k_s():
    pl = P.plan("Q4_K_S", meta(16), llama_tensors(16))
    assert layers_with(pl, "attn_v.weight", "Q5_K") == [0, 1, 2, 3]
    assert layers_with(pl, "ffn_down.weight", "Q5_K") == [0, 1]
    pl = P.plan("Q3_K_L", meta(16), llama_tensors(16))
    assert layers_with(pl, "attn_v.weight", "Q5_K") == list(range(16))
    assert layers_with(pl, "ffn_down.weight", "Q5_K") == list(range(16))
    assert layers_with(pl, "attn_output.weight", "Q5_K") == list(range(16))
    for name, base in (("Q3_K_S", "Q3_K"), ("Q5_K_S", "Q5_K"), ("Q6_K", "Q6_K")):
        g = types(P.plan(name, meta(16), llama_tensors(16)))
        assert g["output.weight"] == "Q6_K"
        assert {v for k, v in g.items() if k.startswith("blk.") and "norm" not in k} == {base}


@pytest.mark.parametrize("n_head,n_head_kv,gqa,v_type", [
    (8, 8, 1, "Q3_K"), (12, 4, 3, "Q3_K"), (8, 2, 4, "Q4_K"), (8, 1, 8, "Q4_K"),
    (8, None, 1, "Q3_K"),   # head_count_kv missing: n_head_kv = n_head
    (8, 0, 0, "Q3_K"),      # n_head_kv 0: n_gqa() is 0
])
def test_q2_k_and_gqa(n_head, n_head_kv, gqa, v_type):
    m = meta(8, n_head=n_head, n_head_kv=n_head_kv)
    assert P.model_info(m).n_gqa == gqa
    g = types(P.plan("Q2_K", m, llama_tensors(8)))
    assert g["blk.3.attn_v.weight"] == v_type
    assert g["blk.3.ffn_down.weight"] == "Q3_K" and g["blk.3.attn_output.weight"] == "Q3_K"
    assert g["blk.3.attn_q.weight"] == "Q2_K" and g["token_embd.weight"] == "Q2_K"
    assert g["output.weight"] == "Q6_K"


def test_iq4_nl_gqa_and_70b():
    g = types(P.plan("IQ4_NL", meta(4, 8, 2), llama_tensors(4)))
    assert g["blk.0.attn_v.weight"] == "Q5_K" and g["blk.1.ffn_down.weight"] == "IQ4_NL"
    assert g["blk.0.ffn_down.weight"] == "IQ4_NL"   # 4/8 == 0: no layer below n_layer/8
    g = types(P.plan("IQ4_NL", meta(4, 8, 8), llama_tensors(4)))
    assert g["blk.0.attn_v.weight"] == "IQ4_NL"
    # llama with 80 layers and GQA is LLM_TYPE_70B: attn_v Q3_K/Q4_K become Q5_K
    pl = P.plan("Q4_K_M", meta(80, 64, 8), llama_tensors(80, n_embd=256, n_kv=256))
    assert set(layers_with(pl, "attn_v.weight", "Q5_K")) | set(
        layers_with(pl, "attn_v.weight", "Q6_K")) == set(range(80))
    assert layers_with(pl, "attn_v.weight", "Q5_K")
    pl = P.plan("Q4_K_M", meta(80, 64, 64), llama_tensors(80))        # 65B: no bump
    assert layers_with(pl, "attn_v.weight", "Q5_K") == []
    assert P.model_info(meta(80, arch="qwen2")).is_70b
    assert P.model_info(meta(68, arch="jais2")).is_70b
    assert not P.model_info(meta(80, 64, 8, n_expert=8)).is_70b


def test_q4_0_is_a_mix_and_q8_0_is_not():
    g = types(P.plan("Q4_0", meta(4), llama_tensors(4)))
    assert g["output.weight"] == "Q6_K" and g["token_embd.weight"] == "Q4_0"
    assert g["blk.0.ffn_down.weight"] == "Q4_0" and g["blk.0.attn_v.weight"] == "Q4_0"
    g = types(P.plan("Q8_0", meta(4), llama_tensors(4)))
    assert g["output.weight"] == "Q8_0"
    # ffn_down of the first n_layer/8 layers only with an importance matrix
    g = types(P.plan("Q4_0", meta(8), llama_tensors(8), imatrix=True))
    assert g["blk.0.ffn_down.weight"] == "Q4_1" and g["blk.1.ffn_down.weight"] == "Q4_0"
    g = types(P.plan("Q5_0", meta(8), llama_tensors(8), imatrix=True))
    assert g["blk.0.ffn_down.weight"] == "Q5_1"


def test_tied_embeddings_and_output_row_length():
    g = types(P.plan("Q4_K_M", meta(2), llama_tensors(2, tied=True)))
    assert g["token_embd.weight"] == "Q6_K"
    g = types(P.plan("Q4_K_M", meta(2), llama_tensors(2)))
    assert g["token_embd.weight"] == "Q4_K" and g["output.weight"] == "Q6_K"
    # row length not a multiple of the default type's block: Q8_0
    g = types(P.plan("Q4_K_M", meta(2), llama_tensors(2, n_embd=160, tied=True)))
    assert g["token_embd.weight"] == "Q8_0"
    # Q4_0 (block 32): 160 % 32 == 0 -> Q6_K, then the fallback of Q6_K for 160 -> Q8_0
    pl = P.plan("Q4_0", meta(2), llama_tensors(2, n_embd=160, tied=True))
    tok = next(t for t in pl.tensors if t.name == "token_embd.weight")
    assert tok.target_name == "Q8_0" and tok.fallback and pl.n_fallback == 1
    # 100 % 32 != 0 -> Q8_0, which does not fit either -> F16
    g = types(P.plan("Q4_0", meta(2), llama_tensors(2, n_embd=100)))
    assert g["output.weight"] == "F16" and g["token_embd.weight"] == "F16"
    assert g["blk.0.attn_q.weight"] == "F16"


@pytest.mark.parametrize("forced,rows,expect", [
    ("Q2_K", 288, "Q4_0"), ("Q3_K", 288, "Q4_0"), ("Q4_K", 288, "Q5_0"), ("Q5_K", 288, "Q5_1"),
    ("Q6_K", 288, "Q8_0"), ("IQ4_XS", 288, "IQ4_NL"), ("IQ3_S", 288, "IQ4_NL"),
    ("TQ2_0", 288, "Q4_0"), ("Q2_0", 96, "Q4_0"),
    ("Q4_K", 272, "F16"), ("Q6_K", 272, "F16"), ("Q4_0", 272, "F16"), ("Q8_0", 48, "F16"),
    ("Q4_0", 288, "Q4_0"), ("Q4_K", 512, "Q4_K"), ("MXFP4", 272, "F16"),
])
def test_row_size_fallbacks(forced, rows, expect):
    ts = [P.Tensor("blk.0.attn_q.weight", (rows, 64), F32)]
    for kwargs in ({"tensor_types": [("attn_q", forced)]},):
        pl = P.plan("Q4_K_M", meta(1), ts, **kwargs)
        t = pl.tensors[0]
        assert t.target_name == expect
        assert t.fallback == (expect != forced) and pl.n_fallback == int(expect != forced)


def test_no_fallback_defined():
    with pytest.raises(P.PresetError, match="no tensor type fallback is defined for type Q1_0"):
        P.plan("Q1_0", meta(1), [P.Tensor("blk.0.attn_q.weight", (96, 64), F32)])
    with pytest.raises(P.PresetError, match="NVFP4"):
        P.plan("Q4_0", meta(1), [P.Tensor("blk.0.attn_q.weight", (96, 64), F32)],
               tensor_types=[("q", "NVFP4")])


def test_pure_and_pure_with_fallback():
    ts = llama_tensors(8, n_ff=288)
    g = types(P.plan("Q4_K_M", meta(8), ts, pure=True))
    assert g["output.weight"] == "Q4_K" and g["blk.0.attn_v.weight"] == "Q4_K"
    assert g["blk.0.ffn_down.weight"] == "Q5_0"      # fallback still applies
    assert g["output_norm.weight"] == "F32"


def test_options():
    ts = llama_tensors(2)
    g = types(P.plan("Q4_K_M", meta(2), ts, leave_output_tensor=True))
    assert g["output.weight"] == "F16"
    g = types(P.plan("Q4_K_M", meta(2), ts, output_tensor_type="q8_0", token_embedding_type=T["Q5_K"]))
    assert g["output.weight"] == "Q8_0" and g["token_embd.weight"] == "Q5_K"
    # output_tensor_type on output.weight skips the fallback; on a tied token_embd it does not
    odd = llama_tensors(1, n_embd=288, tied=True) + [P.Tensor("output.weight", (288, 512), F16)]
    g = types(P.plan("Q4_K_M", meta(1), odd, output_tensor_type="Q6_K"))
    assert g["output.weight"] == "Q6_K"
    tied = llama_tensors(1, n_embd=288, tied=True)
    g = types(P.plan("Q4_K_M", meta(1), tied, output_tensor_type="Q6_K"))
    assert g["token_embd.weight"] == "Q8_0"
    # first matching pattern wins and bypasses the mixture rules
    g = types(P.plan("Q4_K_M", meta(8), llama_tensors(8),
                     tensor_types=[(r"blk\.[0-3]\.attn_v", "Q8_0"), ("attn_v", "Q3_K")]))
    assert g["blk.0.attn_v.weight"] == "Q8_0" and g["blk.7.attn_v.weight"] == "Q3_K"
    with pytest.raises(P.PresetError, match="unknown GGML type"):
        P.plan("Q4_K_M", meta(2), ts, output_tensor_type="Q9_9")


def test_float_presets_and_copy():
    ts = llama_tensors(2, dtype=F32)
    for name, t in (("F16", "F16"), ("BF16", "BF16"), ("F32", "F32")):
        g = types(P.plan(name, meta(2), ts))
        assert g["blk.0.attn_q.weight"] == t and g["output.weight"] == t
        assert g["output_norm.weight"] == "F32"
    pl = P.plan("COPY", meta(2), llama_tensors(2))
    assert not any(t.convert for t in pl.tensors)
    assert "general.file_type" not in pl.kv
    assert P.plan("Q5_K_M", meta(2), ts).kv == {"general.quantization_version": 2,
                                                  "general.file_type": 17}


def test_low_bit_presets_need_imatrix():
    ts = llama_tensors(8)
    for name in ("Q2_K_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS"):
        with pytest.raises(P.PresetError, match="needs an importance matrix"):
            P.plan(name, meta(8), ts)
    g = types(P.plan("IQ2_XXS", meta(8), ts, imatrix=True))
    assert g["token_embd.weight"] == "Q2_K" and g["output.weight"] == "Q5_K"
    assert g["blk.0.attn_v.weight"] == "Q2_K" and g["blk.0.ffn_down.weight"] == "Q2_K"
    assert g["blk.1.ffn_down.weight"] == "IQ2_XXS" and g["blk.1.attn_q.weight"] == "IQ2_XXS"
    g = types(P.plan("IQ2_XXS", meta(8, 8, 2), ts, imatrix=True))      # n_gqa 4
    assert g["blk.0.attn_v.weight"] == "Q4_K"
    g = types(P.plan("IQ2_XXS", meta(8, 8, 4), ts, imatrix=True))      # n_gqa 2
    assert g["blk.0.attn_v.weight"] == "Q2_K"
    g = types(P.plan("IQ2_S", meta(8, 8, 4), ts, imatrix=True))
    assert g["blk.0.attn_v.weight"] == "IQ3_S" and g["blk.0.ffn_down.weight"] == "IQ3_S"
    assert g["blk.0.attn_output.weight"] == "IQ3_S" and g["token_embd.weight"] == "IQ3_S"
    g = types(P.plan("IQ1_M", meta(8, n_expert=4), llama_tensors(8, experts=4), imatrix=True))
    assert g["blk.0.attn_v.weight"] == "Q4_K" and g["blk.0.attn_output.weight"] == "IQ2_XXS"
    g = types(P.plan("Q2_K_S", meta(8, 8, 2), ts, imatrix=True))
    assert g["blk.0.attn_v.weight"] == "Q4_K" and g["blk.0.ffn_down.weight"] == "Q4_K"
    assert g["blk.1.ffn_down.weight"] == "Q2_K"
    # the refusal looks at each tensor's final type: where every row length falls back (160,
    # 288: multiples of 32, not of 256) no tensor needs a matrix and llama.cpp runs the preset
    fb = llama_tensors(2, n_embd=160, n_ff=288, n_kv=160)
    for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS"):
        pl = P.plan(name, meta(2, 5, 5), fb)
        assert not pl.will_require_imatrix and pl.n_fallback > 0
        assert set(types(pl).values()) <= {"IQ4_NL", "Q4_0", "Q5_0", "Q8_0", "F32"}, name
    with pytest.raises(P.PresetError, match="blk.1.ffn_down.weight would be IQ2_XXS"):
        P.plan("IQ2_XXS", meta(8, 5, 5), llama_tensors(8, n_embd=160, n_ff=256, n_kv=160))
    # (blk.0.ffn_down, the first n_layer/8, is Q2_K: no matrix needed for it)
    # IQ3_S / IQ3_M need none: their types (IQ3_S, Q4_K) do not require one
    g = types(P.plan("IQ3_M", meta(8), ts))
    assert g["blk.3.attn_v.weight"] == "Q4_K" and g["blk.0.ffn_down.weight"] == "Q4_K"
    assert g["blk.3.attn_output.weight"] == "Q4_K" and g["blk.3.attn_q.weight"] == "IQ3_S"


def test_mxfp4_moe():
    g = types(P.plan("MXFP4_MOE", meta(2, n_expert=8), llama_tensors(2, experts=8)))
    assert g["blk.0.ffn_up_exps.weight"] == "MXFP4" and g["blk.0.attn_q.weight"] == "Q8_0"
    assert g["output.weight"] == "Q8_0" and g["token_embd.weight"] == "Q8_0"


def test_requantize_and_bad_input():
    ts = [P.Tensor("blk.0.attn_q.weight", (256, 256), T["Q4_0"])]
    with pytest.raises(P.PresetError, match="allow_requantize"):
        P.plan("Q4_K_M", meta(1), ts)
    assert P.plan("Q4_K_M", meta(1), ts, allow_requantize=True).tensors[0].target_name == "Q4_K"
    assert not P.plan("Q4_0", meta(1), ts).tensors[0].convert      # same type: copied
    with pytest.raises(P.PresetError, match="general.architecture"):
        P.plan("Q4_K_M", {}, ts)
    with pytest.raises(P.PresetError, match="llama.block_count"):
        P.plan("Q4_K_M", {"general.architecture": "llama"}, ts)
    with pytest.raises(P.PresetError, match="duplicate"):
        P.plan("Q4_K_M", meta(1), ts + ts)
    with pytest.raises(P.PresetError, match="bad tensor-type pattern"):
        P.plan("Q4_K_M", meta(1), ts, tensor_types=[("(", "Q8_0")])


def test_metadata_arrays_and_notes():
    m = {"general.architecture": "llama", "llama.block_count": 4,
         "llama.attention.head_count": [32, 32, 32, 32], "llama.attention.head_count_kv": [8] * 4}
    assert P.model_info(m).n_gqa == 4
    pl = P.plan("Q4_K_M", m, llama_tensors(4))
    assert any("not modelled" in n for n in pl.notes)
    assert not any("architecture" in n for n in P.plan("Q4_K_M", meta(4, arch="falcon"), llama_tensors(4)).notes)
    assert not any("generic rules" in n for n in pl.notes)
    other = P.plan("Q4_K_M", meta(4, arch="gemma3"), llama_tensors(4))
    assert any("'gemma3'" in n for n in other.notes)
    assert "Q4_K_M: " in pl.summary()


def test_refusal_order_follows_llama_cpp():
    # the importance-matrix check runs while types are chosen, the requantize check while writing:
    # an earlier already-quantized tensor does not mask a later tensor that needs an imatrix
    ts = [P.Tensor("token_embd.weight", (256, 512), T["Q4_0"]),   # first; becomes Q2_K
          P.Tensor("output.weight", (256, 512), F16),
          P.Tensor("blk.1.attn_q.weight", (256, 256), F16)]
    with pytest.raises(P.PresetError, match="importance matrix: tensor blk.1.attn_q.weight"):
        P.plan("IQ2_XXS", meta(2), ts)
    with pytest.raises(P.PresetError, match="token_embd.weight is already Q4_0"):
        P.plan("IQ2_XXS", meta(2), ts, imatrix=True)


@pytest.mark.slow
def test_against_llama_cpp_quantizer(tmp_path):
    """A few presets through llama.cpp's own quantizer (llama-cpp-python built from source;
    interpreter: ``llama_oracle.LLAMA_PY``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from llama_oracle import LLAMA_PY as py
    if not Path(py).exists() or subprocess.run([py, "-c", "import llama_cpp"],
                                               capture_output=True).returncode != 0:
        pytest.skip("no llama-cpp-python interpreter")
    pytest.importorskip("gguf")
    tool = Path(__file__).resolve().parents[2] / "tools" / "compare_presets.py"
    r = subprocess.run([sys.executable, str(tool), "--python", py, "--models", "gqa4,l16gqa8",
                        "--presets", "Q4_K_M,Q3_K_M,Q2_K,Q4_0,Q5_K_S,Q2_K_S", "--keep",
                        str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "12 of 12 (model, preset) pairs agree" in r.stdout
