"""ggml's legacy block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1): quantizers and dequantizers
bit-identical to ggml (checked against gguf-py's numpy codecs, against the oracle, and against
ggml itself when libggml-python is installed); canonical dots bit-exact against the oracle."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import numba_qk as qk
from numba_qk import _registry
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing.reference import core as ref
from numba_qk.formats import legacy as legacy_family

from numba_qk.testing.asserts import assert_same_f32, assert_same_records

FORMATS = [f.name.lower() for f in legacy_family.FORMATS]   # q4_0 ... q8_1, from the declarations
WEIGHTS = [f.name.lower() for f in legacy_family.FORMATS if f in _registry.WEIGHTS]
assert FORMATS == ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1"] and "q8_1" not in WEIGHTS
GGUF_PY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]  # gguf-py has no Q8_1 codec
GGML = ggml_bridge.load()
needs_ggml = pytest.mark.skipif(GGML is None, reason="libggml-python not installed")
FMAX = np.float32(np.finfo(np.float32).max)


def fmt(name):
    return getattr(qk.quant, name)


def weight_inputs(rng, g=512):
    """Random normal, heavy-tailed, all-equal, zero, tiny and huge blocks, ties."""
    blocks = [
        rng.standard_normal((g, 32)),
        rng.standard_cauchy((g, 32)),
        rng.standard_normal((g, 32)) * 10.0 ** rng.uniform(-40, 38, (g, 1)),
        np.full((4, 32), 3.0), np.full((4, 32), -0.25), np.zeros((3, 32)),
        np.full((2, 32), 1e-45), np.full((2, 32), -FMAX),
        rng.integers(-16, 17, (g, 32)) / 2.0,   # many exact .5 ties after scaling
        np.tile(np.linspace(-1, 1, 32), (4, 1)),
    ]
    x = np.concatenate([np.asarray(b, np.float64) for b in blocks]).astype(np.float32)
    x[-1, 0] = -0.0
    return x


@pytest.mark.parametrize("name", GGUF_PY)
def test_quantize_and_dequantize_match_gguf_py(name, rng):
    gq = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    t = getattr(GGMLQuantizationType, name.upper())
    x = weight_inputs(rng)
    got = qk.quantize(x, format=fmt(name))
    with np.errstate(all="ignore"):
        want = gq.quantize(x, t)
    assert_same_records(got, want, name)
    with np.errstate(all="ignore"):
        deq_want = gq.dequantize(got, t).reshape(-1, 32)
    assert_same_f32(qk.dequantize(got, fmt(name)), deq_want, name)
    # and on arbitrary record bytes (any f16 pattern in d and m)
    raw = rng.integers(0, 256, (256, fmt(name).block_bytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        assert_same_f32(qk.dequantize(raw, fmt(name)), gq.dequantize(raw, t).reshape(-1, 32))


@pytest.mark.parametrize("name", FORMATS)
def test_quantize_matches_the_oracle(name, rng):
    x = weight_inputs(rng, g=64)
    got = qk.quantize(x, format=fmt(name))
    want = np.stack([np.frombuffer(ref.legacy_quantize_block(name.upper(), r), np.uint8)
                     for r in x])
    assert_same_records(got, want, name)


@needs_ggml
@pytest.mark.parametrize("name", FORMATS)
def test_quantize_and_dequantize_match_ggml(name, rng):
    x = weight_inputs(rng)
    got = qk.quantize(x, format=fmt(name))
    assert_same_records(got, GGML.quantize_ref(fmt(name).ggml_type, x), name)
    if name != "q8_1":  # ggml has no Q8_1 dequantizer
        raw = rng.integers(0, 256, (256, fmt(name).block_bytes), dtype=np.uint8)
        assert_same_f32(qk.dequantize(raw, fmt(name)), GGML.dequantize(fmt(name).ggml_type, raw))


def test_documented_quirks():
    zero = np.zeros((1, 32), np.float32)
    # Q4_0 / Q5_0 of a zero block store d = max / -8 = -0.0 (as ggml does)
    for name in ("q4_0", "q5_0"):
        assert qk.quantize(zero, format=fmt(name))[0, :2].tobytes() == b"\x00\x80"
    assert qk.quantize(zero, format=fmt("q8_0"))[0, :2].tobytes() == b"\x00\x00"
    # Q8_0 rounds halves away from zero: with amax = 127, id = 1
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [127.0, 0.5, 1.5, -0.5, -2.5]
    q = qk.decode(qk.quantize(x, format=fmt("q8_0")), fmt("q8_0")).q[0, :5]
    assert q.tolist() == [127, 1, 2, -1, -3]
    # Q4_0 truncates after adding 8.5: a value of exactly -max maps to 15 via min(15, 16)
    x = np.zeros((1, 32), np.float32)
    x[0, :2] = [-4.0, 4.0]
    q = qk.decode(qk.quantize(x, format=fmt("q4_0")), fmt("q4_0")).q[0, :2]
    assert q.tolist() == [0, 15]


@pytest.mark.parametrize("name", FORMATS)
def test_decode_matches_the_oracle(name, rng):
    raw = rng.integers(0, 256, (64, fmt(name).block_bytes), dtype=np.uint8)
    f = qk.decode(raw, fmt(name))
    assert isinstance(f, qk.BlockFields) and f.q.shape == (64, 32)
    for b in range(64):
        dec = ref.legacy_decode(name.upper(), raw[b].tobytes())
        assert f.q[b].tolist() == dec["q"]
        assert_same_f32(np.float32(f.d[b]), dec["d"])
        for key in ("m", "s"):
            if key in dec:
                assert_same_f32(np.float32(getattr(f, key)[b]), dec[key])
            else:
                assert getattr(f, key) is None
    assert qk.find_invalid_records(raw, fmt(name)).size == 0


def _pairs(rng, name, g, wild):
    act = qk.activation_format(fmt(name))
    if wild:
        w = rng.integers(0, 256, (g, fmt(name).block_bytes), dtype=np.uint8)
        x = rng.integers(0, 256, (g, act.block_bytes), dtype=np.uint8)
    else:
        w = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=fmt(name))
        x = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
    return w, x, act


@pytest.mark.parametrize("name", WEIGHTS)
@pytest.mark.parametrize("wild", [False, True], ids=["quantized", "any-bytes"])
def test_dot_matches_the_oracle(name, wild, rng):
    for g in (1, 2, 7, 64):
        w, x, act = _pairs(rng, name, g, wild)
        got = qk.quantized_dot(w, x, lhs_format=fmt(name), rhs_format=act)
        assert got.dtype == np.float32 and got.shape == ()
        assert_same_f32(got, ref.legacy_dot(name.upper(), w, act.name, x), f"{name} G={g}")


@pytest.mark.parametrize("name", WEIGHTS)
def test_dot_extremes(name):
    act = qk.activation_format(fmt(name))
    w = np.full((3, fmt(name).block_bytes), 0xFF, np.uint8)   # d = dmin = NaN patterns
    x = np.full((3, act.block_bytes), 0x80, np.uint8)          # q = -128, d = -0.0-ish
    w[0, :4] = [0x00, 0x3C, 0x00, 0x3C]                        # d = 1, m = 1 where present
    x[0, :4] = [0x00, 0x3C, 0x00, 0x7C]                        # d = 1, s = inf where present
    for g in (1, 3):
        got = qk.quantized_dot(w[:g], x[:g], lhs_format=fmt(name), rhs_format=act)
        assert_same_f32(got, ref.legacy_dot(name.upper(), w[:g], act.name, x[:g]))
    assert_same_f32(qk.quantized_dot(w[:0], x[:0], lhs_format=fmt(name), rhs_format=act),
                    np.float32(0.0))


@needs_ggml
@pytest.mark.parametrize("name", WEIGHTS)
def test_dot_is_close_to_ggml(name, rng):
    """A sanity check: ggml orders its float steps differently, so close, not equal."""
    w, x, act = _pairs(rng, name, 128, wild=False)
    assert GGML.vec_dot_type(fmt(name).ggml_type) == act.ggml_type
    ours = float(qk.quantized_dot(w, x, lhs_format=fmt(name), rhs_format=act))
    theirs = GGML.vec_dot(fmt(name).ggml_type, w, x)
    scale = float(np.abs(qk.dequantize(w, fmt(name))).sum() * np.abs(qk.dequantize(x, act)).max())
    assert abs(ours - theirs) <= 1e-5 * scale


# Q5_0 and Q5_1 under -m slow (each case compiles its own gemm and threaded runners, ~12 s of
# CPU cold; tests/simd/test_legacy_vnni.py checks their vector gemv against the portable loops on
# any bytes by default); Q4_0, Q4_1 and Q8_0 by default
@pytest.mark.parametrize("name", [n if n not in ("q5_0", "q5_1") else
                                  pytest.param(n, marks=pytest.mark.slow) for n in WEIGHTS])
def test_gemv_gemm_matmul_equal_dot(name, rng):
    rows, g = 19, 3
    act = qk.activation_format(fmt(name))
    w = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32),
                    format=fmt(name)).reshape(rows, g, -1)
    xf = rng.standard_normal((5, g * 32)).astype(np.float32)
    xq = qk.quantize(xf.reshape(-1, 32), format=act).reshape(5, g, -1)
    want = np.array([[qk.quantized_dot(w[r], xq[a], lhs_format=fmt(name), rhs_format=act)
                      for r in range(rows)] for a in range(5)], np.float32)
    for threads in (1, 2):
        assert_same_f32(qk.gemv(w, xq[0], lhs_format=fmt(name), rhs_format=act,
                                threads=threads), want[0])
        assert_same_f32(qk.gemm(w, xq, lhs_format=fmt(name), rhs_format=act,
                                threads=threads), want)
        assert_same_f32(qk.matmul(w, xf, lhs_format=fmt(name), threads=threads), want)
        assert_same_f32(qk.matmul(w, xf[1], lhs_format=fmt(name), threads=threads), want[1])


# One weight format per activation pairing by default (Q4_0 with Q8_0, Q4_1 with Q8_1): each
# compiles the strided threaded gemv anew; the others under -m slow.
@pytest.mark.parametrize("name", [n if n in ("q4_0", "q4_1") else pytest.param(
    n, marks=pytest.mark.slow) for n in WEIGHTS])
def test_gemv_prefetching_tiles_strided_rows(name, rng):
    """Rows in several 8-row tiles (the gemv prefetches the next tile's records) taken as a
    strided view of every other row: each output equals its row's dot."""
    rows, g = 40, 5
    act = qk.activation_format(fmt(name))
    w2 = qk.quantize(rng.standard_normal((2 * rows * g, 32)).astype(np.float32),
                     format=fmt(name)).reshape(2 * rows, g, -1)
    w = w2[::2]
    xq = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), format=act)
    want = np.array([qk.quantized_dot(w[r], xq, lhs_format=fmt(name), rhs_format=act)
                     for r in range(rows)], np.float32)
    for threads in (1, 2):
        assert_same_f32(qk.gemv(w, xq, lhs_format=fmt(name), rhs_format=act, threads=threads),
                        want)


@pytest.mark.parametrize("name", FORMATS)
def test_errors(name):
    f = fmt(name)
    with pytest.raises(ValueError, match=r"values: expected shape \[G, 32\]"):
        qk.quantize(np.zeros((2, 256), np.float32), format=f)
    with pytest.raises(TypeError, match="values: expected float32"):
        qk.quantize(np.zeros((2, 32)), format=f)
    x = np.ones((4, 32), np.float32)
    x[2, 7] = np.inf
    out = np.full((4, f.block_bytes), 5, np.uint8)
    with pytest.raises(qk.QuantizationDomainError, match=r"^block 2: values\[2, 7\] is inf"):
        qk.quantize(x, format=f, out=out)
    assert (out == 5).all()
    with pytest.raises(ValueError, match=rf"records: expected shape \[G, {f.block_bytes}\]"):
        qk.decode(np.zeros((2, f.block_bytes + 1), np.uint8), f)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FORMATS),
       arrays(np.float32, (3, 32), elements=st.floats(width=32, allow_nan=False,
                                                      allow_infinity=False)))
def test_quantize_property_matches_oracle(name, x):
    got = qk.quantize(x, format=fmt(name))
    want = np.stack([np.frombuffer(ref.legacy_quantize_block(name.upper(), r), np.uint8)
                     for r in x])
    assert_same_records(got, want, name)


@pytest.mark.parametrize("name", FORMATS)
def test_quantize_equal_magnitudes_keep_the_first(name):
    """ggml keeps the first value of largest magnitude (strict ``<``): with +m and -m in one
    block the sign of the earlier one sets d.  Every ordered pair of positions, both signs
    first, beside smaller values, zeros of both signs and a subnormal."""
    rows = []
    for i in range(32):
        for k in (0, 5, 16, 31):
            if k == i:
                continue
            for first in (1.0, -1.0):
                r = np.linspace(-0.5, 0.5, 32, dtype=np.float32)
                r[3] = -0.0
                r[7] = np.float32(1e-45)
                r[i] = first * 6.0
                r[k] = -first * 6.0
                rows.append(r)
    x = np.stack(rows).astype(np.float32)
    got = qk.quantize(x, format=fmt(name))
    want = np.stack([np.frombuffer(ref.legacy_quantize_block(name.upper(), r), np.uint8)
                     for r in x])
    assert_same_records(got, want, name)
