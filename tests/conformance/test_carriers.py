"""Any buffer in: read-only memory maps, unaligned and strided views, memoryviews -- same bits."""

import numpy as np
import pytest

import numba_qk as qk

from numba_qk.testing.asserts import assert_same_f32, assert_same_records
from records import random_q4_k, random_q8_k

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def qdot(w, x):
    return qk.quantized_dot(w, x, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)


@pytest.fixture
def data(rng):
    g = 9
    values = rng.standard_normal((g, 256)).astype(np.float32)
    w = random_q4_k(rng, g)
    x = qk.quantize(values, format=Q8)
    return values, w, x, qdot(w, x), qk.quantize(values, format=Q8)


def test_read_only_memmap(tmp_path, data):
    values, w, x, want, want_q = data
    paths = {}
    for name, arr in (("w", w), ("x", x), ("v", values)):
        paths[name] = tmp_path / name
        arr.tofile(paths[name])
    wm = np.memmap(paths["w"], dtype=np.uint8, mode="r", shape=w.shape)
    xm = np.memmap(paths["x"], dtype=np.uint8, mode="r", shape=x.shape)
    vm = np.memmap(paths["v"], dtype=np.float32, mode="r", shape=values.shape)
    assert not wm.flags.writeable
    assert_same_f32(qdot(wm, xm), want)
    assert_same_records(qk.quantize(vm, format=Q8), want_q)
    assert_same_records(qk.decode(wm, Q4).q, qk.decode(w, Q4).q)


def test_unaligned_views_of_a_bytes_buffer(data):
    values, w, x, want, want_q = data
    for offset in (1, 2, 3):
        raw = b"\0" * offset + values.tobytes()
        v = np.frombuffer(raw, dtype=np.float32, offset=offset).reshape(values.shape)
        assert not v.flags.aligned and not v.flags.writeable
        assert_same_records(qk.quantize(v, format=Q8), want_q)
        wraw = b"\0" * offset + w.tobytes()
        wv = np.frombuffer(wraw, dtype=np.uint8, offset=offset).reshape(w.shape)
        assert_same_f32(qdot(wv, x), want)


def test_non_contiguous_views(data):
    values, w, x, want, want_q = data
    # records as a column window of a wider table, and every other row of a doubled table
    wide = np.zeros((w.shape[0], 200), np.uint8)
    wide[:, 33:177] = w
    assert_same_f32(qdot(wide[:, 33:177], x), want)
    doubled = np.repeat(x, 2, axis=0)
    assert_same_f32(qdot(w, doubled[::2]), want)
    fortran = np.asfortranarray(values)
    assert_same_records(qk.quantize(fortran, format=Q8), want_q)
    strided = np.zeros((values.shape[0], 512), np.float32)
    strided[:, ::2] = values
    assert_same_records(qk.quantize(strided[:, ::2], format=Q8), want_q)
    out = np.zeros((values.shape[0] * 2, 292), np.uint8)
    qk.quantize(values, format=Q8, out=out[::2])
    assert_same_records(out[::2], want_q)
    assert not out[1::2].any()


def test_memoryviews(data):
    values, w, x, want, want_q = data
    assert_same_f32(qdot(memoryview(w), memoryview(x)), want)
    mv = memoryview(values.tobytes()).cast("f", values.shape)
    assert_same_records(qk.quantize(mv, format=Q8), want_q)
    wmv = memoryview(bytearray(w.tobytes())).cast("B", w.shape)
    assert_same_f32(qdot(wmv, x), want)


def test_readonly_inputs_through_decode_and_dequantize(data):
    _, w, x, _, _ = data
    w2 = w.copy()
    w2.flags.writeable = False
    assert_same_f32(qk.dequantize(w2, Q4), qk.dequantize(w, Q4))
    x2 = x.copy()
    x2.flags.writeable = False
    assert_same_f32(qk.decode(x2, Q8).ds, qk.decode(x, Q8).ds)
