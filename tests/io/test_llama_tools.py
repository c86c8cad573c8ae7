"""numba_qk's split writer, merger and importance-matrix readers against llama.cpp's own
command-line tools (issue 25): ``llama-gguf-split --split`` / ``--merge``, files written by
``llama-imatrix`` (GGUF and legacy ``.dat``) and ``llama-quantize --imatrix``, byte for byte.

The binaries come from ``NUMBA_QK_LLAMA_TOOLS`` (tests/io/llama_tools.py; build commands in
docs/llama-quantize.md); each test skips when the tool it needs is not there. The committed
fixtures under tests/io/data/ were written by llama-imatrix and are checked without the tools.
"""

import importlib.util
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

from numba_qk import gguf as G  # noqa: E402
from numba_qk.__main__ import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


C = _load("compare_presets", ROOT / "tools" / "compare_presets.py")
LT = _load("llama_tools", Path(__file__).with_name("llama_tools.py"))

SPLIT = LT.tool("llama-gguf-split")
IMATRIX = LT.tool("llama-imatrix")
QUANTIZE = LT.tool("llama-quantize")
need_split = pytest.mark.skipif(SPLIT is None, reason="no llama-gguf-split in NUMBA_QK_LLAMA_TOOLS")
need_imatrix = pytest.mark.skipif(IMATRIX is None or QUANTIZE is None,
                                  reason="no llama-imatrix / llama-quantize in NUMBA_QK_LLAMA_TOOLS")

# F32, GQA 4, ffn rows 288: 40 tensors, 6.6 MB of data, 66 kB to 295 kB each
SMALL = dict(C.MODELS["gqa4"], n_layer=4, vocab=256)
# 1.2 MB token_embd first (larger than --split-max-size 1M): gguf-split's refusal
BIGFIRST = dict(C.MODELS["gqa4"], n_layer=2, vocab=1200)
# the same in string order: the 1.2 MB output/token_embd come later, each in a shard of its own
BIGLATER = dict(BIGFIRST, string_order=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    out = {}
    for name, spec in (("small", SMALL), ("bigfirst", BIGFIRST), ("biglater", BIGLATER)):
        out[name] = d / f"{name}.gguf"
        C.build_model(out[name], spec)
    return out


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _gguf_split(tmp, *args):
    d = tmp / "ref"
    d.mkdir(exist_ok=True)
    r = LT.run("llama-gguf-split", *args[:-1], d / args[-1])
    return r, d


# --- the over-size rule and --no-tensor-first-split, without the tools ---------------------------

def test_oversize_first_tensor_refused_later_ones_alone(models, tmp_path):
    """gguf-split starts a new shard before a tensor that would take the shard over the size;
    a later tensor larger than the size so gets a shard of its own, the first one would leave
    the first shard empty, which gguf-split refuses ("one of splits have 0 tensors")."""
    with pytest.raises(G.GGUFError, match="'token_embd.weight' takes 1228800 bytes.*gguf-split "
                                          "refuses"):
        G.split_file(models["bigfirst"], tmp_path / "a", max_size=1_000_000)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(G.GGUFError, match="one of splits have 0 tensors"):
        G.quantize_file(models["bigfirst"], tmp_path / "q", preset="COPY",
                        split_max_size=1_000_000)
    assert list(tmp_path.iterdir()) == []
    paths = G.split_file(models["biglater"], tmp_path / "b", max_size=1_000_000)
    alone = []
    for p in paths:
        names = [t.name for t in gguf_py.GGUFReader(p).tensors]
        if names in (["output.weight"], ["token_embd.weight"]):
            alone.append(names[0])
    assert sorted(alone) == ["output.weight", "token_embd.weight"]


def test_no_tensor_first_split(models, tmp_path):
    paths = G.split_file(models["small"], tmp_path / "s", max_tensors=16,
                         no_tensor_first_split=True)
    assert [Path(p).name for p in paths] == [f"s-0000{i}-of-00004.gguf" for i in (1, 2, 3, 4)]
    with G.open(paths[0]) as f:
        assert len(f.tensors) == 40 and f.split_paths == paths
    assert len(gguf_py.GGUFReader(paths[0]).tensors) == 0


def test_merge_file(models, tmp_path):
    paths = G.split_file(models["small"], tmp_path / "s", max_tensors=15)
    out = G.merge_file(paths[0], tmp_path / "m.gguf")
    with G.open(out) as m, G.open(models["small"]) as src:
        assert [t.name for t in m.tensors] == [t.name for t in src.tensors]
        assert all(bytes(m.raw(t.name)) == bytes(src.raw(t.name)) for t in src.tensors)
        md = m.metadata
        assert (md["split.no"], md["split.tensors.count"], md["split.count"]) == (0, 40, 0)
        assert list(m._kvs)[-3:] == ["split.no", "split.tensors.count", "split.count"]
        assert m.split_paths == [out]
    with pytest.raises(G.GGUFError, match="valid split count 0"):
        G.merge_file(out, tmp_path / "again.gguf")
    with pytest.raises(G.GGUFError, match="does not contain split.count"):
        G.merge_file(models["small"], tmp_path / "none.gguf")


def test_gguf_split_command(models, tmp_path, run_cli):
    """``python -m numba_qk gguf-split``: the plan on stdout, the same files as split_file /
    merge_file, --dry-run writes nothing, the merge refuses an existing output as
    llama-gguf-split does, --delete-splits removes the shards once merged, usage errors."""
    code, out, _ = run_cli("gguf-split", "--dry-run", "--split-max-tensors", "15",
                           models["small"], tmp_path / "d")
    assert code == 0 and out.splitlines()[0] == "n_split: 3" and not list(tmp_path.iterdir())
    assert [ln.split(":")[0] for ln in out.splitlines()[1:]] == [f"split 0000{i}" for i in (1, 2, 3)]
    (want,) = G.split_file(models["small"], tmp_path / "api", max_tensors=128)
    code, out, _ = run_cli("gguf-split", models["small"], tmp_path / "s")   # 128 by default
    assert code == 0 and out.splitlines()[0] == "n_split: 1"
    assert (tmp_path / "s-00001-of-00001.gguf").read_bytes() == Path(want).read_bytes()
    shards = G.split_file(models["small"], tmp_path / "t", max_tensors=15)
    code, out, _ = run_cli("gguf-split", "--merge", "--dry-run", shards[0], tmp_path / "m.gguf")
    assert code == 0 and not (tmp_path / "m.gguf").exists()
    code, _, _ = run_cli("gguf-split", "--merge", shards[0], tmp_path / "m.gguf")
    assert code == 0
    ref = G.merge_file(shards[0], tmp_path / "ref.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == ref.read_bytes()
    code, _, err = run_cli("gguf-split", "--merge", shards[0], tmp_path / "m.gguf")
    assert code == 1 and "already exists" in err
    code, _, _ = run_cli("gguf-split", "--merge", "--delete-splits", shards[0], tmp_path / "d.gguf")
    assert code == 0 and not any(Path(p).exists() for p in shards)
    assert (tmp_path / "d.gguf").read_bytes() == ref.read_bytes()
    for args, msg in ((["--split-max-tensors", "2", "--split-max-size", "1M"], "not allowed"),
                      (["--split-max-size", "3K"], "supported units are M"),
                      (["--split-max-tensors", "0"], "must be positive"),
                      (["--merge", "--split-max-tensors", "2"], "go with --split"),
                      (["--delete-splits"], "goes with --merge")):
        code, _, err = run_cli("gguf-split", *args, models["small"], tmp_path / "x")
        assert code == 2 and msg in err, (args, err)


# --- against llama-gguf-split -------------------------------------------------------------------

SPLIT_CASES = [
    ("small", ["--split-max-tensors", "1"]),
    ("small", ["--split-max-tensors", "7"]),
    ("small", ["--split-max-tensors", "13"]),
    ("small", ["--split-max-tensors", "39"]),
    ("small", ["--split-max-tensors", "40"]),
    ("small", []),                                    # the default, 128 tensors
    ("small", ["--split-max-size", "1M"]),
    ("small", ["--split-max-size", "2M"]),
    ("small", ["--split-max-size", "7M"]),
    ("small", ["--split-max-tensors", "13", "--no-tensor-first-split"]),
    ("small", ["--split-max-size", "2M", "--no-tensor-first-split"]),
    ("biglater", ["--split-max-size", "1M"]),
    ("biglater", ["--split-max-size", "2M"]),
    ("bigfirst", ["--split-max-size", "2M"]),
]


def _split_kwargs(args):
    kw = {}
    for i, a in enumerate(args):
        if a == "--split-max-tensors":
            kw["max_tensors"] = int(args[i + 1])
        elif a == "--split-max-size":
            kw["max_size"] = int(args[i + 1][:-1]) * {"M": 10**6, "G": 10**9}[args[i + 1][-1]]
        elif a == "--no-tensor-first-split":
            kw["no_tensor_first_split"] = True
    if not any(k in kw for k in ("max_tensors", "max_size")):
        kw["max_tensors"] = 128
    return kw


@need_split
@pytest.mark.parametrize("model,args", SPLIT_CASES, ids=lambda v: v if isinstance(v, str) else
                         "_".join(v).replace("--", "") or "default")
def test_split_equals_gguf_split(models, tmp_path, model, args):
    r, ref = _gguf_split(tmp_path, "--split", *args, models[model], "out")
    assert r.returncode == 0, r.stderr
    ours = tmp_path / "ours"
    ours.mkdir()
    paths = G.split_file(models[model], ours / "out", **_split_kwargs(args))
    want = _files(ref)
    assert [Path(p).name for p in paths] == list(want)
    got = _files(ours)
    for name in want:
        assert got[name] == want[name], name


@need_split
@pytest.mark.parametrize("args", [[], ["--split-max-size", "2M", "--no-tensor-first-split"]],
                         ids=["default", "size-no-first"])
def test_split_command_equals_gguf_split(models, tmp_path, run_cli, args):
    """``python -m numba_qk gguf-split`` against the binary: the same files, the same plan
    (its stdout lines), and the merge of the shards."""
    r, ref = _gguf_split(tmp_path, *args, models["small"], "out")
    assert r.returncode == 0, r.stderr
    ours = tmp_path / "ours"
    ours.mkdir()
    code, out, _ = run_cli("gguf-split", *args, models["small"], ours / "out")
    assert code == 0 and _files(ours) == _files(ref)
    assert out.splitlines() == [ln for ln in r.stdout.splitlines()
                                if ln.startswith(("n_split", "split "))]
    first = sorted(ref.iterdir())[0]
    assert LT.run("llama-gguf-split", "--merge", first, tmp_path / "ref.gguf").returncode == 0
    code, _, _ = run_cli("gguf-split", "--merge", sorted(ours.iterdir())[0], tmp_path / "o.gguf")
    assert code == 0 and (tmp_path / "o.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()


@need_split
def test_oversize_first_tensor_refused_as_gguf_split(models, tmp_path):
    r, ref = _gguf_split(tmp_path, "--split", "--split-max-size", "1M", models["bigfirst"], "out")
    assert r.returncode != 0 and "one of splits have 0 tensors" in r.stderr
    assert list(ref.iterdir()) == []
    with pytest.raises(G.GGUFError, match="one of splits have 0 tensors"):
        G.split_file(models["bigfirst"], tmp_path / "ours", max_size=1_000_000)


@need_split
@pytest.mark.skipif(QUANTIZE is None, reason="no llama-quantize in NUMBA_QK_LLAMA_TOOLS")
def test_quantize_split_output_equals_gguf_split(models, tmp_path, capsys):
    """quantize --split-max-tensors/--split-max-size: llama-quantize's one file, then gguf-split."""
    one = tmp_path / "one.gguf"
    r = LT.run("llama-quantize", models["small"], one, "Q8_0")
    assert r.returncode == 0, r.stderr[-2000:]
    for args in (["--split-max-tensors", "9"], ["--split-max-size", "1M"]):
        r, ref = _gguf_split(tmp_path, "--split", *args, one, "q")
        assert r.returncode == 0, r.stderr
        d = tmp_path / ("ours" + args[0])
        d.mkdir()
        assert main(["quantize", *args, str(models["small"]), str(d / "q"), "Q8_0"]) == 0
        assert _files(d) == _files(ref)
        shutil.rmtree(ref)
    capsys.readouterr()


@need_split
@pytest.mark.parametrize("how", ["gguf-split", "keep-split"])
def test_merge_equals_gguf_split_merge(models, tmp_path, how):
    """merge_file against gguf-split --merge, of gguf-split's shards (split keys last) and of
    llama-quantize --keep-split shards (split.count before split.tensors.count)."""
    d = tmp_path / "shards"
    d.mkdir()
    if how == "gguf-split":
        first = G.split_file(models["small"], d / "s", max_tensors=11)[0]
    else:
        parts = G.split_file(models["small"], tmp_path / "in", max_tensors=11)
        G.quantize_file(parts[0], d / "s", preset="Q8_0", keep_split=True)
        first = G.split_path(d / "s", 0, len(parts))
    r = LT.run("llama-gguf-split", "--merge", first, tmp_path / "ref.gguf")
    assert r.returncode == 0, r.stderr
    G.merge_file(first, tmp_path / "ours.gguf")
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    # gguf-split refuses to merge its own output again, as merge_file does
    r = LT.run("llama-gguf-split", "--merge", tmp_path / "ref.gguf", tmp_path / "again.gguf")
    assert r.returncode != 0 and "valid split count 0" in r.stderr


# --- importance matrices written by llama-imatrix ---------------------------------------------

def _expected_gguf(path):
    """An imatrix GGUF file read independently (gguf-py) and normalised as llama-quantize's
    load_imatrix does: {name: sums / lround(count) per expert, 1 where the count is 0}, plus
    the raw counts, datasets, chunk_count, chunk_size."""
    r = gguf_py.GGUFReader(path)
    sums = {t.name[:-len(".in_sum2")]: np.asarray(t.data, np.float32).reshape(-1)
            for t in r.tensors if t.name.endswith(".in_sum2")}
    counts = {t.name[:-len(".counts")]: np.asarray(t.data, np.float32).reshape(-1)
              for t in r.tensors if t.name.endswith(".counts")}
    assert set(sums) == set(counts)
    weights = {}
    for name, s in sums.items():
        c = np.rint(counts[name])              # whole numbers: lround is exact
        ne0 = s.size // c.size
        w = s.reshape(c.size, ne0) / c[:, None].astype(np.float32)
        w[c == 0] = 1
        weights[name] = w.reshape(-1).astype(np.float32)
    meta = {k: r.fields[k].contents() for k in ("imatrix.datasets", "imatrix.chunk_count",
                                                   "imatrix.chunk_size")}
    return weights, counts, meta


def _expected_dat_from_gguf(path_gguf):
    """What llama-imatrix --output-format dat writes for the same statistics, then read as
    load_imatrix reads it: (sum / count) * ncall per value (count 0: 1), ncall = the largest
    count / chunk size rounded up; weights = that / ncall."""
    r = gguf_py.GGUFReader(path_gguf)
    chunk = int(r.fields["imatrix.chunk_size"].contents())
    data = {t.name: np.asarray(t.data, np.float32).reshape(-1) for t in r.tensors}
    out = {}
    for key, s in data.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key[:-len(".in_sum2")]
        c = data[name + ".counts"]
        ncall = np.float32((int(c.max()) + chunk - 1) // chunk)
        cc = np.repeat(c, s.size // c.size)
        zero = cc == 0
        v = np.where(zero, np.float32(1), s) / np.where(zero, np.float32(1), cc)
        out[name] = (v.astype(np.float32) * ncall).astype(np.float32) / ncall
    return out


def _same(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.asarray(a[k]).view(np.uint32).tolist() == np.asarray(b[k]).view(
            np.uint32).tolist(), k


@pytest.mark.parametrize("name", ["imatrix-tiny.gguf", "imatrix-tiny-moe.gguf"])
def test_read_llama_imatrix_gguf_fixture(name):
    """Files written by llama-imatrix (tests/io/data/README.md): entries, weights bit for bit,
    per-expert counts, datasets, chunk count and size."""
    im = G.read_imatrix(DATA / name)
    weights, counts, meta = _expected_gguf(DATA / name)
    _same(im.weights, weights)
    assert im.datasets == list(meta["imatrix.datasets"]) == ["imatrix-text.txt"]
    assert (im.chunk_count, im.chunk_size) == (meta["imatrix.chunk_count"],
                                                meta["imatrix.chunk_size"]) == (4, 32)
    assert not im.is_legacy
    if "moe" in name:
        exps = [k for k in counts if "_exps" in k]
        assert exps and all(counts[k].size == 4 for k in exps)
        # some experts saw more tokens than others: the per-expert division matters
        assert any(len(set(counts[k].tolist())) > 1 for k in exps)
    else:
        assert "output.weight" in im.weights         # --process-output
        assert all(c.size == 1 for c in counts.values())


def test_read_llama_imatrix_dat_fixture():
    """The legacy file of the same run: the same entries (less output.weight, which that run
    did not collect), each weight what the GGUF file's statistics give through the .dat
    format's (sum / count) * ncall / ncall, bit for bit; the trailer's chunk count and
    dataset name."""
    im = G.read_imatrix(DATA / "imatrix-tiny.dat")
    want = _expected_dat_from_gguf(DATA / "imatrix-tiny.gguf")
    want.pop("output.weight")
    _same(im.weights, want)
    assert (im.is_legacy, im.chunk_count, im.chunk_size) == (True, 4, 0)
    assert im.datasets == ["imatrix-text.txt"]
    assert im.kv_overrides()[1:] == [("quantize.imatrix.dataset", "str", "imatrix-text.txt"),
                                     ("quantize.imatrix.entries_count", "int", 14),
                                     ("quantize.imatrix.chunks_count", "int", 4)]


@pytest.fixture(scope="module")
def imatrix_runs(tmp_path_factory):
    """Fresh llama-imatrix outputs for the fixtures' models (the dense one and the MoE one)."""
    if IMATRIX is None or QUANTIZE is None:
        pytest.skip("no llama-imatrix / llama-quantize in NUMBA_QK_LLAMA_TOOLS")
    d = tmp_path_factory.mktemp("im")
    LT.write_vocab_model(d / "m.gguf")
    LT.write_vocab_model(d / "moe.gguf", n_expert=4, n_ff=256)
    LT.write_text(d / "imatrix-text.txt")
    out = {"dir": d}
    for key, model, extra in (("gguf", "m.gguf", ("--process-output",)),
                              ("dat", "m.gguf", ("--output-format", "dat")),
                              ("moe", "moe.gguf", ())):
        name = f"im-{key}" + (".dat" if key == "dat" else ".gguf")
        r = LT.run("llama-imatrix", "-m", model, "-f", "imatrix-text.txt", "-o", name,
                   *LT.IMATRIX_ARGS, *extra, cwd=d)
        assert r.returncode == 0, r.stderr[-3000:]
        out[key] = name
    return out


@need_imatrix
def test_fresh_llama_imatrix_files_read_exactly(imatrix_runs):
    d = imatrix_runs["dir"]
    for key in ("gguf", "moe"):
        im = G.read_imatrix(d / imatrix_runs[key])
        weights, _, meta = _expected_gguf(d / imatrix_runs[key])
        _same(im.weights, weights)
        assert (im.datasets, im.chunk_count, im.chunk_size) == (["imatrix-text.txt"], 4, 32)
    im = G.read_imatrix(d / imatrix_runs["dat"])
    want = _expected_dat_from_gguf(d / imatrix_runs["gguf"])
    want.pop("output.weight")
    _same(im.weights, want)
    assert (im.datasets, im.chunk_count) == (["imatrix-text.txt"], 4)


def _llama_quantize_vs_ours(d, model, imatrix, preset, *flags):
    ref, ours = f"ref-{preset}.gguf", f"ours-{preset}.gguf"
    r = LT.run("llama-quantize", *flags, "--imatrix", imatrix, model, ref, preset, "2", cwd=d)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    import os

    cwd = os.getcwd()
    os.chdir(d)        # quantize.imatrix.file holds the path as given, in both
    try:
        rc = main(["quantize", *flags, "--imatrix", imatrix, model, ours, preset, "2"])
    finally:
        os.chdir(cwd)
    assert rc == 0
    a, b = (d / ours).read_bytes(), (d / ref).read_bytes()
    (d / ours).unlink()
    (d / ref).unlink()
    return a == b


@need_imatrix
@pytest.mark.parametrize("preset,imatrix,flags", [
    ("Q4_K_M", "gguf", ()),
    ("IQ2_XS", "gguf", ()),
    ("IQ4_XS", "dat", ()),
    ("Q4_K_M", "moe", ()),
])
def test_quantize_with_llama_imatrix_equals_llama_quantize(imatrix_runs, preset, imatrix, flags,
                                                           capsys):
    model = "moe.gguf" if imatrix == "moe" else "m.gguf"
    assert _llama_quantize_vs_ours(imatrix_runs["dir"], model, imatrix_runs[imatrix], preset,
                                   *flags)
    capsys.readouterr()


@need_imatrix
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["Q2_K", "Q2_K_S", "Q3_K_M", "Q4_K_S", "Q5_K_M", "Q6_K",
                                    "Q4_0", "Q5_1", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ3_M",
                                    "IQ2_XXS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"])
@pytest.mark.parametrize("imatrix", ["gguf", "dat", "moe"])
def test_quantize_with_llama_imatrix_sweep(imatrix_runs, preset, imatrix, capsys):
    model = "moe.gguf" if imatrix == "moe" else "m.gguf"
    assert _llama_quantize_vs_ours(imatrix_runs["dir"], model, imatrix_runs[imatrix], preset)
    capsys.readouterr()


@need_imatrix
@pytest.mark.parametrize("flags", [("--include-weights", "attn_"),
                                   ("--exclude-weights", "ffn_down", "--exclude-weights", "blk.1")])
def test_include_exclude_weights_equal_llama_quantize(imatrix_runs, flags, capsys):
    assert _llama_quantize_vs_ours(imatrix_runs["dir"], "m.gguf", imatrix_runs["gguf"],
                                   "Q4_K_M", *flags)
    capsys.readouterr()


@need_imatrix
def test_keep_split_cli_equals_llama_quantize(imatrix_runs, tmp_path, capsys):
    """llama-quantize --keep-split on a split input (OUT's ".gguf" cut off, one output per
    shard), with an importance matrix, against the CLI."""
    d = imatrix_runs["dir"]
    first = G.split_file(d / "m.gguf", tmp_path / "in", max_tensors=9)[0]
    im = d / imatrix_runs["gguf"]
    r = LT.run("llama-quantize", "--keep-split", "--imatrix", im, first, tmp_path / "ref.gguf",
               "IQ4_XS")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert main(["quantize", "--keep-split", "--imatrix", str(im), str(first),
                 str(tmp_path / "ours.gguf"), "IQ4_XS"]) == 0
    refs = sorted(tmp_path.glob("ref-*-of-*.gguf"))
    assert len(refs) == 3
    for p in refs:
        assert (tmp_path / p.name.replace("ref", "ours")).read_bytes() == p.read_bytes(), p.name
    capsys.readouterr()
