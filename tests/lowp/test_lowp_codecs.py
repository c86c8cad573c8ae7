"""Encode/decode of every low-precision type against ml_dtypes/numpy and the exact oracle.

Deliberate differences from ml_dtypes (DESIGN.md §8), each tested on its own row below:
* e4m3 overflow and +-inf saturate to +-448 (ml_dtypes: NaN);
* fp6/fp4 NaN -> +0 (ml_dtypes: -0 for +NaN, +0 for -NaN);
* e8m0: +inf and overflow -> 0xFE (ml_dtypes: NaN); f32 subnormals round to the nearest power
  of two (ml_dtypes rounds every value in (2^-127, 2^-126) up to 2^-126);
* f16/bf16/e5m2 NaN: canonical quiet NaN with the sign (numpy's f16 keeps the payload);
* f64 sources are rounded once (ml_dtypes rounds through f32 for bf16/fp8/fp6/fp4);
* integer targets round half to even and saturate inf (ml_dtypes int4 truncates, inf -> 0).
Everything else must agree bit for bit; the counts are asserted.
"""

import math

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import lowp as ref
from subsets import default_few

ml = pytest.importorskip("ml_dtypes")

FLOATS = {qk.bf16: ml.bfloat16, qk.f16: np.float16, qk.e4m3: ml.float8_e4m3fn,
          qk.e5m2: ml.float8_e5m2, qk.e2m3: ml.float6_e2m3fn, qk.e3m2: ml.float6_e3m2fn,
          qk.e2m1: ml.float4_e2m1fn, qk.e8m0: ml.float8_e8m0fnu}
ALL = list(FLOATS) + [qk.i8, qk.u8, qk.i4, qk.u4, qk.u1]


def codes_of(res):
    """One unsigned code per element of an astype result (packed types unpacked)."""
    if isinstance(res, qk.Tensor):
        return res.codes().reshape(-1).astype(np.int64)
    return res.reshape(-1).view(f"u{res.dtype.itemsize}").astype(np.int64)


def ml_codes(x, t):
    """ml_dtypes'/numpy's codes for the same conversion (fp6/fp4: low bits of the byte)."""
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.asarray(x).astype(FLOATS[t]).reshape(-1)
    return r.view(f"u{r.dtype.itemsize}").astype(np.int64)


def all_codes(t):
    n = 1 << (t.code_bits if t.bits != 6 else 6)
    return np.arange(n, dtype=np.int64)


def tensor_of_codes(t, codes):
    """A Tensor holding ``codes`` (packed where needed, via manual nibble packing)."""
    pb = t.block_size
    if pb == 1:
        return qk.Tensor(np.asarray(codes, dtype=qk.tensor.storage_dtype(t) if t.numpy_dtype is None
                                    else f"u{t.block_bytes}"), dtype=t)
    c = np.asarray(codes, np.uint8)
    if pb == 2:
        return qk.Tensor((c[0::2] << 4) | c[1::2], dtype=t)
    return qk.Tensor(np.packbits(c), dtype=t)


def same_value_bits(ours, theirs, t):
    """Bit equality, except any NaN equals any NaN *of the same sign* (payloads may differ)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if t in (qk.f16, qk.bf16, qk.e5m2):
        sign = 1 << (t.bits - 1)
        emask = ((1 << t.exponent_bits) - 1) << t.mantissa_bits
        mmask = (1 << t.mantissa_bits) - 1
        nan_o = ((ours & emask) == emask) & ((ours & mmask) != 0)
        nan_t = ((theirs & emask) == emask) & ((theirs & mmask) != 0)
        both = nan_o & nan_t & ((ours & sign) == (theirs & sign))
        return (ours == theirs) | both
    return ours == theirs


# ---- decode: exhaustive -----------------------------------------------------------------------

@pytest.mark.parametrize("t", list(FLOATS), ids=str)
def test_decode_exhaustive_vs_ml_dtypes(t):
    codes = all_codes(t)
    ours = qk.astype(tensor_of_codes(t, codes), qk.f32)
    store = codes.astype(np.uint16 if t.block_bytes == 2 else np.uint8)
    theirs = store.view(FLOATS[t]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)) or \
        np.array_equal(ours, theirs, equal_nan=True)
    # and the oracle, value by value (NaN == NaN)
    oracle = np.array([ref.decode(t, c) for c in codes], np.float64)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(ours.astype(np.float64), oracle, equal_nan=True)
    # f64 decode is the same values
    assert np.array_equal(qk.astype(qk.astype(tensor_of_codes(t, codes), qk.f32), qk.f32), ours,
                          equal_nan=True)


@pytest.mark.parametrize("t", [qk.i8, qk.u8, qk.i4, qk.u4, qk.u1], ids=str)
def test_decode_exhaustive_ints(t):
    codes = np.resize(all_codes(t), max(8, len(all_codes(t))))   # u1: a whole byte
    ours = qk.astype(tensor_of_codes(t, codes), qk.i32)
    assert ours.tolist() == [ref.decode(t, c) for c in codes]


def test_i4_u4_decode_vs_ml_dtypes_views():
    c = np.arange(16, dtype=np.uint8)
    assert qk.astype(tensor_of_codes(qk.i4, c), qk.f32).tolist() == \
        np.arange(16, dtype=np.int8).astype(ml.int4).astype(np.float32).tolist()[:8] + list(range(-8, 0))
    assert qk.Tensor(qk.astype(np.arange(-8, 8), qk.i4)).numpy().tolist() == list(range(-8, 8))
    assert qk.astype(qk.astype(np.arange(16), qk.u4).numpy(), qk.i32).tolist() == list(range(16))


# ---- f32 -> type: every rounding boundary +-1 ulp ------------------------------------------------

def boundary_inputs(t):
    """Every finite value of t, every midpoint between neighbours (and above the max), and the
    f32 values one ulp either side of each; both signs; subnormal boundaries included."""
    codes = all_codes(t)
    vals = np.array(sorted({abs(ref.decode(t, c)) for c in codes
                            if math.isfinite(ref.decode(t, c))}), np.float64)
    ulp_top = math.ldexp(1.0, int(math.floor(math.log2(vals[-1]))) - max(t.mantissa_bits, 0))
    ext = np.append(vals, vals[-1] + ulp_top)
    mids = (ext[:-1] + ext[1:]) / 2
    with np.errstate(over="ignore"):
        pts = np.concatenate([vals, mids, [vals[-1] + ulp_top]]).astype(np.float32)
    up = np.nextafter(pts, np.float32(np.inf))
    down = np.nextafter(pts, np.float32(0))
    x = np.concatenate([pts, up, down])
    return np.concatenate([x, -x])


def policy_mask(x, t):
    """Inputs where DESIGN.md §8 deliberately differs from ml_dtypes (tested separately)."""
    with np.errstate(invalid="ignore"):
        x = np.asarray(x, np.float64)
    nan = np.isnan(x)
    if t is qk.e4m3:
        return nan | (np.abs(x) >= 464)             # ml_dtypes: overflow -> NaN
    if t in (qk.e2m3, qk.e3m2, qk.e2m1):
        return nan
    if t is qk.e8m0:       # ml: inf/overflow -> NaN; f32 subnormals (< 2^-126) round up
        return nan | (x == np.inf) | (x >= 2.0 ** 127 * 1.5) | (np.abs(x) < 2.0 ** -126)
    return np.zeros(x.shape, bool)


@pytest.mark.parametrize("t", list(FLOATS), ids=str)
def test_f32_boundaries_vs_ml_dtypes_and_oracle(t):
    x = boundary_inputs(t)
    if t is qk.e8m0:
        x = x[x > 0]                                 # ml_dtypes and §8 agree on positives only
    ours = codes_of(qk.astype(x, t))
    keep = ~policy_mask(x, t)
    theirs = ml_codes(x[keep], t)
    ok = same_value_bits(ours[keep], theirs, t)
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, (f"{t}: {bad.size} of {keep.sum()} differ; first x={x[keep][bad[0]]!r} "
                           f"ours={ours[keep][bad[0]]:#x} ml={theirs[bad[0]]:#x}")
    # the oracle on a deterministic sample (all of it for <= 8-bit types)
    step = 1 if t.code_bits <= 8 else 37
    for xi, oi in zip(x[::step], ours[::step]):
        assert oi == ref.encode(t, float(xi)), (t, float(xi), hex(oi))


@pytest.mark.parametrize("t", [qk.i8, qk.u8, qk.i4, qk.u4, qk.u1], ids=str)
def test_f32_to_ints_ties_and_saturation(t):
    k = np.arange(-300, 301, dtype=np.float64) / 2             # every half-integer: ties
    x = np.concatenate([k, np.nextafter(k, np.inf), np.nextafter(k, -np.inf),
                        [np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30, -0.0]]).astype(np.float32)
    x = x[:len(x) // 8 * 8]                                     # u1: whole bytes
    ours = codes_of(qk.astype(x, t))
    assert ours.tolist() == [ref.encode(t, float(v)) for v in x]
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(x)
        expect = np.clip(np.rint(x[finite].astype(np.float64)), t.min, t.max).astype(np.int64)
    assert (ours[finite] == (expect & ((1 << t.code_bits) - 1))).all()


# ---- random bit patterns --------------------------------------------------------------------

def random_f32(n, seed):
    return np.random.default_rng(seed).integers(0, 2 ** 32, n, dtype=np.uint64).astype(
        np.uint32).view(np.float32)


def check_random(t, n, seed):
    x = random_f32(n, seed)
    if t is qk.e8m0:
        x = np.abs(x)
    ours = codes_of(qk.astype(x, t))
    pol = policy_mask(x, t) | ((x <= 0) if t is qk.e8m0 else False)
    theirs = ml_codes(x[~pol], t)
    ok = same_value_bits(ours[~pol], theirs, t)
    assert ok.all(), f"{t}: {(~ok).sum()} of {ok.size} differ from ml_dtypes"
    # the policy rows: against the oracle
    for xi, oi in zip(x[pol][:2000], ours[pol][:2000]):
        assert oi == ref.encode(t, float(xi)), (t, float(xi), hex(oi))
    return ok.size


@pytest.mark.parametrize("t", list(FLOATS), ids=str)
def test_random_bit_patterns(t):
    assert check_random(t, 200_000, seed=hash(t.name) & 0xFFFF) > 100_000


@pytest.mark.slow
@pytest.mark.parametrize("t", list(FLOATS), ids=str)
def test_random_bit_patterns_1e7(t):
    assert check_random(t, 10_000_000, seed=7) > 5_000_000


# ---- the policy table, row by row ------------------------------------------------------------

SPECIALS = np.array([np.inf, -np.inf, np.nan, -np.nan, 1e38, -1e38, 3e38, -3e38, 0.0, -0.0,
                     1e-45, -1e-45], np.float32)

POLICY = {  # expected codes for SPECIALS, straight from DESIGN.md §8
    qk.f16: [0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C00, 0xFC00, 0x7C00, 0xFC00, 0, 0x8000, 0, 0x8000],
    qk.bf16: [0x7F80, 0xFF80, 0x7FC0, 0xFFC0, None, None, None, None, 0, 0x8000, 0, 0x8000],  # finite
    qk.e5m2: [0x7C, 0xFC, 0x7E, 0xFE, 0x7C, 0xFC, 0x7C, 0xFC, 0, 0x80, 0, 0x80],
    qk.e4m3: [0x7E, 0xFE, 0x7F, 0xFF, 0x7E, 0xFE, 0x7E, 0xFE, 0, 0x80, 0, 0x80],
    qk.e2m3: [0x1F, 0x3F, 0, 0, 0x1F, 0x3F, 0x1F, 0x3F, 0, 0x20, 0, 0x20],
    qk.e3m2: [0x1F, 0x3F, 0, 0, 0x1F, 0x3F, 0x1F, 0x3F, 0, 0x20, 0, 0x20],
    qk.e2m1: [0x7, 0xF, 0, 0, 0x7, 0xF, 0x7, 0xF, 0, 0x8, 0, 0x8],
    qk.e8m0: [0xFE, 0xFF, 0xFF, 0xFF, None, 0xFF, 0xFE, 0xFF, 0xFF, 0xFF, 0, 0xFF],  # 1e38: finite
    qk.i8: [0x7F, 0x80, 0, 0, 0x7F, 0x80, 0x7F, 0x80, 0, 0, 0, 0],
    qk.u8: [0xFF, 0, 0, 0, 0xFF, 0, 0xFF, 0, 0, 0, 0, 0],
    qk.i4: [0x7, 0x8, 0, 0, 0x7, 0x8, 0x7, 0x8, 0, 0, 0, 0],
    qk.u4: [0xF, 0, 0, 0, 0xF, 0, 0xF, 0, 0, 0, 0, 0],
    qk.u1: [1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0],
}


@pytest.mark.parametrize("t", list(POLICY), ids=str)
def test_policy_rows(t):
    x = SPECIALS if t.block_size == 1 else np.concatenate([SPECIALS, np.zeros(4, np.float32)])
    got = codes_of(qk.astype(x, t))[:len(SPECIALS)]
    want = POLICY[t]
    assert all(w is None or g == w for g, w in zip(got.tolist(), want)), [hex(v) for v in got]
    assert got.tolist() == [ref.encode(t, float(v)) for v in SPECIALS]
    got64 = codes_of(qk.astype(x.astype(np.float64), t))[:len(SPECIALS)]
    assert got64.tolist() == got.tolist()


def test_i32_policy():
    x = np.array([np.inf, -np.inf, np.nan, 3e9, -3e9, 2.5, -2.5, 2147483520.0], np.float32)
    assert qk.astype(x, qk.i32).tolist() == [2**31 - 1, -2**31, 0, 2**31 - 1, -2**31, 2, -2,
                                             2147483520]


def test_e8m0_rounding_rows():
    x = np.array([1.0, 1.4999999, 1.5, 2.9999998, 3.0, 2.0 ** -127, 1.4 * 2.0 ** -127,
                  1.5 * 2.0 ** -127, 2.0 ** -128, 2.0 ** -149, 2.0 ** 127, 1.5 * 2.0 ** 127], np.float32)
    got = codes_of(qk.astype(x, qk.e8m0)).tolist()
    assert got == [127, 127, 128, 128, 129, 0, 0, 1, 0, 0, 254, 254]
    assert got == [ref.encode(qk.e8m0, float(v)) for v in x]


# ---- f64 sources: one rounding, against the exact oracle -------------------------------------

def f64_double_rounding_traps(t, n, seed):
    """f64 values just off a midpoint of t by less than half an f32 ulp: rounding to f32 first
    lands exactly on the midpoint and then rounds to even -- the double-rounding error."""
    rng = np.random.default_rng(seed)
    vals = np.array(sorted({abs(ref.decode(t, c)) for c in all_codes(t)
                            if math.isfinite(ref.decode(t, c))}), np.float64)
    i = rng.integers(0, len(vals) - 1, n)
    mid = (vals[i] + vals[i + 1]) / 2
    eps = np.abs(mid) * 2.0 ** -30 * rng.choice([-1, 1], n)      # << half an f32 ulp
    x = (mid + eps) * rng.choice([-1.0, 1.0], n)
    return x


@pytest.mark.parametrize("t", [qk.bf16, qk.f16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e3m2, qk.e2m1],
                         ids=str)
def test_f64_single_rounding_vs_oracle(t):
    x = f64_double_rounding_traps(t, 3000, seed=3)
    x = np.concatenate([x, np.random.default_rng(4).standard_normal(2000) * t.max / 3])
    ours = codes_of(qk.astype(x, t))
    oracle = np.array([ref.encode(t, float(v)) for v in x])
    assert np.array_equal(ours, oracle)
    if t is not qk.f16:                       # numpy's f64 -> f16 is correctly rounded already
        with np.errstate(over="ignore"):
            through_f32 = ml_codes(x.astype(np.float32), t)
        assert (through_f32 != oracle).sum() > 100   # the trap is real: double rounding differs


def test_f64_to_f32_and_e8m0_vs_oracle():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3000) * np.exp2(rng.integers(-140, 120, 3000))
    assert np.array_equal(qk.astype(x, qk.f32), x.astype(np.float32))
    got = codes_of(qk.astype(np.abs(x), qk.e8m0))
    assert got.tolist() == [ref.encode(qk.e8m0, float(v)) for v in np.abs(x)]


@pytest.mark.slow  # default run under 10 minutes (a sweep over every target type)
def test_int64_sources_round_once():
    big = np.array([2**62 + 2**38 + 1, -(2**62 + 2**38 + 1), 2**63 - 1, -2**63, 2**53 + 1,
                    (1 << 40) + (1 << 32), 16777217, 2**24 + 3], np.int64)
    for t in (qk.f32, qk.bf16, qk.f16, qk.e4m3, qk.i32, qk.i4):
        got = codes_of(qk.astype(big, t)).tolist()
        assert got == [ref.encode(t, int(v)) for v in big], t
    u = np.array([2**64 - 1, 2**63 + 2**39 + 1, 5], np.uint64)
    assert codes_of(qk.astype(u, qk.f32)).tolist() == [ref.encode(qk.f32, int(v)) for v in u]


@pytest.mark.slow  # default run under 10 minutes (a sweep over every ml_dtypes source)
def test_ml_dtypes_sources_by_value():
    x = random_f32(5000, 11)
    for src in (ml.bfloat16, ml.float8_e4m3fn, ml.float8_e5m2, ml.float6_e2m3fn,
                ml.float4_e2m1fn, ml.float8_e4m3, ml.float8_e8m0fnu, ml.int4, ml.uint4):
        with np.errstate(invalid="ignore", over="ignore"):
            a = x.astype(src)
        want = a.astype(np.float32)
        got = qk.astype(a, qk.f32)
        assert np.array_equal(got, want, equal_nan=True), src
    for bad in (ml.float8_e4m3fnuz, ml.float8_e5m2fnuz, ml.float8_e4m3b11fnuz, ml.float8_e3m4):
        with pytest.raises(TypeError, match="not accepted"):
            qk.astype(np.zeros(2, bad), qk.f32)


def test_f16_decode_bits_exact_including_signalling_nans():
    """The hardware widening path keeps every NaN's bits like numpy (no quietening)."""
    c = np.arange(65536, dtype=np.uint16)
    ours = qk.astype(c.view(np.float16), qk.f32).view(np.uint32)
    assert np.array_equal(ours, c.view(np.float16).astype(np.float32).view(np.uint32))
    t = qk.Tensor(c.view(np.float16))
    assert np.array_equal(qk.astype(t, qk.f32).view(np.uint32), ours)


# ---- fp8 NaNs keep their sign (issue 21 B) ----------------------------------------------------

FP8_NAN_CODES = {qk.e4m3: [0x7F, 0xFF], qk.e5m2: [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]}
QUIET_NAN = {qk.f32: (0x7FC00000, 1 << 31), qk.f16: (0x7E00, 0x8000), qk.bf16: (0x7FC0, 0x8000),
             qk.e4m3: (0x7F, 0x80), qk.e5m2: (0x7E, 0x80)}


def fp8_nan_expect(src, dst, codes):
    """The quiet NaN of each code's sign in ``dst`` (the same code when ``dst`` is ``src``)."""
    if dst is src:
        return [int(c) for c in codes]
    q, sign = QUIET_NAN[dst]
    return [q | (sign if c & 0x80 else 0) for c in codes]


@pytest.mark.parametrize("n", default_few([1, 2, 6, 15, 16, 17, 67, 4099], {"1", "17", "4099"}))
# each (src, dst) pair compiles its own converters: the f32 and FP8 targets by default, the
# f16/bf16 ones under -m slow
@pytest.mark.parametrize("dst", default_few(list(QUIET_NAN), {str(qk.f32), str(qk.e4m3),
                                                              str(qk.e5m2)}))
@pytest.mark.parametrize("src", list(FP8_NAN_CODES), ids=str)
def test_fp8_nan_codes_keep_sign_every_target(src, dst, n):
    """Every NaN code of e4m3 / e5m2 gives the quiet NaN of its sign in every float target, on
    the vector runs (16 codes at a time) and on the scalar tails (n = 1, 15, 17, 67 ...), from a
    contiguous source at every phase and from a strided one (the scratch-row path); the same
    bits as ml_dtypes."""
    nans = np.array(FP8_NAN_CODES[src], np.uint8)
    neg, pos = nans[nans >= 0x80], nans[nans < 0x80]
    codes = np.resize(np.stack([neg[::-1], pos]).T.reshape(-1), n + 3)   # signs alternate
    for start in range(3):
        part = codes[start:start + n]
        got = codes_of(qk.astype(qk.Tensor(part, dtype=src), dst))
        assert got.tolist() == fp8_nan_expect(src, dst, part), (start, [hex(c) for c in got])
    strided = np.repeat(codes[:n], 2)[::2]
    got = codes_of(qk.astype(qk.Tensor(strided, dtype=src), dst))
    assert got.tolist() == fp8_nan_expect(src, dst, strided)
    with np.errstate(invalid="ignore"):                   # ml_dtypes agrees bit for bit
        theirs = codes[:n].view(FLOATS[src]).astype(FLOATS[dst] if dst is not qk.f32 else
                                                     np.float32)
    assert got.tolist() == theirs.view(f"u{theirs.dtype.itemsize}").astype(np.int64).tolist()


def test_fp8_nan_sign_in_oracle_scalars_and_njit_helpers():
    from numba_qk import kernels as K

    for t, nans in FP8_NAN_CODES.items():
        dec = getattr(K, f"decode_{t._attr}")
        for c in nans:
            neg = bool(c & 0x80)
            v = ref.decode(t, c)
            assert math.isnan(v) and (math.copysign(1.0, v) < 0) == neg
            s = qk.Scalar.from_bits(t, c)
            assert math.isnan(float(s)) and (math.copysign(1.0, float(s)) < 0) == neg
            assert int(np.float32(dec(np.uint8(c))).view(np.uint32)) == \
                0x7FC00000 | (neg << 31)
            assert ref.encode(qk.e5m2 if t is qk.e4m3 else qk.e4m3, v) == (0x80 if neg else 0) | \
                (0x7E if t is qk.e4m3 else 0x7F)


def test_f16_bf16_to_f32_keep_nan_payload_and_signalling_bit():
    """f16 / bf16 -> f32 is an exact widening: NaN payloads and the signalling bit are kept
    (the documented rule; fp8 NaNs give the canonical quiet NaN)."""
    f16 = np.array([0x7C01, 0xFC01, 0x7D55, 0xFE01, 0x7E00], np.uint16)
    assert qk.astype(f16.view(np.float16), qk.f32).view(np.uint32).tolist() == \
        [0x7F802000, 0xFF802000, 0x7FAAA000, 0xFFC02000, 0x7FC00000]
    bf = np.array([0x7F81, 0xFF81, 0x7FC1, 0xFFD5], np.uint16)
    assert qk.astype(qk.Tensor(bf, dtype=qk.bf16), qk.f32).view(np.uint32).tolist() == \
        [0x7F810000, 0xFF810000, 0x7FC10000, 0xFFD50000]
