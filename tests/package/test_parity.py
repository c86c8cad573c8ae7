"""Pure-Python and JIT semantics cannot drift: the same kernels run with NUMBA_DISABLE_JIT=1
(plain Python over numpy scalars) must give the same bits as the compiled ones."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk

from parity_registry import DEFAULT_SUBSET, all_formats, registry_run
from records import random_q4_k, random_q8_k

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, warnings
    warnings.simplefilter("ignore")
    import numba_qk as qk
    d = np.load(sys.argv[1])
    with np.errstate(all="ignore"):
        rec = qk.quantize(d["values"], format=qk.quant.q8_k)
        dot = qk.quantized_dot(d["w"], d["x"], lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
        deq = qk.dequantize(d["w"], qk.quant.q4_k)
        lw = qk.quantize(d["values"].reshape(-1, 32), format=qk.quant.q5_1).reshape(6, 8, 24)
        lx = qk.quantize(d["values"][0].reshape(8, 32), format=qk.quant.q8_1)
        lgemv = qk.gemv(lw, lx, lhs_format=qk.quant.q5_1, rhs_format=qk.quant.q8_1)
        # 8-row / 8-activation tiles and remainders, every weight format
        gw = d["gw"]
        gx = qk.quantize(d["gv"].reshape(-1, 256), format=qk.quant.q8_k).reshape(9, 2, 292)
        kgemm = qk.gemm(gw, gx, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
        # threads=2 without JIT (17 rows: 3 chunks run as Python pieces); the compiled
        # runs skip it (a gemv compile per subprocess; in-process tests cover that path)
        import os
        if os.environ.get("NUMBA_DISABLE_JIT") == "1":
            from numba_qk import _threads
            _threads.ADAPTIVE = False
            tgemv = qk.gemv(gw, gx[0], lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k,
                            threads=2)
        else:
            tgemv = kgemm[0]
        legacy = []
        for name in sys.argv[3].split(","):
            f = getattr(qk.quant, name)
            w = qk.quantize(d["lv"].reshape(-1, 32), format=f).reshape(11, 4, -1)
            legacy.append(qk.matmul(w, d["lx"], lhs_format=f))
    np.savez(sys.argv[2], rec=rec, dot=dot, deq=deq, lw=lw, lgemv=lgemv, kgemm=kgemm,
             tgemv=tgemv, legacy=np.stack(legacy))
""")


LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


def _run_script(tmp_path, rng, env_extra, legacy=LEGACY):
    g = 6
    values = rng.standard_normal((g, 256)).astype(np.float32)
    values[1] *= np.float32(1e-30)
    values[2] = 0.0
    values[3, :] = np.float32(-2.5)
    w = random_q4_k(rng, g)
    w[4, 0:2] = [0x01, 0x00]  # subnormal d
    x = random_q8_k(rng, g)
    x[5, 0:4] = [0, 0, 0x80, 0xFF]  # ds = -inf
    gw = random_q4_k(rng, 17 * 2).reshape(17, 2, 144)
    gv = rng.standard_normal((9, 512)).astype(np.float32)
    lv = rng.standard_normal((11, 128)).astype(np.float32)
    lx = rng.standard_normal((9, 128)).astype(np.float32)
    np.savez(tmp_path / "in.npz", values=values, w=w, x=x, gw=gw, gv=gv, lv=lv, lx=lx)
    env = dict(os.environ, **env_extra)
    root = Path(qk.__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz"), ",".join(legacy)], check=True, env=env,
                   timeout=300)
    return values, w, x, np.load(tmp_path / "out.npz"), (gw, gv, lv, lx), legacy


def _check(values, w, x, py, extra, legacy):
    assert (py["rec"] == qk.quantize(values, format=qk.quant.q8_k)).all()
    jit_dot = qk.quantized_dot(w, x, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
    assert py["dot"].view(np.uint32) == jit_dot.view(np.uint32) or (
        np.isnan(py["dot"]) and np.isnan(jit_dot))
    assert (py["deq"].view(np.uint32) == qk.dequantize(w, qk.quant.q4_k).view(np.uint32)).all()
    lw = qk.quantize(values.reshape(-1, 32), format=qk.quant.q5_1).reshape(6, 8, 24)
    lx = qk.quantize(values[0].reshape(8, 32), format=qk.quant.q8_1)
    assert (py["lw"] == lw).all()
    lgemv = qk.gemv(lw, lx, lhs_format=qk.quant.q5_1, rhs_format=qk.quant.q8_1)
    assert (py["lgemv"].view(np.uint32) == lgemv.view(np.uint32)).all()
    gw, gv, lv, lx2 = extra
    gx = qk.quantize(gv.reshape(-1, 256), format=qk.quant.q8_k).reshape(9, 2, 292)
    kgemm = qk.gemm(gw, gx, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
    assert (py["kgemm"].view(np.uint32) == kgemm.view(np.uint32)).all()
    tgemv = qk.gemv(gw, gx[0], lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
    assert (py["tgemv"].view(np.uint32) == tgemv.view(np.uint32)).all()
    for k, name in enumerate(legacy):
        f = getattr(qk.quant, name)
        w2 = qk.quantize(lv.reshape(-1, 32), format=f).reshape(11, 4, -1)
        got = qk.matmul(w2, lx2, lhs_format=f)
        assert (py["legacy"][k].view(np.uint32) == got.view(np.uint32)).all(), name


def test_disable_jit_matches_compiled(tmp_path, rng):
    """NUMBA_DISABLE_JIT=1: the kernels run as plain Python (portable loops)."""
    _check(*_run_script(tmp_path, rng, {"NUMBA_DISABLE_JIT": "1"}))


def _needs_simd():
    """Comparing the portable loops with the default path only tests something when the
    default path is the SIMD one; without AVX2 both are the portable loops: skip, not pass."""
    from numba_qk.kernels.simd.base import HAVE_AVX2

    if not HAVE_AVX2:
        import pytest

        pytest.skip("no AVX2 on this machine: the default path is the portable one")


@pytest.mark.slow
def test_portable_path_matches_default(tmp_path, rng):
    """NUMBA_QK_PORTABLE=1: compiled portable loops instead of the SIMD fast path.  Slow (run
    with -m slow): test_parity_registry_portable.py covers every format under the same mode."""
    _needs_simd()
    cache = tmp_path / "cache"
    _check(*_run_script(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1", "NUMBA_CACHE_DIR": str(cache)}))


# The AVX2 run compiles cold in its own cache (~50 s of CPU with every legacy format; Q4_0 alone
# 25 s warm and more cold on the Zen 5 VM of session 14, the default run's longest test): both
# under -m slow. In the default run the 256-bit intrinsics are still checked in process, variant
# by variant, against the loops (tests/kquants, tests/iq, tests/simd: the "avx2" variants).
@pytest.mark.parametrize("legacy", [pytest.param(("q4_0",), id="q4_0", marks=pytest.mark.slow),
                                    pytest.param(LEGACY, id="every-legacy",
                                                 marks=pytest.mark.slow)])
def test_avx2_path_matches_default(tmp_path, rng, legacy):
    """NUMBA_QK_NO_AVX512=1: the 256-bit intrinsics (what AVX2-only machines run)."""
    from numba_qk.kernels.simd.base import HAVE_AVX2

    if not HAVE_AVX2:
        pytest.skip("no AVX2 on this machine")
    cache = tmp_path / "cache"
    _check(*_run_script(tmp_path, rng, {"NUMBA_QK_NO_AVX512": "1", "NUMBA_CACHE_DIR": str(cache)},
                        legacy))


def test_registry_disable_jit_matches_compiled(tmp_path, rng):
    """One format of each kernel family under NUMBA_DISABLE_JIT=1 equals the compiled kernels
    (``parity_registry.DEFAULT_SUBSET``; the others under ``-m slow``)."""
    registry_run(tmp_path, rng, {"NUMBA_DISABLE_JIT": "1"})


@pytest.mark.slow
def test_registry_disable_jit_matches_compiled_other_formats(tmp_path, rng):
    rest = tuple(n for n in all_formats() if n not in DEFAULT_SUBSET)
    registry_run(tmp_path, rng, {"NUMBA_DISABLE_JIT": "1"}, rest)
