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
def rng():
    return np.random.default_rng(20261130)


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.slow`` sweeps run on purpose only: with ``-m slow`` (any marker expression
    naming ``slow``) or ``NUMBA_QK_SLOW=1``; the default run skips them with that reason.
    ``@pytest.mark.models`` (real GGUF models) likewise: ``-m models`` or
    ``NUMBA_QK_MODELS_RUN=1``."""
    import os

    for marker, env in (("slow", "NUMBA_QK_SLOW"), ("models", "NUMBA_QK_MODELS_RUN")):
        if marker in (config.option.markexpr or "") or os.environ.get(env):
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with -m {marker} or {env}=1")
        for item in items:
            if item.get_closest_marker(marker) is not None:  # (keywords hold folder names)
                item.add_marker(skip)
