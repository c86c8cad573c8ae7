"""Every bound format under NUMBA_QK_PORTABLE=1 (the portable loops, compiled cold in a fresh
cache) equals the SIMD default bit for bit.  Its own file: the longest parity subprocess.  The
default run compares one format of each kernel family (``parity_registry.DEFAULT_SUBSET``);
``-m slow`` compares the others."""

import pytest

from parity_registry import DEFAULT_SUBSET, all_formats, needs_simd, registry_run


def test_registry_portable_matches_default(tmp_path, rng):
    """One format of each kernel family: NUMBA_QK_PORTABLE=1 equals the SIMD default."""
    needs_simd()
    registry_run(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1",
                                  "NUMBA_CACHE_DIR": str(tmp_path / "cache")})


@pytest.mark.slow
def test_registry_portable_matches_default_other_formats(tmp_path, rng):
    """The formats the default run leaves out."""
    needs_simd()
    rest = tuple(n for n in all_formats() if n not in DEFAULT_SUBSET)
    assert rest
    registry_run(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1",
                                  "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, rest)
