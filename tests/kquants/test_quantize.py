"""quantize to Q8_K: bit-exact against the reference oracle, canonical decisions, domain."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref
from numba_qk.kernels import quantize_block_q8_k

from numba_qk.testing.asserts import assert_same_records

Q8 = qk.quant.q8_k
FMAX = np.finfo(np.float32).max
TINY_SUB = np.float32(1e-45)  # smallest positive subnormal


def quant(values, **kw):
    return qk.quantize(values, format=Q8, **kw)


def check(values):
    values = np.asarray(values, dtype=np.float32)
    got = quant(values)
    assert got.dtype == np.uint8 and got.shape == (values.shape[0], 292)
    assert got.flags.c_contiguous
    assert_same_records(got, ref.quantize(values))
    return got


def block(*pairs, fill=0.0):
    """A [1, 256] block: ``fill`` everywhere, then (index, value) pairs."""
    v = np.full(256, fill, dtype=np.float32)
    for i, x in pairs:
        v[i] = x
    return v[None]


@pytest.mark.parametrize("seed", range(6))
def test_random_blocks(seed):
    rng = np.random.default_rng(seed)
    g = 128
    scales = np.float32(10.0) ** rng.uniform(-30, 30, size=(g, 1)).astype(np.float32)
    values = (rng.standard_normal((g, 256)).astype(np.float32) * scales).astype(np.float32)
    check(values)
    heavy = rng.standard_cauchy((g, 256)).astype(np.float32)
    check(heavy)


def test_g_zero():
    out = quant(np.empty((0, 256), np.float32))
    assert out.shape == (0, 292) and out.dtype == np.uint8


def test_zero_blocks_either_sign():
    for fill in (0.0, -0.0):
        got = check(block(fill=fill))
        assert not got.any()  # ds = +0.0, q = 0, bsum = 0
    mixed = np.zeros((1, 256), np.float32)
    mixed[0, ::2] = -0.0
    assert not check(mixed).any()


def test_extreme_ties_pick_the_minimum():
    got = check(block((3, 3.0), (7, -3.0), (9, 1.5)))
    fields = qk.decode(got, Q8)
    # extreme = -3: inverse = +127/3, so -3 maps to -127 and +3 to +127
    assert fields.q[0, 7] == -127 and fields.q[0, 3] == 127
    assert fields.ds[0] > 0  # ds = 1 / inverse, inverse = -127 / extreme: sign opposite to extreme
    got2 = check(block((3, 3.0), (7, -2.0)))
    assert qk.decode(got2, Q8).q[0, 3] == -127  # extreme = +3 (larger magnitude)
    assert qk.decode(got2, Q8).ds[0] < 0


@pytest.mark.parametrize("extreme", [127.0, -127.0])
def test_round_half_even_ties(extreme):
    # |extreme| = 127 makes inverse = -+1 exactly, so scaled = -+value: .5 ties stay ties
    ties = [0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 126.5, -126.5, 64.5, 0.49999997, 2.5000002]
    pairs = [(0, extreme)] + [(1 + i, t) for i, t in enumerate(ties)]
    got = check(block(*pairs))
    q = qk.decode(got, Q8).q[0]
    sign = -1 if extreme > 0 else 1
    expect = [0, 2, 2, 4, 0, -2, -2, 126, -126, 64, 0, 3]
    assert [int(v) for v in q[1:1 + len(ties)]] == [sign * e for e in expect]


def test_subnormal_values_and_huge_values():
    check(block((0, 1.0), (1, TINY_SUB), (2, -TINY_SUB), (3, 1e-40), (4, -1e-39)))
    check(block((0, FMAX), (1, -FMAX), (2, 1e38), (3, TINY_SUB)))
    check(block((0, -FMAX), (1, 3e38), (2, -1.0)))
    check(block(fill=FMAX))
    check(block(fill=-3.0))  # all equal: every q = 127 or -127


def _finite_inverse(x) -> bool:
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.float32(-127.0) / np.float32(x)))


def inverse_boundary():
    """(largest positive f32 whose inverse overflows, smallest whose inverse is finite)."""
    lo, hi = 1, 0x7F7FFFFF  # bit patterns of positive floats; the order matches the values
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _finite_inverse(np.uint32(mid).view(np.float32)):
            hi = mid
        else:
            lo = mid
    return np.uint32(lo).view(np.float32), np.uint32(hi).view(np.float32)


def test_smallest_invertible_extreme():
    too_small, ok = inverse_boundary()
    assert 3e-37 < ok < 4e-37
    for sign in (1, -1):
        e = np.float32(sign * ok)
        got = check(block((5, e), (6, e / 2), (7, -e / 3)))
        assert qk.decode(got, Q8).q[0, 5] == -127
        bad = block((5, np.float32(sign * too_small)))
        with pytest.raises(qk.QuantizationDomainError) as info:
            quant(bad)
        assert info.value.block == 0 and "too small" in str(info.value)
        with pytest.raises(ref.ReferenceDomainError):
            ref.quantize(bad)


def test_subnormal_extreme_is_out_of_domain():
    with pytest.raises(qk.QuantizationDomainError, match="block 0: extreme"):
        quant(block((9, TINY_SUB)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_name_the_block(bad):
    values = np.ones((5, 256), np.float32)
    values[3, 17] = bad
    with pytest.raises(qk.QuantizationDomainError) as info:
        quant(values)
    assert info.value.block == 3
    assert "values[3, 17]" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_out_untouched_on_error():
    values = np.ones((4, 256), np.float32)
    values[2, 0] = np.nan
    out = np.full((4, 292), 0xAB, np.uint8)
    with pytest.raises(qk.QuantizationDomainError):
        quant(values, out=out)
    assert (out == 0xAB).all()


def test_out_is_filled_and_returned(rng):
    values = rng.standard_normal((3, 256)).astype(np.float32)
    out = np.zeros((3, 292), np.uint8)
    assert quant(values, out=out) is out
    assert_same_records(out, ref.quantize(values))
    buf = bytearray(3 * 292)
    mv = memoryview(buf).cast("B", (3, 292))
    assert quant(values, out=mv) is mv
    assert bytes(buf) == ref.quantize(values).tobytes()


def test_block_kernel_reports_domain_without_writing():
    out = np.full((3, 292), 7, np.uint8)
    v = np.ones((2, 256), np.float32)
    v[1, 4] = np.inf
    assert not quantize_block_q8_k(v, 1, out, 2)
    assert (out == 7).all()
    v[1, 4] = 2.0
    assert quantize_block_q8_k(v, 1, out, 2)
    assert out[2].tobytes() == ref.quantize_block(v[1])
    assert (out[:2] == 7).all()


def test_bsum_is_exact_and_records_valid(rng):
    values = rng.standard_normal((16, 256)).astype(np.float32)
    got = quant(values)
    f = qk.decode(got, Q8)
    assert (f.bsum == f.q.astype(np.int32).reshape(16, 16, 16).sum(axis=2)).all()
    assert qk.find_invalid_records(got, Q8).size == 0
