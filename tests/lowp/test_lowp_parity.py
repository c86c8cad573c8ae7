"""The lowp kernels interpreted by Python (NUMBA_DISABLE_JIT=1) give the compiled results."""

import os
import subprocess
import sys

import numpy as np
import pytest

from subsets import default_few

ALL = ["f16", "bf16", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "i8", "u8", "i32", "i4",
       "u4", "u1"]
# every type from f32 sources; the f64 and strided sources (each its own compiled cast) for one
# type of each kind by default, for every type under -m slow
FEW = ["f16", "e4m3", "e2m1", "i8", "u4"]


COMPUTE = r"""
import numpy as np, numba_qk as qk
rng = np.random.default_rng(9)
x = np.concatenate([rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32).view(np.float32),
                    np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1.5, 2.5, 448, 464, 1e-40, -7.75,
                              65520, 3.0, 2.0**-127, 1e38, -1e38], np.float32)])
x = x[:len(x) // 8 * 8]
out = {}
for name in NAMES:
    t = qk.from_name(name)
    for src_name, src in (("f32", x), ("f64", x.astype(np.float64) * 1.0000001)):
        if src_name == "f64" and name not in EXTRA:
            continue
        r = qk.astype(src, t)
        c = r.codes() if isinstance(r, qk.Tensor) else r.view(f"u{r.dtype.itemsize}")
        out[f"{name}_{src_name}"] = np.asarray(c, np.int64).reshape(-1)
        back = qk.astype(r if isinstance(r, qk.Tensor) else qk.Tensor(r), qk.f32)
        out[f"{name}_{src_name}_back"] = back.view(np.uint32).astype(np.int64)
        if name not in EXTRA:
            continue
        rs = qk.astype(src.reshape(-1, 8)[::-1, ::-1], t)            # strided source rows
        cs = rs.codes() if isinstance(rs, qk.Tensor) else rs.view(f"u{rs.dtype.itemsize}")
        out[f"{name}_{src_name}_strided"] = np.asarray(cs, np.int64).reshape(-1)
"""
SCRIPT = COMPUTE + "import sys\nnp.savez(sys.argv[1], **out)\n"


def _header(extra):
    return f"NAMES = {ALL!r}\nEXTRA = {extra!r}\n"


def interpreted(tmp_path, extra):
    path = tmp_path / "py.npz"
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-c", _header(extra) + SCRIPT, str(path)], check=True,
                   env=env, timeout=600)
    return np.load(path)


def compiled(extra):
    """The same script in this process (its compiled kernels are shared with the other tests)."""
    ns = {}
    with np.errstate(all="ignore"):   # the f64 source overflows f32 on purpose
        exec(_header(extra) + COMPUTE, ns)
    return ns["out"]


@pytest.mark.parametrize("extra", default_few(["few", "all"], {"few"}))
def test_interpreted_equals_compiled(tmp_path, extra):
    extra = FEW if extra == "few" else ALL
    jit, py = compiled(extra), interpreted(tmp_path, extra)
    assert sorted(jit) == sorted(py.files) and len(jit) == 2 * len(ALL) + 4 * len(extra)
    for k in jit:
        assert np.array_equal(jit[k], py[k]), k
