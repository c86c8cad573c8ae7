"""The package's import graph, read from the sources (every import statement, function-level
ones included): no import cycles at all, and no more imports of another module's private names
than today (that number only goes down; the restructure issue takes it to none)."""

import ast
from pathlib import Path

import numba_qk

ROOT = Path(numba_qk.__file__).resolve().parent

# Import cycles tolerated: none (the last one, the low-precision array types and casts, was
# broken by issue 22: the element types are declared below them, astype's dispatch sits above
# the element conversion and the block-scaled encode/decode, and Tensor's methods reach astype
# and DLPack through ``tensor.OPERATIONS``, filled from above).  Never add one.
KNOWN_CYCLES = []
# numba_qk.testing (oracles, the ggml bridge, bit-level assertions) serves tests, bench/ and the
# CLI's self-check only; the old oracle paths are aliases of its modules.
TESTING = "numba_qk.testing"
TESTING_ALIASES = {"numba_qk.reference", "numba_qk.reference_kquants", "numba_qk.reference_lowp",
                   "numba_qk.reference_mx", "numba_qk.reference_mxrec", "numba_qk._ggml_ctypes"}
MAY_USE_TESTING = {"numba_qk.__main__"}  # the CLI (top layer): the demo checks the oracle
# Production modules that still call an oracle: none (the last one, dtypes, ran a scalar's value
# and construction through the Fraction oracle; issue 22 gave it its own exact code,
# numba_qk.formats.exact).  Never add one.
KNOWN_ORACLE_USERS = set()
# No module imports another's ``_private`` name (what is shared is public within the package),
# except the pickle lookups: their names are written into every pickle of a format, element
# type or ScaledFormat, so they keep their underscores for old pickles to load.
PICKLE_LOOKUPS = {("numba_qk.formats", "numba_qk.formats._schema", "_lookup_format"),
                  ("numba_qk.formats", "numba_qk.formats.scalars", "_lookup_scalar"),
                  ("numba_qk.mx", "numba_qk.formats.mx", "_lookup")}


def _modules() -> dict:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _target(mod, path, node):
    if not node.level:
        return node.module
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    base = package.split(".")
    if node.level > 1:
        base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _graph(sources=None):
    """({module: set of numba_qk modules it imports}, [(module, target, private name)]), of the
    package's files or of ``sources`` ({module: (path, source text)}, for testing the reader)."""
    if sources is None:
        sources = {m: (p, p.read_text()) for m, p in _modules().items()}
    mods = {m: Path(p) for m, (p, _) in sources.items()}
    edges = {m: set() for m in mods}
    private = []
    for m, p in mods.items():
        for node in ast.walk(ast.parse(sources[m][1], str(p))):
            if isinstance(node, ast.Import):
                edges[m].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                t = _target(m, p, node)
                if not t or not t.startswith("numba_qk"):
                    continue
                for a in node.names:
                    sub = f"{t}.{a.name}"
                    if sub in mods:
                        edges[m].add(sub)
                        continue
                    if t in mods:
                        edges[m].add(t)
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.append((m, t, a.name))
    return edges, private


def _cycles(edges) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = _cycles(edges)
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import cycles (function-level imports count): {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"these cycles are gone or changed: update KNOWN_CYCLES: {gone}"


def test_kernels_top_level_holds_only_shared_pieces():
    """kernels/ is organised by family (kquants/, legacy/, iq/, ...) and tier (simd/); directly
    in it only what every family shares (the driver, the scalar helpers, the traits type, the
    thread pool's compiled half, the @njit building blocks): at most 8 files (issue 22)."""
    top = sorted(p.name for p in (ROOT / "kernels").glob("*.py"))
    assert len(top) <= 8, f"{len(top)} modules directly in numba_qk/kernels/: {top}"


def test_no_imports_of_another_modules_private_names():
    _, private = _graph()
    bad = sorted(set(private) - PICKLE_LOOKUPS)
    assert not bad, (f"imports of another module's private names (module, home, name): {bad}; "
                     "make what is shared public within the package instead")


def _is_testing(mod: str) -> bool:
    return mod == TESTING or mod.startswith(TESTING + ".") or mod in TESTING_ALIASES


def _testing_users(edges) -> dict:
    """{production module: the numba_qk.testing modules (or aliases) it imports}."""
    bad = {m: sorted(t for t in targets if _is_testing(t)) for m, targets in edges.items()
           if not _is_testing(m) and m not in MAY_USE_TESTING | KNOWN_ORACLE_USERS}
    return {m: t for m, t in bad.items() if t}


def test_production_never_imports_numba_qk_testing():
    edges, _ = _graph()
    assert TESTING in edges and "numba_qk.testing.reference" in edges
    bad = _testing_users(edges)
    assert not bad, f"production modules importing numba_qk.testing (or an alias of it): {bad}"
    # the check is not blind: a function-level import of an oracle (or of an alias) is caught
    fake = {"numba_qk.dtypes": ("numba_qk/dtypes.py",
                                "def value():\n    from .reference_lowp import decode\n"),
            "numba_qk.ops": ("numba_qk/ops.py", "from numba_qk.testing.reference import lowp\n"),
            "numba_qk.reference_lowp": ("numba_qk/reference_lowp.py", ""),
            "numba_qk.testing.reference": ("numba_qk/testing/reference/__init__.py", ""),
            "numba_qk.testing.reference.lowp": ("numba_qk/testing/reference/lowp.py", "")}
    assert _testing_users(_graph(fake)[0]) == {
        "numba_qk.dtypes": ["numba_qk.reference_lowp"],
        "numba_qk.ops": ["numba_qk.testing.reference.lowp"]}


def test_the_oracles_import_no_production_code():
    """The oracles stay independent of what they check: the element-type oracle (against which
    the scalars' exact code, numba_qk.formats.exact, is tested) imports nothing of numba_qk."""
    edges, _ = _graph()
    assert edges["numba_qk.testing.reference.lowp"] == set()


def test_the_graph_sees_function_level_imports():
    """The reader is not blind: a function-level import makes an edge, and a cycle made only
    of function-level imports is found (the test above would fail on it)."""
    edges, _ = _graph()
    assert "numba_qk.testing.reference.core" in edges["numba_qk.__main__"]   # inside the demo
    assert "numba_qk.presets" in edges["numba_qk.gguf"]                      # inside functions
    assert "numba_qk.formats" in edges["numba_qk.dtypes"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    fake = {"numba_qk.a": ("numba_qk/a.py", "def f():\n    from . import b\n"),
            "numba_qk.b": ("numba_qk/b.py", "def g():\n    from .a import _h\n"),
            "numba_qk.c": ("numba_qk/c.py", "import numba_qk.a\n")}
    edges, private = _graph(fake)
    assert edges == {"numba_qk.a": {"numba_qk.b"}, "numba_qk.b": {"numba_qk.a"},
                     "numba_qk.c": {"numba_qk.a"}}
    assert _cycles(edges) == [{"numba_qk.a", "numba_qk.b"}]
    assert private == [("numba_qk.b", "numba_qk.a", "_h")]
