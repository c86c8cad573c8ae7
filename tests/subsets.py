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
