"""``_jit.closure_named`` keys closures whose cells hold plain functions, classes and
``@intrinsic``s (the SIMD tiles of kernels/drive.py: Gemma-3's first batched Q6_K/Q5_0 ``gemm``
raised TypeError before): by their module and qualified name, plus their own cells' values."""

from numba.extending import intrinsic

from numba_qk._jit import closure_key


class _A:
    pass


class _B:
    pass


def _factory(cls, k):
    def inner(builder):
        return cls, k

    @intrinsic
    def intr(typingctx, x):
        return None

    def outer():
        return inner, intr
    return outer


def test_cells_of_functions_classes_and_intrinsics_have_stable_distinct_keys():
    a1, a2, b = _factory(_A, 1), _factory(_A, 1), _factory(_B, 1)
    c = _factory(_A, 2)
    assert closure_key(a1) == closure_key(a2)
    assert len({closure_key(a1), closure_key(b), closure_key(c)}) == 3
    assert f"{__name__}._A" in closure_key(a1)
