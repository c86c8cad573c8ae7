"""The JIT policy holds everywhere: no fast-math, cached, GIL released."""

import re

import pytest
from pathlib import Path

import numba_qk
from numba_qk import kernels
from numba.core.caching import FunctionCache

from numba_qk._jit import JIT_OPTIONS, DependencyCache
from numba_qk.kernels import _bits
from numba_qk.kernels.kquants import dot
from numba_qk.kernels.legacy import kernels as legacy
from numba_qk.kernels.kquants import q4_k
from numba_qk.kernels.kquants import q8_k

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
            assert isinstance(obj._cache, FunctionCache), name
            assert isinstance(obj._cache, DependencyCache), \
                f"{name}: its cache key does not follow its dependencies"
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


_TABLES = "import numpy as np\nTABLE = np.array([{}], np.float32)\n"
# drive.py: an @overload reaching tables.py, as the format entry points reach the SIMD tiles
# through kernels/drive.py; compiled with the options numba_qk's overloads use
_DRIVE = """from numba.extending import overload
from numba_qk._jit import {options}
from . import tables


def value():
    raise NotImplementedError


@overload(value, jit_options={options})
def _value_overload():
    return lambda: tables.TABLE[0]
"""
# leaf.py: a kernel built from tables.py; factory.py: a closure holding a compiled kernel it
# is given (as the driver's gemv closures hold the format tiles), in a module that imports
# neither tables.py nor leaf.py
_LEAF = """from numba_qk._jit import kernel
from . import tables


@kernel
def get():
    return tables.TABLE[0]
"""
_FACTORY = """from numba_qk._jit import kernel


def make(inner):
    @kernel
    def call():
        return inner()
    return call
"""
_KERNEL = """from numba_qk._jit import kernel
from . import drive, factory, leaf, tables


@kernel
def first():
    return tables.TABLE[0]


@kernel
def second():
    return drive.value()


third = factory.make(leaf.get)
"""

_RUN = """import sys
sys.path.insert(0, {root!r})
from depcheck import kern
print(kern.first(), kern.second(), kern.third(),
      *(k.stats.cache_hits.get(k.signatures[0], 0) if k.signatures else 0
        for k in (kern.first, kern.second, kern.third)))
"""


def _run_depcheck(root, env):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _RUN.format(root=str(root))], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    first, second, third, *hits = r.stdout.split()
    return float(first), float(second), float(third), *map(int, hits)


def _edit_a_dependency(tmp_path, overload_options):
    """Four processes running ``kern.first`` (reads ``tables.TABLE``), ``kern.second`` (the
    same through an ``@overload`` in ``drive.py``) and ``kern.third`` (the same through a
    closure holding ``leaf.get``): two before and two after only ``tables.py`` changes; each
    gives (first, second, third, cache hits of each)."""
    import os

    pkg = tmp_path / "depcheck"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tables.py").write_text(_TABLES.format("1.0"))
    (pkg / "drive.py").write_text(_DRIVE.format(options=overload_options))
    (pkg / "kern.py").write_text(_KERNEL)
    (pkg / "leaf.py").write_text(_LEAF)
    (pkg / "factory.py").write_text(_FACTORY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NUMBA_DISABLE_JIT", None)
    runs = [_run_depcheck(tmp_path, env), _run_depcheck(tmp_path, env)]
    stats = {f: os.stat(pkg / f) for f in ("kern.py", "drive.py", "leaf.py", "factory.py")}
    (pkg / "tables.py").write_text(_TABLES.format("2.0"))   # only the dependency changes
    for f, st in stats.items():
        os.utime(pkg / f, ns=(st.st_atime_ns, st.st_mtime_ns))
    return runs + [_run_depcheck(tmp_path, env), _run_depcheck(tmp_path, env)]


def test_cache_follows_edits_of_modules_a_kernel_is_built_from(tmp_path):
    """numba keys its cache on the kernel's own file: a kernel that freezes another module's
    array (or calls IR defined there) kept stale code after that module changed.  With
    DependencyCache the next process recompiles; an unchanged tree loads from the cache.  An
    ``@overload`` implementation is compiled as a function of its own; cached (numba keys it
    on the overload's file alone), it kept the code of the older ``tables.py`` and was linked
    into the recompiled kernel (``JIT_OPTIONS`` there gives 1.0 after the edit).
    ``OVERLOAD_OPTIONS`` compiles it uncached: the kernel's own cache entry holds it.
    A closure holding a compiled kernel loads from the cache in the second process (numba's
    own key hashes the pickled kernel, a fresh uuid each process: it recompiled every time)
    and is recompiled when the held kernel's module is built from an edited file."""
    assert _edit_a_dependency(tmp_path, "OVERLOAD_OPTIONS") == [
        (1.0, 1.0, 1.0, 0, 0, 0),    # compiled, cache written
        (1.0, 1.0, 1.0, 1, 1, 1),    # loaded from the cache
        (2.0, 2.0, 2.0, 0, 0, 0),    # recompiled, not the stale 1.0
        (2.0, 2.0, 2.0, 1, 1, 1)]


_USER_KERNEL = """from numba_qk._jit import kernel


@kernel
def fill(w, x, out):
    for i in range(out.shape[0]):
        out[i] = {value}
"""
_RUN_USER = """
import sys
sys.path.insert(0, {root!r})
import numpy as np
import userk
from numba_qk.kernels import _pool
job = _pool.rows_job(userk.fill, 2)   # a closure of numba_qk's, cached in numba_qk's folder
w, x, out = np.zeros((4, 2), np.uint8), np.zeros((1, 1), np.uint8), np.zeros(4, np.float32)
job(w.ctypes.data, 4, 2, 0, x.ctypes.data, 1, 1, 1, out.ctypes.data, 4, 0, 4, 1)
print(out[0], job.stats.cache_hits[job.signatures[0]] if job.signatures else -1)
"""


def test_a_closure_over_another_packages_kernel_follows_its_edits(tmp_path):
    """A closure of numba_qk's (``_pool.rows_job``, as ``Helpers.product`` makes for a user's
    gemv) holding a kernel of another package: after that kernel's file changes, the next
    process runs the new code.  The closure's cache key held the digests of numba_qk's modules
    only, so it loaded the old compiled code (a test's toy kernel, edited, ran stale)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent), os.environ.get("PYTHONPATH", "")]), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NUMBA_DISABLE_JIT", None)
    user = tmp_path / "userk.py"
    got = []
    for value in ("1.0", "1.0", "2.5"):
        if value == "2.5":
            stamp = user.stat().st_mtime_ns + 10**10
            user.write_text(_USER_KERNEL.format(value=value))
            os.utime(user, ns=(stamp, stamp))
        elif not user.exists():
            user.write_text(_USER_KERNEL.format(value=value))
        r = subprocess.run([sys.executable, "-c", _RUN_USER.format(root=str(tmp_path))],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        value_run, hits = r.stdout.split()
        got.append((float(value_run), int(hits)))
    # the values, and the second process loading from the cache (the key is the same in every
    # process; the first may load an entry of an earlier run of this test)
    assert [v for v, _ in got] == [1.0, 1.0, 2.5] and got[1][1] == 1


def test_every_compiled_kernel_has_a_name_of_its_own():
    """numba names a compiled symbol after the kernel's qualified name and a per-process
    counter: two closures of one factory (``bind(fmt).<locals>.quantize``), compiled in two
    processes, could carry one symbol, and once both were loaded from the cache into one
    process the second ran the first's code.  ``kernel`` names closures by their values."""
    import gc

    from numba.core.registry import CPUDispatcher

    from numba_qk._jit import closure_key
    import numba_qk.gguf  # noqa: F401  (everything that makes kernels, imported)
    import numba_qk.models  # noqa: F401

    list(_bound_kernels())
    owners = {}
    dispatchers = []
    for d in gc.get_objects():
        # type(), not isinstance: numpy's NpzFile.f (a BagObj) raises on __class__, and a
        # dead weakref proxy raises ReferenceError
        try:
            if issubclass(type(d), CPUDispatcher):
                dispatchers.append(d)
        except ReferenceError:
            pass
    for d in dispatchers:
        f = d.py_func
        if f.__module__.startswith("numba_qk"):
            # a factory called twice with the same values makes two equal kernels: one name is
            # right for them; two kernels with other code or other values must differ in name
            what = (f.__code__, closure_key(f) if f.__closure__ else "")
            key = (f.__module__, f.__qualname__)
            assert owners.setdefault(key, what) == what, f"two different kernels named {key}"
    assert sum("<locals>" in q for _, q in owners) >= 40


_CROSS_PROCESS = """
import sys
import numpy as np
import numba_qk as qk
from numba_qk import kernels
from numba_qk.testing.reference import quantize
x = np.random.default_rng(7).standard_normal(64).astype(np.float32)
for name in sys.argv[1].split(","):
    fmt = getattr(qk.quant, name)
    got = np.zeros((2, fmt.block_bytes), np.uint8)
    getattr(kernels, "quantize_" + name)(x, got)
    ref = b"".join(quantize(fmt, x[i:i + 32]) for i in (0, 32))
    assert got.tobytes() == ref, name
"""


@pytest.mark.slow  # three processes; test_every_compiled_kernel_has_a_name_of_its_own guards it by default
def test_closures_compiled_in_two_processes_keep_their_own_code(tmp_path):
    """The regression test of the collision above: Q8_1's and Q8_0's quantizers (closures of
    one factory) compiled into one cache by two processes, then both loaded by a third."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_DISABLE_JIT", None)
    for formats in ("q8_1", "q8_0", "q8_0,q8_1"):
        r = subprocess.run([sys.executable, "-c", _CROSS_PROCESS, formats], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{formats}: {r.stderr[-2000:]}"


# One-row matmul (the driver's gemv closures over the K-quant tiles and the IQ grid tiles),
# a batch (the panel-gemm closures), two threads (the pool's row runners) and an encoder entry
# closure; the second process prints every package kernel that compiled instead of loading.
_WARM = """
import gc
import numpy as np
import numba_qk as qk
from numba.core.registry import CPUDispatcher
rng = np.random.default_rng(3)
for name in ("q5_k", "iq2_s"):
    fmt = getattr(qk.quant, name)
    w = qk.quantize(rng.standard_normal((64, 256)).astype(np.float32), fmt).reshape(16, 4, -1)
    for n, threads in ((1, 1), (32, 1), (1, 2)):
        qk.matmul(w, rng.standard_normal((n, 1024)).astype(np.float32), lhs_format=fmt,
                  threads=threads)
compiled = sorted({d.py_func.__qualname__ for d in gc.get_objects()
                   if type(d) is CPUDispatcher and d.py_func.__module__.startswith("numba_qk")
                   and sum(d.stats.cache_misses.values())})
print(";".join(compiled))
"""


@pytest.mark.slow  # compiles the Q5_K and IQ2_S products once (~40 s of CPU)
def test_a_second_process_compiles_no_kernel(tmp_path):
    """Closures over compiled kernels load from numba's cache (decision 044): a second process
    running the same products compiles nothing (numba's own key for a closure pickles its
    cells, and a kernel pickles with a fresh uuid every process: each recompiled)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent), os.environ.get("PYTHONPATH", "")]), "NUMBA_QK_ADAPTIVE_THREADS": "0"}
    env.pop("NUMBA_DISABLE_JIT", None)
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _WARM], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(r.stdout.strip())
    assert runs[0], "the first process compiled nothing: the test does not test"
    assert runs[1] == "", f"compiled again in a second process: {runs[1]}"


def test_import_statements_store_gives_what_parsing_gives(tmp_path, monkeypatch):
    """The dependency digest reads each source's import statements from an on-disk store keyed
    by the file's bytes: what it holds equals parsing, for every module of the package; an
    edited file is parsed again; a corrupt store is ignored."""
    from numba_qk import _jit

    store = tmp_path / "imports.json"
    monkeypatch.setattr(_jit, "_statements_path", lambda: store)
    monkeypatch.setattr(_jit, "_STATEMENTS", {})
    monkeypatch.setattr(_jit, "_statements_loaded", False)
    sources = sorted(Path(numba_qk.__file__).parent.rglob("*.py"))
    want = {p: _jit.parse_import_statements(p.read_bytes(), str(p)) for p in sources}
    for p in sources:
        assert _jit.import_statements(p.read_bytes(), str(p)) == want[p], p
    _jit._save_statements()
    assert store.exists()

    def no_parsing(source, path):
        raise AssertionError(f"{path} parsed again")

    monkeypatch.setattr(_jit, "_STATEMENTS", {})             # a new process: from the store only
    monkeypatch.setattr(_jit, "_statements_loaded", False)
    with monkeypatch.context() as m:
        m.setattr(_jit, "parse_import_statements", no_parsing)
        for p in sources:
            assert _jit.import_statements(p.read_bytes(), str(p)) == want[p], p
        edited = b"import numba_qk.kernels.f16\nfrom . import x\n"
        with pytest.raises(AssertionError, match="parsed again"):
            _jit.import_statements(edited, "edited.py")
    assert _jit.import_statements(edited, "edited.py") == [(0, "numba_qk.kernels.f16", None),
                                                          (1, "", ["x"])]
    store.write_text("{not json")
    monkeypatch.setattr(_jit, "_STATEMENTS", {})
    monkeypatch.setattr(_jit, "_statements_loaded", False)
    assert _jit.import_statements(edited, "edited.py") == [(0, "numba_qk.kernels.f16", None),
                                                          (1, "", ["x"])]
