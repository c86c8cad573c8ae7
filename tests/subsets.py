"""Parametrisations whose default run keeps a representative few: each case compiles its own
kernel specialisations (strided, read-only, unaligned), and the README's test command must stay
under 10 minutes on 2 cores with a cold numba cache.  The other cases run under ``-m slow``."""

import pytest


def default_few(items, keep, name=str):
    """``items`` as ``parametrize`` values: those whose ``name(item)`` is in ``keep`` run by
    default, the others under ``-m slow``; every case keeps ``name(item)`` as its id."""
    keep = set(keep)
    missing = keep - {name(x) for x in items}
    if missing:
        raise ValueError(f"default_few: {sorted(missing)} not among the cases")
    return [pytest.param(x, id=name(x), marks=() if name(x) in keep else pytest.mark.slow)
            for x in items]


# One weight format of each kernel family (Q4_K's own kernels, the K-quant tiles, the legacy
# formats, the FP4 records, IQ4, the grid IQ formats, ternary, Q1_0/Q2_0): the default run's
# formats for the products whose every format compiles its own batched kernels (gemm, threads);
# every format under -m slow.  Legacy keeps Q4_0 alone: tests/legacy/test_legacy.py checks every
# legacy weight format's quantizer, dot and gemv/gemm/matmul (1 and 2 threads) by default.
FAMILY_FEW = {"Q4_K", "Q6_K", "Q4_0", "MXFP4", "NVFP4", "IQ4_XS", "IQ3_S", "IQ1_M", "TQ1_0",
              "Q1_0"}


def simd_variant_runs():
    """``{variant: whether this machine runs it}`` for the vector variants of the SIMD modules
    (``VARIANTS`` of ``kernels/simd/ternary.py``, ``lowbit.py``), narrowest first."""
    from numba_qk.kernels.simd import base

    return {"avx2": True, "avx2vnni": base.HAVE_VNNI, "avx512": base.HAVE_AVX512,
            "avx512vnni": base.HAVE_AVX512 and base.HAVE_VNNI}


def variant_cases(names):
    """``(name, variant)`` for every format name and vector variant, as ``default_few`` values
    (ids ``name-variant``): the AVX2 and the widest variant this machine runs by default."""
    runs = simd_variant_runs()
    widest = [v for v in runs if runs[v]][-1]
    return default_few([(n, v) for n in names for v in runs],
                       {f"{n}-{v}" for n in names for v in ("avx2", widest)},
                       lambda case: f"{case[0]}-{case[1]}")
