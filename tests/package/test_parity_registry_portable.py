"""Every bound format under NUMBA_QK_PORTABLE=1 (the portable loops, compiled cold in a fresh
cache) equals the SIMD default bit for bit.  Its own file: the longest parity subprocess.  The
default run compares two formats (``PORTABLE_FEW``);
``-m slow`` compares the others."""

import pytest

from parity_registry import all_formats, needs_simd, registry_run


# the portable run compiles cold in a cache of its own: three formats by default (Q4_K's own
# kernels, the Q8_0-paired legacy family, the FP4 records), every other format
# under -m slow
PORTABLE_FEW = ("Q4_K", "Q4_0")


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
