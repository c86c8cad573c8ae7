"""numba_qk.models.kernels against numpy emulations of ggml-cpu's arithmetic."""

import numpy as np
import pytest

from numba_qk.models import kernels as K


def test_rms_norm_follows_ggml_step_by_step(rng):
    x = rng.standard_normal((5, 96)).astype(np.float32) * 3
    w = rng.standard_normal(96).astype(np.float32)
    eps = np.float32(1e-5)
    out = np.empty_like(x)
    K.rms_norm(x, w, eps, out)
    for t in range(5):
        s = 0.0
        for v in x[t]:
            s += float(np.float32(v * v))        # f32 squares, double sum
        mean = np.float32(s / 96)
        scale = np.float32(1) / np.float32(np.sqrt(np.float32(mean + eps)))
        np.testing.assert_array_equal(out[t], (x[t] * scale) * w)


NO_FACTORS = np.empty(0, np.float32)
ONE = np.float32(1.0)


def test_rope_layouts(rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    pos = np.array([0, 1, 7])
    for neox in (False, True):
        y = x.copy()
        K.rope(y, pos, 8, 10000.0, neox, NO_FACTORS, ONE, ONE)
        np.testing.assert_array_equal(y[0], x[0])          # position 0: the identity
        pairs = [(i, i + 4) for i in range(4)] if neox else [(i, i + 1) for i in range(0, 8, 2)]
        for t in range(3):
            for n, (a, b) in enumerate(pairs):
                theta = pos[t] * 10000.0 ** (-2 * n / 8)
                c, s = np.cos(theta), np.sin(theta)
                np.testing.assert_allclose(y[t, :, a], x[t, :, a] * c - x[t, :, b] * s, atol=1e-5)
                np.testing.assert_allclose(y[t, :, b], x[t, :, a] * s + x[t, :, b] * c, atol=1e-5)
    y = x.copy()
    K.rope(y, pos, 4, 10000.0, False, NO_FACTORS, ONE, ONE)   # dims past n_rot stay
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])


def test_rope_factors_linear_scale_and_attn_factor(rng):
    """Llama 3.1's rope_freqs divide each pair's angle, linear scaling multiplies it by
    1/factor, the attention factor scales cos and sin (ggml's rope_yarn without YaRN)."""
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    pos = np.array([0, 5, 300])
    ff = np.array([1.0, 2.0, 8.0, 31.5], np.float32)
    for neox in (False, True):
        y = x.copy()
        K.rope(y, pos, 8, 500000.0, neox, ff, np.float32(0.25), np.float32(1.5))
        pairs = [(i, i + 4) for i in range(4)] if neox else [(i, i + 1) for i in range(0, 8, 2)]
        for t in range(3):
            for n, (a, b) in enumerate(pairs):
                theta = 0.25 * pos[t] * 500000.0 ** (-2 * n / 8) / ff[n]
                c, s = 1.5 * np.cos(theta), 1.5 * np.sin(theta)
                np.testing.assert_allclose(y[t, :, a], x[t, :, a] * c - x[t, :, b] * s,
                                           atol=2e-4, rtol=1e-4)
                np.testing.assert_allclose(y[t, :, b], x[t, :, a] * s + x[t, :, b] * c,
                                           atol=2e-4, rtol=1e-4)
    y1, y2 = x.copy(), x.copy()    # factors of 1, scale 1, attn factor 1: the plain rotation
    K.rope(y1, pos, 8, 10000.0, False, np.ones(4, np.float32), ONE, ONE)
    K.rope(y2, pos, 8, 10000.0, False, NO_FACTORS, ONE, ONE)
    np.testing.assert_array_equal(y1, y2)


def test_geglu_table_and_swiglu(rng):
    tab = K.gelu_f16_table()
    g = np.array([-12.0, -10.0, -1.0, 0.0, 0.5, 3.0, 10.0, 11.0], np.float32)
    u = np.full_like(g, 2.0)
    out = np.empty_like(g)
    K.geglu(g, u, tab, out)
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g.astype(np.float64) ** 3)))
    np.testing.assert_allclose(out, 2 * gelu, rtol=2e-3, atol=1e-6)   # the f16 table's rounding
    assert out[0] == 0 and out[1] == 0 and out[-1] == 22 and out[-2] == 20
    K.swiglu(g, u, out)
    np.testing.assert_allclose(out, 2 * g / (1 + np.exp(-g.astype(np.float64))), rtol=1e-6)


def test_attention_window_and_groups():
    """One key per position with one-hot values: the output of each query head is the softmax
    weight it gives each position, so the mask is visible."""
    T, Hq, Hkv, hd = 6, 4, 2, 8
    q = np.zeros((T, Hq, hd), np.float32)
    k = np.zeros((Hkv, T, hd), np.float32)
    v = np.zeros((Hkv, T, hd), np.float32)
    for j in range(T):
        v[:, j, j] = 1.0
    out = np.empty((T, Hq, hd), np.float32)
    K.attention(q, K.key_blocks(k), _f16_bits(v), 0, np.float32(1.0), 3, out)   # equal scores
    for t in range(T):
        lo = max(0, t - 2)
        want = np.zeros(hd, np.float32)
        want[lo:t + 1] = np.float32(np.float16(1.0 / (t + 1 - lo)))
        for h in range(Hq):
            np.testing.assert_array_equal(out[t, h], want)


def _f16_bits(a):
    return a.astype(np.float16).view(np.uint16)


def _attention_in_order(q, k, v, n_past, scale, window):
    """The documented numerics written out: per key an f32 sum of f32 products in the order of
    i, ``s * scale``, softmax (expf in f32, sum in double, times (float)(1/sum)), p rounded to
    f16, ``sum_j p_j v_j`` in f32 in the order of j.  k, v: ``[Hkv, n_kv, hd]``."""
    f = np.float32
    T, Hq, hd = q.shape
    group = Hq // k.shape[0]
    out = np.empty_like(q)
    for t in range(T):
        pos = n_past + t
        j0 = max(0, pos - window + 1) if window > 0 else 0
        for h in range(Hq):
            kh = h // group
            sc = []
            for j in range(j0, pos + 1):
                acc = f(0.0)
                for i in range(hd):
                    acc = f(acc + f(q[t, h, i] * k[kh, j, i]))
                sc.append(f(acc * scale))
            mx = max(sc)
            es = [f(np.exp(f(s - mx))) for s in sc]
            inv = f(1.0 / sum(float(e) for e in es))
            acc_v = np.zeros(hd, np.float32)
            for j, e in zip(range(j0, pos + 1), es):
                p = f(np.float16(f(e * inv)))
                acc_v = (acc_v + (p * v[kh, j]).astype(np.float32)).astype(np.float32)
            out[t, h] = acc_v
    return out


@pytest.mark.parametrize("window", [0, 3, 20])
def test_attention_sums_in_the_documented_order(rng, window):
    """Each score is the in-order f32 sum, bit for bit, as are the softmax and the weighted
    values (against the docstring's steps written out in numpy)."""
    T, Hq, Hkv, hd, n_past = 3, 4, 2, 37, 70
    q = rng.standard_normal((T, Hq, hd)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((Hkv, n_past + T, hd)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((Hkv, n_past + T, hd)).astype(np.float16).astype(np.float32)
    out = np.empty((T, Hq, hd), np.float32)
    K.attention(q, K.key_blocks(k), _f16_bits(v), n_past, np.float32(0.125), window, out)
    np.testing.assert_array_equal(out, _attention_in_order(q, k, v, n_past, np.float32(0.125),
                                                           window))
