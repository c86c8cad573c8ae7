"""K-quant kernels under NUMBA_DISABLE_JIT=1 (plain Python over numpy scalars) give the same
bits as the compiled ones: encoder, dequantizer, record dot and gemv on a small subset."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import numba_qk as qk

from test_kquants import FORMATS, IDS, adversarial_pairs

SCRIPT = textwrap.dedent("""
    import sys, importlib, numpy as np, warnings
    warnings.simplefilter("ignore")
    name = sys.argv[3]
    m = importlib.import_module("numba_qk.kernels.kquants." + name)
    d = np.load(sys.argv[1])
    with np.errstate(all="ignore"):
        rec = np.zeros((d["values"].shape[0], d["w"].shape[1]), np.uint8)
        rc = getattr(m, "quantize_" + name)(d["values"], rec)
        deq = np.empty((d["w"].shape[0], 256), np.float32)
        getattr(m, "dequantize_" + name)(d["w"], deq)
        dot = np.float32(getattr(m, "dot_%s_q8_k" % name)(d["w"], d["x"]))
        vals = np.array([getattr(m, "record_value_%s_q8_k" % name)(d["w"], b, d["x"], b)
                         for b in range(d["w"].shape[0])], np.float32)
        gv = np.empty(2, np.float32)
        getattr(m, "gemv_%s_q8_k" % name)(d["w"][:4].reshape(2, 2, -1), d["x"][:2], gv)
    np.savez(sys.argv[2], rec=rec, rc=rc, deq=deq, dot=dot, vals=vals, gv=gv)
""")


def _run(tmp_path, f, env_extra, inputs):
    np.savez(tmp_path / "in.npz", **inputs)
    env = dict(os.environ, **env_extra)
    root = Path(qk.__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz"), f.name], check=True, env=env, timeout=300)
    return np.load(tmp_path / "out.npz")


@pytest.mark.parametrize("f", FORMATS, ids=IDS)
def test_disable_jit_matches_compiled(tmp_path, rng, f):
    values = rng.standard_normal((3, 256)).astype(np.float32)
    values[1] *= np.float32(1e-30)  # f16 scales underflow
    values[2] = np.float32(-2.5)
    wa, xa = adversarial_pairs(f)
    pick = [0, 7, 40, 61, 101, 106]
    w, x = wa[pick], xa[pick]
    py = _run(tmp_path, f, {"NUMBA_DISABLE_JIT": "1"}, dict(values=values, w=w, x=x))
    rec = np.zeros((3, f.nbytes), np.uint8)
    assert f.k("quantize_{t}")(values, rec) == py["rc"] == -1
    assert (py["rec"] == rec).all()
    same = lambda a, b: ((np.asarray(a, np.float32).view(np.uint32)  # noqa: E731
                          == np.asarray(b, np.float32).view(np.uint32))
                         | (np.isnan(a) & np.isnan(b))).all()
    assert same(py["deq"], f.dequantize(w))
    assert same(py["dot"], f.dot(w, x))
    assert same(py["vals"], [f.record_value(w, b, x, b) for b in range(len(pick))])
    assert same(py["gv"], f.gemv(w[:4].reshape(2, 2, -1), x[:2]))
