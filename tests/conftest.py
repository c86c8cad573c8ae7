import numpy as np
import pytest

from numba_qk.testing.asserts import assert_same_f32, assert_same_records, bits_equal  # noqa: F401 (re-export)


@pytest.fixture(autouse=True)
def _fixed_thread_counts(monkeypatch):
    """Tests ask for ``threads=N`` to exercise N-thread runs: switch off the adaptive thread
    count (which would run serially on a busy CI machine); tests/runtime/test_threads.py tests it."""
    from numba_qk import _threads

    monkeypatch.setattr(_threads, "ADAPTIVE", False)


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """numba_qk's command line in this process (what ``python -m numba_qk ARGS`` runs, without
    starting and importing a new interpreter: ~2 s of CPU each): ``run(*args, cwd=None) ->
    (status, stdout, stderr)``; argparse's usage errors give their exit status."""
    from numba_qk.__main__ import main

    def run(*args, cwd=None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            code = main(list(map(str, args)))
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


# The files that take longest in the default run (cold numba cache; the first three compile in
# subprocesses of their own), run first: ``--dist loadfile`` hands files out in collection order,
# and a long file handed out last leaves the other worker idle at the end.
LONGEST_FIRST = ("package/test_parity.py", "package/test_jit_policy.py",
                 "conformance/test_registry.py", "package/test_parity_registry_portable.py",
                 "lowp/test_lowp_codecs.py", "lowp/test_lowp_dlpack.py",
                 "conformance/test_fast_paths.py", "kquants/test_kquants.py", "io/test_gguf.py",
                 "lowp/test_lowp_parity.py", "iq/test_iq2_encode.py", "iq/test_iq3_encode.py",
                 "simd/test_legacy_vnni_paths.py", "simd/test_legacy_vnni.py",
                 "iq/test_iq_grid_fast.py", "ternary/test_tq_fast.py",
                 "models/test_tiny_models.py")


def _file_rank(item):
    path = item.nodeid.split("::")[0]
    for rank, tail in enumerate(LONGEST_FIRST):
        if path.endswith(tail):
            return rank
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """The longest files first (``LONGEST_FIRST``; a stable sort keeps each file's tests
    together and in order).  ``@pytest.mark.slow`` sweeps run on purpose only: with ``-m slow``
    (any marker expression naming ``slow``) or ``NUMBA_QK_SLOW=1``; the default run skips them
    with that reason.  ``@pytest.mark.models`` (real GGUF models) likewise: ``-m models`` or
    ``NUMBA_QK_MODELS_RUN=1``."""
    import os

    items.sort(key=_file_rank)

    for marker, env in (("slow", "NUMBA_QK_SLOW"), ("models", "NUMBA_QK_MODELS_RUN")):
        if marker in (config.option.markexpr or "") or os.environ.get(env):
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with -m {marker} or {env}=1")
        for item in items:
            if item.get_closest_marker(marker) is not None:  # (keywords hold folder names)
                item.add_marker(skip)
