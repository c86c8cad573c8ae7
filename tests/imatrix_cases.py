"""Shared cases of the importance-matrix encoder tests (``tests/kquants/test_kquants_imatrix.py``,
``tests/legacy/test_legacy_imatrix.py``, ``tests/iq/test_iq4_imatrix.py``): rows of data and
weights, and the byte comparison of ``numba_qk.quantize(..., imatrix=w)`` with ggml's
``ggml_quantize_chunk`` (live ggml: ``NUMBA_QK_GGML_LIB`` names a library folder, else
libggml-python; skipped without one)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing import ggml as ggml_bridge
from numba_qk.testing.asserts import assert_same_records

GGML = ggml_bridge.load(os.environ.get("NUMBA_QK_GGML_LIB")) or ggml_bridge.load()


def rows(n_per_row: int, per_kind: int, seed: int) -> np.ndarray:
    """f32 rows: normal, heavy-tailed (Student t, 2 d.o.f.), normal * 10**k per row for k in
    -30..30, constant (3.5, -2, 1e30), zero, half zero; ``per_kind`` rows of the random kinds."""
    r = np.random.default_rng(seed)
    n = n_per_row
    with np.errstate(over="ignore"):
        out = [r.standard_normal((per_kind, n)), r.standard_t(2, (per_kind, n)),
               r.standard_normal((per_kind, n)) * 10.0 ** r.integers(-30, 31, (per_kind, 1))]
        out.append(np.stack([np.full(n, v) for v in (3.5, -2.0, 1e30)]))
        half = r.standard_normal((2, n))
        half[0] = 0
        half[1, : n // 2] = 0
        out.append(half)
        return np.concatenate(out).astype(np.float32)


def weights(n_per_row: int, seed: int) -> list:
    """Importance weights: uniform, with ~30% zeros, heavy-tailed, and zero but for 3 columns."""
    r = np.random.default_rng(seed)
    w = [r.random(n_per_row), r.random(n_per_row), r.standard_t(1, n_per_row) ** 2]
    w[1][r.random(n_per_row) < 0.3] = 0
    sparse = np.zeros(n_per_row)
    sparse[[0, n_per_row // 2, n_per_row - 1]] = 1.0
    w.append(sparse)
    return [np.asarray(v, np.float32) for v in w]


def compare(fmt, x: np.ndarray, w) -> int:
    """Assert ``qk.quantize(x, fmt, imatrix=w)`` equals ggml's ``ggml_quantize_chunk`` byte for
    byte (x: [rows, n_per_row]); returns the number of blocks compared."""
    if GGML is None:
        pytest.skip("no ggml library")
    want = GGML.quantize_chunk(fmt.ggml_type, x, w)
    got = qk.quantize(x.reshape(-1, fmt.block_size), fmt, imatrix=w)
    assert_same_records(got, want, f"{fmt.name} imatrix={'None' if w is None else 'w'}")
    return want.shape[0]
