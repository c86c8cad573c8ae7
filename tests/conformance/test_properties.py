"""hypothesis property tests: agreement with the oracle, block independence, determinism,
decode totality, and the quantize/dequantize error bound."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import numba_qk as qk
from numba_qk.testing.reference import core as ref

from numba_qk.testing.asserts import assert_same_f32, assert_same_records

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
blocks = st.integers(1, 4).flatmap(
    lambda g: arrays(np.float32, (g, 256), elements=finite_f32))
weird_blocks = st.integers(1, 3).flatmap(
    lambda g: arrays(np.float32, (g, 256), elements=any_f32))
record_pairs = st.integers(1, 6).flatmap(lambda g: st.tuples(
    arrays(np.uint8, (g, 144)), arrays(np.uint8, (g, 292))))


def _ref_or_error(values):
    try:
        return ref.quantize(values), None
    except ref.ReferenceDomainError as e:
        return None, e.block


@SETTINGS
@given(weird_blocks)
def test_quantize_agrees_with_oracle_or_both_reject(values):
    want, bad = _ref_or_error(values)
    try:
        got = qk.quantize(values, format=Q8)
    except qk.QuantizationDomainError as e:
        assert e.block == bad
        return
    assert bad is None
    assert_same_records(got, want)


@SETTINGS
@given(blocks, blocks)
def test_quantize_blocks_are_independent(a, b):
    both = np.concatenate([a, b])
    _, bad = _ref_or_error(both)
    if bad is not None:
        return
    whole = qk.quantize(both, format=Q8)
    assert_same_records(whole, np.concatenate([qk.quantize(a, format=Q8),
                                               qk.quantize(b, format=Q8)]))


@SETTINGS
@given(arrays(np.float32, (2, 256), elements=st.floats(-2.0**100, 2.0**100, width=32)))
def test_quantize_dequantize_error_bound(values):
    _, bad = _ref_or_error(values)
    if bad is not None:
        return
    rec = qk.quantize(values, format=Q8)
    back = qk.dequantize(rec, Q8).astype(np.float64)
    ds = np.abs(qk.decode(rec, Q8).ds.astype(np.float64))[:, None]
    # |x - ds*q| <= |ds|/2 plus a few f32 ulps of rounding in inverse, ds and the products
    err = np.abs(values.astype(np.float64) - back)
    bound = ds * 0.5 * (1 + 1e-5) + np.abs(values) * 1e-6 + 1e-44
    assert (err <= bound).all()


@SETTINGS
@given(record_pairs)
def test_dot_agrees_with_oracle_on_any_bytes(pair):
    w, x = pair
    got = qk.quantized_dot(w, x, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)
    assert_same_f32(got, ref.quantized_dot(w, x))
    again = qk.quantized_dot(w, x, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)
    assert_same_f32(again, got)  # deterministic


@SETTINGS
@given(record_pairs)
def test_dot_is_the_fold_of_single_record_dots(pair):
    w, x = pair
    parts = [qk.quantized_dot(w[b:b + 1], x[b:b + 1], lhs_format=Q4, rhs_format=Q8)
             for b in range(w.shape[0])]
    acc = parts[0]
    with np.errstate(all="ignore"):
        for p in parts[1:]:
            acc = np.float32(acc + p)
    assert_same_f32(qk.quantized_dot(w, x, lhs_format=Q4, rhs_format=Q8), acc)


@SETTINGS
@given(record_pairs)
def test_decode_is_total(pair):
    w, x = pair
    f4 = qk.decode(w, Q4)
    assert f4.sc.max(initial=0) < 64 and f4.m.max(initial=0) < 64 and f4.q.max(initial=0) < 16
    f8 = qk.decode(x, Q8)
    assert f8.q.shape == (x.shape[0], 256)
    qk.dequantize(w, Q4)
    qk.dequantize(x, Q8)
