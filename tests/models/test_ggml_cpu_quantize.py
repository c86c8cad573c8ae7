"""``quantize(..., numerics="ggml_cpu")``: ggml's CPU activation quantizers (what llama.cpp runs
at run time), bit for bit against libggml-cpu's exported ``from_float`` on random and
adversarial blocks (ties, subnormal and huge extremes, +a/-a extremes, zero blocks)."""

import os

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import kernels
from numba_qk.errors import QuantizationDomainError
from numba_qk.formats import quant
from numba_qk.formats.ggml_types import GGMLType
from numba_qk.testing import ggml as ggml_bridge

GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()
CASES = [(quant.q8_0, GGMLType.Q8_0), (quant.q8_1, GGMLType.Q8_1), (quant.q8_k, GGMLType.Q8_K)]


def _blocks(blk, n=64, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, blk)).astype(np.float32)
          * (np.float32(10) ** rng.integers(-6, 6, (n, 1))).astype(np.float32)]
    for at, top in ((0, 127.0), (3, -127.0)):   # halves at id == 1: ties
        t = (rng.integers(-254, 255, (n, blk)) / 2).astype(np.float32)
        t[:, at] = top
        xs.append(t)
    z = np.zeros((n, blk), np.float32)          # tiny extremes (Q8_0/Q8_1: id overflows to inf)
    z[::2, 5], z[1::4, 7], z[2::4, 1] = ((1e-38, -3e-39, 1e-45) if blk == 32
                                         else (1e-30, -2e-36, 4e-37))
    xs.append(z)
    pm = rng.standard_normal((n, blk)).astype(np.float32)   # +a and -a both extreme
    pm[:, 4], pm[:, 9] = 9, -9
    pm[1::2, 4], pm[1::2, 9] = -9, 9
    xs.append(pm)
    xs.append(np.float32(3.0e38) * np.sign(rng.standard_normal((n, blk))).astype(np.float32))
    xs.append(np.zeros((n, blk), np.float32))
    return np.concatenate(xs)


@pytest.mark.skipif(GGML is None, reason="no ggml library (libggml-python / NUMBA_QK_GGML_LIB)")
@pytest.mark.parametrize("fmt,type_id", CASES, ids=[f.name for f, _ in CASES])
def test_ggml_cpu_quantizer_is_bit_identical_to_libggml_cpu(fmt, type_id):
    x = _blocks(fmt.block_size)
    want = ggml_bridge.quantize_row_cpu(GGML, type_id, x)
    got = qk.quantize(x, fmt, numerics="ggml_cpu")
    np.testing.assert_array_equal(got, want)
    # the @njit building block gives the same records
    out = np.zeros_like(want)
    assert getattr(kernels, f"quantize_{fmt.name.lower()}_ggml_cpu")(x.reshape(-1), out) == -1
    np.testing.assert_array_equal(out, want)


def test_ggml_cpu_numerics_differ_from_canonical_only_where_documented():
    # a tie: 0.5 * id with amax 127 -> ggml_cpu rounds to even (0), the _ref half away (1)
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 127.0, 0.5
    canon = qk.quantize(x, quant.q8_0)
    cpu = qk.quantize(x, quant.q8_0, numerics="ggml_cpu")
    assert np.int8(canon[0, 3]) == 1 and np.int8(cpu[0, 3]) == 0
    np.testing.assert_array_equal(canon[:, :3], cpu[:, :3])


def test_ggml_cpu_numerics_domain_and_errors():
    x = np.zeros((2, 32), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(QuantizationDomainError):
        qk.quantize(x, quant.q8_0, numerics="ggml_cpu")
    with pytest.raises(ValueError, match="numerics"):
        qk.quantize(x, quant.q4_0, numerics="ggml_cpu")
    with pytest.raises(ValueError, match="numerics"):
        qk.quantize(x, quant.q8_0, numerics="fast")
