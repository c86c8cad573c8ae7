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


def _package_modules():
    """Every module of the package, imported (the lint walks all of them, not a list)."""
    import importlib
    import pkgutil

    mods = [numba_qk]
    for info in pkgutil.walk_packages(numba_qk.__path__, "numba_qk."):
        if info.name.endswith("__main__"):
            continue
        mods.append(importlib.import_module(info.name))
    return mods


def _bound_kernels():
    """The @njit kernels reachable only through the registry (closures per format)."""
    from numba_qk import _registry

    for b in _registry.BINDINGS:
        for slot in ("dequantize", "quantize", "find_invalid", "dot", "gemv", "gemm"):
            k = getattr(b, slot)
            if k is not None:
                yield f"{b.format.name}.{slot}", k


def test_every_kernel_uses_the_policy():
    from numba.core.registry import CPUDispatcher

    seen = 0
    found = [(f"{m.__name__}.{name}", getattr(m, name)) for m in _package_modules()
             for name in dir(m)] + list(_bound_kernels())
    for name, obj in found:
        if isinstance(obj, CPUDispatcher) and not obj.targetoptions.get("parallel"):
            seen += 1
            opts = obj.targetoptions
            assert opts.get("fastmath") is False, name
            assert opts.get("nogil") is True, name
            assert opts.get("error_model") == "numpy", name
            assert obj._cache.__class__.__name__ != "NullCache", f"{name} is not cached"
    assert seen >= 20
    assert JIT_OPTIONS["fastmath"] is False and JIT_OPTIONS["parallel"] is False
    for module in (_bits, q4_k, q8_k, dot, legacy, kernels):  # the original list is covered
        assert module in _package_modules()


def test_no_njit_outside_the_policy():
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        if path.name in ("_jit.py", "parallel.py"):
            continue
        assert not re.search(r"^\s*@(numba\.)?n?jit\b", text, re.M), \
            f"{path} bypasses numba_qk._jit.kernel"


def test_no_numba_parallel_code():
    """numba_qk starts no numba threading layer: threads are its own (numba_qk._threads), so a
    user's parallel=True code and fork() never meet numba_qk's threads inside numba."""
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        assert "prange" not in text and not re.search(r"parallel\s*=\s*True\s*[,)]", text), path
