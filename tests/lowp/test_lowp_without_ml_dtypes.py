"""Everything but ml_dtypes-typed results works without ml_dtypes (it is optional)."""

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["ml_dtypes"] = None          # import ml_dtypes -> ImportError
import numpy as np, numba_qk as qk
x = np.array([1.5, -2.0, 3.25, 448.0, 1e9, np.nan, 0.1, -0.0], np.float32)
b = qk.astype(x, qk.bf16)
assert b.codes().tolist()[:2] == [0x3FC0, 0xC000]
assert qk.astype(b, qk.f32)[:4].tolist() == [1.5, -2.0, 3.25, 448.0]
assert qk.astype(x, qk.e4m3).codes()[4] == 0x7E
assert qk.astype(x, qk.i4).shape == (8,)
assert float(qk.bf16(1.5)) == 1.5 and qk.e4m3.max == 448.0
for call in (lambda: b.numpy(), lambda: np.array([1.0], dtype=qk.bf16)):
    try:
        call()
    except TypeError as e:
        assert "ml_dtypes" in str(e), e
    else:
        raise AssertionError("expected a TypeError naming ml_dtypes")
assert qk.astype(x, qk.f16).dtype == np.float16
# numpy dtypes name numba_qk types without ml_dtypes too (issue 21 C)
for spelling, t in ((np.float16, qk.f16), (np.dtype("float32"), qk.f32), (np.int8, qk.i8),
                    (np.dtype(np.uint8), qk.u8), (np.int32, qk.i32)):
    r = qk.astype(x, spelling)
    assert type(r) is np.ndarray and r.dtype == t.numpy_dtype
    assert (r.view(f"u{r.dtype.itemsize}") == qk.astype(x, t).view(f"u{r.dtype.itemsize}")).all()
    assert qk.Tensor(np.zeros(4, np.uint8).view(t.numpy_dtype), dtype=spelling).dtype is t
try:
    qk.astype(x, np.float64)
except TypeError as e:
    assert "float64" in str(e), e
else:
    raise AssertionError("expected a TypeError naming float64")
print("ok")
"""


def test_works_without_ml_dtypes():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"
