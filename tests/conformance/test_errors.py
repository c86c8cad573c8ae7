"""Bad input: clear errors that name the argument, what was expected and what was given."""

import numpy as np
import pytest

import numba_qk as qk

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
W = np.zeros((2, 144), np.uint8)
X = np.zeros((2, 292), np.uint8)
V = np.ones((2, 256), np.float32)


def qdot(w=W, x=X, **kw):
    args = dict(lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)
    args.update(kw)
    return qk.quantized_dot(w, x, **args)


@pytest.mark.parametrize("slot", ["lhs_format", "rhs_format"])
@pytest.mark.parametrize("bad, words", [
    ("q4_k", "the string 'q4_k'"), (np.dtype(np.uint8), "numpy dtype uint8"),
    (np.float32, "numpy dtype float32"), (None, "a NoneType"), (qk.f32, "numba_qk.f32")])
def test_dot_format_slots(slot, bad, words):
    with pytest.raises(TypeError) as info:
        qdot(**{slot: bad})
    assert slot in str(info.value) and words in str(info.value)


def test_dot_wrong_format_for_slot():
    with pytest.raises(TypeError, match=r"lhs_format: quantized_dot expects numba_qk.quant.q4_k "
                                        r"\(Q4_K\), .*; got numba_qk.quant.q8_k"):
        qdot(lhs_format=Q8, rhs_format=Q4)
    with pytest.raises(TypeError, match=r"rhs_format: quantized_dot expects numba_qk.quant.q8_k "
                                        r"\(Q8_K\) to pair with Q4_K weights, got "
                                        r"numba_qk.quant.q8_0"):
        qdot(rhs_format=qk.quant.q8_0)
    with pytest.raises(TypeError, match=r"expects numba_qk.quant.q8_1 \(Q8_1\) to pair with Q4_1"):
        qdot(lhs_format=qk.quant.q4_1, rhs_format=qk.quant.q8_0)


@pytest.mark.parametrize("bad", [np.float32, "f32", qk.quant.q8_k, np.dtype("float64")])
def test_acc_dtype(bad):
    with pytest.raises(TypeError, match="acc_dtype"):
        qdot(acc_dtype=bad)


@pytest.mark.parametrize("dtype", [np.int8, np.float32, np.uint16, np.int64])
def test_dot_record_dtypes(dtype):
    with pytest.raises(TypeError, match=r"lhs: expected uint8 Q4_K records, got dtype"):
        qdot(w=W.astype(dtype))
    with pytest.raises(TypeError, match=r"rhs: expected uint8 Q8_K records, got dtype"):
        qdot(x=X.astype(dtype))


@pytest.mark.parametrize("shape", [(144,), (2, 145), (2, 143), (1, 2, 144), (2, 292)])
def test_dot_lhs_shapes(shape):
    with pytest.raises(ValueError, match=r"lhs: expected shape \[G, 144\]"):
        qdot(w=np.zeros(shape, np.uint8))


def test_dot_g_mismatch():
    with pytest.raises(ValueError, match="lhs has 2, rhs has 3"):
        qdot(x=np.zeros((3, 292), np.uint8))


def test_dot_non_buffer():
    with pytest.raises(TypeError, match="lhs: expected a numpy array or a buffer-protocol object, got list"):
        qdot(w=[[0] * 144] * 2)
    with pytest.raises(ValueError, match=r"got \(288,\)"):
        qdot(w=bytes(288))


def test_dot_out():
    out = np.full((), 5.0, np.float32)
    assert qdot(out=out) is out and float(out) == 0.0
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        qdot(out=np.zeros((), np.float64))
    with pytest.raises(ValueError, match="out: expected shape"):
        qdot(out=np.zeros(1, np.float32))
    ro = np.zeros((), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        qdot(out=ro)


@pytest.mark.parametrize("bad", ["q8_k", np.dtype(np.int8), qk.f32, None])
def test_quantize_format(bad):
    with pytest.raises(TypeError, match="format: quantize expects numba_qk.quant.q8_k"):
        qk.quantize(V, format=bad)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, ">f4"])
def test_quantize_dtypes(dtype):
    with pytest.raises(TypeError, match=r"values: expected float32 values, got dtype"):
        qk.quantize(V.astype(dtype), format=Q8)


@pytest.mark.parametrize("shape", [(256,), (2, 255), (2, 512), (1, 1, 256), ()])
def test_quantize_shapes(shape):
    with pytest.raises(ValueError, match=r"values: expected shape \[G, 256\]"):
        qk.quantize(np.zeros(shape, np.float32), format=Q8)


def test_quantize_out_checks_leave_out_untouched():
    for out, exc, words in [
        (np.zeros((2, 292), np.int8), TypeError, "out: expected dtype uint8"),
        (np.zeros((3, 292), np.uint8), ValueError, r"out: expected shape \[2, 292\]"),
        (np.zeros((2, 291), np.uint8), ValueError, "out: expected shape"),
    ]:
        out[...] = 9
        with pytest.raises(exc, match=words):
            qk.quantize(V, format=Q8, out=out)
        assert (out == 9).all()
    ro = np.full((2, 292), 9, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        qk.quantize(V, format=Q8, out=ro)
    with pytest.raises(ValueError, match="read-only"):
        qk.quantize(V, format=Q8, out=memoryview(bytes(2 * 292)).cast("B", (2, 292)))


def test_quantize_out_overlapping_input():
    buf = np.zeros(2 * 292 * 4, np.uint8)
    values = buf[: 2 * 256 * 4].view(np.float32).reshape(2, 256)
    values[...] = 1.0
    out = buf[: 2 * 292].reshape(2, 292)
    with pytest.raises(ValueError, match="overlaps"):
        qk.quantize(values, format=Q8, out=out)


@pytest.mark.parametrize("fn", [qk.decode, qk.dequantize, qk.find_invalid_records])
def test_decode_family(fn):
    with pytest.raises(TypeError, match="format: .* expects one of"):
        fn(W, "q4_k")
    with pytest.raises(TypeError, match="expects one of"):
        fn(W, qk.f32)
    with pytest.raises(ValueError, match=r"records: expected shape \[G, 292\]"):
        fn(W, Q8)
    with pytest.raises(TypeError, match="records: expected uint8"):
        fn(W.view(np.int8), Q4)
