"""GGUF backend: zero-copy tensors, matmul, dequantize, the Q4_K converter and the CLI."""

import mmap
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import gguf  # noqa: E402

from numba_qk.testing.asserts import assert_same_f32, assert_same_records  # noqa: E402
from subsets import default_few  # noqa: E402



@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return gguf.write_demo_model(tmp_path_factory.mktemp("gguf") / "demo.gguf")


def test_listing(demo):
    with gguf.open(demo) as f:
        info = {t.name: t for t in f.tensors}
        assert info["blk.0.attn_k.weight"].format is qk.quant.q4_k
        assert info["blk.0.attn_k.weight"].shape == (512, 512)
        assert info["blk.0.attn_v.weight"].format is qk.quant.q8_0
        assert info["blk.0.ffn_up.weight"].format is qk.f16
        assert info["blk.0.ffn_down.weight"].format is qk.bf16
        assert info["blk.0.ffn_down.weight"].shape == (512, 1024)
        assert info["output.weight"].format is qk.quant.iq2_xxs
        assert info["output.weight"].type_name == "IQ2_XXS"
        assert [t.accelerated for t in f.tensors].count(True) == 3
        assert info["blk.0.attn_k.weight"].bits_per_weight == 4.5
        assert f.metadata["general.name"] == "numba_qk demo model"
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            f.tensor("nope")


def test_records_are_zero_copy_views_of_the_read_only_map(demo):
    with gguf.open(demo) as f:
        recs = f.records("blk.0.attn_k.weight")
        assert recs.shape == (512, 2, 144) and recs.dtype == np.uint8
        assert not recs.flags.writeable
        whole = np.frombuffer(f._mm, dtype=np.uint8)
        assert np.shares_memory(recs, whole)
        del whole
        base = recs  # the base chain ends at the file's read-only mmap (it keeps the map alive)
        while base is not None and not isinstance(base, mmap.mmap):
            base = base.obj if isinstance(base, memoryview) else base.base
        assert isinstance(base, mmap.mmap)
        with pytest.raises(gguf.GGUFError, match="not a block-quantized format"):
            f.records("blk.0.attn_q.weight")


def test_matmul_never_copies_the_weights_and_is_exact(demo):
    with gguf.open(demo) as f:
        recs = f.records("blk.0.attn_k.weight")
        x = np.random.default_rng(0).standard_normal(512).astype(np.float32)
        f.matmul("blk.0.attn_k.weight", x, threads=2)  # compile outside the measurement
        tracemalloc.start()
        y = f.matmul("blk.0.attn_k.weight", x, threads=2)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < recs.nbytes // 8, f"matmul allocated {peak} bytes for {recs.nbytes} of weights"
        xq = qk.quantize(x.reshape(2, 256), format=qk.quant.q8_k)
        want = np.array([qk.quantized_dot(recs[r], xq, lhs_format=qk.quant.q4_k,
                                          rhs_format=qk.quant.q8_k) for r in range(512)])
        assert_same_f32(y, want)
        xs = np.stack([x, -x])
        assert_same_f32(f.matmul("blk.0.attn_v.weight", xs)[1],
                        f.matmul("blk.0.attn_v.weight", -x))
        # F16 weights multiply zero-copy with numba_qk's F16 numerics (docs/halfmat.md); F32
        # weights are not accelerated
        w16 = np.asarray(f.raw("blk.0.ffn_up.weight")).view(np.float16)
        assert_same_f32(f.matmul("blk.0.ffn_up.weight", x), qk.matmul(w16, x, lhs_format=qk.f16))
        with pytest.raises(gguf.GGUFError, match="F32: not accelerated"):
            f.matmul("blk.0.attn_q.weight", x)


def test_dequantize_every_type_matches_gguf_py(demo):
    with gguf.open(demo) as f:
        for t in f.tensors:
            got = f.dequantize(t.name)
            raw = np.asarray(f.raw(t.name))
            if t.type_name in ("F32", "F16"):
                want = raw.astype(np.float32)
            else:
                want = gguf_py.quants.dequantize(raw, gguf_py.GGMLQuantizationType[t.type_name])
            assert got.shape == t.shape and got.dtype == np.float32
            assert_same_f32(got, np.asarray(want, np.float32).reshape(t.shape), t.name)


def test_quantize_file_round_trip(demo, tmp_path):
    out = tmp_path / "q.gguf"
    lines = []
    results = gguf.quantize_file(demo, out, progress=lines.append)
    assert len(lines) == 8 and lines[0].startswith("[1/8] token_embd.weight")
    converted = {r.name for r in results if r.rms_error is not None}
    assert converted == {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                         "blk.0.ffn_down.weight"}
    assert all(0 < r.rms_error < 0.12 for r in results if r.rms_error is not None)
    with gguf.open(demo) as a, gguf.open(out) as b:
        assert a.metadata == b.metadata
        for t in a.tensors:
            tb = b.tensor(t.name)
            assert tb.shape == t.shape
            if t.name in converted:
                assert tb.format is qk.quant.q4_k
                want = qk.quantize(a.dequantize(t.name).reshape(-1, 256), format=qk.quant.q4_k)
                assert_same_records(b.records(t.name).reshape(-1, 144), want, t.name)
            else:
                assert tb.type_name == t.type_name
                assert np.array_equal(np.asarray(a.raw(t.name)), np.asarray(b.raw(t.name)))


def test_quantize_file_to_legacy_format(demo, tmp_path):
    out = tmp_path / "q8.gguf"
    gguf.quantize_file(demo, out, to=qk.quant.q8_0)
    with gguf.open(out) as b:
        assert b.tensor("blk.0.attn_q.weight").format is qk.quant.q8_0
    with pytest.raises(TypeError, match="weight format"):
        gguf.quantize_file(demo, tmp_path / "x.gguf", to=qk.quant.q8_k)


def _patched(demo, tmp_path, name, new_ne0=None, truncate=None):
    data = bytearray(Path(demo).read_bytes())
    if new_ne0 is not None:
        key = name.encode()
        at = data.index(key) + len(key) + 4  # then: n_dims (u32), ne0 (u64), ...
        data[at:at + 8] = int(new_ne0).to_bytes(8, "little")
    if truncate is not None:
        data = data[:truncate]
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    return path


def test_bad_files(demo, tmp_path):
    with pytest.raises(gguf.GGUFError, match="no such file"):
        gguf.open(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(gguf.GGUFError, match="not a GGUF file"):
        gguf.open(tmp_path / "text.gguf")
    with pytest.raises(gguf.GGUFError, match="truncated or corrupt"):
        gguf.open(_patched(demo, tmp_path, "", truncate=os.path.getsize(demo) - 5000))
    with pytest.raises(gguf.GGUFError, match="is Q4_K .blocks of 256. but its rows have 500"):
        gguf.open(_patched(demo, tmp_path, "blk.0.attn_k.weight", new_ne0=500))
    with pytest.raises(gguf.GGUFError, match="truncated or corrupt|does not match"):
        gguf.open(_patched(demo, tmp_path, "blk.0.attn_k.weight", new_ne0=512 * 64))


def test_cli_commands_on_the_embedded_default(tmp_path, run_cli):
    code, out, err = run_cli("inspect", cwd=tmp_path)
    assert code == 0, err
    assert "blk.0.attn_k.weight" in out and "IQ2_XXS" in out and "accelerated" in out
    code, out, err = run_cli("quantize", cwd=tmp_path)
    assert code == 0, err
    assert "4 tensors converted to Q4_K" in out and "[8/8]" in err
    assert (tmp_path / "numba_qk-demo-q4_k.gguf").exists()
    code, out, err = run_cli("bench", "--repeat", "2", cwd=tmp_path)
    assert code == 0, err
    assert "GB/s" in out and "blk.0.attn_v.weight" in out
    code, out, err = run_cli("inspect", tmp_path / "numba_qk-demo-q4_k.gguf", cwd=tmp_path)
    assert code == 0 and out.count("Q4_K") >= 5


def test_cli_errors_are_one_line_and_write_nothing(demo, tmp_path, run_cli):
    bad = _patched(demo, tmp_path, "", truncate=200)
    cases = [("inspect", str(tmp_path / "missing.gguf")), ("bench", str(tmp_path)),
             ("quantize", str(bad), str(tmp_path / "out.gguf")),
             ("quantize", str(demo), str(demo))]
    for args in cases:
        code, out, err = run_cli(*args, cwd=tmp_path)
        assert code == 1, (args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "out.gguf").exists()
    assert not [p for p in tmp_path.iterdir()
                if "numba_qk-tmp" in p.name or p.name.endswith(".tmp")]


# each format compiles its own file pipeline: two by default, the rest under -m slow
@pytest.mark.parametrize("name", default_few(["q2_k", "q3_k", "q5_k", "q6_k", "mxfp4", "nvfp4",
                                              "iq4_nl", "iq4_xs"], {"q6_k", "iq4_xs"}))
def test_record_files_are_accelerated_end_to_end(demo, tmp_path, name, capsys):
    """quantize_file(to=FORMAT), then inspect / dequantize / matmul accelerate those tensors: the
    records equal qk.quantize of the source, dequantize equals gguf-py's numpy decoders, matmul
    equals gemm against the paired activation (two Q8_0 records per NVFP4 record), inspect lists
    the format's kernels."""
    from numba_qk import __main__ as cli

    fmt = getattr(qk.quant, name)
    act = qk.activation_format(fmt)
    out = tmp_path / f"{name}.gguf"
    gguf.quantize_file(demo, out, to=fmt)
    assert fmt in gguf.ACCELERATED
    with gguf.open(demo) as a, gguf.open(out) as b:
        t = b.tensor("blk.0.attn_q.weight")
        assert t.format is fmt and t.accelerated
        want = qk.quantize(a.dequantize(t.name).reshape(-1, fmt.block_size), format=fmt)
        assert_same_records(b.records(t.name).reshape(-1, fmt.block_bytes), want, t.name)
        raw = np.asarray(b.raw(t.name))
        assert_same_f32(b.dequantize(t.name).reshape(-1),
                        gguf_py.quants.dequantize(raw, gguf_py.GGMLQuantizationType[fmt.name])
                        .reshape(-1))
        x = np.random.default_rng(0).standard_normal((2, t.shape[-1])).astype(np.float32)
        w = b.records(t.name)
        xq = qk.quantize(x.reshape(-1, act.block_size), format=act).reshape(2, -1,
                                                                             act.block_bytes)
        assert xq.shape[1] * act.block_size == w.shape[1] * fmt.block_size
        assert_same_f32(b.matmul(t.name, x), qk.gemm(w, xq, lhs_format=fmt, rhs_format=act))
    capsys.readouterr()
    assert cli.cmd_inspect(str(out)) == 0
    assert f"  {fmt.name}: quantize, dequantize, decode, dot with {act.name}, gemv/gemm/matmul" \
        in capsys.readouterr().out
