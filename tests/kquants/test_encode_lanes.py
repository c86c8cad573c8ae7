"""The sub-block lanes of the K-quant encoders (``kernels/kquants/encode_lanes.py``) against the scalar
transcriptions of ggml's searches, bit for bit, on adversarial sub-blocks: ties of the rounding
grid, +-0, constant and all-zero sub-blocks beside live ones, subnormal and overflowing scales,
spikes.  (The whole encoders are checked against ggml's bytes in test_kquants.py /
test_q4_k_encode.py, and lanes vs NUMBA_QK_PORTABLE in test_parity.py.)"""

import numpy as np
import pytest
from numba import njit

from numba_qk.kernels.kquants.encode_lanes import ENCODE_LANES, Q3_SCR_ROWS, QX_SCR_ROWS, SCR_ROWS, q3_lanes, qkx2_lanes, qx_lanes, requant_lanes
from numba_qk.kernels._round import nearest_int
from numba_qk.kernels.kquants.q4_k_encode import make_qkx2_quants_mad
from numba_qk.kernels.kquants.q3_k import make_q3_quants_rmse
from numba_qk.kernels.kquants.q6_k import make_qx_quants_rmse1

pytestmark = pytest.mark.skipif(not ENCODE_LANES, reason="lanes disabled (portable or no JIT)")

# (n, lanes, nmax, rmin, rdelta, nstep, use_mad, weights) of Q4_K, Q5_K, Q2_K
CASES = {"q4_k": (32, 8, 15, -1.0, 0.1, 20, False, "avx"),
         "q5_k": (32, 8, 31, -0.5, 0.1, 15, False, "avx"),
         "q2_k": (16, 16, 3, -0.5, 0.1, 15, True, "abs")}


@njit
def _weights(X, W, avx):
    for r in range(X.shape[0]):
        for j in range(X.shape[2]):
            s = np.float32(0.0)
            for i in range(X.shape[1]):
                s = np.float32(s + np.float32(X[r, i, j] * X[r, i, j]))
            av = np.float32(np.sqrt(np.float32(s / np.float32(X.shape[1])))) if avx else np.float32(0)
            for i in range(X.shape[1]):
                W[r, i, j] = np.float32(av + abs(X[r, i, j]))


@njit
def _scalar(X, W, nmax, rmin, rdelta, nstep, mad, S, M, Ls):
    n, nl = X.shape[1], X.shape[2]
    Laux = np.zeros(n, np.int32)
    L = np.zeros(n, np.int32)
    x = np.empty(n, np.float32)
    w = np.empty(n, np.float32)
    for r in range(X.shape[0]):
        for j in range(nl):
            for i in range(n):
                x[i] = X[r, i, j]
                w[i] = W[r, i, j]
            S[r, j], M[r, j] = make_qkx2_quants_mad(x, 0, n, nmax, w, L, Laux, rmin, rdelta,
                                                    nstep, mad)
            for i in range(n):
                Ls[r, i, j] = L[i]


@njit
def _lanes(X, W, nmax, rmin, rdelta, nstep, mad, S, M, Ls):
    n, nl = X.shape[1], X.shape[2]
    scr = np.zeros((SCR_ROWS, nl), np.float32)
    laux = np.zeros((n, nl), np.int32)
    for r in range(X.shape[0]):
        qkx2_lanes(np.ascontiguousarray(X[r]), np.ascontiguousarray(W[r]), n, nl, nmax, rmin,
                   rdelta, nstep, mad, Ls[r], S[r], M[r], scr, laux)


def adversarial(n, nl, rng):
    """[R, n, nl] f32 sub-blocks (lane j = sub-block j), each row mixing lane kinds."""
    rows = []
    kinds = [
        lambda: rng.standard_normal(n),
        lambda: np.round(rng.standard_normal(n) * 8) / 8,           # grid: rounding ties
        lambda: np.round(rng.uniform(-4, 4, n)) / 2,
        lambda: np.full(n, rng.choice([0.0, -0.0, 1.5, -2.25, 7.0])),  # constant / zero
        lambda: np.where(rng.random(n) < 0.5, 0.0, -0.0),            # signed zeros only
        lambda: np.where(rng.random(n) < 0.8, -0.0, rng.standard_normal(n)),
        lambda: rng.standard_normal(n) * 10.0 ** rng.uniform(-38, -33),  # subnormal-ish
        lambda: rng.standard_normal(n) * 10.0 ** rng.uniform(33, 38),   # sums overflow
        lambda: np.abs(rng.standard_normal(n)) + rng.uniform(0, 3),      # all positive
        lambda: -np.abs(rng.standard_normal(n)) - rng.uniform(0, 3),     # all negative
        lambda: np.eye(n)[rng.integers(n)] * rng.choice([1.0, -1.0, 3e38, 1e-40]),  # spike
        lambda: np.full(n, 3.0e38) * np.sign(rng.standard_normal(n)),  # +-max, overflowing range
    ]
    for _ in range(150):
        rows.append(np.stack([kinds[rng.integers(len(kinds))]() for _ in range(nl)], axis=1))
    for k in kinds:  # every kind in every lane position at least once
        rows.append(np.stack([k() for _ in range(nl)], axis=1))
    with np.errstate(over="ignore"):
        return np.asarray(rows).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_lanes_equal_scalar_search(name, rng):
    n, nl, nmax, rmin, rdelta, nstep, mad, wkind = CASES[name]
    X = adversarial(n, nl, rng)
    W = np.empty_like(X)
    with np.errstate(all="ignore"):
        _weights(X, W, wkind == "avx")
    res = []
    for f in (_scalar, _lanes):
        S = np.full((len(X), nl), np.nan, np.float32)
        M = np.full((len(X), nl), np.nan, np.float32)
        Ls = np.full((len(X), n, nl), -99, np.int32)
        f(X, W, nmax, np.float32(rmin), np.float32(rdelta), nstep, mad, S, M, Ls)
        res.append((S.view(np.uint32), M.view(np.uint32), Ls))
    (s0, m0, l0), (s1, m1, l1) = res
    bad = np.nonzero(~((s0 == s1).all(1) & (m0 == m1).all(1) & (l0 == l1).all((1, 2))))[0]
    assert bad.size == 0, f"{name}: rows {bad[:10]} differ"
    assert (l0 >= 0).all() and (l0 <= nmax).all()


@njit
def _qx_scalar(X, nmax, S, Ls):
    n, nl = X.shape[1], X.shape[2]
    x = np.empty(n, np.float32)
    L = np.zeros(n, np.int32)
    for r in range(X.shape[0]):
        for j in range(nl):
            for i in range(n):
                x[i] = X[r, i, j]
            S[r, j] = make_qx_quants_rmse1(x, 0, n, nmax, L, 0)
            for i in range(n):
                Ls[r, i, j] = L[i]


@njit
def _qx_lanes(X, nmax, S, Ls):
    nl = X.shape[2]
    scr = np.zeros((QX_SCR_ROWS, nl), np.float32)
    for r in range(X.shape[0]):
        qx_lanes(np.ascontiguousarray(X[r]), X.shape[1], nl, nmax, Ls[r], S[r], scr)


def test_qx_lanes_equal_scalar_search(rng):
    """Q6_K's make_qx_quants (nmax 32, 16 sub-blocks of 16), plus tiny groups near ggml's
    GROUP_MAX_EPS (1e-15: below it a group is "all zero")."""
    X = adversarial(16, 16, rng)
    X[:20] *= np.float32(1e-15) / np.abs(X[:20]).max(axis=1, keepdims=True).clip(1e-38)
    X[:10] *= np.float32(0.999)
    res = []
    for f in (_qx_scalar, _qx_lanes):
        S = np.full((len(X), 16), np.nan, np.float32)
        Ls = np.full((len(X), 16, 16), -99, np.int32)
        with np.errstate(all="ignore"):
            f(X, 32, S, Ls)
        res.append((S.view(np.uint32), Ls))
    (s0, l0), (s1, l1) = res
    bad = np.nonzero(~((s0 == s1).all(1) & (l0 == l1).all((1, 2))))[0]
    assert bad.size == 0, f"rows {bad[:10]} differ"
    assert (l0 >= 0).all() and (l0 <= 63).all()


@njit
def _q3_scalar(X, nmax, S, Ls):
    n, nl = X.shape[1], X.shape[2]
    x = np.empty(n, np.float32)
    L = np.zeros(n, np.int32)
    for r in range(X.shape[0]):
        for j in range(nl):
            for i in range(n):
                x[i] = X[r, i, j]
            S[r, j] = make_q3_quants_rmse(x, 0, n, nmax, L, 0)
            for i in range(n):
                Ls[r, i, j] = L[i]


@njit
def _q3_lanes(X, nmax, S, Ls):
    nl = X.shape[2]
    scr = np.zeros((Q3_SCR_ROWS, nl), np.float32)
    for r in range(X.shape[0]):
        q3_lanes(np.ascontiguousarray(X[r]), X.shape[1], nl, nmax, Ls[r], S[r], scr)


def test_q3_lanes_equal_scalar_search(rng):
    """Q3_K's make_q3_quants (nmax 4, 16 sub-blocks of 16): lanes stop their refinement rounds
    independently, as each scalar call breaks out of its own loop."""
    X = adversarial(16, 16, rng)
    X[:20] *= np.float32(1e-15) / np.abs(X[:20]).max(axis=1, keepdims=True).clip(1e-38)
    X[:10] *= np.float32(0.999)
    res = []
    for f in (_q3_scalar, _q3_lanes):
        S = np.full((len(X), 16), np.nan, np.float32)
        Ls = np.full((len(X), 16, 16), -99, np.int32)
        with np.errstate(all="ignore"):
            f(X, 4, S, Ls)
        res.append((S.view(np.uint32), Ls))
    (s0, l0), (s1, l1) = res
    bad = np.nonzero(~((s0 == s1).all(1) & (l0 == l1).all((1, 2))))[0]
    assert bad.size == 0, f"rows {bad[:10]} differ"
    assert (l0 >= 0).all() and (l0 <= 7).all()


@njit
def _requant_scalar(X, dm, d, lo, hi, off, Ls):
    for r in range(X.shape[0]):
        for j in range(X.shape[2]):
            if d[r, j] == np.float32(0.0):  # C: if (!d) continue;
                continue
            for i in range(X.shape[1]):
                t = np.float32(np.float32(np.float32(X[r, i, j]) + dm[r, j]) / d[r, j])
                Ls[r, i, j] = max(lo, min(hi, nearest_int(t))) + off


@njit
def _requant_lanes(X, dm, d, lo, hi, off, Ls):
    for r in range(X.shape[0]):
        requant_lanes(np.ascontiguousarray(X[r]), dm[r], d[r], lo, hi, off, Ls[r], X.shape[1],
                      X.shape[2])


@pytest.mark.parametrize("n, nl, lo, hi, off", [(32, 8, 0, 15, 0), (32, 8, 0, 31, 0),
                                                (16, 16, 0, 3, 0), (16, 16, -4, 3, 4),
                                                (16, 16, -32, 31, 32)])
def test_requant_lanes_equal_scalar(n, nl, lo, hi, off, rng):
    """The final pass: d = +-0 keeps the lane's quants, NaN d does not (C's ``if (!d)``), tiny
    d overflows the quotient, dm = -0.0 is the plain ``x / d``, ties of the grid round to even."""
    X = adversarial(n, nl, rng)
    R = len(X)
    d = (rng.choice([0.5, 0.25, 1.0, 3.0, 1e-38, 1e30], (R, nl))
         * rng.choice([1.0, -1.0], (R, nl))).astype(np.float32)
    d[rng.random((R, nl)) < 0.1] = 0.0
    d[rng.random((R, nl)) < 0.05] = -0.0
    d[rng.random((R, nl)) < 0.03] = np.nan
    dm = rng.choice([-0.0, 0.0, 0.25, 1.5, -3.0], (R, nl)).astype(np.float32)
    start = rng.integers(lo + off, hi + off + 1, (R, n, nl)).astype(np.int32)
    res = []
    for f in (_requant_scalar, _requant_lanes):
        Ls = start.copy()
        with np.errstate(all="ignore"):
            f(X, dm, d, np.int32(lo), np.int32(hi), np.int32(off), Ls)
        res.append(Ls)
    assert (res[0] == res[1]).all()
    keep = np.broadcast_to((d == 0)[:, None, :], start.shape)
    assert (res[1][keep] == start[keep]).all() and (res[1] != start).any()
