"""IQ3_XXS / IQ3_S encoders (``kernels/iq/iq3_encode.py``) byte-identical to ggml's
``ggml_quantize_chunk`` (``quantize_iq3_xxs`` / ``quantize_iq3_s``), without and with an
importance matrix; the tables of ggml's ``iq3xs_init_impl``; the domain (blocks on which ggml's
grid search aborts the process are refused, naming the block).  Bigger sweeps and the check
that ggml really aborts (a subprocess per case): ``slow``."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numba_qk as qk
from imatrix_cases import GGML, compare, weights
from numba_qk.kernels.iq import iq3_encode as E
from subsets import default_few

NAMES = ["iq3_xxs", "iq3_s"]


def rows(n_per_row: int, per_kind: int, seed: int, top: int = 9) -> np.ndarray:
    """f32 rows inside the encoders' domain: normal, Student t (2 d.o.f.), normal * 10**k per
    row for k in -30..top, constant (3.5, -2, 1e-30), zero, half zero."""
    r = np.random.default_rng(seed)
    n = n_per_row
    out = [r.standard_normal((per_kind, n)), r.standard_t(2, (per_kind, n)),
           r.standard_normal((per_kind, n)) * 10.0 ** r.integers(-30, top + 1, (per_kind, 1))]
    out.append(np.stack([np.full(n, v) for v in (3.5, -2.0, 1e-30)]))
    half = r.standard_normal((2, n))
    half[0] = 0
    half[1, : n // 2] = 0
    out.append(half)
    return np.concatenate(out).astype(np.float32)


# ---- the tables of iq3xs_init_impl ----------------------------------------------------------

# ggml-quants.c's kgrid_256 / kgrid_512 begin (the level codes of the grid points)
KGRID_256_HEAD = (0, 2, 4, 9, 11, 15, 16, 18, 25, 34, 59, 61, 65, 67, 72, 74)
KGRID_512_HEAD = (0, 1, 2, 5, 7, 8, 9, 10, 12, 14, 16, 17, 21, 27, 32, 34)


@pytest.mark.parametrize("size", [256, 512])
def test_tables_are_ggml_init(size):
    grid, kmap, nbrs = ((E.GRID256, E.MAP256, E.NEIGHBOURS256) if size == 256
                        else (E.GRID512, E.MAP512, E.NEIGHBOURS512))
    nwant = 2 if size == 256 else 3
    levels = (grid.astype(np.int64) - 1) // 2
    codes = (levels << (3 * np.arange(4))).sum(axis=1)
    assert tuple(codes[:16]) == (KGRID_256_HEAD if size == 256 else KGRID_512_HEAD)
    assert grid.shape == (size, 4) and (kmap[codes] == np.arange(size)).all()
    off = np.flatnonzero(kmap < 0)
    assert len(off) == 4096 - size
    at = 0
    for u in off:                       # brute force: the nwant nearest distances, (d2, index)
        assert kmap[u] == -(at + 1)
        pos = 2 * ((u >> (3 * np.arange(4))) & 7) + 1
        d2 = ((grid - pos) ** 2).sum(axis=1)
        ds = np.unique(d2)[:nwant]
        want = sorted((int(d2[j]), j) for j in np.flatnonzero(np.isin(d2, ds)))
        n = int(nbrs[at])
        assert [int(j) for j in nbrs[at + 1: at + 1 + n]] == [j for _, j in want]
        at += 1 + n
    assert at == len(nbrs)


# ---- byte identity with ggml ------------------------------------------------------------------

# The default run compiles two of the four encoders (the CI's budget): IQ3_XXS with and
# without weights; -m slow takes IQ3_S here and the sweep all four.
@pytest.mark.parametrize("name", default_few(NAMES, {"iq3_xxs"}))
def test_encode_is_ggml(name):
    fmt = getattr(qk.quant, name)
    x = rows(512, 3, 31)
    compare(fmt, x, None)
    if name == "iq3_xxs":
        for w in weights(512, 32):
            compare(fmt, x, w)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_encode_is_ggml_sweep(name):
    fmt = getattr(qk.quant, name)
    blocks = 0
    for seed, n in ((1, 256), (2, 1024), (3, 4096)):
        x = rows(n, 16, seed)
        blocks += compare(fmt, x, None)
        for w in weights(n, seed + 100):
            blocks += compare(fmt, x, w)
    print(f"{name}: {blocks} blocks equal")


# ---- the domain -----------------------------------------------------------------------------

# Blocks ggml aborts on (checked by test_ggml_aborts_where_numba_qk_refuses): without an
# importance matrix 1e13 in every value (block 1), and a normal block times 3e13 (block 3);
# with weights of 1 a normal block times 1e18 (block 2).
def _too_large():
    x = rows(256, 1, 5)[:4]
    x[1] = 1e13
    x[2] = np.random.default_rng(6).standard_normal(256).astype(np.float32) * np.float32(1e18)
    x[3] = np.random.default_rng(6).standard_normal(256).astype(np.float32) * np.float32(3e13)
    return x


ONES = np.ones(256, np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_domain_error_names_the_block_and_writes_nothing(name):
    fmt = getattr(qk.quant, name)
    x = _too_large()
    out = np.full((4, fmt.block_bytes), 7, np.uint8)
    with pytest.raises(qk.QuantizationDomainError,
                       match=r"^block 1: ggml's grid search aborts on this block .*largest "
                             r"\|value\| values\[1, 0\] = 9999999827968\.0\).*aborts the "
                             r"process") as e:
        qk.quantize(x, fmt, out=out)
    assert e.value.block == 1 and (out == 7).all()
    if name == "iq3_xxs":     # (the weighted IQ3_S encoder: in the slow tests)
        with pytest.raises(qk.QuantizationDomainError, match=r"^block 2: ggml's grid search aborts"):
            qk.quantize(x, fmt, imatrix=ONES, out=out)
        assert (out == 7).all()
    x[0, 5] = np.nan            # the first bad block wins, whatever the reason
    with pytest.raises(qk.QuantizationDomainError,
                       match=r"^block 0: values\[0, 5\] is nan; quantize needs finite"):
        qk.quantize(x, fmt, out=out)
    assert (out == 7).all()
    x[0, 5] = 0
    x[1:3] = 1.0
    with pytest.raises(qk.QuantizationDomainError, match=r"^block 3: ggml's grid search aborts"):
        qk.quantize(x, fmt, out=out)
    assert (out == 7).all()


_ORACLE = textwrap.dedent("""
    import sys, numpy as np
    from numba_qk.testing import ggml as bridge
    g = bridge.load(sys.argv[1] or None)
    d = np.load(sys.argv[2])
    w = d["w"] if d["w"].size else None
    g.quantize_chunk(int(sys.argv[3]), d["x"], w)
    print("ok")
""")


def _ggml_survives(tmp_path, fmt, x, w) -> bool:
    np.savez(tmp_path / "case.npz", x=x, w=np.zeros(0, np.float32) if w is None else w)
    p = subprocess.run([sys.executable, "-c", _ORACLE, os.environ.get("NUMBA_QK_GGML_LIB", ""),
                        str(tmp_path / "case.npz"), str(fmt.ggml_type)],
                       capture_output=True, text=True, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    return p.returncode == 0 and p.stdout.strip() == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_ggml_aborts_where_numba_qk_refuses(tmp_path, name):
    """One block per case, each in a fresh ggml process (an abort kills it): ggml survives
    exactly the blocks numba_qk encodes (and then gives the same bytes)."""
    if GGML is None:
        pytest.skip("no ggml library")
    fmt = getattr(qk.quant, name)
    r = np.random.default_rng(7)
    cases = [(b[None], w) for b in _too_large() for w in (None, ONES)]
    for k in (10, 11, 11.5, 12, 12.5, 13, 20, 30, 38):
        v = (r.standard_normal(256) * 10.0 ** k).astype(np.float32)
        v = np.where(np.isfinite(v), v, np.float32(3e38)).astype(np.float32)
        cases += [(v[None], None), (v[None], r.random(256).astype(np.float32))]
    cases.append((np.ones((1, 256), np.float32), np.full(256, 3e38, np.float32)))
    agree = 0
    for x, w in cases:
        try:
            got = qk.quantize(x, fmt, imatrix=w)
        except qk.QuantizationDomainError:
            got = None
        assert _ggml_survives(tmp_path, fmt, x, w) == (got is not None), (x.max(), w is None)
        if got is not None:
            compare(fmt, x, w)
        agree += 1
    print(f"{name}: {agree} cases agree on the domain")
