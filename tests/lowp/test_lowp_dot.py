"""numba_qk.dot: exact integers for integer/packed types, a left-fold f64 sum for floats."""

import math
from fractions import Fraction

import numpy as np
import pytest

import numba_qk as qk


@pytest.mark.parametrize("t", [qk.i4, qk.u4, qk.u1, qk.i8, qk.u8], ids=str)
def test_int_dot_exact(t):
    rng = np.random.default_rng(1)
    v = rng.integers(t.min, t.max + 1, (3, 64))
    w = rng.integers(t.min, t.max + 1, (3, 64))
    a, b = qk.astype(v, t), qk.astype(w, t)
    assert qk.dot(a, b) == int((v.astype(object) * w.astype(object)).sum())
    assert isinstance(qk.dot(a, b), int)


def test_spec004_example_and_i32_extremes():
    codes = np.arange(16, dtype=np.uint8) % 8
    packed = qk.astype(codes, "int4")
    assert qk.dot(packed, packed) == int(codes.astype(np.int64) @ codes)
    i = np.array([2**31 - 1, -2**31, -2**31, 5] * 8, np.int32)
    assert qk.dot(i, i) == sum(int(x) ** 2 for x in i)          # > 2^63: no int64 overflow
    assert qk.dot(i[::-1], i) == sum(int(x) * int(y) for x, y in zip(i[::-1], i))


@pytest.mark.parametrize("t", [qk.bf16, qk.f16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e3m2, qk.e2m1, qk.f32],
                         ids=str)
def test_float_dot_left_fold(t):
    x = (np.random.default_rng(2).standard_normal(200) * 3).astype(np.float32)
    y = (np.random.default_rng(3).standard_normal(200) * 3).astype(np.float32)
    a, b = qk.astype(x, t), qk.astype(y, t)
    va = qk.astype(a, qk.f32).astype(np.float64) if t is not qk.f32 else x.astype(np.float64)
    vb = qk.astype(b, qk.f32).astype(np.float64) if t is not qk.f32 else y.astype(np.float64)
    acc = 0.0
    for p, q in zip(va, vb):
        assert Fraction(p) * Fraction(q) == Fraction(float(p * q))   # products are exact
        acc = acc + p * q
    got = qk.dot(a, b)
    assert got == acc and isinstance(got, float)
    assert qk.dot(a, b) == got                                        # deterministic


def test_dot_specials_and_errors():
    n = qk.astype(np.array([np.nan, 1], np.float32), qk.bf16)
    assert math.isnan(qk.dot(n, n))
    with pytest.raises(TypeError, match="differ"):
        qk.dot(qk.astype(np.zeros(4), qk.i4), qk.astype(np.zeros(4), qk.u4))
    with pytest.raises(ValueError, match="shapes"):
        qk.dot(qk.astype(np.zeros(4), qk.i4), qk.astype(np.zeros(6), qk.i4))
    with pytest.raises(TypeError, match="element type"):
        qk.dot(np.zeros(4), np.zeros(4))
    s = qk.astype(np.arange(16, dtype=np.float32).reshape(4, 4), qk.i8)
    assert qk.dot(s[:, ::2], s[:, 1::2]) == int((np.arange(16).reshape(4, 4)[:, ::2] *
                                                   np.arange(16).reshape(4, 4)[:, 1::2]).sum())
