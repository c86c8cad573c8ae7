"""Every bound format under NUMBA_QK_PORTABLE=1 (the portable loops, compiled cold in a fresh
cache) equals the SIMD default bit for bit.  Its own file: the longest parity subprocess.  All
under ``-m slow`` (a cold compile of 28 s of CPU for two formats): the default run ties the
portable loops to the fast paths in process instead -- strided records (the portable loop)
against unit-stride ones (the SIMD path) on one format per family
(tests/conformance/test_fast_paths.py), every format's dot and gemv against the oracle and
each other (tests/conformance/test_registry.py), and the driver with only its portable slot
(tests/conformance/test_drive.py)."""

import pytest

from parity_registry import all_formats, needs_simd, registry_run


# one format of Q4_K's own kernels and one of the Q8_0-paired legacy family, then the others
PORTABLE_FEW = ("Q4_K", "Q4_0")


@pytest.mark.slow
def test_registry_portable_matches_default(tmp_path, rng):
    """One format of each kernel family: NUMBA_QK_PORTABLE=1 equals the SIMD default."""
    needs_simd()
    registry_run(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1",
                                  "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, PORTABLE_FEW)


@pytest.mark.slow
def test_registry_portable_matches_default_other_formats(tmp_path, rng):
    """The formats the default run leaves out."""
    needs_simd()
    rest = tuple(n for n in all_formats() if n not in PORTABLE_FEW)
    assert rest
    registry_run(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1",
                                  "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, rest)
