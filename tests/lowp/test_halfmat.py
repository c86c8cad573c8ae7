"""F16/BF16 weight matrices (docs/halfmat.md): matmul / gemv / gemm bit for bit against the
oracle written from the numerics text (random and adversarial rows), batch/thread
independence, validation, and GGUFFile.matmul on F16/BF16 tensors."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _halfmat
from numba_qk.testing.reference import halfmat as ref

import gguf_build as B

K = 200          # 6 whole chunks of 32 lanes + a tail of 8
NAMES = {qk.f16: "f16", qk.bf16: "bf16"}


def _weights(t, rows, rng):
    """uint16 codes: normal values plus adversarial rows (subnormals, inf, NaN, +-0, max)."""
    with np.errstate(over="ignore"):
        return _weight_codes(t, rng.standard_normal((rows, K)).astype(np.float32))


def _weight_codes(t, vals):
    """Codes of ``vals`` (at least 7 rows) with rows 1..6 made adversarial."""
    vals[1] *= 1e-6 if t is qk.f16 else 1e-39          # subnormal weights
    vals[2] = -0.0
    vals[3, ::7] = np.inf
    vals[4, 5] = np.nan
    vals[5] *= 6e4 if t is qk.f16 else 3e38             # near the top of the range
    vals[6, ::2] = -vals[6, 1::2]                       # cancellation
    if t is qk.f16:
        return vals.astype(np.float16).view(np.uint16)
    return np.array([[ref.bf16_bits(v) for v in row] for row in vals], np.uint16)


def _acts(rng, batch):
    x = rng.standard_normal((batch, K)).astype(np.float32)
    x[1, 3::5] = 7e4         # overflows the f16 conversion (-> inf)
    x[1, 4::9] = 3e-8        # f16 subnormal / zero
    x[2, 10] = np.nan
    x[2, 11] = -np.inf
    x[3] = -0.0
    x[4] *= 1e30             # bf16 fine, f16 inf
    return x


def _codes_of(t, w):
    return w.view(np.float16) if t is qk.f16 else qk.Tensor(w, dtype=qk.bf16)


def _expect(t, w, x):
    name = NAMES[t]
    return np.array([[ref.dot(name, row, ref.convert(name, xb)) for row in w] for xb in x],
                    np.float32)


@pytest.mark.parametrize("t", [qk.f16, qk.bf16], ids=["f16", "bf16"])
def test_matmul_bits_equal_the_oracle(t):
    rng = np.random.default_rng(24)
    w = _weights(t, 13, rng)       # a row outside the 4-row tiles
    x = _acts(rng, 7)              # odd: an activation outside the 2-activation tiles
    want = _expect(t, w, x).view(np.uint32)
    got = qk.matmul(_codes_of(t, w), x, lhs_format=t)
    np.testing.assert_array_equal(got.view(np.uint32), want)
    for b in range(x.shape[0]):     # the gemv kernel: same bits as each gemm row
        y = qk.matmul(_codes_of(t, w), x[b], lhs_format=t)
        np.testing.assert_array_equal(y.view(np.uint32), want[b])
    strided = np.zeros((x.shape[0], 2 * w.shape[0]), np.float32)[:, ::2]   # a strided out=
    qk.matmul(_codes_of(t, w), x, lhs_format=t, out=strided)
    np.testing.assert_array_equal(strided.view(np.uint32), want)


def test_signed_zeros_nan_and_empty():
    w = np.full((2, 40), -0.0, np.float16)
    x = np.ones(40, np.float32)
    assert qk.matmul(w, x, lhs_format=qk.f16).view(np.uint32).tolist() == [0, 0]   # +0.0
    w[1, 3] = np.inf
    x[3] = 0.0                 # inf * 0 = NaN -> the canonical NaN
    assert qk.matmul(w, x, lhs_format=qk.f16).view(np.uint32)[1] == 0x7FC00000
    empty = qk.matmul(np.zeros((3, 0), np.float16), np.zeros(0, np.float32), lhs_format=qk.f16)
    assert empty.view(np.uint32).tolist() == [0, 0, 0]


@pytest.mark.parametrize("t", [qk.f16, qk.bf16], ids=["f16", "bf16"])
def test_activation_conversion_is_ggmls(t):
    rng = np.random.default_rng(3)
    x = np.concatenate([_acts(rng, 5).ravel(),
                        np.array([np.nan, -np.nan, 65520.0, 65519.0, 1e-45, -1e-40, 3.4e38],
                                 np.float32)])
    x = np.concatenate([x, rng.integers(0, 2**32, 512, dtype=np.uint32).view(np.float32)])
    got = _halfmat.convert_activations(t, x)
    codes = ref.convert(NAMES[t], x)
    want = np.array([ref.value(NAMES[t], c) for c in codes], np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all()


def test_threads_and_gemv_gemm_agree():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((70, 96)).astype(np.float16)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    one = qk.matmul(w, x, lhs_format=qk.f16)
    two = qk.matmul(w, x, lhs_format=qk.f16, threads=2)
    np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))
    xq = x.astype(np.float16)
    np.testing.assert_array_equal(
        qk.gemm(w, xq, lhs_format=qk.f16, rhs_format=qk.f16).view(np.uint32), one.view(np.uint32))
    np.testing.assert_array_equal(
        qk.gemv(w, xq[1], lhs_format=qk.f16, rhs_format=qk.f16, threads=2).view(np.uint32),
        one[1].view(np.uint32))
    # strided weights are read by value (a copy in C order)
    wide = np.zeros((70, 192), np.float16)
    wide[:, ::2] = w
    np.testing.assert_array_equal(qk.matmul(wide[:, ::2], x, lhs_format=qk.f16).view(np.uint32),
                                  one.view(np.uint32))


def test_ml_dtypes_bfloat16_weights():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(9)
    w = rng.standard_normal((5, 64)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal(64).astype(np.float32)
    a = qk.matmul(w, x, lhs_format=qk.bf16)
    b = qk.matmul(qk.Tensor(w.view(np.uint16), dtype=qk.bf16), x, lhs_format=qk.bf16)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    with pytest.raises(TypeError, match="no cast is made"):
        qk.matmul(w, x, lhs_format=qk.f16)


def test_validation_leaves_out_untouched():
    w = np.ones((4, 64), np.float16)
    x = np.ones(64, np.float32)
    out = np.full(4, 7.0, np.float32)
    cases = [
        (TypeError, "float16", lambda: qk.matmul(w.astype(np.float32), x, lhs_format=qk.f16,
                                                 out=out)),
        (TypeError, "bfloat16", lambda: qk.matmul(w.view(np.uint16), x, lhs_format=qk.bf16,
                                                  out=out)),
        (TypeError, "float32", lambda: qk.matmul(w, x.astype(np.float64), lhs_format=qk.f16,
                                                 out=out)),
        (ValueError, "shape", lambda: qk.matmul(w, x[:32], lhs_format=qk.f16, out=out)),
        (ValueError, "rows, K", lambda: qk.matmul(w[0], x, lhs_format=qk.f16, out=out)),
        (ValueError, "out", lambda: qk.matmul(w, x, lhs_format=qk.f16, out=out[:3])),
        (TypeError, "rhs_format", lambda: qk.gemv(w, x.astype(np.float16), lhs_format=qk.f16,
                                                  rhs_format=qk.f32, out=out)),
        (TypeError, "float16", lambda: qk.gemv(w, x, lhs_format=qk.f16, rhs_format=qk.f16,
                                               out=out)),
    ]
    for exc, text, call in cases:
        with pytest.raises(exc, match=text):
            call()
        assert (out == 7.0).all()


def test_gguf_f16_bf16_tensors(tmp_path):
    """GGUFFile.matmul on F16 (type 1) and BF16 (type 30) tensors of a byte-built file (3-D:
    rows = the leading axes) equals qk.matmul on the same codes."""
    pytest.importorskip("gguf")
    import numba_qk.gguf as qg
    rng = np.random.default_rng(1)
    shape = (2, 4, 40)                      # numpy order; GGUF ne = (40, 4, 2)
    f16 = rng.standard_normal(shape).astype(np.float16).view(np.uint16)
    with np.errstate(over="ignore"):
        bf = _weight_codes(qk.bf16, rng.standard_normal((8, 40)).astype(np.float32))
    bf = bf.reshape(shape)
    path = tmp_path / "m.gguf"
    path.write_bytes(B.build(tensors=[("a", (40, 4, 2), 1, f16.tobytes()),
                                      ("b", (40, 4, 2), 30, bf.tobytes())]))
    x = rng.standard_normal((2, 40)).astype(np.float32)
    with qg.open(path) as f:
        for name, t, codes in (("a", qk.f16, f16), ("b", qk.bf16, bf)):
            want = qk.matmul(_codes_of(t, codes.reshape(8, 40)), x, lhs_format=t)
            np.testing.assert_array_equal(f.matmul(name, x).view(np.uint32),
                                          want.view(np.uint32))


@pytest.mark.slow
@pytest.mark.parametrize("t", [qk.f16, qk.bf16], ids=["f16", "bf16"])
def test_random_bit_patterns_sweep(t):
    """Every code (random 16-bit patterns: NaNs, infs, subnormals), K around the chunk edges,
    activations from random f32 bit patterns; gemv, gemm and threads against the oracle."""
    rng = np.random.default_rng(2024)
    for k in (1, 31, 32, 33, 64, 95, 517):
        w = rng.integers(0, 2**16, (9, k), dtype=np.uint16)
        x = rng.integers(0, 2**32, (5, k), dtype=np.uint32).view(np.float32)
        x[::2] = rng.standard_normal((3, k)) * 10.0 ** rng.integers(-45, 39, (3, k))
        want = _expect(t, w, x).view(np.uint32)
        got = qk.matmul(_codes_of(t, w), x, lhs_format=t, threads=2)
        np.testing.assert_array_equal(got.view(np.uint32), want)
        np.testing.assert_array_equal(qk.matmul(_codes_of(t, w), x[4], lhs_format=t)
                                      .view(np.uint32), want[4])
