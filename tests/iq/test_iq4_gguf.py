"""IQ4_NL / IQ4_XS in GGUF files: ``quantize_file(to=...)`` writes ggml's bytes, the tensors open
accelerated, dequantize equals gguf-py's numpy decoders (also routed by ``accelerate_gguf_py``,
tests/io/test_gguf_py_accel.py), and ``matmul`` equals ``gemm`` against the paired activation."""

from __future__ import annotations

import numpy as np
import pytest

gguf_py = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import gguf  # noqa: E402
from numba_qk.testing.asserts import assert_same_f32, assert_same_records  # noqa: E402


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return gguf.write_demo_model(tmp_path_factory.mktemp("gguf") / "demo.gguf", dim=256)


@pytest.mark.parametrize("name", ["iq4_nl", "iq4_xs"])
def test_iq4_files_are_accelerated_end_to_end(demo, tmp_path, name, capsys):
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
        xq = qk.quantize(x.reshape(-1, act.block_size), format=act).reshape(2, w.shape[1], -1)
        assert_same_f32(b.matmul(t.name, x), qk.gemm(w, xq, lhs_format=fmt, rhs_format=act))
    capsys.readouterr()
    assert cli.cmd_inspect(str(out)) == 0
    assert f"  {fmt.name}: quantize, dequantize, decode, dot with {act.name}, gemv/gemm/matmul" \
        in capsys.readouterr().out
