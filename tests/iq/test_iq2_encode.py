"""IQ2_XXS / IQ2_XS / IQ2_S / IQ1_S / IQ1_M encoders (``quantize(..., imatrix=w)``; IQ2_S and
IQ1_M also without)
byte-identical to ggml's ``ggml_quantize_chunk`` (``quantize_row_iq2_*_impl``), their search
tables (``kernels/iq/grid_search.py``) equal to ggml's ``iq2xs_init_impl``, the requires-imatrix
refusal and the domain (non-finite values; blocks where ggml's search aborts).  Bigger sweeps and
the abort checks against ggml in a subprocess: ``slow``."""

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import numba_qk as qk
from imatrix_cases import GGML, compare, weights
from numba_qk.kernels.iq import grid_search
from subsets import default_few

NAMES = ["iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m"]
NO_IMATRIX = ("iq2_s", "iq1_m")          # encoded with or without an importance matrix
# each format compiles its own encoder (tens of seconds cold): IQ2_XXS (imatrix required) and
# IQ2_S (with and without) by default, all four under -m slow
DEFAULT_FEW = default_few(NAMES, {"iq2_s"})   # IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M: -m slow
slow = pytest.mark.slow

# sha256 of kmap (int32 LE) + neighbours (uint16 LE) + grid (int8 [n, 8]) as ggml's
# iq2xs_init_impl makes them (its C code compiled on its own from ggml-quants.c of the llama.cpp
# 0.3.36 vendor tree, the tables dumped), and of ggml's kgrid_* code tables (uint16 LE).
DIGESTS = {
    "iq2_xxs": ("96a6126b6f31b463fb46503630b412a1d7c4e5e28ece2d98f3ac1d96f6da21e8",
                "915952ebc4af8ddb"),
    "iq2_xs": ("a95c9de2ed1d7247132740e9da32cc4b2acf2ce80af456691047c4c7400a56fb",
               "f66435966ca8d64e"),
    "iq2_s": ("b7dc9f7456bc9661eca5578146030dd0014fc8d930b845a9801150790b64a00f",
              "e6e75e121b65e8af"),
    "iq1_s": ("b8ad595900e8bd75ebff7c4a9602f55e5a07a23b062217845984e8586d4fb07f",
              "e9ffebfc997ad602"),
}


def need_current_iq1_m(name):
    """IQ1_M's encoder is that of the llama.cpp 0.3.36 vendor tree (ggml 0.25.3), which
    libggml-python's older ggml predates (its quantize_row_iq1_m_impl gives other bytes in
    ~25% of the blocks): IQ1_M is compared with a native build only (NUMBA_QK_GGML_LIB)."""
    if name == "iq1_m" and GGML is not None and not GGML.version.startswith("native build"):
        pytest.skip("IQ1_M needs the native llama.cpp build as oracle (NUMBA_QK_GGML_LIB)")


def grid_rows(n: int, per_kind: int, seed: int) -> np.ndarray:
    """f32 rows inside the grid encoders' domain: normal, Student t (2 d.o.f.), normal * 10**k
    per row for k in -30..10, constant (3.5, -2, 1e9), zero, half zero."""
    r = np.random.default_rng(seed)
    out = [r.standard_normal((per_kind, n)), r.standard_t(2, (per_kind, n)),
           r.standard_normal((per_kind, n)) * 10.0 ** r.integers(-30, 11, (per_kind, 1)),
           np.stack([np.full(n, v) for v in (3.5, -2.0, 1e9)])]
    half = r.standard_normal((2, n))
    half[0] = 0
    half[1, : n // 2] = 0
    out.append(half)
    return np.concatenate(out).astype(np.float32)


@pytest.mark.parametrize("name", ["iq2_xxs", "iq2_xs", "iq2_s",
                                  pytest.param("iq1_s", marks=slow)])
def test_search_tables_are_ggmls(name):
    t = grid_search.tables(getattr(qk.quant, name))
    full, codes = DIGESTS[name]
    blob = t.kmap.astype("<i4").tobytes() + t.neighbours.astype("<u2").tobytes() + t.grid.tobytes()
    assert hashlib.sha256(blob).hexdigest() == full
    assert hashlib.sha256(t.codes.astype("<u2").tobytes()).hexdigest()[:16] == codes
    assert t.grid.shape == (t.codes.shape[0], 8) and t.kmap.shape == (grid_search.KMAP_SIZE,)


@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_imatrix_is_ggml(name):
    need_current_iq1_m(name)
    fmt = getattr(qk.quant, name)
    x = grid_rows(512, 2, 41)
    n = sum(compare(fmt, x, w) for w in weights(512, 42))
    if name in NO_IMATRIX:
        n += compare(fmt, x, None)
    assert n >= 88


def test_requires_imatrix():
    x = np.ones((1, 256), np.float32)
    for fmt in (qk.quant.iq2_xxs, qk.quant.iq2_xs, qk.quant.iq1_s):
        c = qk.capabilities(fmt)
        assert c.quantize and "requires an importance matrix" in c.quantizer
        with pytest.raises(ValueError, match=rf"^quantize: {fmt.name} needs an importance "
                                             rf"matrix \(imatrix=\.\.\.\)"):
            qk.quantize(x, fmt)
    c = qk.capabilities(qk.quant.iq2_s)
    assert c.quantize and "requires" not in c.quantizer


@pytest.mark.parametrize("name", DEFAULT_FEW)
def test_domain_errors_name_the_block(name):
    fmt = getattr(qk.quant, name)
    x = grid_rows(256, 1, 7)[:4]
    w = np.ones(256, np.float32)
    out = np.full((4, fmt.block_bytes), 7, np.uint8)
    bad = x.copy()
    bad[2, 100] = np.inf
    bad[3] = x[0] * np.float32(1e17)    # a whole normal block this large: ggml aborts
    with pytest.raises(qk.QuantizationDomainError,
                       match=r"^block 2: values\[2, 100\] is inf; quantize needs finite"):
        qk.quantize(bad, fmt, imatrix=w, out=out)
    bad[2, 100] = 0.0
    if name in ("iq1_s", "iq1_m"):  # their search gives up on overflowing sums: no abort
        assert qk.quantize(bad, fmt, imatrix=w, out=out) is out
        return
    with pytest.raises(qk.QuantizationDomainError,
                       match=r"^block 3: ggml's grid search aborts on this block") as e:
        qk.quantize(bad, fmt, imatrix=w, out=out)
    assert e.value.block == 3
    assert (out == 7).all()


def _ggml_aborts(fmt, x, w) -> bool:
    """Whether ggml_quantize_chunk aborts the process on ``x`` (run in a subprocess)."""
    lib = os.environ.get("NUMBA_QK_GGML_LIB")
    code = textwrap.dedent(f"""
        import sys, numpy as np
        from numba_qk.testing import ggml as gb
        G = gb.load({lib!r}) if {lib!r} else gb.load()
        x = np.frombuffer(sys.stdin.buffer.read(), np.float32)
        w = x[:256] if {w is not None} else None
        G.quantize_chunk({fmt.ggml_type}, x[256:].reshape(-1, 256), w)
    """)
    payload = np.concatenate([np.ones(256, np.float32) if w is None else w, x.reshape(-1)])
    p = subprocess.run([sys.executable, "-c", code], input=payload.tobytes(),
                       capture_output=True, timeout=120)
    assert p.returncode in (0, -6, 134), p.stderr.decode()[-2000:]   # 0, or SIGABRT
    return p.returncode != 0


@slow
@pytest.mark.skipif(GGML is None, reason="no ggml library")
@pytest.mark.parametrize("name", NAMES)
def test_domain_is_where_ggml_aborts(name):
    """Near the edge (|x| 1e9 .. 1e16, whole blocks and single outliers, imatrix or not):
    numba_qk raises exactly where ggml's process aborts, and agrees byte for byte elsewhere."""
    need_current_iq1_m(name)
    fmt = getattr(qk.quant, name)
    r = np.random.default_rng(3)
    seen = {True: 0, False: 0}
    for w in ([np.ones(256, np.float32), (r.random(256) * 10).astype(np.float32)]
              + ([None] if name in NO_IMATRIX else [])):
        for e in np.arange(9.0, 16.01, 1.0):
            for outlier in (False, True):
                x = r.standard_normal((1, 256)).astype(np.float32)
                if outlier:
                    x[0, 17] = np.float32(10.0 ** e)
                else:
                    x = (x * 10.0 ** e).astype(np.float32)
                aborts = _ggml_aborts(fmt, x, w)
                seen[aborts] += 1
                if aborts:
                    with pytest.raises(qk.QuantizationDomainError, match="^block 0: ggml's grid"):
                        qk.quantize(x, fmt, imatrix=w)
                else:
                    compare(fmt, x, w)
    assert seen[False] and (seen[True] or name in ("iq1_s", "iq1_m"))  # IQ1: none seen


@slow
@pytest.mark.parametrize("name", NAMES)
def test_imatrix_is_ggml_sweep(name):
    need_current_iq1_m(name)
    fmt = getattr(qk.quant, name)
    total = 0
    for seed, n in ((1, 256), (2, 1024), (3, 4096)):
        x = grid_rows(n, 16, seed)
        for w in weights(n, seed + 100):
            total += compare(fmt, x, w)
        if name in NO_IMATRIX:
            total += compare(fmt, x, None)
    assert total > 0
