"""numba_qk.gguf.accelerate_gguf_py: gguf-py's quantize/dequantize routed through numba_qk give
gguf-py's exact bytes and values, type by type, with and without acceleration; idempotent;
restore_gguf_py undoes it; unrouted types, lazy inputs and non-finite values stay gguf-py's."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import gguf as qg  # noqa: E402

from qk_assert import assert_same_f32  # noqa: E402

T = gguf.GGMLQuantizationType
ROUTED = [f.name for f in qg.GGUF_PY_ROUTED]
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


@pytest.fixture
def original():
    qg.restore_gguf_py()
    yield gguf.quants.quantize, gguf.quants.dequantize
    qg.restore_gguf_py()


def _values(rng, n, block):
    x = (rng.standard_normal((n, block)) * 10.0 ** rng.uniform(-30, 30, (n, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0                        # all -0.0: gguf-py's d sign differs from ggml's (see gguf.py)
    x[2, 0] = -0.0
    x[2, 1:] = 0.0
    x[3] = np.arange(block)            # ties
    x[4] = np.abs(x[4])                # all positive
    x[5] = np.float32(1e-45) * np.arange(block)  # subnormals
    x[6] = np.float32(3.4e38)
    x[7, ::2] = -x[7, ::2]
    return x


def test_routes_cover_what_the_registry_binds():
    assert ROUTED == ["Q4_K", *LEGACY, "Q2_K", "Q3_K", "Q5_K", "Q6_K", "MXFP4", "NVFP4"]
    assert "Q8_1" not in ROUTED and "Q8_K" not in ROUTED
    assert gguf.GGML_QUANT_SIZES[T.Q8_1] == (32, 40)  # gguf-py's Q8_1 size is not ggml's 36 B
    assert qk.quant.q8_1.block_bytes == 36


@pytest.mark.parametrize("name", ROUTED)
def test_dequantize_is_gguf_py_bit_for_bit(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    raw = rng.integers(0, 256, (3, 5, 2 * fmt.block_bytes), dtype=np.uint8)  # 3-D, 2 per row
    raw[0, 0] = 0
    raw[0, 1] = 0xFF                   # NaN/inf scales
    with np.errstate(all="ignore"):
        want = original[1](raw, T[name])
    assert qg.accelerate_gguf_py() == qg.GGUF_PY_ROUTED
    assert gguf.quants.dequantize is not original[1] and gguf.dequantize is gguf.quants.dequantize
    got = gguf.quants.dequantize(raw, T[name])
    assert got.shape == want.shape == (3, 5, 2 * fmt.block_size) and got.dtype == np.float32
    assert_same_f32(got, want, name)
    ro = raw.copy()
    ro.flags.writeable = False
    assert_same_f32(gguf.dequantize(ro, T[name]), want, name)
    qg.restore_gguf_py()
    assert gguf.quants.dequantize is original[1] and gguf.dequantize is original[1]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_quantize_is_gguf_py_bit_for_bit(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    x = _values(rng, 64, fmt.block_size).reshape(8, 8 * fmt.block_size)
    with np.errstate(all="ignore"):
        want = original[0](x, T[name])
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T[name])
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero((got != want).reshape(64, -1).any(axis=1))
    assert bad.size == 0, f"{name}: blocks {bad} differ from gguf-py"
    # float64 / float16 inputs: converted to float32 as gguf-py does
    np.testing.assert_array_equal(gguf.quants.quantize(x.astype(np.float64), T[name]), want)


def test_mxfp4_quantize_is_gguf_py_bit_for_bit(rng, original):
    """gguf-py's MXFP4 encoder (numpy log2, argmin) gives ggml's bytes; so does the routed one."""
    fmt = qk.quant.mxfp4
    x = _values(rng, 64, 32)
    x[8:40, 0] = (np.ldexp(np.float32(1), rng.integers(-140, 127, 32)).astype(np.float32)
                  .view(np.uint32) - rng.integers(0, 3, 32).astype(np.uint32)).view(np.float32)
    x = x.reshape(8, 8 * 32)
    with np.errstate(all="ignore"):
        want = original[0](x, T.MXFP4)
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T.MXFP4)
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero((got != want).reshape(64, -1).any(axis=1))
    assert bad.size == 0, f"MXFP4: blocks {bad} differ from gguf-py"


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "NVFP4"])
def test_kquant_quantize_is_numba_qk_where_gguf_py_cannot(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    with pytest.raises(NotImplementedError):
        original[0](x, T[name])
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T[name])
    assert got.shape == (2, 3, 512 // fmt.block_size * fmt.block_bytes)
    np.testing.assert_array_equal(got.reshape(-1, fmt.block_bytes),
                                  qk.quantize(x.reshape(-1, fmt.block_size), format=fmt))
    # and gguf-py's own decoder reads it back as numba_qk does
    assert_same_f32(original[1](got, T[name]), qk.dequantize(got.reshape(-1, fmt.block_bytes),
                                                             fmt).reshape(2, 3, 512))


def test_unrouted_inputs_go_to_gguf_py(rng, original):
    qg.accelerate_gguf_py()
    x = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(gguf.quants.quantize(x, T.F16), original[0](x, T.F16))
    np.testing.assert_array_equal(gguf.quants.dequantize(x.view(np.uint8), T.F32), x)
    x[1, 5] = np.nan                                 # numba_qk rejects: gguf-py's bytes kept
    with np.errstate(all="ignore"):
        want = original[0](x, T.Q8_0)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(gguf.quants.quantize(x, T.Q8_0), want)
    with pytest.raises(gguf.quants.QuantError):      # gguf-py's own error for a bad row size
        gguf.quants.quantize(np.zeros((2, 33), np.float32), T.Q8_0)
    with pytest.raises(ValueError, match="not a multiple of Q4_K type size"):
        gguf.quants.dequantize(np.zeros((2, 145), np.uint8), T.Q4_K)
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(np.zeros((1, 40), np.uint8), T.Q8_1)


def test_accelerate_is_idempotent_and_restore_undoes_it(original):
    q, dq = original
    qg.restore_gguf_py()                             # no-op when not accelerated
    assert gguf.quants.quantize is q
    qg.accelerate_gguf_py()
    routed = gguf.quants.dequantize
    qg.accelerate_gguf_py()
    assert gguf.quants.dequantize is routed and routed.__wrapped__ is dq
    qg.restore_gguf_py()
    assert (gguf.quants.quantize, gguf.quants.dequantize, gguf.quantize, gguf.dequantize) == (
        q, dq, q, dq)
