"""Registry-wide parity helpers (not a test module): every bound format, in one subprocess per
mode, must give the bits of the default compiled kernels.  Used by test_parity.py and
test_parity_registry_portable.py (a file of its own so pytest-xdist's --dist loadfile runs the
long portable compile beside the other parity subprocesses)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import numba_qk as qk


def needs_simd():
    """Comparing the portable loops with the default path only tests something when the
    default path is the SIMD one; without AVX2 both are the portable loops: skip, not pass."""
    from numba_qk.kernels.simd.base import HAVE_AVX2

    if not HAVE_AVX2:
        import pytest

        pytest.skip("no AVX2 on this machine: the default path is the portable one")


# Every format of the registry, in one subprocess per mode: quantize, dequantize, decode and
# (weights) dot / gemv / gemm over 8-row and 8-activation tiles with remainders.
REGISTRY_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, warnings
    warnings.simplefilter("ignore")
    import numba_qk as qk
    from numba_qk._registry import BINDINGS
    sys.path.insert(0, sys.argv[3])
    from parity_registry import registry_results
    np.savez(sys.argv[2], **registry_results(np.load(sys.argv[1]), sys.argv[4].split(",")))
""")

# The default run's subset: one format of each kernel family (K-quant dot, K-quant drive,
# legacy nibble / 8-bit, MX record, the Q8_K activation); ``-m slow`` runs every format
# (the in-process fast-path tests compare every format's SIMD kernels with its portable loops).
DEFAULT_SUBSET = ("Q8_K", "Q4_K", "Q6_K", "Q4_0", "Q8_0", "MXFP4")


def all_formats():
    from numba_qk._registry import BINDINGS

    return tuple(b.format.name for b in BINDINGS)


def registry_results(d, names):
    import numba_qk as qk
    from numba_qk._registry import BINDINGS

    out = {}
    with np.errstate(all="ignore"):
        for b in BINDINGS:
            f = b.format
            if f.name not in names:
                continue
            n = f.name
            raw = d["raw"][:, :f.block_bytes]
            out[f"{n}.deq"] = qk.dequantize(raw, f)
            for key, value in qk.decode(raw, f)._asdict().items():
                if value is not None:
                    out[f"{n}.decode.{key}"] = value
            if b.quantize is not None:
                out[f"{n}.quant"] = qk.quantize(d["values"].reshape(-1, f.block_size), format=f)
            if b.dot is not None:
                act = qk.activation_format(f)
                w = qk.quantize(d["wv"].reshape(-1, f.block_size), format=f).reshape(9, -1, f.block_bytes)
                span = f.block_size // act.block_size  # NVFP4: 2 Q8_0 records per record
                g = w.shape[1] * span
                x = qk.quantize(d["xv"][:, :g * act.block_size].reshape(-1, act.block_size),
                                format=act).reshape(9, g, act.block_bytes)
                wild = (d["raw"][:3, :f.block_bytes],
                        np.concatenate([d["raw"][3:6, :act.block_bytes]] * span))
                out[f"{n}.dot"] = qk.quantized_dot(*wild, lhs_format=f, rhs_format=act)
                out[f"{n}.gemv"] = qk.gemv(w, x[0], lhs_format=f, rhs_format=act)
                out[f"{n}.gemm"] = qk.gemm(w, x, lhs_format=f, rhs_format=act)
    return out


def registry_run(tmp_path, rng, env_extra, names=DEFAULT_SUBSET):
    raw = rng.integers(0, 256, (6, 292), dtype=np.uint8)
    values = rng.standard_normal((2, 256)).astype(np.float32)
    values[1, :32] = 0.0
    wv = rng.standard_normal((9, 512)).astype(np.float32)
    xv = rng.standard_normal((9, 512)).astype(np.float32)
    np.savez(tmp_path / "rin.npz", raw=raw, values=values, wv=wv, xv=xv)
    env = dict(os.environ, **env_extra)
    root = Path(qk.__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", REGISTRY_SCRIPT, str(tmp_path / "rin.npz"),
                    str(tmp_path / "rout.npz"), str(Path(__file__).resolve().parent),
                    ",".join(names)],
                   check=True, env=env, timeout=300)
    got = np.load(tmp_path / "rout.npz")
    want = registry_results(np.load(tmp_path / "rin.npz"), names)
    assert {k.split(".")[0] for k in want} == set(names)   # every asked format was compared
    assert sorted(got.files) == sorted(want)
    for key, value in want.items():
        a, b = np.asarray(got[key]), np.asarray(value)
        assert a.dtype == b.dtype and a.shape == b.shape, key
        if a.dtype.kind == "f":
            same = (a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")) | (np.isnan(a) & np.isnan(b))
            assert same.all(), key
        else:
            assert (a == b).all(), key
