"""astype carriers, layouts, out= validation, threads; Tensor semantics (spec 004)."""

import threading

import numpy as np
import pytest

import numba_qk as qk
from subsets import default_few

ml = pytest.importorskip("ml_dtypes")


def ref_bits(x, t):
    """Expected codes via the public scalar path (the oracle), one per element."""
    flat = np.asarray(x, np.float64).reshape(-1)
    return np.array([t(float(v)).bits for v in flat], np.int64)


def codes(res):
    if isinstance(res, qk.Tensor):
        return res.codes().reshape(-1).astype(np.int64)
    return res.reshape(-1).view(f"u{res.dtype.itemsize}").astype(np.int64)


TYPES = [qk.f32, qk.f16, qk.bf16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e3m2, qk.e2m1, qk.e8m0, qk.i8,
         qk.u8, qk.i32, qk.i4, qk.u4, qk.u1]


@pytest.mark.parametrize("t", default_few(TYPES, {"F16", "BF16", "E4M3", "E2M1", "I4", "U1"}))
def test_any_rank_any_strides(t):
    rng = np.random.default_rng(1)
    base = (rng.standard_normal((4, 6, 5, 32)) * 4).astype(np.float32)
    views = [base, base[:, ::2, :, ::-1], base.transpose(3, 1, 0, 2)[..., :4].copy().transpose(0, 2, 1, 3),
             base[1, 2, 3], base[::3, :, 1:2, :16], np.asfortranarray(base)]
    for v in views:
        if t.block_size > 1 and v.shape[-1] % t.block_size:
            continue
        r = qk.astype(v, t)
        assert r.shape == v.shape
        assert codes(r).tolist() == ref_bits(v, t).tolist()
        store = r.storage if isinstance(r, qk.Tensor) else r
        assert store.flags.c_contiguous


def test_zero_d_and_empty():
    assert qk.astype(np.float32(1.5).reshape(()), qk.bf16).codes().tolist() == 0x3FC0
    e = qk.astype(np.zeros((3, 0), np.float32), qk.e4m3)
    assert e.shape == (3, 0) and e.nbytes == 0
    with pytest.raises(ValueError, match="multiple of 2"):
        qk.astype(np.zeros((3, 5), np.float32), qk.i4)


def test_return_types():
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    for t, kind in [(qk.f32, np.float32), (qk.f16, np.float16), (qk.i8, np.int8), (qk.u8, np.uint8),
                    (qk.i32, np.int32)]:
        r = qk.astype(x, t)
        assert type(r) is np.ndarray and r.dtype == kind
    for t in (qk.bf16, qk.e4m3, qk.i4, qk.u1, qk.e8m0):
        assert isinstance(qk.astype(x, t), qk.Tensor)
    assert qk.astype(x, "bfloat16").dtype is qk.bf16


from test_lowp_types import DTYPE_TYPES as NUMPY_TARGETS  # noqa: E402


@pytest.mark.parametrize("sctype,t", NUMPY_TARGETS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_numpy_and_ml_dtypes_targets_equal_the_numba_qk_type(sctype, t):
    """``astype(x, numpy.float16)``, ``astype(x, numpy.dtype(ml_dtypes.float8_e4m3fn))`` ... are
    ``astype(x, <the numba_qk type of that format>)``: the same result type (ndarray for numpy's
    dtypes, Tensor otherwise), dtype, shape and codes; also via ``out=``, ``Tensor.astype``,
    ``Tensor(..., dtype=)`` and ScaledTensor decode (issue 21 C)."""
    x = (np.random.default_rng(2).standard_normal((3, 32)) * 4).astype(np.float32)
    want = qk.astype(x, t)
    for spelling in (sctype, np.dtype(sctype)):
        got = qk.astype(x, spelling)
        assert type(got) is type(want) and got.dtype == want.dtype and got.shape == want.shape
        assert codes(got).tolist() == codes(want).tolist()
        out = np.zeros_like(want) if isinstance(want, np.ndarray) else want.copy()
        codes_before = codes(out)
        assert qk.astype(-x, spelling, out=out) is out
        assert codes(out).tolist() == codes(qk.astype(-x, t)).tolist() != codes_before.tolist()
        if t in (qk.f16, qk.e4m3, qk.i4):   # the other sources take the same lookup (each
            b = qk.astype(x, qk.bf16)        # (source, target) pair compiles a converter)
            assert codes(b.astype(spelling)).tolist() == codes(qk.astype(b, t)).tolist()
            st = qk.astype(x, qk.mx.mxfp4)
            assert codes(st.astype(spelling)).tolist() == codes(qk.astype(st, t)).tolist()
        raw = qk.Tensor(want.storage if isinstance(want, qk.Tensor) else want, dtype=spelling)
        assert raw.dtype is t and raw.shape == want.shape


@pytest.mark.slow  # default run under 10 minutes (a sweep over every source type)
def test_sources_ints_bool_f16_buffers():
    ints = np.array([-129, -8, -1, 0, 1, 7, 8, 300], np.int16)
    for dt in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64):
        with np.errstate(over="ignore"):
            a = ints.astype(dt)
        assert codes(qk.astype(a, qk.i4)).tolist() == [qk.i4(int(v)).bits for v in a]
        if dt in (np.int32, np.int64, np.uint64):     # others are exact in f32 (compile less)
            assert np.array_equal(qk.astype(a, qk.f32), a.astype(np.float32))
    b = np.array([True, False] * 4)
    assert qk.astype(b, qk.u1).storage.tolist() == [0b10101010]
    h = np.array([1.5, -2.25, 65504, np.inf], np.float16)
    assert np.array_equal(qk.astype(h, qk.f32), h.astype(np.float32))
    assert qk.astype(bytearray(b"\x01\x02"), qk.f32).tolist() == [1.0, 2.0]
    assert qk.astype(memoryview(np.float32([0.5, 2])), qk.bf16).codes().tolist() == [0x3F00, 0x4000]
    ro = np.arange(8, dtype=np.float32)
    ro.flags.writeable = False
    assert qk.astype(ro, qk.e4m3).shape == (8,)
    unaligned = np.frombuffer(b"\x00" + np.arange(4, dtype=np.float32).tobytes(), np.float32, 4, 1)
    assert qk.astype(unaligned, qk.bf16).numpy().astype(np.float32).tolist() == [0, 1, 2, 3]
    be = np.array([1.5, -2.0, 3e38], ">f4")                    # non-native byte order
    assert qk.astype(be, qk.bf16).codes().tolist() == qk.astype(be.astype("<f4"), qk.bf16).codes().tolist()
    assert qk.astype(np.array([300, -5], ">i8"), qk.i8).tolist() == [127, -5]
    with pytest.raises(TypeError, match="unsupported source dtype"):
        qk.astype(np.zeros(2, np.complex64), qk.f32)
    with pytest.raises(TypeError):
        qk.astype([1.0, 2.0], qk.f32)


def test_same_type_is_independent_copy():
    t = qk.astype(np.array([1, 2, 3, 4], np.float32), qk.bf16)
    nan = qk.Tensor(np.array([0x7FC1, 0xFF81], np.uint16), dtype=qk.bf16)   # payloads kept
    c = qk.astype(nan, qk.bf16)
    assert c.codes().tolist() == [0x7FC1, 0xFF81]
    c2 = qk.astype(t, qk.bf16)
    c2.storage[0] = 0
    assert t.codes()[0] == 0x3F80
    p = qk.astype(np.arange(8) - 4, qk.i4)
    assert qk.astype(p, qk.i4).storage.tolist() == p.storage.tolist()


# ---- out= --------------------------------------------------------------------------------

def test_out_returned_and_filled():
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32)
    out = np.empty((8, 16), np.float16)
    assert qk.astype(x, qk.f16, out=out) is out
    assert np.array_equal(out, x.astype(np.float16))
    ob = np.empty((8, 16), ml.bfloat16)
    assert qk.astype(x, qk.bf16, out=ob) is ob and np.array_equal(ob, x.astype(ml.bfloat16))
    ot = qk.astype(np.zeros((8, 16), np.float32), qk.i4)
    assert qk.astype(x, qk.i4, out=ot) is ot
    assert ot.codes().tolist() == qk.astype(x, qk.i4).codes().tolist()
    mv = memoryview(bytearray(8 * 16 * 4)).cast("B").cast("f", (8, 16))
    assert qk.astype(x, qk.f32, out=mv) is mv
    assert np.array_equal(np.asarray(mv), x)


@pytest.mark.parametrize("make_out, err, match", [
    (lambda: np.full((8, 16), 7, np.float32), TypeError, "dtype"),
    (lambda: np.full((8, 15), 7, np.float16), ValueError, "shape"),
    (lambda: np.full((16, 16), 7, np.float16)[::2], ValueError, "C-contiguous"),
    (lambda: np.full((16, 8), 7, np.float16).T, ValueError, "shape|C-contiguous"),
    (lambda: _readonly(np.full((8, 16), 7, np.float16)), ValueError, "read-only"),
    (lambda: np.full((8, 16), 7, np.uint16), TypeError, "dtype"),
])
def test_out_errors_leave_out_untouched(make_out, err, match):
    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    out = make_out()
    before = np.array(out, copy=True)
    with pytest.raises(err, match=match):
        qk.astype(x, qk.f16, out=out)
    assert np.array_equal(np.asarray(out), before)


def _readonly(a):
    a.flags.writeable = False
    return a


def test_out_overlap_and_packed_needs_tensor():
    buf = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        qk.astype(buf[:32], qk.f32, out=buf[16:48])
    raw = np.zeros(8, np.uint8)
    with pytest.raises(TypeError, match="Tensor out"):
        qk.astype(np.zeros(16, np.float32), qk.i4, out=raw)
    assert raw.tolist() == [0] * 8
    wrong = qk.astype(np.zeros(16, np.float32), qk.u4)
    with pytest.raises(TypeError, match="U4"):
        qk.astype(np.zeros(16, np.float32), qk.i4, out=wrong)
    inplace = np.arange(16, dtype=np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        qk.astype(inplace, qk.f32, out=inplace)
    with pytest.raises(ValueError, match="threads"):
        qk.astype(inplace, qk.f16, threads=0)


# ---- threads and the GIL --------------------------------------------------------------------

@pytest.mark.parametrize("t", [qk.bf16, qk.i4, qk.u1, qk.e2m3], ids=str)
@pytest.mark.parametrize("shape", [(1 << 14,), (3, 1024), (1, 5, 512), (7, 3, 64)])
def test_threads_identical(t, shape):
    x = (np.random.default_rng(4).standard_normal(shape) * 5).astype(np.float32)
    one = codes(qk.astype(x, t))
    for n in (2, 3, 8):
        assert np.array_equal(codes(qk.astype(x, t, threads=n)), one)
        assert np.array_equal(codes(qk.astype(x[..., ::-1], t, threads=n)),
                              codes(qk.astype(np.ascontiguousarray(x[..., ::-1]), t)))


def test_threads_none_means_every_core_like_the_products(monkeypatch):
    """``threads=None`` is accepted by casts, ScaledTensor encode/decode and Tensor.astype as by
    the products (one check, ``_validate.check_threads``): every core, the same bits (issue 21
    D); a bad count is still an error naming ``threads``."""
    from numba_qk import _threads, _validate

    asked = []
    real = _threads.effective_threads
    monkeypatch.setattr(_threads, "effective_threads", lambda n, p: asked.append(n) or real(n, p))
    x = (np.random.default_rng(6).standard_normal((4, 1024)) * 5).astype(np.float32)
    for t in (qk.bf16, qk.i4, qk.f16):
        assert np.array_equal(codes(qk.astype(x, t, threads=None)), codes(qk.astype(x, t)))
    b = qk.astype(x, qk.bf16)
    assert np.array_equal(b.astype(qk.f32, threads=None), qk.astype(b, qk.f32))
    st = qk.astype(x, qk.mx.mxfp4, threads=None)
    assert np.array_equal(st.elements.storage, qk.astype(x, qk.mx.mxfp4).elements.storage)
    assert np.array_equal(qk.astype(st, qk.f32, threads=None), qk.astype(st, qk.f32))
    assert np.array_equal(st.astype(qk.bf16, threads=None).storage,
                          qk.astype(st, qk.bf16).storage)
    if _threads.cpu_count() > 1:
        assert asked and set(asked) == {_threads.cpu_count()}
    from numba_qk import cast
    assert cast._check_threads is _validate.check_threads      # the products' one copy
    for bad, err in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                     ("2", TypeError)):
        with pytest.raises(err, match="threads: expected a positive int or None"):
            qk.astype(x, qk.bf16, threads=bad)
        with pytest.raises(err, match="threads"):
            qk.astype(x, qk.mx.mxfp4, threads=bad)
        with pytest.raises(err, match="threads"):
            qk.astype(st, qk.f32, threads=bad)


def test_python_threads_concurrently():
    x = np.random.default_rng(5).standard_normal(1 << 16).astype(np.float32)
    want = codes(qk.astype(x, qk.e4m3))
    res = [None] * 4

    def work(i):
        res[i] = codes(qk.astype(x, qk.e4m3))

    ths = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    assert all(np.array_equal(r, want) for r in res)


def test_kernels_release_the_gil():
    from numba_qk.kernels.lowp import codecs as lowp
    assert all(k.targetoptions.get("nogil") for k in lowp._CONVERTERS.values())


# ---- Tensor -----------------------------------------------------------------------------------

def test_spec004_packed_example():
    c = np.arange(16, dtype=np.uint8) % 8
    packed = qk.astype(c, "int4")
    assert packed.shape == (16,) and packed.nbytes == 8
    assert np.asarray(packed).shape == (8,) and memoryview(packed.data).shape == (8,)
    assert qk.Tensor(np.asarray(packed.data), dtype="int4").shape == (16,)
    assert packed[3] == 3
    assert packed.storage[0] == 0x01 and packed.storage[1] == 0x23         # element 0: high nibble


def test_u1_matches_packbits_and_e2m1_nibbles():
    bits = np.random.default_rng(6).integers(0, 2, (3, 64)).astype(np.uint8)
    t = qk.astype(bits, qk.u1)
    assert np.array_equal(t.storage, np.packbits(bits, axis=-1))
    assert np.array_equal(t.codes(), bits)
    x = np.array([0.5, -6, 1.5, 3, 0, -0.0, 4, 2], np.float32)
    e = qk.astype(x, qk.e2m1)
    c = np.asarray(x.astype(ml.float4_e2m1fn).view(np.uint8))
    assert e.storage.tolist() == ((c[0::2] << 4) | c[1::2]).tolist()
    assert np.array_equal(e.numpy(), x.astype(ml.float4_e2m1fn))


def test_tensor_indexing_and_views():
    x = np.arange(-8, 8, dtype=np.float32).reshape(2, 8)
    t = qk.astype(x, qk.i4)
    assert int(t[1, 7]) == 7 and int(t[0, 0]) == -8 and int(t[-1, -1]) == 7
    v = t[1, 2:6]
    assert v.shape == (4,) and v.codes().tolist() == [qk.i4(i).bits for i in (2, 3, 4, 5)]
    assert np.shares_memory(v.storage, t.storage)
    assert t[0].shape == (8,) and t[:, 4:].shape == (2, 4)
    with pytest.raises(IndexError, match="multiples of 2"):
        t[0, 1:5]
    with pytest.raises(IndexError, match="step 1"):
        t[0, ::2]
    with pytest.raises(IndexError, match="out of range"):
        t[2, 0]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    b = qk.astype(np.array([[1.5, 2], [3, 4]], np.float32), qk.bf16)
    assert repr(b[0, 1]) == "bf16(2.0, bits=0x4000)" and b[1].shape == (2,)
    assert qk.astype(b[:, 1], qk.f32).tolist() == [2.0, 4.0]      # strided Tensor source


CODE_TYPES = [qk.bf16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e3m2, qk.e8m0, qk.e2m1, qk.i4, qk.u4, qk.u1]


@pytest.mark.parametrize("t", CODE_TYPES, ids=str)
def test_numpy_never_computes_on_codes(t):
    """numpy ufuncs, operators (both orders, numpy and ml_dtypes operands, in-place too) and
    array functions on a Tensor whose storage holds codes are a TypeError pointing at the
    decoded view and at the explicit code views; ``out=`` is untouched (issue 21 A)."""
    x = np.array([1, 2, -0.5, 3, 0.25, -4, 1.5, 2], np.float32)
    a = qk.astype(x, t)
    arr = np.ones(8, np.float32)
    ml_arr = np.ones(8, ml.bfloat16)
    before = a.storage.copy()
    calls = [lambda: np.sum(a), lambda: np.exp(a), lambda: np.add(a, a), lambda: a + arr,
             lambda: arr + a, lambda: a + ml_arr, lambda: ml_arr + a, lambda: arr * a,
             lambda: arr == a, lambda: arr @ a, lambda: np.mean(a), lambda: np.max(a),
             lambda: np.concatenate([arr, a]), lambda: np.add.reduce(a),
             lambda: np.isnan(a), lambda: np.allclose(a, arr), lambda: np.where(arr > 0, a, 0),
             lambda: np.add(arr, arr, out=a), lambda: np.copyto(a, arr)]
    for call in calls:
        with pytest.raises(TypeError, match=rf"numba_qk.Tensor of {t._attr}: its storage holds .*"
                           r"t\.numpy\(\).*numba_qk\.astype\(t, numba_qk\.f32\).*"
                           r"t\.codes\(\), t\.storage"):
            call()
    keep = arr.copy()
    with pytest.raises(TypeError, match="numpy.add"):
        arr += a
    assert np.array_equal(arr, keep) and np.array_equal(a.storage, before)
    # the explicit views still expose the whole bytes (spec 004)
    assert np.asarray(a).tobytes() == a.storage.tobytes()
    assert a.__array_interface__["data"][0] == a.storage.ctypes.data
    assert memoryview(a.data).nbytes == a.nbytes
    back = qk.Tensor(np.asarray(memoryview(a.data)), dtype=t)
    assert back.shape == a.shape and np.array_equal(back.codes(), a.codes())


@pytest.mark.parametrize("t", [qk.f32, qk.f16, qk.i8, qk.u8, qk.i32], ids=str)
def test_numpy_computes_on_value_storage_tensors(t):
    """f32/f16/i8/u8/i32 Tensors hold the values in numpy's dtype: numpy computes on that
    storage and returns plain arrays (``out=`` such a Tensor writes its storage)."""
    vals = np.array([1, 2, 3, 4], t.numpy_dtype)
    a = qk.Tensor(vals.copy())
    assert a.dtype is t
    assert np.sum(a) == vals.sum() and type(np.add(a, a)) is np.ndarray
    assert np.array_equal(a + vals, vals + vals) and np.array_equal(vals * a, vals * vals)
    assert np.array_equal(np.concatenate([a, a]), np.concatenate([vals, vals]))
    out = qk.Tensor(np.zeros(4, t.numpy_dtype))
    np.add(vals, vals, out=out)
    assert np.array_equal(out.storage, vals + vals)
    with pytest.raises(TypeError, match="Tensor of bf16"):       # one code Tensor is enough
        np.add(a, qk.astype(vals, qk.bf16))


@pytest.mark.parametrize("t", [qk.i4, qk.bf16, qk.u1], ids=str)
def test_tensor_rejects_bool_indices(t):
    """``t[True, 0]`` was ``t[1, 0]``: Python and numpy bools are IndexErrors (numpy would read
    them as masks) (issue 21 A)."""
    a = qk.astype(np.zeros((2, 16), np.float32), t)
    for key in (True, False, np.True_, np.False_, (True, 0), (0, True), (1, np.False_),
                (slice(None), True), (Ellipsis, True)):
        with pytest.raises(IndexError, match="not bool"):
            a[key]
    assert int(a[1, 0]) == 0 and a[np.int64(1)].shape == (16,)


@pytest.mark.parametrize("t", [qk.i4, qk.u4, qk.e2m1, qk.u1], ids=str)
def test_empty_packed_slices_are_empty_views(t):
    """Any empty slice of a packed axis is an empty Tensor, as numpy gives an empty view --
    misaligned bounds included (``t[:, 3:3]``) (issue 21 A)."""
    x = np.arange(32, dtype=np.float32).reshape(2, 16) % 2
    a = qk.astype(x, t)
    for sl in (slice(3, 3), slice(5, 2), slice(0, 0), slice(16, 16), slice(17, 40), slice(3, 3, 2),
               slice(2, 5, -1), slice(-1, -1), slice(8, 8)):
        assert x[:, sl].shape == (2, 0)
        v = a[:, sl]
        assert isinstance(v, qk.Tensor) and v.dtype is t and v.shape == (2, 0) and v.nbytes == 0
        assert qk.astype(v, qk.f32).shape == (2, 0) and v.codes().shape == (2, 0)
        w = a[1, sl]
        assert w.shape == (0,) and w.nbytes == 0
    with pytest.raises(IndexError, match="multiples of"):          # non-empty stays checked
        a[:, 3:5]
    with pytest.raises(IndexError, match="step 1"):
        a[:, 0:16:2]


def test_tensor_wraps_and_numpy():
    raw = np.array([0x12, 0xF7], np.uint8)
    t = qk.Tensor(raw, dtype=qk.i4)
    assert t.shape == (4,) and t.numpy().tolist() == [1, 2, -1, 7]
    assert qk.Tensor(raw, dtype=qk.u4).numpy().tolist() == [1, 2, 15, 7]
    assert qk.Tensor(raw, dtype=qk.u1).numpy().tolist() == [0, 0, 0, 1, 0, 0, 1, 0,
                                                           1, 1, 1, 1, 0, 1, 1, 1]
    bf = qk.Tensor(np.array([1.0, -2.0], ml.bfloat16))
    assert bf.dtype is qk.bf16 and bf.numpy().dtype == ml.bfloat16
    assert qk.Tensor(np.zeros(4, np.uint8).view(np.uint16), dtype="bf16").shape == (2,)
    with pytest.raises(ValueError, match="multiple of 2"):
        qk.Tensor(np.array([1, -2, 7], ml.int4))
    assert qk.Tensor(np.array([1, -2, 7, 0], ml.int4)).numpy().tolist() == [1, -2, 7, 0]
    with pytest.raises(TypeError, match="not a numba_qk element type"):
        qk.Tensor(np.zeros(3))
    f = qk.Tensor(np.float32([1, 2]))
    assert f.dtype is qk.f32 and f.numpy().tolist() == [1.0, 2.0]
    assert t.astype(qk.f32).tolist() == [1.0, 2.0, -1.0, 7.0]
