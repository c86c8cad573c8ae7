"""hypothesis property tests for Q2_K/Q3_K/Q5_K/Q6_K: record dot == oracle on arbitrary bytes,
encoder == ggml on arbitrary finite f32 blocks (extremes, subnormals, -0.0 mixed freely),
block independence and determinism, dequantize == ggml on arbitrary bytes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from numba_qk.testing.reference import kquants as ref

from numba_qk.testing.asserts import assert_same_f32, assert_same_records
from test_kquants import FORMATS, GGML, IDS

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
# a block is either arbitrary finite floats or a scaled normal-ish pattern with such floats mixed in
blocks = st.integers(1, 3).flatmap(lambda g: arrays(np.float32, (g, 256), elements=finite_f32))
scaled_blocks = st.tuples(st.integers(1, 3), st.integers(0, 2 ** 32 - 1),
                          st.floats(-40, 38), finite_f32).map(
    lambda t: _scaled(*t))


def _scaled(g, seed, exponent, extra):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((g, 256)) * 10.0 ** exponent).astype(np.float32)
    x[rng.random((g, 256)) < 0.05] = extra
    x[~np.isfinite(x)] = 0.0
    return x


def pairs(f):
    return st.integers(1, 4).flatmap(lambda g: st.tuples(
        arrays(np.uint8, (g, f.nbytes)), arrays(np.uint8, (g, 292))))


@pytest.mark.parametrize("f", FORMATS, ids=IDS)
def test_record_values_and_dot_match_oracle_on_any_bytes(f):
    @SETTINGS
    @given(pairs(f))
    def run(wx):
        w, x = wx
        for b in range(w.shape[0]):
            assert_same_f32(f.record_value(w, b, x, b), ref.record_value(f.NAME, w[b], x[b]))
        assert_same_f32(f.dot(w, x), ref.quantized_dot(f.NAME, w, x))

    run()


@pytest.mark.skipif(GGML is None, reason="libggml-python not installed")
@pytest.mark.parametrize("f", FORMATS, ids=IDS)
def test_encoder_matches_ggml_on_any_finite_block(f):
    @SETTINGS
    @given(st.one_of(blocks, scaled_blocks))
    def run(x):
        assert_same_records(f.quantize(x), GGML.quantize_ref(f.type_id, x), f.NAME)

    run()


@pytest.mark.parametrize("f", FORMATS, ids=IDS)
def test_encoder_blocks_are_independent_and_deterministic(f):
    @SETTINGS
    @given(scaled_blocks, scaled_blocks)
    def run(a, b):
        both = f.quantize(np.concatenate([a, b]))
        assert_same_records(both, np.concatenate([f.quantize(a), f.quantize(b)]))
        assert_same_records(f.quantize(np.concatenate([a, b])), both)

    run()


@pytest.mark.skipif(GGML is None, reason="libggml-python not installed")
@pytest.mark.parametrize("f", FORMATS, ids=IDS)
def test_dequantize_matches_ggml_on_any_bytes(f):
    @SETTINGS
    @given(st.integers(1, 8).flatmap(lambda g: arrays(np.uint8, (g, f.nbytes))))
    def run(r):
        assert_same_f32(f.dequantize(r), GGML.dequantize(f.type_id, r), f.NAME)

    run()
