"""The per-format ``@njit`` building blocks of ``numba_qk.kernels`` (kernels/blocks.py, issue 22):
``dot_<f>_<a>``, ``gemv_<f>_<a>``, ``dequantize_<f>``, ``quantize_<f>`` for every record format,
called from Python and from a user's ``@njit(cache=False)`` function, equal to the public
operations bit for bit (random record bytes with NaN/inf scales; random and adversarial floats,
and a non-finite one, for quantize)."""

import numpy as np
import pytest
from numba import njit
from numba.core.registry import CPUDispatcher

import numba_qk as qk
from numba_qk import _registry, kernels
from numba_qk.kernels import blocks, dequantize_q5_1, dot_q4_0_q8_0, quantize_q8_0
from numba_qk.testing.asserts import assert_same_f32, assert_same_records

FORMATS = [b.format for b in _registry.BINDINGS]
WEIGHTS = [b.format for b in _registry.BINDINGS if b.dot is not None]
QUANTIZABLE = [b.format for b in _registry.BINDINGS if b.quantize is not None]
ids = [f.name for f in FORMATS]

# The numeric comparisons compile each format's public op, its block and a user function
# (~7 s per format on a cold cache, 2 cores): the default run takes one format per family and
# both activation-only formats; -m slow (or NUMBA_QK_SLOW=1) takes all 14.  The cheap checks
# (every name exported, every block wrapping its registry kernel) always cover all of them.
_DEFAULT = {"Q8_K", "Q4_K", "Q6_K", "Q4_0", "Q8_1", "NVFP4"}


def _sweep(formats):
    return [f if f.name in _DEFAULT else pytest.param(f, marks=pytest.mark.slow, id=f.name)
            for f in formats]
G = 2      # records per row (small: the numerics are tested elsewhere, here the plumbing)
ROWS = 3

# Names that predate blocks.py and are the registry's own kernels (their signatures are kept;
# quantize_q8_k takes values [G, 256]).
OLDER = {"dot_q4_k_q8_k": "dot", "gemv_q4_k_q8_k": "gemv", "quantize_q8_k": "quantize"}


# ---- a user's own @njit code (not cached), calling a building block passed in --------------

@njit(cache=False)
def user_dot(fn, w_row, xq):
    return fn(w_row, xq)


@njit(cache=False)
def user_gemv(fn, w, xq, out):
    fn(w, xq, out)


@njit(cache=False)
def user_dequantize(fn, w, out):
    fn(w, out)


@njit(cache=False)
def user_quantize(fn, x, out):
    return fn(x, out)


@njit(cache=False)
def user_composition(x, w, xq, w5, y):
    """Blocks called by their global names: quantize x (Q8_0), sum the dots of the Q4_0 rows,
    dequantize Q5_1 records."""
    if quantize_q8_0(x, xq) >= 0:
        return np.float32(np.nan), np.float32(np.nan)
    acc = np.float32(0.0)
    for r in range(w.shape[0]):
        acc += dot_q4_0_q8_0(w[r], xq)
    dequantize_q5_1(w5, y)
    return acc, y[0]


def names(fmt):
    """{slot: building-block name} of ``fmt``."""
    f = fmt._attr
    out = {"dequantize": f"dequantize_{f}"}
    if fmt in QUANTIZABLE:
        out["quantize"] = f"quantize_{f}"
    if fmt in WEIGHTS:
        a = qk.activation_format(fmt)._attr
        out.update(dot=f"dot_{f}_{a}", gemv=f"gemv_{f}_{a}")
    return out


def _scale_specials(fmt, recs, rng):
    """Put NaN / inf / -0 / subnormal bit patterns into the scale fields of some records of
    ``recs`` (``[..., bytes]``, flattened view); the rest stay random bytes."""
    flat = recs.reshape(-1, fmt.block_bytes)
    n = flat.shape[0]
    f16 = (0x7E00, 0xFC00, 0x7C00, 0x8000, 0x0001, 0xFE01)       # NaN, -inf, inf, -0, sub, -NaN
    f32 = (0x7FC00000, 0xFF800000, 0x7F800000, 0x80000000, 0x00000001, 0xFFC00001)
    for k, pick in enumerate(rng.choice(n, size=min(n, 4), replace=False)):
        for field in fmt.fields:
            width = field.stop - field.start
            if field.name in ("d", "dmin", "m", "s") and width == 2:
                bits = f16[(k + len(field.name)) % len(f16)]
                flat[pick, field.start:field.stop] = [bits & 0xFF, bits >> 8]
            elif field.name == "ds":
                flat[pick, field.start:field.stop] = np.array([f32[k]], "<u4").view(np.uint8)
            elif field.name in ("d", "e"):   # byte scales: ue4m3 (NVFP4), e8m0 (MXFP4)
                flat[pick, field.start:field.stop] = (0xFF, 0x7F, 0xFE, 0x00)[k]
    return recs


def _records(fmt, rng, *shape):
    recs = rng.integers(0, 256, size=(*shape, fmt.block_bytes), dtype=np.uint8)
    return _scale_specials(fmt, recs, rng)


def _same_scalar(got, want, what):
    assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32) or (
        np.isnan(got) and np.isnan(want)), (what, got, want)


# ---- the names ----------------------------------------------------------------------------

def test_every_format_has_its_blocks_in_all():
    expected = {n for f in FORMATS for n in names(f).values()}
    assert len(expected) == len(FORMATS) + len(QUANTIZABLE) + 2 * len(WEIGHTS) == 101
    assert expected <= set(kernels.__all__)
    assert set(blocks.__all__) == expected - set(OLDER)
    assert len(kernels.__all__) == len(set(kernels.__all__))
    for n in expected:
        fn = getattr(kernels, n)
        assert isinstance(fn, CPUDispatcher), n
        opts = fn.targetoptions
        assert opts["fastmath"] is False and opts["nogil"] is True, n
        assert fn._cache.__class__.__name__ != "NullCache", n
        assert fn.__doc__, n


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_blocks_wrap_the_registry_kernels(fmt):
    """Each block calls exactly the kernel the registry binds for its format and slot (the
    older names are those kernels)."""
    b = _registry.BY_FORMAT[fmt]
    for slot, n in names(fmt).items():
        fn = getattr(kernels, n)
        if n in OLDER:
            assert fn is getattr(b, slot), n
            continue
        py = fn.py_func
        called = [py.__globals__[c] for c in py.__code__.co_names
                  if isinstance(py.__globals__.get(c), CPUDispatcher)]
        assert called == [getattr(b, slot)], n


# ---- numerics: equal to the public operations ---------------------------------------------

@pytest.mark.parametrize("fmt", _sweep(WEIGHTS), ids=lambda f: f.name)
def test_dot_and_gemv_equal_public_ops(fmt):
    rng = np.random.default_rng(22_000 + fmt.ggml_type)
    act = qk.activation_format(fmt)
    span = fmt.block_size // act.block_size
    dot = getattr(kernels, names(fmt)["dot"])
    gemv = getattr(kernels, names(fmt)["gemv"])
    kw = dict(lhs_format=fmt, rhs_format=act)
    for g in (G, 0):
        w = _records(fmt, rng, ROWS, g)
        xq = _records(act, rng, span * g)
        want = qk.gemv(w, xq, **kw)
        for r in range(ROWS):
            one = qk.quantized_dot(w[r], xq, **kw)
            _same_scalar(dot(w[r], xq), one, (fmt.name, g, r, "python"))
            _same_scalar(user_dot(dot, w[r], xq), one, (fmt.name, g, r, "njit"))
            _same_scalar(want[r], one, (fmt.name, g, r, "public gemv"))
        for call in (gemv, lambda *a: user_gemv(gemv, *a)):
            out = np.full(ROWS, np.nan, np.float32)
            call(w, xq, out)
            assert_same_f32(out, want, f"{fmt.name} gemv G={g}")


@pytest.mark.parametrize("fmt", _sweep(FORMATS), ids=lambda f: f.name)
def test_dequantize_equals_public_op(fmt):
    rng = np.random.default_rng(22_100 + fmt.ggml_type)
    fn = getattr(kernels, names(fmt)["dequantize"])
    for g in (G + 1, 0):
        w = _records(fmt, rng, g)
        want = qk.dequantize(w, fmt).reshape(-1)
        for call in (fn, lambda *a: user_dequantize(fn, *a)):
            out = np.full(g * fmt.block_size, np.nan, np.float32)
            call(w, out)
            assert_same_f32(out, want, f"{fmt.name} dequantize G={g}")


def _values(fmt, rng):
    """Three blocks: normal values; adversarial (extremes, subnormals, signed zeros, ties);
    random magnitudes over the whole float32 range."""
    bs = fmt.block_size
    x = np.empty((3, bs), np.float32)
    x[0] = rng.standard_normal(bs)
    adv = np.array([3.4e38, -3.4e38, 1e-45, -1e-45, 1e-40, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5,
                    65504.0, 65520.0, -7.0, 8.0, 1.0], np.float32)
    x[1] = np.resize(adv, bs)
    x[1, ::3] *= np.float32(-1.0)
    x[2] = (rng.standard_normal(bs) * 2.0 ** rng.integers(-140, 120, bs)).astype(np.float32)
    if _registry.BY_FORMAT[fmt].domain_reason is _registry.grid_reason:
        # the grid encoders' domain ends where ggml's search aborts, about 1e10
        x[1:] = np.clip(x[1:], np.float32(-1e9), np.float32(1e9))
    return x


def _quantize(fn, fmt, x2d, out):
    """The block called as its signature says: flat values, except the older quantize_q8_k."""
    return fn(x2d if names(fmt)["quantize"] in OLDER else x2d.reshape(-1), out)


@pytest.mark.parametrize("fmt", _sweep(QUANTIZABLE), ids=lambda f: f.name)
def test_quantize_equals_public_op(fmt):
    rng = np.random.default_rng(22_200 + fmt.ggml_type)
    fn = getattr(kernels, names(fmt)["quantize"])
    x = _values(fmt, rng)
    want = qk.quantize(x, fmt)
    for call in (fn, lambda *a: user_quantize(fn, *a)):
        out = np.full((3, fmt.block_bytes), 0xAB, np.uint8)
        assert _quantize(call, fmt, x, out) == -1
        assert_same_records(out, want, f"{fmt.name} quantize")
        out0 = np.empty((0, fmt.block_bytes), np.uint8)
        assert _quantize(call, fmt, x[:0], out0) == -1
    # a non-finite value: the first bad block's index, nothing written; the public op raises
    for bad_block, value in ((2, np.nan), (1, np.inf), (0, -np.inf)):
        y = x.copy()
        y[bad_block, fmt.block_size // 2] = value
        y[2, 0] = np.nan                                   # a later bad block is not reported
        for call in (fn, lambda *a: user_quantize(fn, *a)):
            out = np.full((3, fmt.block_bytes), 0xAB, np.uint8)
            assert _quantize(call, fmt, y, out) == bad_block, (fmt.name, value)
            assert (out == 0xAB).all()
        with pytest.raises(qk.QuantizationDomainError) as e:
            qk.quantize(y, fmt)
        assert e.value.block == bad_block


def test_quantize_q8_k_tiny_extreme_is_out_of_domain():
    """Q8_K's second domain rule (an extreme too small to invert) through the older 2-D block."""
    x = np.zeros((2, 256), np.float32)
    x[0, 3] = 1.0
    x[1, 7] = np.float32(1e-45)
    out = np.full((2, 292), 0xAB, np.uint8)
    assert kernels.quantize_q8_k(x, out) == 1 and (out == 0xAB).all()
    assert user_quantize(kernels.quantize_q8_k, x, out) == 1
    with pytest.raises(qk.QuantizationDomainError) as e:
        qk.quantize(x, qk.quant.q8_k)
    assert e.value.block == 1


def test_blocks_by_global_name_in_user_njit():
    rng = np.random.default_rng(22_300)
    x = rng.standard_normal(2 * 32).astype(np.float32)
    w = _records(qk.quant.q4_0, rng, ROWS, 2)
    xq = np.empty((2, 34), np.uint8)
    y = np.empty(2 * 32, np.float32)
    w5 = _records(qk.quant.q5_1, rng, 2)
    acc, y0 = user_composition(x, w, xq, w5, y)
    want_xq = qk.quantize(x.reshape(2, 32), qk.quant.q8_0)
    assert_same_records(xq, want_xq, "quantize_q8_0")
    want = np.float32(0.0)
    with np.errstate(all="ignore"):   # NaN / inf scales
        for r in range(ROWS):
            want = np.float32(want + qk.quantized_dot(w[r], want_xq, lhs_format=qk.quant.q4_0,
                                                      rhs_format=qk.quant.q8_0))
    _same_scalar(acc, want, "sum of dots")
    assert_same_f32(y, qk.dequantize(w5, qk.quant.q5_1).reshape(-1), "q5_1")
    _same_scalar(y0, y[0], "y[0]")


def test_flat_arrays_of_the_wrong_size_raise():
    """The flat arrays are viewed as [G, block] with reshape: a size that is not G * block
    raises (no out-of-bounds write)."""
    w = np.zeros((2, 18), np.uint8)
    with pytest.raises(ValueError):
        kernels.dequantize_q4_0(w, np.empty(63, np.float32))
    with pytest.raises(ValueError):
        kernels.quantize_q4_0(np.zeros(65, np.float32), w)
