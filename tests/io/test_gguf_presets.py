"""quantize_file(preset=...) / CLI --to PRESET: llama.cpp's per-tensor types written for real.

Without llama.cpp: every tensor gets the type ``presets.plan`` gives it, in the plan's order, with
the bytes numba_qk's encoders (or ggml's F16/BF16 conversions) give its values, and the two keys
llama.cpp sets.  With llama-cpp-python built natively (``/work/native-ggml`` or
``$NUMBA_QK_LLAMA_CPP_PYTHON``; slow): whole files byte-identical to ``llama_model_quantize``.
"""

import importlib.util
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import _registry, presets  # noqa: E402
from numba_qk import gguf as G  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _compare_tool():
    spec = importlib.util.spec_from_file_location("compare_presets", ROOT / "tools" / "compare_presets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


C = _compare_tool()
SMALL = dict(C.MODELS["gqa4"], n_layer=2, vocab=256)         # F32, GQA 4, ffn rows 288
SMALL16 = dict(C.MODELS["tied160"], n_layer=2)               # F16, tied, n_embd 160


def _encodable(plan) -> bool:
    for t in plan.tensors:
        if t.convert:
            fmt = G._fmt_for(t.target)
            if not (fmt in (qk.f32, qk.f16, qk.bf16)
                    or (fmt in G.ACCELERATED and fmt in _registry.QUANTIZABLE)):
                return False
    return True


def _bytes(f, name):
    return np.ascontiguousarray(f.raw(name)).reshape(-1).view(np.uint8)


def _values(f, name):
    """The tensor's values as f32, numpy shape."""
    return np.asarray(f.dequantize(name), dtype=np.float32)


def _bf16_ggml(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16, one value at a time (the oracle for the vectorised cast)."""
    out = np.empty(x.size, np.uint16)
    for i, u in enumerate(x.ravel().view(np.uint32).tolist()):
        if (u & 0x7FFFFFFF) > 0x7F800000:
            out[i] = (u >> 16) | 64
        else:
            out[i] = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF
    return out.reshape(x.shape)


@pytest.mark.parametrize("spec", [SMALL, SMALL16], ids=["f32-gqa4", "f16-tied160"])
@pytest.mark.parametrize("preset", ["Q8_0", "F16", "BF16", "Q4_K_M", "q5_k_m", "Q4_0"])
def test_preset_file_follows_the_plan(tmp_path, spec, preset):
    src, dst = tmp_path / "in.gguf", tmp_path / "out.gguf"
    C.build_model(src, spec)
    plan = G.plan_file(src, preset)
    if not _encodable(plan):
        with pytest.raises(G.GGUFError, match="cannot encode yet"):
            G.quantize_file(src, dst, preset=preset)
        assert not dst.exists()
        return
    results = G.quantize_file(src, dst, preset=preset)
    assert [r.name for r in results] == [t.name for t in plan.tensors]
    with G.open(src) as fi, G.open(dst) as fo:
        assert [t.name for t in fo.tensors] == [t.name for t in plan.tensors]
        md_in, md_out = fi.metadata, fo.metadata
        for k, v in plan.kv.items():
            assert md_out[k] == v
        assert {k: v for k, v in md_out.items() if k not in plan.kv} == \
               {k: v for k, v in md_in.items() if k not in plan.kv}
        for t in plan.tensors:
            out = fo.tensor(t.name)
            assert out.ggml_type == t.target, t.name
            if not t.convert:
                assert np.array_equal(_bytes(fo, t.name), _bytes(fi, t.name)), t.name
                continue
            x = _values(fi, t.name)
            fmt = out.format
            if fmt is qk.f32:
                want = x.view(np.uint8)
            elif fmt is qk.f16:
                want = _f16_ggml(x).view(np.uint8)
            elif fmt is qk.bf16:
                want = _bf16_ggml(x).view(np.uint8)
            else:
                want = qk.quantize(x.reshape(-1, fmt.block_size), format=fmt)
            assert np.array_equal(_bytes(fo, t.name), np.asarray(want).reshape(-1).view(np.uint8)), t.name


def _f16_ggml(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_fp16_row: IEEE nearest-even, overflow to inf, NaN -> sign | 0x7E00."""
    with np.errstate(all="ignore"):
        h = x.astype(np.float16).view(np.uint16).copy()
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    h[nan] = ((u[nan] >> 16) & 0x8000) | 0x7E00
    return h


def test_ggml_cast_rules_match_ggml_itself():
    from numba_qk.testing import ggml as ggml_bridge

    lib = ggml_bridge.load()
    base = lib.base if lib is not None else None
    if base is None or not hasattr(base, "ggml_fp32_to_fp16_row"):
        pytest.skip("ggml (libggml-python) not available")
    import ctypes

    rng = np.random.default_rng(7)
    u = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    u[:4] = [0x7F800001, 0xFFC00001, 0x7FC12345, 0x477FF000]
    x = u.view(np.float32)
    for fn, mine in (("ggml_fp32_to_fp16_row", _f16_ggml), ("ggml_fp32_to_bf16_row", _bf16_ggml)):
        out = np.zeros(x.size, np.uint16)
        getattr(base, fn)(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                          ctypes.c_int64(x.size))
        assert np.array_equal(out, mine(x)), fn


def test_bf16_and_f16_casts_on_special_values(tmp_path):
    specials = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 65504.0, 65520.0, 1e-8, -1e-40,
                         np.inf, -np.inf, np.nan, 3.4028235e38, 1.5e-45] * 64, np.float32)
    specials[11::14] = np.frombuffer(np.array([0x7F800001, 0xFFC00001], np.uint32).tobytes() * 32,
                                     np.float32)  # signalling and quiet NaNs with payloads
    w = gguf_py.GGUFWriter(str(tmp_path / "s.gguf"), "llama")
    w.add_block_count(1); w.add_head_count(4); w.add_head_count_kv(4); w.add_embedding_length(224)
    w.add_tensor("blk.0.ffn_up.weight", specials.reshape(4, 224))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    for preset, fmt in (("BF16", qk.bf16), ("F16", qk.f16)):
        dst = tmp_path / f"{preset}.gguf"
        G.quantize_file(tmp_path / "s.gguf", dst, preset=preset)
        with G.open(dst) as f:
            got = _bytes(f, "blk.0.ffn_up.weight").view(np.uint16).reshape(4, 224)
        want = (_bf16_ggml(specials) if fmt is qk.bf16 else _f16_ggml(specials)).reshape(4, 224)
        assert np.array_equal(got, want), preset


def test_preset_refusals_are_one_line_and_write_nothing(tmp_path):
    src, dst = tmp_path / "in.gguf", tmp_path / "out.gguf"
    C.build_model(src, SMALL)
    # a type numba_qk does not write into files (every preset's types encode now; a tensor
    # type override can still name an activation type such as Q8_K)
    with pytest.raises(G.GGUFError, match="Q8_K.*cannot encode yet") as e:
        G.quantize_file(src, dst, preset="Q8_0", tensor_types=[("attn_v", "Q8_K")])
    assert "\n" not in str(e.value) and not dst.exists()
    with pytest.raises(G.GGUFError, match="importance matrix"):
        G.quantize_file(src, dst, preset="IQ2_XXS")
    with pytest.raises(TypeError, match="not both"):
        G.quantize_file(src, dst, preset="Q8_0", to=qk.quant.q8_0)
    with pytest.raises(TypeError, match="presets only"):
        G.quantize_file(src, dst, pure=True)
    assert not dst.exists()
    # requantizing: refused without --allow-requantize (llama.cpp's rule), which the message
    # names and which numba_qk now has (the CLI flag and allow_requantize=True)
    G.quantize_file(src, tmp_path / "q8.gguf", preset="Q8_0")
    with pytest.raises(G.GGUFError, match="requantiz") as e:
        G.quantize_file(tmp_path / "q8.gguf", dst, preset="F16")
    assert "needs allow_requantize" not in str(e.value)
    assert "--allow-requantize" in str(e.value) and "\n" not in str(e.value)
    assert not dst.exists()
    G.quantize_file(tmp_path / "q8.gguf", dst, preset="F16", allow_requantize=True)
    with G.open(dst) as f, G.open(tmp_path / "q8.gguf") as q:
        name = "blk.0.attn_q.weight"
        assert f.tensor(name).type_name == "F16"
        # dequantized to f32 (ggml's to_float), then ggml's f32 -> f16
        want = _f16_ggml(np.ascontiguousarray(q.dequantize(name)))
        assert np.array_equal(_bytes(f, name).view(np.uint16), want.reshape(-1))


def test_cli_to_preset_and_type(tmp_path, run_cli):
    src = tmp_path / "in.gguf"
    C.build_model(src, SMALL)
    code, out, err = run_cli("quantize", src, tmp_path / "a.gguf", "--to", "q8_0")
    assert code == 0, err
    assert "preset Q8_0:" in out and "converted by llama.cpp's preset Q8_0" in out
    code, out, err = run_cli("quantize", src, tmp_path / "b.gguf", "--type", "q8_0")
    assert code == 0 and "converted to Q8_0" in out, err
    code, out, err = run_cli("quantize", src, tmp_path / "c.gguf", "--to", "q8_0", "--type", "q8_0")
    assert code == 2 and "not allowed with" in err
    code, out, err = run_cli("quantize", src, tmp_path / "c.gguf", "--type", "q8_0", "--pure")
    assert code == 2 and "go with --to PRESET" in err
    code, out, err = run_cli("quantize", src, tmp_path / "c.gguf", "--to", "iq1_m")
    assert code != 0 and "importance matrix" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c.gguf").exists()


from llama_oracle import LLAMA_PY  # noqa: E402  (the one default interpreter)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gqa4", "tied160", "l16gqa8", "moe8"])
def test_whole_files_equal_llama_cpp(tmp_path, model):
    """Every preset numba_qk can encode: the file is byte-identical to llama.cpp's."""
    if not os.path.exists(LLAMA_PY):
        pytest.skip("no llama-cpp-python interpreter")
    src = tmp_path / "in.gguf"
    C.build_model(src, C.MODELS[model])
    compared = 0
    refused = []
    for p in presets.PRESETS:
        if p.copy_only:
            continue
        ref, ours = tmp_path / f"{p.name}-llama.gguf", tmp_path / f"{p.name}-ours.gguf"
        code = ("import llama_cpp, ctypes, sys\n"
                "p = llama_cpp.llama_model_quantize_default_params()\n"
                f"p.ftype = {p.ftype}; p.nthread = 2\n"
                f"sys.exit(llama_cpp.llama_model_quantize({str(src).encode()!r}, "
                f"{str(ref).encode()!r}, ctypes.byref(p)))\n")
        try:
            plan = G.plan_file(src, p.name)
        except presets.PresetError:       # llama.cpp refuses it as well (an imatrix needed)
            r = subprocess.run([LLAMA_PY, "-c", code], capture_output=True, text=True)
            assert r.returncode != 0, (model, p.name)
            refused.append(p.name)
            continue
        if not _encodable(plan):
            continue
        r = subprocess.run([LLAMA_PY, "-c", code], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        G.quantize_file(src, ours, preset=p.name)
        assert ref.read_bytes() == ours.read_bytes(), (model, p.name)
        compared += 1
    assert compared >= 4 and "IQ2_XXS" in refused


def _oracle():
    spec = importlib.util.spec_from_file_location("llama_oracle", Path(__file__).with_name("llama_oracle.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _random_imatrix(src, seed=3):
    """Random positive weights for every matrix: ne0 values per expert (a 3-D expert tensor's
    entry holds one slice per expert, as llama-imatrix writes it)."""
    rng = np.random.default_rng(seed)
    with G.open(src) as f:
        return {t.name: (rng.random(t.shape[-1] * (t.shape[0] if len(t.shape) == 3 else 1))
                         + 0.1).astype(np.float32)
                for t in f.tensors if len(t.shape) >= 2}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gqa4", "tied160", "l16gqa8", "moe8"])
def test_whole_files_with_imatrix_equal_llama_cpp(tmp_path, model):
    """Every preset with an importance matrix (random weights, one slice per expert): the
    importance-weighted encoders and llama.cpp's has_imatrix type rules, file by file."""
    O = _oracle()
    if not O.available():
        pytest.skip("no llama-cpp-python interpreter")
    src = tmp_path / "in.gguf"
    C.build_model(src, C.MODELS[model])
    w = _random_imatrix(src)
    theirs_w = {k: v.tolist() for k, v in w.items()}
    compared = []
    for p in presets.PRESETS:
        if p.copy_only:
            continue
        ref, ours = tmp_path / f"{p.name}-llama.gguf", tmp_path / f"{p.name}-ours.gguf"
        try:
            plan = G.plan_file(src, p.name, imatrix=True)
        except presets.PresetError:       # llama.cpp refuses it as well
            assert O.quantize(src, ref, p.ftype, imatrix=theirs_w).returncode != 0, p.name
            continue
        if not _encodable(plan):
            continue
        r = O.quantize(src, ref, p.ftype, imatrix=theirs_w)
        assert r.returncode == 0, (p.name, r.stderr[-2000:])
        G.quantize_file(src, ours, preset=p.name, imatrix=w)
        assert ref.read_bytes() == ours.read_bytes(), (model, p.name)
        ref.unlink()
        ours.unlink()
        compared.append(p.name)
    assert {"IQ2_XXS", "IQ1_S", "IQ3_XXS", "Q4_K_M"} <= set(compared), compared
