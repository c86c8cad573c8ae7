"""``quantize`` as a drop-in for llama-quantize (issue 25): the argument form, --dry-run,
--allow-requantize, --override-kv, --prune-layers, split models (reading, --keep-split,
split_file), importance-matrix files. Each expectation is read off llama.cpp's
tools/quantize/quantize.cpp, src/llama-quant.cpp, src/llama-model-loader.cpp,
common/imatrix-loader.cpp and tools/gguf-split/gguf-split.cpp (llama-cpp-python 0.3.36's
vendored copy). The whole-file comparisons with llama.cpp's own quantizer are marked slow.
"""

import importlib.util
import os
import struct
from pathlib import Path

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

from numba_qk import gguf as G  # noqa: E402
from numba_qk import presets as P  # noqa: E402
from numba_qk.__main__ import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


C = _load("compare_presets", ROOT / "tools" / "compare_presets.py")
O = _load("llama_oracle", Path(__file__).with_name("llama_oracle.py"))
SMALL = dict(C.MODELS["gqa4"], n_layer=4, vocab=256)   # F32, GQA 4, ffn rows 288, 40 tensors
T = P.GGML_TYPES


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    src = tmp_path_factory.mktemp("lq") / "in.gguf"
    C.build_model(src, SMALL)
    return src


def _cli(capsys, *args):
    try:
        rc = main(["quantize", *map(str, args)])
    except SystemExit as e:   # argparse's usage errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# --- TYPE, as llama-quantize's try_parse_ftype reads it -------------------------------------------

@pytest.mark.parametrize("text,name", [
    ("q4_k_m", "Q4_K_M"), ("Q4_k", "Q4_K"), ("15", "Q4_K"), ("7", "Q8_0"), ("0", "F32"),
    ("copy", "COPY"), (" 12", "Q3_K"), ("+2", "Q4_0"),
    ("15x", "Q4_K"), ("7b.gguf", "Q8_0"),     # std::stoi reads the leading number
    ("out.gguf", None), ("99", None), ("q4km", None), ("", None), ("99999999999", None),
])
def test_parse_ftype(text, name):
    p = P.parse_ftype(text)
    assert (p.name if p else None) == name


def test_help_lists_the_presets_as_llama_quantize(capsys):
    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    out = capsys.readouterr().out
    assert "  15  or  Q4_K_M  :  4.58G, +0.1754 ppl @ Llama-3-8B" in out
    assert "          COPY    : only copy tensors, no quantizing" in out
    assert "IN [OUT] TYPE [NTHREADS]" in out and "--allow-requantize" in out


def test_llama_argument_form(model, tmp_path, capsys):
    src = tmp_path / "m.gguf"
    src.write_bytes(model.read_bytes())
    rc, out, err = _cli(capsys, src, "q8_0")                       # IN TYPE
    assert rc == 0, err
    default = tmp_path / "ggml-model-Q8_0.gguf"                    # llama-quantize's name
    assert default.exists() and "llama-quantize's argument form" in out
    assert "total time" in out and " s\n" in out.split("wrote ")[1].split("\n")[0] + "\n"
    rc, out, err = _cli(capsys, src, tmp_path / "b.gguf", "7", "2")   # IN OUT TYPE NTHREADS
    assert rc == 0, err
    assert (tmp_path / "b.gguf").read_bytes() == default.read_bytes()
    rc, out, err = _cli(capsys, src, tmp_path / "c.gguf", "q9_9")
    assert rc == 2 and "invalid ftype 'q9_9'" in err and not (tmp_path / "c.gguf").exists()
    rc, out, err = _cli(capsys, src, tmp_path / "c.gguf", "q8_0", "two")
    assert rc == 2 and "invalid nthread 'two'" in err
    # --keep-split: OUT loses its ".gguf"; the default name has none
    rc, out, err = _cli(capsys, "--keep-split", src, tmp_path / "k.gguf", "q8_0")
    assert rc == 0, err
    with G.open(tmp_path / "k-00001-of-00001.gguf") as k, G.open(default) as d:
        # llama.cpp's --keep-split order is the input's file order, not its layer order
        assert [t.name for t in k.tensors] == [t.name for t in G.open(src).tensors]
        assert all(np.array_equal(k.raw(t.name), d.raw(t.name)) for t in d.tensors)
    rc, out, err = _cli(capsys, "--keep-split", src, "Q8_0")
    assert rc == 0 and (tmp_path / "ggml-model-Q8_0-00001-of-00001.gguf").exists()


def test_dry_run_writes_nothing_and_sizes(model, tmp_path, capsys):
    rc, out, err = _cli(capsys, "--dry-run", model, "Q4_K_M")
    assert rc == 0, err
    assert not list(model.parent.glob("ggml-model-*")) and "nothing written" in out
    assert "quant size  =" in out and "model size  =" in out
    res = G.quantize_file(model, None, preset="Q4_K_M", dry_run=True)
    plan = G.plan_file(model, "Q4_K_M")
    assert [r.name for r in res] == [t.name for t in plan.tensors]
    assert [r.type_after for r in res] == [t.target_name for t in plan.tensors]
    with G.open(model) as f:
        for r in res:
            t = f.tensor(r.name)
            qs = gguf_py.GGML_QUANT_SIZES[gguf_py.GGMLQuantizationType[r.type_after]]
            assert r.bytes_after == int(np.prod(t.shape)) // qs[0] * qs[1]
    # llama.cpp's dry run sizes even what it would refuse: an imatrix preset (with a warning),
    # types numba_qk cannot encode
    lines = []
    res = G.quantize_file(model, None, preset="IQ2_XXS", dry_run=True, progress=lines.append)
    assert any("will require an imatrix" in ln for ln in lines)
    assert "IQ2_XXS" in {r.type_after for r in res}


def test_plan_options_for_quantize_file():
    F16, Q8 = T["F16"], T["Q8_0"]
    ts = [("blk.1.attn_v.weight", (256, 256), F16), ("blk.0.attn_v.weight", (256, 256), F16),
          ("output.weight", (256, 256), Q8), ("token_embd.weight", (256, 256), Q8)]
    md = {"general.architecture": "llama", "llama.block_count": 2}
    # COPY writes the loader's file type: the file's own, else the guess from the most common
    # tensor type (the first to reach the top count in llama.cpp's order), marked GUESSED
    assert P.guess_ftype(dict(md, **{"general.file_type": 15}), ts) == 15
    assert P.guess_ftype(md, ts) == 7 | P.LLAMA_FTYPE_GUESSED        # Q8_0 reached 2 first
    assert P.guess_ftype(md, ts[:3]) == 1 | P.LLAMA_FTYPE_GUESSED
    # keep_order: the per-layer counters count in the order given (--keep-split's file order)
    q3 = P.plan("Q3_K_M", md, ts[:2], keep_order=True)
    assert [(t.name, t.target_name) for t in q3.tensors] == [
        ("blk.1.attn_v.weight", "Q5_K"), ("blk.0.attn_v.weight", "Q5_K")]
    assert [t.name for t in P.plan("Q3_K_M", md, ts[:2]).tensors] == [
        "blk.0.attn_v.weight", "blk.1.attn_v.weight"]
    # dry_run: neither refusal, the need for an importance matrix recorded
    pl = P.plan("IQ2_XXS", md, ts + [("blk.0.attn_q.weight", (256, 256), F16)], dry_run=True)
    assert pl.will_require_imatrix and not P.plan("Q8_0", md, ts, dry_run=True).will_require_imatrix
    with pytest.raises(P.PresetError, match="--allow-requantize"):
        P.plan("Q4_0", md, ts)
    assert P.plan("Q4_0", md, ts, dry_run=True).tensors


# --- --override-kv ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("a.b=int:42", ("a.b", "int", 42)), ("a=int: -7x", ("a", "int", -7)), ("a=int:x", ("a", "int", 0)),
    ("a=float:0.5e1junk", ("a", "float", 5.0)), ("a=float:inf", ("a", "float", float("inf"))),
    ("a=float:0x1p-2", ("a", "float", 0.25)), ("a=bool:true", ("a", "bool", True)),
    ("a=bool:false", ("a", "bool", False)), ("a=str:x=y:z", ("a", "str", "x=y:z")),
])
def test_parse_kv_override(text, want):
    assert G.parse_kv_override(text) == want


@pytest.mark.parametrize("text,msg", [
    ("nokey", "malformed"), ("k" * 128 + "=int:1", "malformed"), ("a=bool:yes", "invalid boolean"),
    ("a=str:" + "x" * 128, "cannot exceed 127"), ("a=list:1", "invalid type"),
])
def test_parse_kv_override_refusals(text, msg):
    with pytest.raises(G.GGUFError, match=msg):
        G.parse_kv_override(text)


def test_override_kv_written_as_llama_cpp(model, tmp_path):
    dst = tmp_path / "o.gguf"
    G.quantize_file(model, dst, preset="Q8_0", kv_overrides=[
        "general.name=str:x", "x.i=int:-5", "x.f=float:0.1", "x.b=bool:true",
        "llama.context_length=int:4096"])
    with G.open(dst) as f:
        md, kvs = f.metadata, list(f._kvs)
        assert kvs[-5:] == ["general.name", "x.i", "x.f", "x.b", "llama.context_length"]
        assert kvs[-7:-5] == ["general.quantization_version", "general.file_type"]
        assert md["x.i"] == 5 and f._kvs["x.i"].vtype == 4            # u32 of |value|
        assert md["x.f"] == float(np.float32(0.1)) and f._kvs["x.f"].vtype == 6
        assert md["x.b"] is True and md["general.name"] == "x"
        assert md["llama.context_length"] == 4096


# --- --prune-layers ---------------------------------------------------------------------------------

def test_prune_names():
    names = ["output.weight"] + [f"blk.{i}.attn_q.weight" for i in range(6)]
    m, n = P.prune_names(names, [1, 3])
    assert n == 4 and m["output.weight"] == "output.weight"
    assert [m[f"blk.{i}.attn_q.weight"] for i in range(6)] == [
        "blk.0.attn_q.weight", None, "blk.1.attn_q.weight", None, "blk.2.attn_q.weight",
        "blk.3.attn_q.weight"]
    assert P.prune_names(names, [])[1] == -1


def test_prune_layers_file(model, tmp_path):
    dst = tmp_path / "p.gguf"
    G.quantize_file(model, dst, preset="Q8_0", prune_layers=[0, 2])
    G.quantize_file(model, tmp_path / "all.gguf", preset="Q8_0")
    with G.open(dst) as f, G.open(tmp_path / "all.gguf") as fa:
        assert f.metadata["llama.block_count"] == 2 and list(f._kvs)[-1] == "llama.block_count"
        names = {t.name for t in f.tensors}
        assert "blk.1.attn_q.weight" in names and "blk.2.attn_q.weight" not in names
        assert len(names) == len(fa.tensors) - 2 * 9
        # layers 1 and 3 are now 0 and 1 (Q8_0 has no per-layer rules: the same bytes)
        for new, old in ((0, 1), (1, 3)):
            assert np.array_equal(f.raw(f"blk.{new}.attn_q.weight"),
                                  fa.raw(f"blk.{old}.attn_q.weight"))


# --- split models -------------------------------------------------------------------------------------

def test_split_models_read_as_one(model, tmp_path, capsys):
    paths = G.split_file(model, tmp_path / "s", max_tensors=15)
    assert main(["inspect", str(paths[0])]) == 0
    assert ": 40 tensors" in capsys.readouterr().out
    assert [p.name for p in paths] == [f"s-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with G.open(paths[0]) as f, G.open(model) as one:
        assert f.split_paths == paths
        assert sorted(t.name for t in f.tensors) == sorted(t.name for t in one.tensors)
        for t in one.tensors:
            assert np.array_equal(np.asarray(f.raw(t.name)), np.asarray(one.raw(t.name)))
        md = f.metadata
        assert (md["split.no"], md["split.count"], md["split.tensors.count"]) == (0, 3, 40)
        assert list(f._kvs)[-3:] == ["split.no", "split.tensors.count", "split.count"]
        x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
        assert np.array_equal(f.dequantize("blk.3.attn_q.weight") @ x,
                              one.dequantize("blk.3.attn_q.weight") @ x)
    # the same validation as one file, one line each
    with pytest.raises(G.GGUFError, match="shard 2 of a 3-file split model; open the first"):
        G.open(paths[1])
    data = paths[2].read_bytes()
    paths[2].unlink()
    with pytest.raises(G.GGUFError, match="shard 3 of 3 is missing") as e:
        G.open(paths[0])
    assert "\n" not in str(e.value)
    paths[2].write_bytes(data)
    renamed = tmp_path / "t.gguf"
    renamed.write_bytes(paths[0].read_bytes())
    with pytest.raises(G.GGUFError, match="does not end in '-00001-of-00003.gguf'"):
        G.open(renamed)


def test_split_count_mismatch(model, tmp_path):
    paths = G.split_file(model, tmp_path / "s", max_tensors=30)
    raw = bytearray(paths[0].read_bytes())
    key = b"split.tensors.count"
    at = raw.index(key) + len(key) + 4
    raw[at:at + 4] = struct.pack("<i", 41)
    paths[0].write_bytes(bytes(raw))
    with pytest.raises(G.GGUFError, match="split.tensors.count is 41 but the 2 shards hold 40"):
        G.open(paths[0])


def test_quantize_split_input_and_keep_split(model, tmp_path):
    paths = G.split_file(model, tmp_path / "s", max_tensors=15)
    one = tmp_path / "one.gguf"
    G.quantize_file(model, one, preset="Q8_0")
    merged = tmp_path / "merged.gguf"
    G.quantize_file(paths[0], merged, preset="Q8_0")
    assert merged.read_bytes() == one.read_bytes()   # split keys removed, tensors merged
    G.quantize_file(paths[0], tmp_path / "k", preset="Q8_0", keep_split=True)
    outs = [tmp_path / f"k-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with G.open(outs[0]) as f, G.open(paths[0]) as s:
        assert len(f.tensors) == 40 and list(f._kvs)[-3:] == [
            "split.no", "split.count", "split.tensors.count"]
        assert {n: e.shard for n, e in f._tensors.items()} == {
            n: e.shard for n, e in s._tensors.items()}
    with G.open(outs[0]) as f:
        assert f.split_paths == outs


def test_split_output(model, tmp_path, capsys):
    """--split-max-tensors: the quantized model as gguf-split --split would split it."""
    one = tmp_path / "one.gguf"
    G.quantize_file(model, one, preset="Q8_0")
    G.split_file(one, tmp_path / "byhand", max_tensors=16)
    rc, out, err = _cli(capsys, "--split-max-tensors", "16", model, tmp_path / "q.gguf", "q8_0")
    assert rc == 0, err
    for i in (1, 2, 3):
        a = tmp_path / f"q-0000{i}-of-00003.gguf"
        assert a.read_bytes() == (tmp_path / f"byhand-0000{i}-of-00003.gguf").read_bytes()
    rc, out, err = _cli(capsys, "--split-max-size", "5K", model, tmp_path / "r.gguf", "q8_0")
    assert rc == 2 and "supported units are M" in err


# --- importance matrices ------------------------------------------------------------------------------

def _write_imatrix_gguf(path, entries, *, meta=True, datasets=("wiki.txt",), chunks=10):
    w = gguf_py.GGUFWriter(str(path), "imatrix")
    if meta:
        w.add_array("imatrix.datasets", list(datasets))
        w.add_uint32("imatrix.chunk_count", chunks)
        w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        if sums is not None:
            w.add_tensor(name + ".in_sum2", np.asarray(sums, np.float32))
        if counts is not None:
            w.add_tensor(name + ".counts", np.asarray(counts, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_imatrix_dat(path, entries, trailer=(7, "data.txt")):
    b = struct.pack("<i", len(entries))
    for name, (ncall, sums) in entries.items():
        n = name.encode()
        b += struct.pack("<i", len(n)) + n + struct.pack("<ii", ncall, len(sums))
        b += np.asarray(sums, "<f4").tobytes()
    if trailer:
        d = trailer[1].encode()
        b += struct.pack("<ii", trailer[0], len(d)) + d
    Path(path).write_bytes(b)


def test_read_imatrix_gguf(tmp_path):
    p = tmp_path / "im.gguf"
    sums = np.arange(8, dtype=np.float32) + 1
    _write_imatrix_gguf(p, {"blk.0.ffn_up.weight": (sums, [4.0]),
                            "blk.0.ffn_down_exps.weight": (sums, [2.0, 0.0]),
                            "output.weight": (sums[:4], [2.6])})   # lround(2.6) = 3
    im = G.read_imatrix(p)
    assert not im.is_legacy and im.datasets == ["wiki.txt"] and im.chunk_count == 10
    assert np.array_equal(im.weights["blk.0.ffn_up.weight"], sums / np.float32(4))
    assert np.array_equal(im.weights["blk.0.ffn_down_exps.weight"],
                          np.concatenate([sums[:4] / np.float32(2), np.ones(4, np.float32)]))
    assert np.array_equal(im.weights["output.weight"], sums[:4] / np.float32(3))
    assert im.kv_overrides() == [("quantize.imatrix.file", "str", str(p)),
                                 ("quantize.imatrix.dataset", "str", "wiki.txt"),
                                 ("quantize.imatrix.entries_count", "int", 3),
                                 ("quantize.imatrix.chunks_count", "int", 10)]
    assert set(G.read_imatrix(p, exclude=["exps"]).weights) == {"blk.0.ffn_up.weight",
                                                                "output.weight"}
    assert set(G.read_imatrix(p, include=["ffn"]).weights) == {"blk.0.ffn_up.weight",
                                                               "blk.0.ffn_down_exps.weight"}
    with pytest.raises(G.GGUFError, match="cannot be used together"):
        G.read_imatrix(p, include=["a"], exclude=["b"])


@pytest.mark.parametrize("entries,meta,msg", [
    ({"a": ([1.0], None)}, True, "mismatched sums and counts for a"),
    ({"a": ([1.0], [1.0])}, False, "missing imatrix metadata"),
])
def test_read_imatrix_gguf_refusals(tmp_path, entries, meta, msg):
    p = tmp_path / "im.gguf"
    _write_imatrix_gguf(p, entries, meta=meta)
    with pytest.raises(G.GGUFError, match=msg):
        G.read_imatrix(p)


def test_read_imatrix_legacy(tmp_path):
    p = tmp_path / "im.dat"
    _write_imatrix_dat(p, {"blk.0.attn_q.weight": (4, [4.0, 8.0]), "x": (0, [3.0])})
    im = G.read_imatrix(p)
    assert im.is_legacy and im.datasets == ["data.txt"] and im.chunk_count == 7
    assert im.weights["blk.0.attn_q.weight"].tolist() == [1.0, 2.0]
    assert im.weights["x"].tolist() == [3.0]                  # ncall 0: the sums as they are
    _write_imatrix_dat(p, {"a": (1, [1.0])}, trailer=None)
    assert G.read_imatrix(p).chunk_count == 0
    p.write_bytes(struct.pack("<i", 0))
    with pytest.raises(G.GGUFError, match="no data in file"):
        G.read_imatrix(p)
    p.write_bytes(struct.pack("<ii", 1, 100) + b"abc")
    with pytest.raises(G.GGUFError, match="failed reading name for entry 1"):
        G.read_imatrix(p)


def test_imatrix_in_quantize(model, tmp_path):
    rng = np.random.default_rng(0)
    with G.open(model) as f:
        w = {t.name: (rng.random(t.shape[-1]) + 0.5).astype(np.float32)
             for t in f.tensors if len(t.shape) == 2}
    dst = tmp_path / "q8.gguf"
    # Q8_0's ggml quantizer ignores the matrix: same tensors as without, the rules see one
    G.quantize_file(model, dst, preset="Q8_0", imatrix=w)
    G.quantize_file(model, tmp_path / "plain.gguf", preset="Q8_0")
    assert dst.read_bytes() == (tmp_path / "plain.gguf").read_bytes()
    # weighted encoders: every tensor equals ggml_quantize_chunk with that tensor's weights
    _assert_tensors_equal_ggml_chunks(model, tmp_path / "q4km.gguf", "Q4_K_M", w)
    # llama.cpp's checks: size, non-finite values, missing entries of a low-bit preset
    bad = dict(w, **{"blk.0.attn_q.weight": np.ones(7, np.float32)})
    with pytest.raises(G.GGUFError, match="imatrix size 7 is different from tensor size 256 "
                                          "for blk.0.attn_q.weight"):
        G.quantize_file(model, tmp_path / "x.gguf", preset="Q8_0", imatrix=bad)
    nan = dict(w, **{"blk.0.attn_q.weight": np.full(256, np.nan, np.float32)})
    with pytest.raises(G.GGUFError, match="non-finite"):
        G.quantize_file(model, tmp_path / "x.gguf", preset="Q8_0", imatrix=nan)
    part = {k: v for k, v in w.items() if "attn_q" not in k}
    with pytest.raises(G.GGUFError, match="Missing importance matrix for tensor blk.0.attn_q"):
        G.quantize_file(model, tmp_path / "x.gguf", preset="Q2_K_S", imatrix=part)
    assert not (tmp_path / "x.gguf").exists()


def _assert_tensors_equal_ggml_chunks(src, dst, preset, w):
    """``quantize_file(src, dst, preset, imatrix=w)``; then each tensor it encoded equals
    ggml's ``ggml_quantize_chunk`` of the source rows with the same weights (what llama.cpp's
    quantizer calls; its Python binding cannot pass an importance matrix)."""
    import os

    from numba_qk.testing import ggml as ggml_bridge

    g = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
    if g is None:
        pytest.skip("no ggml library to compare with")
    G.quantize_file(src, dst, preset=preset, imatrix=w)
    compared = set()
    with G.open(src) as f, G.open(dst) as q:
        for t in q.tensors:
            if t.format is None or not t.format.is_quantized:
                continue
            rows = np.asarray(f.raw(t.name), np.float32).reshape(-1, t.shape[-1])
            want = g.quantize_chunk(t.format.ggml_type, rows, w.get(t.name))
            got = np.asarray(q.records(t.name)).reshape(want.shape)
            assert np.array_equal(got, want), f"{t.name} ({t.format.name})"
            compared.add(t.format.name)
    assert {"Q4_K", "Q6_K"} <= compared


def test_cli_imatrix_file_adds_llama_quantize_keys(model, tmp_path, capsys):
    p = tmp_path / "im.gguf"
    with G.open(model) as f:
        _write_imatrix_gguf(p, {t.name: (np.ones(t.shape[-1]), [1.0])
                                for t in f.tensors if len(t.shape) == 2})
    rc, out, err = _cli(capsys, "--imatrix", p, "--exclude-weights", "ffn", model,
                        tmp_path / "o.gguf", "Q8_0")
    assert rc == 0, err
    assert "loaded 18 importance matrix entries" in out        # 30 matrices, 12 ffn ones
    with G.open(tmp_path / "o.gguf") as f:
        md = f.metadata
        assert md["quantize.imatrix.file"] == str(p)
        assert md["quantize.imatrix.dataset"] == "wiki.txt"
        assert md["quantize.imatrix.entries_count"] == 18
        assert md["quantize.imatrix.chunks_count"] == 10


# --- against llama.cpp's own quantizer ------------------------------------------------------------

KVS = [("general.name", "str", "renamed"), ("foo.int", "int", -7), ("foo.f", "float", 0.1),
       ("foo.b", "bool", True), ("llama.context_length", "int", 4096)]
TT = [("attn_v", "Q8_0"), ("ffn_.*", "Q5_1")]
CASES = {  # name: (preset, source, numba_qk keywords, llama_model_quantize parameters)
    "q4_k_m": ("Q4_K_M", "f32", {}, {}),
    "kv-override": ("Q8_0", "f32", dict(kv_overrides=KVS), dict(kv_overrides=KVS)),
    "prune": ("Q4_K_M", "f32", dict(prune_layers=[1, 2]), dict(prune_layers=[1, 2])),
    "requant-q8-q4km": ("Q4_K_M", "q8_0", dict(allow_requantize=True),
                        dict(allow_requantize=True)),
    "requant-q8-f16": ("F16", "q8_0", dict(allow_requantize=True), dict(allow_requantize=True)),
    "requant-q4km-q4_0": ("Q4_0", "q4_k_m", dict(allow_requantize=True),
                          dict(allow_requantize=True)),
    "requant-q4km-q8_0": ("Q8_0", "q4_k_m", dict(allow_requantize=True),
                          dict(allow_requantize=True)),
    "copy": ("COPY", "f32", {}, dict(only_copy=True)),
    "copy-q4km": ("COPY", "q4_k_m", {}, dict(only_copy=True)),
    "pure": ("Q4_K_M", "f32", dict(pure=True), dict(pure=True)),
    "leave-output": ("Q4_K_M", "f32", dict(leave_output_tensor=True),
                     dict(quantize_output_tensor=False)),
    "types": ("Q4_K_M", "f32", dict(output_tensor_type="Q8_0", token_embedding_type="Q5_0",
                                    tensor_types=TT),
              dict(output_tensor_type=T["Q8_0"], token_embedding_type=T["Q5_0"],
                   tensor_types=[[p, T[t]] for p, t in TT])),
    "imatrix-q8_0": ("Q8_0", "f32", dict(imatrix="w"), dict(imatrix="w")),
    # the importance-weighted encoders (issue 24), whole files: every preset they serve
    **{f"imatrix-{p.lower()}": (p, "f32", dict(imatrix="w"), dict(imatrix="w"))
       for p in ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q3_K_M", "Q2_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0",
                 "Q5_1", "IQ4_NL", "IQ4_XS", "Q2_K_S", "IQ3_XS", "IQ3_S", "IQ3_M",
                 # the grid IQ encoders' presets (on this model llama.cpp refuses each without one)
                 "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M",
                 # ternary: ggml's quantizer ignores the matrix, the type plan does not
                 "TQ1_0", "TQ2_0", "Q2_0")},
    "split-q4km": ("Q4_K_M", "split", {}, {}),
    # Q1_0 / Q2_0 (ggml types 41, 42): Q1_0 has no fallback for ffn_down's rows of 288
    # (llama.cpp refuses them), so ffn_down goes to Q8_0 on both sides
    "q2_0": ("Q2_0", "f32", {}, {}),
    "q1_0": ("Q1_0", "f32", dict(tensor_types=[("ffn_down", "Q8_0")]),
             dict(tensor_types=[["ffn_down", T["Q8_0"]]])),
    "imatrix-q1_0": ("Q1_0", "f32", dict(imatrix="w", tensor_types=[("ffn_down", "Q8_0")]),
                     dict(imatrix="w", tensor_types=[["ffn_down", T["Q8_0"]]])),
}


@pytest.fixture(scope="module")
def sources(model, tmp_path_factory):
    if not O.available():
        pytest.skip("no llama-cpp-python interpreter")
    d = tmp_path_factory.mktemp("src")
    out = {"f32": model}
    for name, ft in (("q8_0", 7), ("q4_k_m", 15)):
        out[name] = d / f"{name}.gguf"
        assert O.quantize(model, out[name], ft).returncode == 0
    out["split"] = G.split_file(model, d / "split", max_tensors=12)[0]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_files_equal_llama_cpp(sources, tmp_path, case):
    preset, source, ours_kw, theirs_kw = CASES[case]
    src = sources[source]
    if "imatrix" in ours_kw:
        rng = np.random.default_rng(3)
        with G.open(src) as f:
            w = {t.name: (rng.random(t.shape[-1]) + 0.1).astype(np.float32)
                 for t in f.tensors if len(t.shape) == 2}
        ours_kw = dict(ours_kw, imatrix=w)
        theirs_kw = dict(theirs_kw, imatrix={k: v.tolist() for k, v in w.items()})
    ref, ours = tmp_path / "ref.gguf", tmp_path / "ours.gguf"
    r = O.quantize(src, ref, P.find_preset(preset).ftype, **theirs_kw)
    assert r.returncode == 0, r.stderr[-2000:]
    G.quantize_file(src, ours, preset=preset, **ours_kw)
    assert ref.read_bytes() == ours.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["Q8_0", "Q4_K_M"])
def test_keep_split_equals_llama_cpp(sources, tmp_path, preset):
    """--keep-split: llama.cpp visits each shard's tensors in file order (the per-layer
    counters of Q4_K_M count in that order) and writes one file per input shard."""
    src = sources["split"]
    ft = P.find_preset(preset).ftype
    assert O.quantize(src, tmp_path / "ref", ft, keep_split=True).returncode == 0
    G.quantize_file(src, tmp_path / "ours", preset=preset, keep_split=True)
    refs = sorted(tmp_path.glob("ref-*.gguf"))
    assert len(refs) == 4
    for r in refs:
        assert r.read_bytes() == (tmp_path / r.name.replace("ref", "ours")).read_bytes(), r.name
    if preset != "Q8_0":
        return
    # llama.cpp reads numba_qk's shards back (by the first) and gets the merged model
    assert O.quantize(tmp_path / "ours-00001-of-00004.gguf", tmp_path / "back.gguf",
                      7).returncode == 0
    assert O.quantize(src, tmp_path / "direct.gguf", 7).returncode == 0
    assert (tmp_path / "back.gguf").read_bytes() == (tmp_path / "direct.gguf").read_bytes()


@pytest.mark.slow
def test_cli_equals_llama_quantize(sources, tmp_path, capsys):
    """The CLI with llama-quantize's arguments, against llama_model_quantize given what
    llama-quantize's main() derives from them (the kv overrides, the imatrix keys)."""
    src = sources["f32"]
    im = tmp_path / "im.gguf"
    with G.open(src) as f:
        _write_imatrix_gguf(im, {t.name: (np.full(t.shape[-1], 2.0), [2.0])
                                 for t in f.tensors if len(t.shape) == 2})
    rc, out, err = _cli(capsys, "--override-kv", "foo.bar=str:baz", "--imatrix", im,
                        "--tensor-type", "ATTN_V=f16", src, tmp_path / "ours.gguf", "7", "2")
    assert rc == 0, err
    n = len(G.read_imatrix(im).weights)
    kv = [("foo.bar", "str", "baz"), ("quantize.imatrix.file", "str", str(im)),
          ("quantize.imatrix.dataset", "str", "wiki.txt"),
          ("quantize.imatrix.entries_count", "int", n),
          ("quantize.imatrix.chunks_count", "int", 10)]
    r = O.quantize(src, tmp_path / "ref.gguf", 7, kv_overrides=kv,
                   tensor_types=[["attn_v", T["F16"]]],
                   imatrix={k: [1.0] * len(v) for k, v in G.read_imatrix(im).weights.items()})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "ref.gguf").read_bytes() == (tmp_path / "ours.gguf").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "Q2_K_S"])
def test_imatrix_type_rules_equal_llama_cpp(tmp_path, preset):
    """The type plan with an importance matrix (llama-quant.cpp's has_imatrix rules: Q4_1/Q5_1
    ffn_down in the first n_layer/8 layers, IQ4 and IQ3_XXS without their no-imatrix bumps, the
    low-bit presets allowed): numba_qk's dry run against the types in llama.cpp's file."""
    if not O.available():
        pytest.skip("no llama-cpp-python interpreter")
    src = tmp_path / "in.gguf"
    C.build_model(src, dict(C.MODELS["gqa4"], vocab=256))      # 8 layers: n_layer/8 = 1
    with G.open(src) as f:
        w = {t.name: np.full(t.shape[-1], 1.0, np.float32) for t in f.tensors
             if len(t.shape) == 2}
    r = O.quantize(src, tmp_path / "ref.gguf", P.find_preset(preset).ftype,
                   imatrix={k: v.tolist() for k, v in w.items()})
    assert r.returncode == 0, r.stderr[-2000:]
    with G.open(tmp_path / "ref.gguf") as f:
        theirs = [(t.name, t.type_name) for t in f.tensors]
    ours = G.quantize_file(src, None, preset=preset, dry_run=True, imatrix=w)
    assert [(r.name, r.type_after) for r in ours] == theirs
    without = G.quantize_file(src, None, preset=preset, dry_run=True)
    if preset in ("Q4_0", "Q5_0", "IQ4_NL", "IQ3_XXS"):
        assert [r.type_after for r in without] != [t for _, t in theirs]


IQ_PRESETS = ("IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M")
# every row length a multiple of 32 but not of 256: each IQ type falls back to IQ4_NL, the
# K-quants to legacy types, the output to Q8_0, so no tensor needs an importance matrix
ALL_FALLBACK = C._m(2, 160, 5, 5, 288, 256, "rows 160 and 288: every 256-block type falls back")


@pytest.mark.slow
@pytest.mark.parametrize("preset", IQ_PRESETS)
def test_iq_presets_without_imatrix_as_llama_cpp(sources, tmp_path, preset):
    """Without an importance matrix llama.cpp refuses a preset as soon as one tensor's final
    type (after the row-size fallbacks) needs one (tensor_requires_imatrix), before writing
    anything; numba_qk refuses the same files. Where no tensor needs one it runs the preset,
    and the files are byte-identical."""
    ft = P.find_preset(preset).ftype
    r = O.quantize(sources["f32"], tmp_path / "ref.gguf", ft)
    assert r.returncode != 0 and "requires an imatrix" in r.stderr, r.stderr[-2000:]
    with pytest.raises(G.GGUFError, match=f"preset {preset} needs an importance matrix"):
        G.quantize_file(sources["f32"], tmp_path / "ours.gguf", preset=preset)
    assert not (tmp_path / "ours.gguf").exists()
    src = tmp_path / "fb.gguf"
    C.build_model(src, ALL_FALLBACK)
    r = O.quantize(src, tmp_path / "ref.gguf", ft)
    assert r.returncode == 0, r.stderr[-2000:]
    G.quantize_file(src, tmp_path / "ours.gguf", preset=preset)
    assert (tmp_path / "ref.gguf").read_bytes() == (tmp_path / "ours.gguf").read_bytes()


def _tensor_bytes(path):
    with G.open(path) as f:
        return {t.name: f.raw(t.name).tobytes() for t in f.tensors}


@pytest.mark.parametrize("alignment", [8, 256])
def test_custom_alignment_honoured(tmp_path, alignment):
    """A source whose ``general.alignment`` is not 32: the output keeps the key and every
    offset honours it (llama_model_quantize pads to 32 whatever the header says, so its files
    for 8 and 256 contradict their own header: with 8 the data starts 8 bytes after where the
    header puts it, with 256 llama.cpp's own reader refuses the offsets), with the same tensors
    as from the 32-aligned source."""
    spec = dict(C.MODELS["gqa4"], n_layer=2, vocab=256)
    C.build_model(tmp_path / "a32.gguf", spec)
    C.build_model(tmp_path / "ax.gguf", spec, alignment=alignment)
    G.quantize_file(tmp_path / "a32.gguf", tmp_path / "o32.gguf", preset="Q8_0")
    G.quantize_file(tmp_path / "ax.gguf", tmp_path / "ox.gguf", preset="Q8_0")
    gguf_py = pytest.importorskip("gguf")
    r = gguf_py.GGUFReader(str(tmp_path / "ox.gguf"))
    assert r.alignment == alignment and r.data_offset % alignment == 0
    assert all(int(t.data_offset) % alignment == 0 for t in r.tensors)
    assert _tensor_bytes(tmp_path / "ox.gguf") == _tensor_bytes(tmp_path / "o32.gguf")


@pytest.mark.slow
def test_alignment_64_equals_llama_cpp(tmp_path):
    """With ``general.alignment`` 64 llama.cpp's 32-byte padding happens to honour the header
    (every tensor of this model is a multiple of 64 bytes): the files are byte-identical."""
    if not O.available():
        pytest.skip("no llama-cpp-python interpreter")
    C.build_model(tmp_path / "in.gguf", dict(C.MODELS["gqa4"], n_layer=2, vocab=256), alignment=64)
    for preset in ("Q8_0", "Q4_K_M"):
        r = O.quantize(tmp_path / "in.gguf", tmp_path / "ref.gguf", P.find_preset(preset).ftype)
        assert r.returncode == 0, r.stderr[-2000:]
        G.quantize_file(tmp_path / "in.gguf", tmp_path / "ours.gguf", preset=preset)
        assert (tmp_path / "ref.gguf").read_bytes() == (tmp_path / "ours.gguf").read_bytes()


@pytest.mark.slow
def test_llama_cpp_reads_split_output(model, tmp_path):
    """llama.cpp loads numba_qk's split output (split_max_tensors) by its first shard and sees
    the same model as the one-file output."""
    if not O.available():
        pytest.skip("no llama-cpp-python interpreter")
    G.quantize_file(model, tmp_path / "one.gguf", preset="Q8_0")
    G.quantize_file(model, tmp_path / "s", preset="Q8_0", split_max_tensors=7)
    assert O.quantize(tmp_path / "s-00001-of-00006.gguf", tmp_path / "a.gguf", 7).returncode == 0
    assert O.quantize(tmp_path / "one.gguf", tmp_path / "b.gguf", 7).returncode == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_preset_of_a_type_gguf_py_does_not_size(model, tmp_path):
    """Q2_0 (ggml type 42, block_q2_0: f16 d + 16 bytes per 64 values) is missing from
    gguf-py 0.19's size table: the Q2_0 preset's dry run sizes it as llama.cpp does, and the real
    run writes them (Q2_0 records, numba_qk's encoder)."""
    res = G.quantize_file(model, None, preset="Q2_0", dry_run=True)
    with G.open(model) as f:
        for r in res:
            if r.type_after == "Q2_0":
                n = int(np.prod(f.tensor(r.name).shape))
                assert r.bytes_after == n // 64 * 18
    assert "Q2_0" in {r.type_after for r in res}
    # Q1_0 (gguf-py sizes it): sized as converted, not as kept
    # (ffn_down's rows of 288 have no Q1_0 fallback: llama.cpp refuses them, so does the plan)
    res = G.quantize_file(model, None, preset="Q1_0", dry_run=True,
                          tensor_types=[("ffn_down", "Q8_0")])
    q1 = [r for r in res if r.type_after == "Q1_0"]
    assert q1 and all(r.bytes_after == int(np.prod(r.shape)) // 128 * 18 for r in q1)
    G.quantize_file(model, tmp_path / "q.gguf", preset="Q2_0")
    with G.open(tmp_path / "q.gguf") as f:
        assert "Q2_0" in {t.type_name for t in f.tensors}
