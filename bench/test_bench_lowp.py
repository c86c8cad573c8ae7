"""pytest-benchmark suite for spec 004 casts (not part of the test run):

    python -m pytest bench/test_bench_lowp.py --benchmark-only --benchmark-group-by=group

Each group puts numba_qk.astype beside numkong.astype and ml_dtypes' astype on the same 16 M
f32 elements with a preallocated out=; bench/compare_lowp.py prints the ratio table.
"""

import threading

import numpy as np
import pytest

import numba_qk as qk

ml_dtypes = pytest.importorskip("ml_dtypes")
try:
    import numkong as nk
except ImportError:  # pragma: no cover
    nk = None

N = 1 << 24
TYPES = [("bf16", "bfloat16", "bfloat16"), ("f16", "float16", None), ("e4m3", "e4m3", "float8_e4m3fn"),
         ("e5m2", "e5m2", "float8_e5m2"), ("e2m3", "e2m3", "float6_e2m3fn"),
         ("e3m2", "e3m2", "float6_e3m2fn"), ("e2m1", None, "float4_e2m1fn"), ("i4", "int4", "int4")]


@pytest.fixture(scope="module")
def x():
    return (np.random.default_rng(0).standard_normal(N) * 3).astype(np.float32)


@pytest.mark.parametrize("qname, nkname, mlname", TYPES, ids=[t[0] for t in TYPES])
@pytest.mark.parametrize("lib", ["numba_qk", "numkong", "ml_dtypes"])
def test_encode(benchmark, x, qname, nkname, mlname, lib):
    benchmark.group = f"f32 -> {qname}"
    if lib == "numba_qk":
        t = qk.from_name(qname)
        out = qk.astype(x, t)
        benchmark(qk.astype, x, t, out=out)
    elif lib == "numkong":
        if nk is None or nkname is None:
            pytest.skip("numkong lacks this cast")
        out = nk.astype(x, nkname)
        benchmark(nk.astype, x, nkname, out=out)
    else:
        out = np.empty(N, np.float16 if mlname is None else getattr(ml_dtypes, mlname))
        benchmark(np.copyto, out, x, casting="unsafe")


@pytest.mark.parametrize("qname, nkname, mlname", TYPES, ids=[t[0] for t in TYPES])
@pytest.mark.parametrize("lib", ["numba_qk", "numkong"])
def test_decode(benchmark, x, qname, nkname, mlname, lib):
    benchmark.group = f"{qname} -> f32"
    out = np.empty(N, np.float32)
    if lib == "numba_qk":
        src = qk.astype(x, qk.from_name(qname))
        benchmark(qk.astype, src, qk.f32, out=out)
    else:
        if nk is None or nkname is None:
            pytest.skip("numkong lacks this cast")
        src = nk.astype(x, nkname)
        o = nk.astype(src, "float32")
        benchmark(nk.astype, src, "float32", out=o)


@pytest.mark.parametrize("lib", ["numba_qk", "numkong"])
def test_strided(benchmark, lib):
    base = np.random.default_rng(1).standard_normal((N // 2048, 4096)).astype(np.float32)
    xs = base[:, ::2]
    benchmark.group = "strided f32 -> bf16"
    if lib == "numba_qk":
        out = qk.astype(xs, qk.bf16)
        benchmark(qk.astype, xs, qk.bf16, out=out)
    else:
        if nk is None:
            pytest.skip("numkong not installed")
        out = nk.astype(xs, "bfloat16")
        benchmark(nk.astype, xs, "bfloat16", out=out)


@pytest.mark.parametrize("mode", ["one call", "two python threads", "threads=2"])
def test_concurrency(benchmark, x, mode):
    benchmark.group = "concurrency f32 -> bf16 (per call of all the work)"
    y = x.copy()
    outs = [qk.astype(x, qk.bf16), qk.astype(y, qk.bf16)]
    if mode == "one call":
        benchmark(lambda: (qk.astype(x, qk.bf16, out=outs[0]), qk.astype(y, qk.bf16, out=outs[1])))
    elif mode == "threads=2":
        benchmark(lambda: (qk.astype(x, qk.bf16, out=outs[0], threads=2),
                           qk.astype(y, qk.bf16, out=outs[1], threads=2)))
    else:
        def two():
            ths = [threading.Thread(target=qk.astype, args=(a, qk.bf16), kwargs={"out": o})
                   for a, o in ((x, outs[0]), (y, outs[1]))]
            [t.start() for t in ths]
            [t.join() for t in ths]
        benchmark(two)
