"""Block-scaled formats (spec 004 part 2, DESIGN.md §9): numba_qk.mx, ScaledTensor, astype.

The kernels are checked bit for bit against numba_qk.testing.reference.mx (exact rational arithmetic,
written from the rules, no shared code) on adversarial block families.
"""

import pickle

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.tensor import storage_dtype
from numba_qk.testing.reference import mx as R
from numba_qk.formats import ScaledFormat

MX = [qk.mx.mxfp4, qk.mx.mxfp6e2m3, qk.mx.mxfp6e3m2, qk.mx.mxfp8e4m3, qk.mx.mxfp8e5m2,
      qk.mx.mxint8]
ALL = MX + [qk.mx.nvfp4]
ELEM = {"E2M1": "e2m1", "E2M3": "e2m3", "E3M2": "e3m2", "E4M3": "e4m3", "E5M2": "e5m2",
        "I8": "i8"}


def codes_of(st):
    """One uint8 code per element (e2m1 unpacked), and the scale bytes."""
    el = st.elements
    codes = el.codes().astype(np.uint8) if el.dtype.block_size > 1 else \
        np.ascontiguousarray(el.storage).view(np.uint8)
    return codes, np.ascontiguousarray(st.block_scales.storage).view(np.uint8)


def oracle(x, fmt, tensor_scale=None):
    """(scales, codes, ts, decoded) from the oracle."""
    if fmt is qk.mx.nvfp4:
        s, c, ts = R.encode_nvfp4(x, tensor_scale)
        return s, c, ts, R.decode_nvfp4(s, c, ts)
    e = ELEM[fmt.element.name]
    s, c = R.encode_mx(x, e)
    return s, c, None, R.decode_mx(s, c, e)


def bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def check_against_oracle(x, fmt, tensor_scale=None):
    st = qk.astype(x, fmt, tensor_scale=tensor_scale)
    s, c, ts, dec = oracle(x, fmt, tensor_scale)
    codes, scales = codes_of(st)
    np.testing.assert_array_equal(scales, s, err_msg=f"{fmt.name} scales")
    np.testing.assert_array_equal(codes, c, err_msg=f"{fmt.name} element codes")
    if fmt.has_tensor_scale:
        assert st.tensor_scale == float(ts) and isinstance(st.tensor_scale, float)
    else:
        assert st.tensor_scale is None
    got = qk.astype(st, qk.f32)
    np.testing.assert_array_equal(bits(got), bits(dec), err_msg=f"{fmt.name} decode")
    return st


# ------------------------------------------------------------------------------ formats

def test_format_facts():
    table = {  # block, element, scale, tensor scale, bits/element, block bytes (our layout)
        "mxfp4": (32, qk.e2m1, qk.e8m0, False, 4.25, 17),
        "mxfp6e2m3": (32, qk.e2m3, qk.e8m0, False, 6.25, 33),
        "mxfp6e3m2": (32, qk.e3m2, qk.e8m0, False, 6.25, 33),
        "mxfp8e4m3": (32, qk.e4m3, qk.e8m0, False, 8.25, 33),
        "mxfp8e5m2": (32, qk.e5m2, qk.e8m0, False, 8.25, 33),
        "mxint8": (32, qk.i8, qk.e8m0, False, 8.25, 33),
        "nvfp4": (16, qk.e2m1, qk.e4m3, True, 4.5, 9),
    }
    assert [f.name for f in qk.mx.FORMATS] == list(table)
    for name, (block, el, sc, has_ts, bpe, bb) in table.items():
        f = getattr(qk.mx, name)
        assert qk.from_name(name) is f and qk.from_name(name.upper()) is f
        assert (f.block_size, f.element, f.scale, f.has_tensor_scale, f.bits_per_element,
                f.block_bytes) == (block, el, sc, has_ts, bpe, bb)
        # spec 001's questions
        assert f.is_quantized and f.is_float == (el is not qk.i8) and f.ggml_type is None
        assert f.storage_bytes(0) == 0 and f.storage_bytes(3 * block) == 3 * bb
        assert f.storage_bytes(block + 1) is None and f.storage_bytes(block // 2) is None
        assert str(f) == name and repr(f) == f"numba_qk.mx.{name}"
        assert pickle.loads(pickle.dumps(f)) is f
        c = qk.capabilities(f)
        assert not (c.quantize or c.dequantize or c.decode or c.gemv)


def test_formats_are_closed():
    with pytest.raises(TypeError, match="closed"):
        type("Mine", (ScaledFormat,), {})
    with pytest.raises(TypeError, match="created by numba_qk only"):
        ScaledFormat(None, "x", 32, qk.e2m1, qk.e8m0, False, 2, "")
    with pytest.raises(AttributeError, match="immutable"):
        qk.mx.mxfp4.block_size = 16
    with pytest.raises(TypeError, match="block-scaled format, not an element type"):
        qk.Tensor(np.zeros(4, np.uint8), dtype="mxfp4")
    with pytest.raises(TypeError, match="block-scaled format, not an element type"):
        qk.Tensor(np.zeros(4, np.uint8), dtype=qk.mx.nvfp4)


# ------------------------------------------------------------------------------ block families

def _families(fmt, rng):
    """name -> float32 array [rows, 2 blocks]: the adversarial block families."""
    B = fmt.block_size
    emax = fmt.emax if fmt.emax is not None else 2
    n = 2 * B
    out = {}
    out["random"] = rng.standard_normal((4, n)).astype(np.float32)
    out["heavy_tailed"] = (rng.standard_cauchy((4, n)) *
                           np.exp2(rng.integers(-30, 30, (4, 1)))).astype(np.float32)
    # tiny: amax around 2^(emax-127), where X hits the -127 clamp, and f32 subnormals
    tiny = rng.uniform(-1, 1, (4, n)) * np.exp2(np.array([[emax - 128], [emax - 127],
                                                          [emax - 126], [-135]]))
    out["tiny"] = tiny.astype(np.float32)
    sub = rng.integers(-(1 << 23), 1 << 23, (2, n)).astype(np.int64)
    out["subnormal"] = (np.abs(sub).astype(np.uint32) | ((sub < 0).astype(np.uint32) << 31)) \
        .view(np.float32).reshape(2, n)
    huge = rng.uniform(-1, 1, (3, n)) * np.float32(3.4e38)
    huge[0, 0] = np.finfo(np.float32).max
    huge[1, 5] = -np.finfo(np.float32).max
    out["huge"] = huge.astype(np.float32)
    eq = np.repeat(np.float32([1.0, -3.0, 6.0, 7.5, 1e-30, 2.5e37, 0.1, -448.0])[:, None], n, 1)
    out["all_equal"] = eq.astype(np.float32)
    zeros = np.zeros((3, n), np.float32)
    zeros[1] = -0.0
    zeros[2, ::3] = -0.0
    out["signed_zeros"] = zeros
    mixed = rng.standard_normal((2, n)).astype(np.float32)
    mixed[:, ::4] = -0.0
    mixed[:, 1::7] = -1e-30                    # tiny negatives: -0 codes
    out["zeros_in_block"] = mixed
    return out


def _ties(fmt, rng):
    """Blocks whose values sit exactly halfway between element codes after scaling."""
    B = fmt.block_size
    rows = []
    if fmt is qk.mx.nvfp4:
        # with tensor scale 1 and amax 6*s, d = s: v = (midpoint of e2m1 codes) * s
        grid = [R.element_value("e2m1", c) for c in range(8)]
        mids = [float(a + b) / 2 for a, b in zip(grid, grid[1:])]
        for s in (1.0, 0.5, 2.0 ** -6, 448.0 / 64):
            for _ in range(2):
                v = rng.choice(mids + [-m for m in mids], B).astype(np.float64)
                v[0] = 6.0
                rows.append(np.float32(v * s))
        return np.array(rows, np.float32)
    e = ELEM[fmt.element.name]
    if e == "i8":
        mids = [k + 0.5 for k in range(-127, 127)]
        top = 64.0 * 1.5
    else:
        grid = sorted({float(R.element_value(e, c)) for c in range(1 << (fmt.element.bits - 1))})
        mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
        mids += [-m for m in mids]
        top = float(R.element_max(e))
    for X in (-127, -120, -3, 0, 5, 100):
        for _ in range(2):
            v = rng.choice(mids, B).astype(np.float64)
            v[rng.integers(B)] = top               # fixes X: amax's exponent is emax (or 6)
            scale = 2.0 ** (X - 6) if e == "i8" else 2.0 ** X
            rows.append(v * scale)
    arr = np.array(rows)
    assert np.array_equal(arr.astype(np.float32).astype(np.float64), arr)   # exact inputs
    return arr.astype(np.float32)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_encode_decode_match_oracle(fmt):
    rng = np.random.default_rng(11 + ALL.index(fmt))
    for name, x in _families(fmt, rng).items():
        check_against_oracle(x, fmt)
    check_against_oracle(_ties(fmt, rng), fmt)


def test_tie_blocks_really_tie():
    # mxfp4 with X = 0: 0.25 (between 0 and 0.5) -> 0, 0.75 -> 1.0 (even), 2.5 -> 2, 5 -> 4
    x = np.zeros(32, np.float32)
    x[:5] = [4.0, 0.25, 0.75, 2.5, 5.0]
    x[5:9] = [-0.25, -0.75, -2.5, -5.0]
    st = qk.astype(x, qk.mx.mxfp4)
    assert int(st.block_scales.storage[0]) == 127
    got = qk.astype(st, qk.f32)
    assert list(got[:9]) == [4.0, 0.0, 1.0, 2.0, 4.0, -0.0, -1.0, -2.0, -4.0]
    assert np.signbit(got[5]) and not np.signbit(got[1])


def test_saturation_and_clamps():
    x = np.zeros(32, np.float32)
    x[0] = 7.9  # mxfp4: X = 0, 7.9 > 6 saturates to 6
    st = qk.astype(x, qk.mx.mxfp4)
    assert int(st.block_scales.storage[0]) == 127 and qk.astype(st, qk.f32)[0] == 6.0
    x[0] = np.finfo(np.float32).max
    for fmt in MX:
        st = qk.astype(x, fmt)
        assert int(st.block_scales.storage[0]) == 127 + 127 - fmt.emax
        assert np.isfinite(qk.astype(st, qk.f32)).all()
    x[0] = np.float32(2.0 ** -149)     # smallest subnormal: X clamps at -127, code 0
    for fmt in MX:
        assert int(qk.astype(x, fmt).block_scales.storage[0]) == 0
    z = qk.astype(np.zeros(32, np.float32), qk.mx.mxfp8e4m3)
    assert int(z.block_scales.storage[0]) == 0 and not z.elements.storage.any()


def test_nvfp4_tensor_scale():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    st = qk.astype(x, qk.mx.nvfp4)
    assert st.tensor_scale == float(np.float32(np.abs(x).max() / np.float32(2688)))
    assert qk.astype(np.zeros(16, np.float32), "nvfp4").tensor_scale == 1.0
    for ts in (1.0, 0.1, 1e-30, 1e30, 3):                # caller's scale, rounded to f32
        st = check_against_oracle(x, qk.mx.nvfp4, tensor_scale=ts)
        assert st.tensor_scale == float(np.float32(ts))
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e-50):
        with pytest.raises(ValueError, match="tensor_scale"):
            qk.astype(x, qk.mx.nvfp4, tensor_scale=bad)
    with pytest.raises(TypeError, match="tensor_scale"):
        qk.astype(x, qk.mx.nvfp4, tensor_scale="1")
    with pytest.raises(TypeError, match="mxfp4 has no tensor scale"):
        qk.astype(x, qk.mx.mxfp4, tensor_scale=1.0)
    with pytest.raises(TypeError, match="tensor_scale"):
        qk.astype(x, qk.bf16, tensor_scale=1.0)


@pytest.mark.parametrize("bad", [
    10 ** 400, -10 ** 400, 10 ** 5000, 2 ** 128, 10 ** 39, -3, 0, float("inf"), float("-inf"),
    float("nan"), -0.0, 3.4028235677973366e38, 1e-46, np.float64(1e300), np.float64("nan"),
    np.float64(-2.0), np.longdouble("1e4000"), np.float16("inf"), np.int64(0), np.int8(-1),
    np.float32(0)], ids=lambda v: f"int:{'-' if v < 0 else ''}2**{v.bit_length()}"
    if type(v) is int and abs(v) > 2 ** 64 else f"{type(v).__name__}:{str(v)[:12]}")
def test_nvfp4_tensor_scale_out_of_range_is_a_one_line_value_error(bad):
    """Every real number that does not round to a finite float32 > 0 is the documented
    ValueError -- huge ints used to raise OverflowError, float64/longdouble overflow warned
    (issue 21); both in astype and in the ScaledTensor constructor, before anything is
    written."""
    import warnings
    x = np.ones((1, 16), np.float32)
    out = qk.astype(x, qk.mx.nvfp4)
    before = [p.copy() for p in codes_of(out)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: qk.astype(x, qk.mx.nvfp4, tensor_scale=bad),
                     lambda: qk.astype(x, qk.mx.nvfp4, tensor_scale=bad, out=out),
                     lambda: qk.ScaledTensor(out.elements, out.block_scales, qk.mx.nvfp4, bad)):
            with pytest.raises(ValueError) as ei:
                call()
            msg = str(ei.value)
            assert type(ei.value) is ValueError
            assert msg.startswith("tensor_scale: must round to a finite float32 > 0, got ")
            assert "\n" not in msg and len(msg) < 120
    for a, b in zip(codes_of(out), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), "1", b"1", 1 + 0j,
                                 np.complex64(1), np.array(2.0), [1.0], object()],
                         ids=lambda v: type(v).__name__)
def test_nvfp4_tensor_scale_of_the_wrong_type_is_a_type_error(bad):
    x = np.ones((1, 16), np.float32)
    with pytest.raises(TypeError, match=f"^tensor_scale: expected a real number, got "
                                        f"{type(bad).__name__}$"):
        qk.astype(x, qk.mx.nvfp4, tensor_scale=bad)


def test_nvfp4_tensor_scale_accepts_numpy_and_python_reals():
    x = np.ones((1, 16), np.float32)
    for ts, want in ((np.int64(3), 3.0), (np.uint64(2 ** 64 - 1), float(np.float32(2 ** 64))),
                     (np.float16(2), 2.0), (2 ** 100, float(np.float32(2 ** 100))),
                     (np.longdouble(0.5), 0.5), (3.4028234663852886e38, 3.4028234663852886e38),
                     (1e-45, float(np.float32(1e-45)))):
        assert qk.astype(x, qk.mx.nvfp4, tensor_scale=ts).tensor_scale == want


# ------------------------------------------------------------------------------ every code

@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_decode_every_code(fmt):
    e = ELEM[fmt.element.name]
    ncodes = 256 if fmt.element.bits == 8 else 1 << fmt.element.bits
    # every element code under a spread of scale codes (edges included) ...
    el = np.resize(np.arange(ncodes, dtype=np.uint8), ((ncodes + 31) // 32) * 32)
    scale_codes = [0, 1, 2, 60, 126, 127, 128, 200, 240, 253, 254, 255]
    codes = np.tile(el, (len(scale_codes), 1))
    scales = np.repeat(np.array(scale_codes, np.uint8)[:, None], el.size // 32, 1)
    # ... and every scale code with a few element codes
    codes2 = np.tile(el[:32], (256, 1))
    scales2 = np.arange(256, dtype=np.uint8)[:, None]
    for c, s in ((codes, scales), (codes2, scales2)):
        packed = c if e != "e2m1" else ((c[:, 0::2] << 4) | c[:, 1::2]).astype(np.uint8)
        st = qk.ScaledTensor(packed, s, fmt)
        got = qk.astype(st, qk.f32)
        np.testing.assert_array_equal(bits(got), bits(R.decode_mx(s, c, e)))


def test_nvfp4_decode_every_code():
    c = np.tile(np.arange(16, dtype=np.uint8), (256, 1))
    s = np.arange(256, dtype=np.uint8)[:, None]
    packed = ((c[:, 0::2] << 4) | c[:, 1::2]).astype(np.uint8)
    for ts in (1.0, 2.0 ** -140, 1e30, 0.3):
        st = qk.ScaledTensor(packed, s, qk.mx.nvfp4, tensor_scale=ts)
        np.testing.assert_array_equal(bits(qk.astype(st, qk.f32)),
                                      bits(R.decode_nvfp4(s, c, np.float32(ts))))


# ------------------------------------------------------------------------------ round trips

@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_round_trip_is_idempotent(fmt):
    rng = np.random.default_rng(3)
    for x in _families(fmt, rng).values():
        st = qk.astype(x, fmt)
        y = qk.astype(st, qk.f32)
        st2 = qk.astype(y, fmt)
        for a, b in zip(codes_of(st), codes_of(st2)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(bits(qk.astype(st2, qk.f32)), bits(y))


@pytest.mark.slow  # default run under 10 minutes (a sweep over every target type)
def test_decode_to_other_types_goes_through_f32():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    for fmt in ALL:
        st = qk.astype(x, fmt)
        f = qk.astype(st, qk.f32)
        for t in (qk.bf16, qk.f16, qk.e4m3, qk.i8):
            want = qk.astype(f, t)
            got = st.astype(t)
            wa = want.storage if isinstance(want, qk.Tensor) else want
            ga = got.storage if isinstance(got, qk.Tensor) else got
            np.testing.assert_array_equal(ga.view(np.uint8), wa.view(np.uint8))
        assert qk.astype(st, "float32").dtype == np.float32


def test_sources_other_than_f32():
    x64 = np.array([1.0, 1 + 2.0 ** -30] * 16)                   # f64 rounds once to f32
    st = qk.astype(x64, qk.mx.mxfp8e4m3)
    ref = qk.astype(x64.astype(np.float32), qk.mx.mxfp8e4m3)
    assert np.array_equal(st.elements.storage, ref.elements.storage)
    h = qk.astype(x64.astype(np.float32), qk.bf16)                # a Tensor source
    assert np.array_equal(qk.astype(h, "mxfp4").elements.storage,
                          qk.astype(qk.astype(h, qk.f32), "mxfp4").elements.storage)
    strided = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)[:, ::2]
    ro = np.ascontiguousarray(strided)
    ro.flags.writeable = False
    a = qk.astype(strided, qk.mx.mxint8)
    b = qk.astype(ro, qk.mx.mxint8)
    assert np.array_equal(a.elements.storage, b.elements.storage)


# ------------------------------------------------------------------------------ views and parts

def test_views_share_memory_in_lockstep():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    for fmt in (qk.mx.nvfp4, qk.mx.mxfp4, qk.mx.mxfp8e5m2):
        st = qk.astype(x, fmt)
        full = qk.astype(st, qk.f32)
        B = fmt.block_size
        for key, want in (((1,), full[1]), ((1, 2), full[1, 2]), ((slice(None), 0), full[:, 0]),
                          ((Ellipsis, slice(B, 2 * B)), full[..., B:2 * B]),
                          ((2, slice(None), slice(0, 64)), full[2]),
                          ((slice(None, None, 2), -1, slice(32, 64)), full[::2, -1, 32:64])):
            v = st[key]
            assert isinstance(v, qk.ScaledTensor) and v.shape == want.shape
            assert np.shares_memory(v.elements.storage, st.elements.storage)
            assert np.shares_memory(v.block_scales.storage, st.block_scales.storage)
            assert v.block_scales.shape == want.shape[:-1] + (want.shape[-1] // B,)
            assert v.tensor_scale == st.tensor_scale
            np.testing.assert_array_equal(bits(qk.astype(v, qk.f32)), bits(want))
        assert st[:, :, 16:16].shape == (3, 4, 0)
        with pytest.raises(IndexError, match=f"block size {B}"):
            st[..., 8:8 + B]
        with pytest.raises(IndexError, match=f"block size {B}"):
            st[0, 0, 0:B + 1]
        with pytest.raises(IndexError, match=f"block size {B}"):
            st[0, 0, ::2]
        with pytest.raises(IndexError, match="integer index on the blocked last axis"):
            st[0, 0, 3]
        with pytest.raises(IndexError, match="too many indices"):
            st[0, 0, 0, 0]


@pytest.mark.parametrize("fmt", [qk.mx.mxfp4, qk.mx.nvfp4, qk.mx.mxint8], ids=lambda f: f.name)
def test_scaled_tensor_is_not_a_numpy_array(fmt):
    """``np.asarray(st)`` gave an empty (rows, 0) float64 array; it, ufuncs, operators and array
    functions on a ScaledTensor are a TypeError pointing at the decode and the parts; bool
    indices are IndexErrors (issue 21 A)."""
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    st = qk.astype(x, fmt)
    arr = np.ones((2, 64), np.float32)
    before = arr.copy()
    msg = (rf"a numba_qk.ScaledTensor \({fmt.name}\) is not a numpy array; decode it with "
           r"st\.astype\(numba_qk\.f32\).*st\.elements and st\.block_scales")
    for call in (lambda: np.asarray(st), lambda: np.array(st), lambda: np.asarray(st, np.float32),
                 lambda: np.exp(st), lambda: arr + st, lambda: np.add(arr, 1, out=st),
                 lambda: np.sum(st), lambda: np.concatenate([arr, st]), lambda: np.shape(st)):
        with pytest.raises(TypeError, match=msg):
            call()
    with pytest.raises(TypeError, match="not a numpy array"):
        arr += st
    assert np.array_equal(arr, before)
    for key in (True, False, np.True_, (True, slice(None)), (0, np.False_)):
        with pytest.raises(IndexError, match="not bool"):
            st[key]
    B = fmt.block_size
    for sl in (slice(B, B), slice(3, 3), slice(2 * B, 0), slice(0, 0, 2), slice(2, 5, -1)):
        v = st[:, sl]
        assert isinstance(v, qk.ScaledTensor) and v.shape == (2, 0)
        assert v.block_scales.shape == (2, 0) and qk.astype(v, qk.f32).shape == (2, 0)


def test_spec_example_shapes():
    X = qk.astype(np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32), "nvfp4")
    assert str(X.dtype) == "nvfp4" and X.dtype is qk.mx.nvfp4 and X.block_size == 16
    assert X.block_scales.shape == (3, 4) and X.elements.shape == (3, 64)
    assert X[1].shape == (64,) and X[:, 16:48].shape == (3, 32)
    assert X.block_scales.dtype is qk.e4m3 and X.elements.dtype is qk.e2m1
    q = qk.astype(np.zeros(64, np.float32), "mxfp4")
    assert q.tensor_scale is None and q.block_size == 32 and q.block_scales.dtype is qk.e8m0


def test_from_parts_without_copy():
    rng = np.random.default_rng(4)
    st = qk.astype(rng.standard_normal((2, 64)).astype(np.float32), qk.mx.mxfp6e3m2)
    codes = np.array(st.elements.storage)
    scales = np.array(st.block_scales.storage)
    st2 = qk.ScaledTensor(codes, scales, "mxfp6e3m2")
    assert np.shares_memory(st2.elements.storage, codes)
    assert np.shares_memory(st2.block_scales.storage, scales)
    st3 = qk.ScaledTensor(st.elements, st.block_scales, qk.mx.mxfp6e3m2)
    assert st3.elements is st.elements
    np.testing.assert_array_equal(qk.astype(st2, qk.f32), qk.astype(st, qk.f32))
    with pytest.raises(ValueError, match="one scale per 32 elements"):
        qk.ScaledTensor(codes, scales[:, :1], qk.mx.mxfp6e3m2)
    with pytest.raises(TypeError, match="a Tensor of E5M2, expected E3M2"):
        qk.ScaledTensor(qk.Tensor(codes, dtype=qk.e5m2), scales, qk.mx.mxfp6e3m2)
    with pytest.raises(TypeError, match="numba_qk.mx format"):
        qk.ScaledTensor(codes, scales, qk.e3m2)
    with pytest.raises(TypeError, match="mxfp6e3m2 has no tensor scale"):
        qk.ScaledTensor(codes, scales, qk.mx.mxfp6e3m2, tensor_scale=2.0)
    nv = qk.ScaledTensor(np.zeros((1, 8), np.uint8), np.zeros((1, 1), np.uint8), "nvfp4")
    assert nv.tensor_scale == 1.0 and nv.shape == (1, 16)


# ------------------------------------------------------------------------------ errors and out=

def test_non_finite_input_names_the_block_and_writes_nothing():
    x = np.ones((2, 3, 64), np.float32)
    x[1, 2, 40] = np.nan
    for fmt in ALL:
        out = qk.astype(np.zeros_like(x), fmt)
        before = [np.array(p.storage) for p in (out.elements, out.block_scales)]
        with pytest.raises(qk.QuantizationDomainError, match=r"block \d of row \(1, 2\)") as ei:
            qk.astype(x, fmt, out=out)
        assert ei.value.block == (5 * 64 + 40) // fmt.block_size
        for b, p in zip(before, (out.elements, out.block_scales)):
            assert np.array_equal(b, p.storage)
    x[1, 2, 40] = -np.inf
    with pytest.raises(qk.QuantizationDomainError, match="non-finite value -inf"):
        qk.astype(x, "mxfp8e4m3")


def test_shape_errors():
    with pytest.raises(ValueError, match="whole number of blocks of 32 elements"):
        qk.astype(np.ones((2, 48), np.float32), qk.mx.mxfp4)
    with pytest.raises(ValueError, match="whole number of blocks of 16"):
        qk.astype(np.float32(1.0), qk.mx.nvfp4)


def test_out_buffers():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for fmt in ALL:
        ref = qk.astype(x, fmt)
        out = qk.astype(np.zeros_like(x), fmt)
        assert qk.astype(x, fmt, out=out) is out
        assert out.tensor_scale == ref.tensor_scale
        for a, b in zip(codes_of(out), codes_of(ref)):
            np.testing.assert_array_equal(a, b)
        parts = (np.zeros_like(ref.elements.storage).view(np.uint8),
                 np.zeros_like(ref.block_scales.storage))
        st = qk.astype(x, fmt, out=parts)
        assert np.shares_memory(st.elements.storage, parts[0])
        np.testing.assert_array_equal(codes_of(st)[0], codes_of(ref)[0])
        dec = np.full(x.shape, 7.0, np.float32)
        assert qk.astype(ref, qk.f32, out=dec) is dec
        np.testing.assert_array_equal(dec, qk.astype(ref, qk.f32))
        with pytest.raises(ValueError, match="shape"):
            qk.astype(ref, qk.f32, out=np.zeros((4, 32), np.float32))
        with pytest.raises(TypeError, match="dtype"):
            qk.astype(ref, qk.f32, out=np.zeros((4, 64), np.float64))
    with pytest.raises(TypeError, match="mxfp4 ScaledTensor, expected nvfp4"):
        qk.astype(x, qk.mx.nvfp4, out=qk.astype(x, qk.mx.mxfp4))
    with pytest.raises(ValueError, match="expected"):
        qk.astype(x, qk.mx.mxfp4, out=qk.astype(x[:2], qk.mx.mxfp4))


def _parts_in(mem, fmt, shape, el_at, sc_at):
    """(elements, block_scales) Tensors of ``fmt`` for ``shape`` laid into the uint8 buffer
    ``mem`` at byte offsets el_at / sc_at (which may overlap)."""
    eshape = shape[:-1] + (shape[-1] // fmt.element.block_size,)
    sshape = shape[:-1] + (shape[-1] // fmt.block_size,)
    ne, ns = int(np.prod(eshape)), int(np.prod(sshape))
    el = qk.Tensor(mem[el_at:el_at + ne].reshape(eshape), dtype=fmt.element)
    sc = qk.Tensor(mem[sc_at:sc_at + ns].reshape(sshape), dtype=fmt.scale)
    return el, sc, ne, ns


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_encode_out_overlap_is_refused_and_out_untouched(fmt):
    """out=(elements, block_scales) whose parts share memory (or share it with the input) used
    to be encoded into, the scales overwriting codes (issue 21): ValueError, nothing written."""
    rng = np.random.default_rng(31)
    shape = (4, 64)
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    mem = rng.integers(0, 256, 4096, dtype=np.uint8)
    ne = _parts_in(mem, fmt, shape, 0, 0)[2]
    for el_at, sc_at in ((0, 0), (0, ne - 1), (4, 0), (0, ne // 2)):
        el, sc, _, _ = _parts_in(mem, fmt, shape, el_at, sc_at)
        before = mem.copy()
        with pytest.raises(ValueError, match="^out: elements and block_scales overlap"):
            qk.astype(x, fmt, out=(el, sc))
        with pytest.raises(ValueError, match="^out: elements and block_scales overlap"):
            qk.astype(x, fmt, out=(el.storage, sc.storage))
        with pytest.raises(ValueError, match="^out: elements and block_scales overlap"):
            qk.astype(x, fmt, out=qk.ScaledTensor(el, sc, fmt))
        assert np.array_equal(mem, before)
    el, sc, ne, ns = _parts_in(mem, fmt, shape, 0, ne)            # adjacent: fine
    st = qk.astype(x, fmt, out=(el, sc))
    ref = qk.astype(x, fmt)
    for a, b in zip(codes_of(st), codes_of(ref)):
        np.testing.assert_array_equal(a, b)
    # either part overlapping the input: the float32 array itself ...
    big = np.zeros(8192, np.uint8)
    src = big[:x.nbytes].view(np.float32).reshape(shape)
    src[...] = x
    for el_at, sc_at in ((0, 4096), (4096, 0), (100, 6000), (4096, 1000)):
        el, sc, _, _ = _parts_in(big, fmt, shape, el_at, sc_at)
        before = big.copy()
        with pytest.raises(ValueError, match="^out: (elements|block_scales) overlaps the input"):
            qk.astype(src, fmt, out=(el, sc))
        assert np.array_equal(big, before)
    # ... or a ScaledTensor being re-encoded into memory it occupies
    st = qk.astype(x, fmt)
    for out in (st, (st.elements, qk.Tensor(np.zeros_like(st.block_scales.storage),
                                             dtype=fmt.scale))):
        before = [p.copy() for p in codes_of(st)]
        with pytest.raises(ValueError, match="^out: (elements|block_scales) overlaps the input"):
            qk.astype(st, fmt, out=out)
        for a, b in zip(codes_of(st), before):
            np.testing.assert_array_equal(a, b)


DECODE_TARGETS = [qk.f32, qk.f16, qk.bf16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e8m0, qk.i8, qk.u8,
                  qk.i32, qk.i4, qk.u4, qk.e2m1, qk.u1]


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
@pytest.mark.parametrize("t", DECODE_TARGETS, ids=str)
def test_decode_out_overlapping_the_source_is_refused(fmt, t):
    """Decoding into an ``out`` that shares memory with the ScaledTensor's elements or block
    scales used to overwrite the source on every path but the direct f32 one (issue 21):
    ValueError before anything is written, on every path (ndarray or Tensor out)."""
    rng = np.random.default_rng(32)
    shape = (4, 64)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    ref = qk.astype(x, fmt)
    mem = np.zeros(16384, np.uint8)
    el, sc, ne, ns = _parts_in(mem, fmt, shape, 0, 8192)
    np.copyto(el.storage, ref.elements.storage)
    np.copyto(sc.storage, ref.block_scales.storage)
    st = qk.ScaledTensor(el, sc, fmt, ref.tensor_scale)
    sshape = shape[:-1] + (shape[-1] // t.block_size,)
    nbytes = int(np.prod(sshape)) * storage_dtype(t).itemsize
    outs = []
    for at in (0, ne // 2, 8192 - nbytes + 1, 8192 + ns - 1):   # elements, scales, both edges
        raw = mem[at:at + nbytes]
        outs.append(qk.Tensor(raw.reshape(sshape[:-1] + (-1,)), dtype=t))
        if t.numpy_dtype is not None and t.block_size == 1:
            outs.append(raw.view(t.numpy_dtype).reshape(shape))
    for out in outs:
        before = mem.copy()
        with pytest.raises(ValueError, match="^out: overlaps the input"):
            qk.astype(st, t, out=out)
        assert np.array_equal(mem, before)
    # An adjacent out is fine.  (Each (format, target) decode compiles its own converter,
    # ~1.7 s cold: the refusals above run for every pair, which compiles nothing; the decode
    # itself runs for f32 (every format) and for bf16 and i4 (the FP4 formats).)
    if t is qk.f32 or (t in (qk.bf16, qk.i4) and fmt in (qk.mx.mxfp4, qk.mx.nvfp4)):
        want = qk.astype(st, t)
        free = qk.Tensor(mem[8192 + ns:8192 + ns + nbytes].reshape(sshape[:-1] + (-1,)),
                         dtype=t)
        assert qk.astype(st, t, out=free) is free
        w = want if isinstance(want, qk.Tensor) else qk.Tensor(want)
        assert np.array_equal(free.storage.view(np.uint8), w.storage.view(np.uint8))


def test_threads_give_identical_bits():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((33, 64)) * 100).astype(np.float32)
    for fmt in (qk.mx.mxfp4, qk.mx.nvfp4):
        a = qk.astype(x, fmt)
        b = qk.astype(x, fmt, threads=3)
        for p, q in zip(codes_of(a), codes_of(b)):
            np.testing.assert_array_equal(p, q)
        np.testing.assert_array_equal(qk.astype(a, qk.f32), qk.astype(b, qk.f32, threads=4))


def test_parts_export_through_dlpack():
    x = np.random.default_rng(12).standard_normal((2, 64)).astype(np.float32)
    for fmt in ALL:
        st = qk.astype(x, fmt)[:, 32:64]
        s = qk.from_dlpack(st.block_scales)
        assert s.dtype is fmt.scale and np.shares_memory(s.storage, st.block_scales.storage)
        e = qk.from_dlpack(st.elements)                  # e2m1 arrives as its packed bytes
        assert np.shares_memory(e.storage, st.elements.storage)
        assert np.array_equal(e.storage.view(np.uint8), st.elements.storage.view(np.uint8))


# ------------------------------------------------------------------------------ ggml bridge

def _random_mxfp4_records(rng, shape):
    rec = rng.integers(0, 256, shape + (17,), dtype=np.uint8)
    rec[..., 0] = rng.integers(0, 255, shape, dtype=np.uint8)      # every scale but 0xFF
    rec[..., 0].flat[:3] = (0, 1, 254)
    return rec.reshape(shape[:-1] + (shape[-1] * 17,))


def test_from_ggml_decodes_like_gguf_py():
    gq = pytest.importorskip("gguf.quants")
    rng = np.random.default_rng(21)
    rec = _random_mxfp4_records(rng, (3, 40))
    st = qk.mx.from_ggml(rec)
    assert st.dtype is qk.mx.mxfp4 and st.shape == (3, 40 * 32)
    with np.errstate(over="ignore"):                            # scale 254 * 12 -> inf (both)
        want = gq.MXFP4.dequantize_blocks(rec.reshape(-1, 17)).reshape(3, -1)
    np.testing.assert_array_equal(bits(qk.astype(st, qk.f32)), bits(want))


def test_ggml_round_trips_exact_by_value():
    rng = np.random.default_rng(22)
    rec = _random_mxfp4_records(rng, (2, 7))
    st = qk.mx.from_ggml(rec)
    back = qk.mx.to_ggml(st)
    nib8 = rec.copy().reshape(2, 7, 17)                          # ggml's nibble 8 reads as +0
    lo, hi = nib8[..., 1:] & 0xF, nib8[..., 1:] >> 4
    nib8[..., 1:] = np.where(lo == 8, 0, lo) | (np.where(hi == 8, 0, hi) << 4)
    np.testing.assert_array_equal(back, nib8.reshape(rec.shape))
    x = np.random.default_rng(23).standard_normal((4, 96)).astype(np.float32)
    ours = qk.astype(x, qk.mx.mxfp4)
    again = qk.mx.from_ggml(qk.mx.to_ggml(ours))
    np.testing.assert_array_equal(qk.astype(again, qk.f32), qk.astype(ours, qk.f32))  # by value
    assert np.array_equal(again.block_scales.storage, ours.block_scales.storage)


def test_ggml_bridge_errors():
    rec = np.zeros(34, np.uint8)
    rec[17] = 0xFF
    with pytest.raises(qk.QuantizationDomainError, match="block 1: MXFP4 record scale byte 0xFF"):
        qk.mx.from_ggml(rec)
    with pytest.raises(ValueError, match="17-byte MXFP4 blocks"):
        qk.mx.from_ggml(np.zeros(18, np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        qk.mx.from_ggml(np.zeros(17, np.int8))
    with pytest.raises(TypeError, match="an mxfp4 ScaledTensor"):
        qk.mx.to_ggml(qk.astype(np.zeros(32, np.float32), qk.mx.mxint8))
    nan_scale = qk.ScaledTensor(np.zeros(16, np.uint8), np.full(1, 0xFF, np.uint8), "mxfp4")
    with pytest.raises(qk.QuantizationDomainError, match="block 0"):
        qk.mx.to_ggml(nan_scale)


def test_streamed_decode_equals_plain(monkeypatch):
    """Large decodes stream their output with non-temporal stores (kernels/simd/stream.py) in
    chunks that keep back a partial cache line: the same bits for every format, whatever the
    output's alignment, chunk count and thread split."""
    from numba_qk import scaled as S
    from numba_qk.kernels.simd import stream as _stream
    from numba_qk.kernels.mx import codecs as K

    x = (np.random.default_rng(5).standard_normal((3, 8192 + 160)) * 20).astype(np.float32)
    x[0, :64] = 0.0                                           # a zero block
    plain = {f: qk.astype(x, f) for f in ALL}
    expect = {f: qk.astype(st, qk.f32) for f, st in plain.items()}
    flags = []

    def spy(fn):
        def wrapped(*args):
            flags.append(args[-1])
            return fn(*args)
        return wrapped

    real_mx = K.mx_decoder
    monkeypatch.setattr(S._k, "mx_decoder", lambda *key: spy(real_mx(*key)))
    monkeypatch.setattr(S._k, "nvfp4_decode", spy(K.nvfp4_decode))
    monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 0)
    for f, st in plain.items():
        scales = st.block_scales.storage.reshape(-1)
        saved = int(scales[7])
        scales[7] = 0x7F if f is qk.mx.nvfp4 else 0xFF        # a NaN block scale
        for pad in (0, 1, 5, 15):
            for threads in (1, 3):
                flags.clear()
                buf = np.full(x.size + 20, 7.0, np.float32)
                out = buf[pad:pad + x.size].reshape(x.shape)
                assert qk.astype(st, qk.f32, out=out, threads=threads) is out
                assert flags and all(flags) == _stream.HAVE_STREAM
                assert (buf[:pad] == 7.0).all() and (buf[pad + x.size:] == 7.0).all()
                monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 1 << 62)
                ref = qk.astype(st, qk.f32)
                monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 0)
                assert (out.view(np.uint32) == ref.view(np.uint32)).all(), (f.name, pad, threads)
        assert np.isnan(ref.reshape(-1)[7 * f.block_size])
        scales[7] = saved
        got = qk.astype(st, qk.f32)                           # and as the oracle-checked path
        assert (got.view(np.uint32) == expect[f].view(np.uint32)).all(), f.name


@pytest.mark.parametrize("fmt", [qk.mx.mxfp8e4m3, qk.mx.mxfp8e5m2], ids=lambda f: f.name)
def test_mxfp8_nan_elements_keep_sign(fmt, monkeypatch):
    """An mxfp8 element NaN code decodes to the quiet NaN of its sign under every finite scale,
    on the plain, threaded and streamed decoders (issue 21 B); the oracle agrees."""
    from numba_qk.kernels.simd import stream as _stream

    nans = [0x7F, 0xFF] if fmt.element is qk.e4m3 else [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    codes = np.resize(np.array(nans, np.uint8), (6, 128))
    scales = np.array([0, 1, 127, 200, 254, 127], np.uint8)[:, None].repeat(4, 1)
    want = np.uint32(0x7FC00000) | ((codes.astype(np.uint32) & 0x80) << 24)
    st = qk.ScaledTensor(codes, scales, fmt)
    for threads in (1, 3):
        assert (bits(qk.astype(st, qk.f32, threads=threads)) == want).all()
    monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 0)
    assert (bits(qk.astype(st, qk.f32)) == want).all()
    assert (bits(R.decode_mx(scales, codes, ELEM[fmt.element.name])) == want).all()
    # and on to the other float targets through the f32 decode
    assert (qk.astype(st, qk.bf16).codes() == (0x7FC0 | ((codes.astype(np.uint16) & 0x80) << 8))
            ).all()
