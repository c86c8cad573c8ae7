"""The JIT policy, in one place.  Every kernel in numba_qk is compiled with these options.

* ``fastmath=False``: no reassociation, no FMA contraction, no flush-to-zero -- each float
  operation is one IEEE round-to-nearest-even step, as the numerics require.
* ``error_model='numpy'``: float division follows IEEE (x/0 -> inf/nan), never raises.
* ``cache=True``: compiled code is stored beside the modules, so later processes start fast.
  numba keys a cached function on its own file and bytecode only, so a kernel would keep code
  built from an older version of what it uses from other modules (IR intrinsics, tables frozen
  into the code, inlined helpers).  ``DependencyCache`` adds a digest of the source of every
  module of the package that the kernel's module imports, transitively: an edit anywhere in
  what a kernel is built from recompiles it, and nothing else.
* ``nogil=True``: kernels release the GIL; callers may run them from several threads.
* ``parallel=False``: record order is part of the semantics; kernels never reorder it.
* Closures made by a factory (one per format: ``bind(fmt).<locals>.quantize``) get a qualified
  name of their own, ``<qualname>__<digest of the closure's values>``: numba names compiled
  symbols after the qualified name and a per-process counter, so two closures compiled in two
  processes could carry one symbol, and once both were loaded from the cache into one process,
  calls to the second ran the first (Q8_1's quantizer ran Q8_0's).  See ``closure_named``.
"""

import ast
import hashlib
import sys
import types
from pathlib import Path

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit
from numba.core.caching import FunctionCache

JIT_OPTIONS = dict(
    fastmath=False,
    error_model="numpy",
    cache=True,
    nogil=True,
    parallel=False,
    boundscheck=False,
)

# The options of the ``@overload`` implementations (the driver's dot/gemv/gemm/fold, the
# K-quant portable pieces): JIT_OPTIONS uncached.  numba compiles an overload as a function of
# its own and, cached, keys it on the overload's file alone; a caller recompiled because a
# module it depends on changed (``DependencyCache``) then linked the overload's stale code (an
# edited SIMD tile kept running the old one).  Uncached, the overload is compiled with its
# caller, whose cache entry holds both.
OVERLOAD_OPTIONS = {**JIT_OPTIONS, "cache": False}


def kernel(fn):
    """Compile ``fn`` with numba_qk's JIT policy."""
    return _with_dependency_cache(njit(**JIT_OPTIONS)(closure_named(fn)))


def inline_kernel(fn):
    """``kernel`` inlined into its callers at numba's IR level (``inline='always'``): for small
    per-block helpers called once per block from a hot loop, where LLVM kept the call (measured:
    the legacy encoders' absmax / min-max helpers cost 0.19 ms per 1 M floats as calls)."""
    return _with_dependency_cache(njit(inline="always", **JIT_OPTIONS)(closure_named(fn)))


def closure_named(fn):
    """``fn`` itself; when it is a closure, first renamed ``<qualname>__<12 hex digits>``, the
    digits a sha256 of what its cells hold (``closure_key``), so that closures from one factory
    with different values have different names in every process -- and so different compiled
    symbols and cache files (decision 038).  Cells may hold plain numbers, strings, None, tuples
    of these, compiled kernels (named by their own qualified name), numba intrinsics and plain
    functions (named by their code's qualified name and, recursively, their own cells), classes,
    LLVM IR types (an intrinsic's vector types: by their text) and numpy arrays (named by their
    bytes); anything else raises TypeError when the kernel is made, as it would give no name
    that is the same in every process."""
    if fn.__closure__:
        digest = hashlib.sha256(closure_key(fn).encode()).hexdigest()[:12]
        fn.__qualname__ = f"{fn.__qualname__}__{digest}"
    return fn


def kernel_identity(dispatcher) -> str:
    """The module and qualified name of a compiled kernel: unique within the package and the
    same in every process (closures are named by their values, ``closure_named``)."""
    f = dispatcher.py_func
    return f"{f.__module__}.{f.__qualname__}"


def closure_key(fn) -> str:
    """What the cells of closure ``fn`` hold, as text that is the same in every process."""
    parts = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
        try:
            value = cell.cell_contents
        except ValueError:
            raise TypeError(f"kernel {fn.__qualname__}: closure cell {name!r} is empty") from None
        parts.append(f"{name}={_value_key(fn, name, value)}")
    return ";".join(parts)


def closure_modules(fn) -> set:
    """The modules of the compiled kernels, intrinsics, plain functions and classes that
    closure ``fn`` holds, and of those their own cells hold, transitively."""
    found, seen = set(), set()
    for cell in fn.__closure__ or ():
        _modules_of(cell.cell_contents, found, seen)
    return found


def _modules_of(v, found: set, seen: set) -> None:
    if isinstance(v, tuple):
        for e in v:
            _modules_of(e, found, seen)
        return
    if isinstance(v, type):                    # a class (a layout declaration): its module
        found.add(v.__module__)
        return
    f = getattr(v, "py_func", None) or getattr(v, "_defn", v)
    if isinstance(f, types.FunctionType) and id(f) not in seen:
        seen.add(id(f))
        found.add(f.__module__)
        for cell in f.__closure__ or ():
            _modules_of(cell.cell_contents, found, seen)


def _value_key(fn, name, v) -> str:
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ",".join(_value_key(fn, name, e) for e in v) + ")"
    if hasattr(v, "py_func"):
        return kernel_identity(v)
    f = getattr(v, "_defn", v)   # a numba @intrinsic is named by its definition
    if isinstance(f, types.FunctionType):     # a plain function: its name and its cells' values
        cells = f"[{closure_key(f)}]" if f.__closure__ else ""
        return f"{f.__module__}.{f.__qualname__}{cells}"
    if isinstance(v, type):                    # a class (a layout declaration)
        return f"{v.__module__}.{v.__qualname__}"
    if isinstance(v, llvm_ir.Type):            # an intrinsic's LLVM IR type: its text
        return f"ir({v})"
    if isinstance(v, np.ndarray):              # a table frozen into the code: its bytes
        return f"array({v.dtype.str},{v.shape},{hashlib.sha256(v.tobytes()).hexdigest()[:16]})"
    raise TypeError(f"kernel {fn.__qualname__}: closure cell {name!r} holds a "
                    f"{type(v).__name__}, which has no name that is the same in every process")


# ----------------------------------------------------------------------------- cache keys

def _with_dependency_cache(dispatcher):
    if hasattr(dispatcher, "py_func"):   # not under NUMBA_DISABLE_JIT (a plain function then)
        dispatcher._cache = DependencyCache(dispatcher.py_func)
    return dispatcher


class DependencyCache(FunctionCache):
    """numba's on-disk function cache, with one more part in each entry's key: the digest of
    the sources the function's module is built from (``module_digest``).  Entries written
    before a dependency changed are then never loaded again (they stay in the index until the
    module's own file changes, which resets it, as numba does).  A closure's entries are keyed
    by its values as ``closure_key`` names them, not by numba's pickle of its cells (decision
    044), and by the digests of the modules of the kernels and functions it holds."""

    _closure_hash = None

    def _index_key(self, sig, codegen):
        fn = self._py_func
        if not fn.__closure__:
            sig_, magic, hashes = super()._index_key(sig, codegen)
            return (sig_, magic, (*hashes, module_digest(fn.__module__)))
        # numba would hash the pickled cells, and a compiled function pickles with a uuid fresh
        # in every process: a closure holding one was never found again (it recompiled in every
        # process).  The held kernels are compiled into the closure, so an edit to what they
        # are built from must recompile it: their modules' digests are part of the key.
        if self._closure_hash is None:
            # every module the held kernels come from, a user's or a test's too (a closure of
            # numba_qk's over an edited kernel of theirs kept its old code), but not numba's,
            # numpy's or the standard library's (their files change only with their version)
            modules = sorted(m for m in {fn.__module__, *closure_modules(fn)}
                             if m.split(".")[0] not in _UNFOLLOWED_ROOTS)
            text = "\n".join([fn.__code__.co_code.hex(), closure_key(fn),
                              *map(module_digest, modules)])
            self._closure_hash = hashlib.sha256(text.encode()).hexdigest()
        return (sig, codegen.magic_tuple(), (self._closure_hash,))


_DIGESTS: dict = {}
_IMPORTS: dict = {}
# the packages whose modules a closure's cache key leaves out (DependencyCache._index_key)
_UNFOLLOWED_ROOTS = frozenset({"numba", "numpy", "llvmlite", *sys.stdlib_module_names})


def module_digest(name: str) -> str:
    """sha256 over the source files of module ``name`` and of every module of its top-level
    package that it imports, transitively (in numba_qk: the kernel and declaration layers,
    ``_followed``) -- function-level imports included, found by reading the files (nothing is
    imported).  Computed once per module per
    process, when a cache entry is first looked up."""
    digest = _DIGESTS.get(name)
    if digest is None:
        files = sorted(_closure(name))
        _save_statements()
        h = hashlib.sha256()
        for f in files:
            h.update(str(Path(f).name).encode() + b"\0" + Path(f).read_bytes() + b"\0")
        digest = _DIGESTS[name] = h.hexdigest()
    return digest


def _closure(name: str) -> set:
    """Source files of ``name`` and of the package modules it imports, transitively."""
    seen, files, todo = set(), set(), [name]
    root = name.split(".")[0]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = _source_of(mod)
        if path is None:
            continue
        files.add(path)
        todo.extend(m for m in _imports_of(mod, path) if _followed(m, root))
    return files


# What compiled code can be built from, in numba_qk: the kernels and the declarations (their
# schemas give byte offsets and constants).  The layers above them (ops, array types, files)
# never reach compiled code, and following their function-level imports would tie every
# kernel to every Python-side edit.
_NUMBA_QK_KERNEL_LAYERS = ("numba_qk.kernels", "numba_qk.formats", "numba_qk.errors",
                           "numba_qk._jit")


def _followed(mod: str, root: str) -> bool:
    if mod == "numba_qk" or mod.startswith("numba_qk."):
        return mod.startswith(_NUMBA_QK_KERNEL_LAYERS)
    return mod.split(".")[0] == root


def _source_of(mod: str):
    m = sys.modules.get(mod)
    f = getattr(m, "__file__", None)
    if f is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            return None
        f = getattr(spec, "origin", None) if spec is not None else None
    return f if f and f.endswith(".py") else None


def _imports_of(mod: str, path: str) -> list:
    """Modules named by the import statements of ``path`` (module ``mod``), relative ones
    resolved; ``from pkg import name`` counts ``pkg.name`` when that is a module, else ``pkg``."""
    found = _IMPORTS.get(path)
    if found is not None:
        return found
    is_pkg = path.endswith("__init__.py")
    package = mod if is_pkg else mod.rpartition(".")[0]
    found = []
    for level, target, names in import_statements(Path(path).read_bytes(), path):
        if names is None:                      # import a.b.c
            found.append(target)
            continue
        if level:
            base = package.split(".")
            base = base[:len(base) - level + 1] if level > 1 else base
            target = ".".join(base + ([target] if target else []))
        for a in names:
            sub = f"{target}.{a}"
            found.append(sub if _source_of(sub) is not None else target)
    _IMPORTS[path] = found
    return found


def parse_import_statements(source: bytes, path: str) -> list:
    """The import statements of a Python source, in ``ast.walk`` order (function-level ones
    included): ``(0, name, None)`` for ``import name``, ``(level, module or "", [names])`` for
    ``from ... import``."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found.extend((0, a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", [a.name for a in node.names]))
    return found


# Parsing the ~50 kernel-layer sources took ~0.45 s of every process's first cache lookup (a
# model's warm start is ~5 s); their import statements are kept on disk beside numba's cache,
# keyed by the sha256 of each file's bytes, so only an edited file is parsed again.
_STATEMENTS: dict = {}
_STATEMENTS_FILE = "numba_qk-imports-1.json"
_statements_loaded = False


def _statements_path() -> Path:
    from numba.core import config

    base = Path(config.CACHE_DIR) if config.CACHE_DIR else Path(__file__).parent / "__pycache__"
    return base / _STATEMENTS_FILE


def import_statements(source: bytes, path: str) -> list:
    """``parse_import_statements`` of ``source``, from the on-disk store when a file with the
    same bytes was parsed before (an unreadable, corrupt or unwritable store is ignored)."""
    global _statements_loaded
    if not _statements_loaded:
        _statements_loaded = True
        try:
            import json

            _STATEMENTS.update(json.loads(_statements_path().read_text()))
        except (OSError, ValueError):
            pass
    key = hashlib.sha256(source).hexdigest()
    got = _STATEMENTS.get(key)
    if isinstance(got, list):
        return [(lvl, name, names) for lvl, name, names in got]
    global _statements_new
    got = parse_import_statements(source, path)
    _STATEMENTS[key] = got
    _statements_new = True
    return got


_statements_new = False


def _save_statements():
    """Write the store if this process parsed a file it did not hold."""
    global _statements_new
    if not _statements_new:
        return
    _statements_new = False
    import json
    import os
    import tempfile

    path = _statements_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".imports-")
        with os.fdopen(fd, "w") as f:
            json.dump(_STATEMENTS, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        pass
