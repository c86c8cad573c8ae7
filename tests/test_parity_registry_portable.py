"""Every bound format under NUMBA_QK_PORTABLE=1 (the portable loops, compiled cold in a fresh
cache) equals the SIMD default bit for bit.  Its own file: the longest parity subprocess."""

from parity_registry import needs_simd, registry_run


def test_registry_portable_matches_default(tmp_path, rng):
    """Every bound format: NUMBA_QK_PORTABLE=1 (portable loops) equals the SIMD default."""
    needs_simd()
    registry_run(tmp_path, rng, {"NUMBA_QK_PORTABLE": "1",
                                  "NUMBA_CACHE_DIR": str(tmp_path / "cache")})
