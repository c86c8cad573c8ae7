"""quantized_dot: bit-exact against the reference oracle on random and adversarial records."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref
from numba_qk.kernels import record_sums_q4_k_q8_k, record_value_q4_k_q8_k

from numba_qk.testing.asserts import assert_same_f32
from records import (F16_SPECIALS, F32_SPECIALS, f16_bits, f32_bits, pack_q4_k, pack_q8_k,
                     pair_with_sums, random_q4_k, random_q8_k)

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def qdot(w, x):
    return qk.quantized_dot(w, x, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)


def check_records(w, x):
    """Every record's v_b and (S_b, T_b), and the whole fold, against the reference."""
    for b in range(w.shape[0]):
        S, T = ref.record_sums(w[b].tobytes(), x[b].tobytes())
        assert tuple(record_sums_q4_k_q8_k(w, b, x, b)) == (S, T), f"record {b}"
        assert_same_f32(record_value_q4_k_q8_k(w, b, x, b),
                        ref.record_value(w[b].tobytes(), x[b].tobytes()), f"v_b of record {b}")
    assert_same_f32(qdot(w, x), ref.quantized_dot(w, x), "dot")


def test_result_is_0d_float32(rng):
    w, x = random_q4_k(rng, 3), random_q8_k(rng, 3)
    r = qdot(w, x)
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.float32


@pytest.mark.parametrize("seed", range(8))
def test_random_legal_records(seed):
    rng = np.random.default_rng(seed)
    g = 64
    w, x = random_q4_k(rng, g), random_q8_k(rng, g)
    check_records(w, x)
    # every prefix length folds the same way as the reference
    for n in (1, 2, 3, 17):
        assert_same_f32(qdot(w[:n], x[:n]), ref.quantized_dot(w[:n], x[:n]), f"G={n}")


def test_random_bytes_everywhere(rng):
    """Arbitrary bytes in both records: any f16/f32 pattern, inconsistent bsum (used as stored)."""
    for _ in range(16):
        w = rng.integers(0, 256, size=(32, 144), dtype=np.uint8)
        x = rng.integers(0, 256, size=(32, 292), dtype=np.uint8)
        check_records(w, x)


def test_g_zero_reads_nothing_and_is_plus_zero():
    w = np.empty((0, 144), np.uint8)
    x = np.empty((0, 292), np.uint8)
    r = qdot(w, x)
    assert r.dtype == np.float32 and int(r.view(np.uint32)) == 0


def _extreme_pair(xq_value, bsum_value=None, sc=63, m=63, wq=15):
    w = pack_q4_k(0x3C00, 0x3C00, [sc] * 8, [m] * 8, [wq] * 256)
    bsum = None if bsum_value is None else [bsum_value] * 16
    x = pack_q8_k(0x3F800000, [xq_value] * 256, bsum)
    return w, x


def test_largest_statistics():
    # |S_b| = 30965760 and |T_b| = 2064384: the spec's bounds for legal records
    w, x = _extreme_pair(-128)
    assert ref.record_sums(w.tobytes(), x.tobytes()) == (-30965760, -2064384)
    w2, x2 = _extreme_pair(127)
    check_records(np.stack([w, w2]), np.stack([x, x2]))
    # illegal bsum at the int16 extremes is still used exactly as stored
    for bs in (-32768, 32767):
        w3, x3 = _extreme_pair(-128, bsum_value=bs)
        S, T = ref.record_sums(w3.tobytes(), x3.tobytes())
        assert abs(T) == 63 * 8 * 2 * abs(bs)
        check_records(w3[None], x3[None])


@pytest.mark.parametrize("S", [2**24 + 1, 2**24 + 3, 2**24 + 5, -(2**24 + 1), -(2**24 + 3),
                               26000001, 26000003, -25999999, 16777215, 2**24 + 2])
def test_integer_to_f32_conversion_rounds_nearest_even(S):
    w, x = pair_with_sums(S, 0)
    assert ref.record_sums(w.tobytes(), x.tobytes()) == (S, 0)
    got = qdot(w[None], x[None])
    assert_same_f32(got, np.float32(float(S)))  # d = ds = 1: v = f32(S)
    check_records(w[None], x[None])


@pytest.mark.parametrize("d", sorted(F16_SPECIALS))
@pytest.mark.parametrize("dmin", ["+0", "-0", "min_sub", "max", "+inf", "-inf", "qnan", "one"])
def test_special_d_dmin(d, dmin):
    w, x = pair_with_sums(1234567, -4321, F16_SPECIALS[d], F16_SPECIALS[dmin])
    check_records(w[None], x[None])


@pytest.mark.parametrize("ds", sorted(F32_SPECIALS))
def test_special_ds(ds, rng):
    w = random_q4_k(rng, 4)
    x = random_q8_k(rng, 4)
    x[:, 0:4] = np.frombuffer(np.uint32(F32_SPECIALS[ds]).tobytes(), np.uint8)
    check_records(w, x)


def test_zero_statistics_give_signed_zeros():
    # S = T = 0: p = d * 0, n = dmin * 0, v = ds * (p - n); signs follow IEEE
    cases = []
    for d in ("one", "-one"):
        for dmin in ("one", "-one"):
            for ds in ("one", "-one"):
                w, x = pair_with_sums(0, 0, F16_SPECIALS[d], F16_SPECIALS[dmin], F32_SPECIALS[ds])
                cases.append((w, x))
    for w, x in cases:
        check_records(w[None], x[None])
    # G = 1 returns v_0 bit for bit: -0.0 stays -0.0 (no +0.0 seed)
    w, x = pair_with_sums(0, 0, F16_SPECIALS["one"], F16_SPECIALS["one"], F32_SPECIALS["-one"])
    r = qdot(w[None], x[None])
    assert int(r.view(np.uint32)) == 0x80000000
    r3 = qdot(np.stack([w] * 3), np.stack([x] * 3))
    assert int(r3.view(np.uint32)) == 0x80000000


def test_fold_overflows_to_inf_and_nan():
    big = F32_SPECIALS["max"]
    w_pos, x_pos = pair_with_sums(1, 0, ds_bits=big)            # v = FLT_MAX
    w_neg, x_neg = pair_with_sums(-1, 0, ds_bits=big)           # v = -FLT_MAX
    w_ninf, x_ninf = pair_with_sums(1, 0, ds_bits=F32_SPECIALS["-inf"])  # v = -inf
    w = np.stack([w_pos, w_pos, w_neg, w_ninf])
    x = np.stack([x_pos, x_pos, x_neg, x_ninf])
    check_records(w, x)
    # the fold is in record order: (big + big) + (-big) = inf, not big
    assert np.isposinf(qdot(w[:3], x[:3]))
    assert_same_f32(qdot(w[[0, 2, 1]], x[[0, 2, 1]]), np.float32(np.finfo(np.float32).max))
    assert np.isnan(qdot(w, x))  # inf + (-inf)


def test_q8_k_minus_128_and_product_difference_not_fused():
    # q = -128 everywhere; choose d, dmin so that p - n cancels: an FMA would keep extra bits
    rng = np.random.default_rng(7)
    for _ in range(50):
        sc = rng.integers(0, 64, 8).tolist()
        m = rng.integers(0, 64, 8).tolist()
        wq = rng.integers(0, 16, 256).tolist()
        d = f16_bits(np.float16(rng.uniform(0.001, 0.1)))
        w = pack_q4_k(d, d, sc, m, wq)
        x = pack_q8_k(f32_bits(np.float32(rng.uniform(0.5, 2))), [-128] * 256)
        check_records(w[None], x[None])


def test_odd_statistics_near_the_maximum():
    # large odd S_b (well above 2**24) from near-extreme fields: f32(S_b) must round, once
    rng = np.random.default_rng(11)
    seen = 0
    for _ in range(40):
        sc = rng.integers(60, 64, 8).tolist()
        wq = rng.integers(13, 16, 256).tolist()
        sign = 1 if rng.integers(2) else -1
        xq = (sign * rng.integers(120, 128, 256)).clip(-128, 127).tolist()
        w = pack_q4_k(0x3C00, 0x3C00, sc, [0] * 8, wq)
        x = pack_q8_k(0x3F800000, xq)
        S, _ = ref.record_sums(w.tobytes(), x.tobytes())
        if abs(S) > 2**24 and S % 2:
            seen += 1
            assert_same_f32(qdot(w[None], x[None]), np.float32(float(S)))
        check_records(w[None], x[None])
    assert seen >= 10


def test_fold_order_is_left_to_right():
    # values whose sum depends on the order: 1e8, 1, -1e8, 1, ...
    vals = [(1 << 24) + 0, 1, -((1 << 24) + 0), 3, 5]
    pairs = [pair_with_sums(v, 0) for v in vals]
    w = np.stack([p[0] for p in pairs])
    x = np.stack([p[1] for p in pairs])
    acc = np.float32(vals[0])
    for v in vals[1:]:
        acc = np.float32(acc + np.float32(v))
    assert_same_f32(qdot(w, x), acc)
    check_records(w, x)
