"""The JIT policy holds everywhere: no fast-math, cached, GIL released."""

import re
from pathlib import Path

import numba_qk
from numba_qk import kernels
from numba_qk._jit import JIT_OPTIONS
from numba_qk.kernels import _bits, dot, legacy, q4_k, q8_k

ROOT = Path(numba_qk.__file__).resolve().parent


def test_no_fastmath_literal_anywhere():
    pattern = re.compile(r"fastmath\s*=\s*(True|\{)")
    for path in list(ROOT.rglob("*.py")) + list((ROOT.parent / "examples").glob("*.py")):
        assert not pattern.search(path.read_text()), f"fast-math enabled in {path}"


def test_every_kernel_uses_the_policy():
    from numba.core.registry import CPUDispatcher

    seen = 0
    for module in (_bits, q4_k, q8_k, dot, legacy, kernels):
        for name in dir(module):
            obj = getattr(module, name)
            if isinstance(obj, CPUDispatcher):
                seen += 1
                opts = obj.targetoptions
                assert opts.get("fastmath") is False, name
                assert opts.get("nogil") is True, name
                assert opts.get("error_model") == "numpy", name
                assert obj._cache.__class__.__name__ != "NullCache", f"{name} is not cached"
    assert seen >= 20
    assert JIT_OPTIONS["fastmath"] is False and JIT_OPTIONS["parallel"] is False


def test_no_njit_outside_the_policy():
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        if path.name in ("_jit.py", "parallel.py"):
            continue
        assert not re.search(r"^\s*@(numba\.)?n?jit\b", text, re.M), \
            f"{path} bypasses numba_qk._jit.kernel"


def test_parallel_drivers_only_split_rows():
    """parallel.py is the one place with parallel=True: same policy otherwise."""
    from numba_qk.kernels import parallel

    text = (ROOT / "kernels" / "parallel.py").read_text()
    assert text.count("@njit(**PARALLEL_OPTIONS)") == 4
    for name in ("gemv_parallel", "gemm_parallel", "gemv_legacy_parallel", "gemm_legacy_parallel"):
        opts = getattr(parallel, name).targetoptions
        assert opts["parallel"] is True and opts["fastmath"] is False and opts["nogil"] is True
