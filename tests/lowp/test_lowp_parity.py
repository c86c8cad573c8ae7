"""The lowp kernels interpreted by Python (NUMBA_DISABLE_JIT=1) give the compiled results."""

import os
import subprocess
import sys

import numpy as np


COMPUTE = r"""
import numpy as np, numba_qk as qk
rng = np.random.default_rng(9)
x = np.concatenate([rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32).view(np.float32),
                    np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1.5, 2.5, 448, 464, 1e-40, -7.75,
                              65520, 3.0, 2.0**-127, 1e38, -1e38], np.float32)])
x = x[:len(x) // 8 * 8]
out = {}
for name in ["f16", "bf16", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "i8", "u8", "i32",
             "i4", "u4", "u1"]:
    t = qk.from_name(name)
    for src_name, src in (("f32", x), ("f64", x.astype(np.float64) * 1.0000001)):
        r = qk.astype(src, t)
        c = r.codes() if isinstance(r, qk.Tensor) else r.view(f"u{r.dtype.itemsize}")
        out[f"{name}_{src_name}"] = np.asarray(c, np.int64).reshape(-1)
        back = qk.astype(r if isinstance(r, qk.Tensor) else qk.Tensor(r), qk.f32)
        out[f"{name}_{src_name}_back"] = back.view(np.uint32).astype(np.int64)
        rs = qk.astype(src.reshape(-1, 8)[::-1, ::-1], t)            # strided source rows
        cs = rs.codes() if isinstance(rs, qk.Tensor) else rs.view(f"u{rs.dtype.itemsize}")
        out[f"{name}_{src_name}_strided"] = np.asarray(cs, np.int64).reshape(-1)
"""
SCRIPT = COMPUTE + "import sys\nnp.savez(sys.argv[1], **out)\n"


def interpreted(tmp_path):
    path = tmp_path / "py.npz"
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-c", SCRIPT, str(path)], check=True, env=env, timeout=600)
    return np.load(path)


def compiled():
    """The same script in this process (its compiled kernels are shared with the other tests)."""
    ns = {}
    with np.errstate(all="ignore"):   # the f64 source overflows f32 on purpose
        exec(COMPUTE, ns)
    return ns["out"]


def test_interpreted_equals_compiled(tmp_path):
    jit, py = compiled(), interpreted(tmp_path)
    assert sorted(jit) == sorted(py.files) and len(jit) == 84
    for k in jit:
        assert np.array_equal(jit[k], py[k]), k
