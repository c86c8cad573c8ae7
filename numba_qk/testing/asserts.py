"""Bit-level assertions: float32 results equal bit for bit (NaN matches NaN), records equal byte
for byte, each failure naming the first mismatch.  Used by tests/ and bench/ (tests/conftest.py
re-exports them); generic, so usable from anyone's tests."""
import numpy as np

__all__ = ["bits_equal", "assert_same_f32", "assert_same_records"]


def bits_equal(a, b) -> bool:
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if np.isnan(a) and np.isnan(b):
        return True
    return a.view(np.uint32) == b.view(np.uint32)


def assert_same_f32(got, want, what=""):
    """Bit equality of float32 scalars or arrays (NaN matches NaN); reports the first mismatch."""
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    gb = got.view(np.uint32)
    wb = want.view(np.uint32)
    same = (gb == wb) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        idx = np.unravel_index(int(np.flatnonzero(~same.ravel())[0]), same.shape) if same.ndim else ()
        raise AssertionError(
            f"{what} first mismatch at {idx}: got {got[idx]!r} (0x{int(gb[idx]):08x}), "
            f"want {want[idx]!r} (0x{int(wb[idx]):08x}); {int((~same).sum())} of {same.size} differ")


def assert_same_records(got, want, what=""):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    rows = np.flatnonzero((got != want).reshape(got.shape[0], -1).any(axis=1)) if got.size else []
    if len(rows):
        b = int(rows[0])
        col = int(np.flatnonzero(got[b] != want[b])[0])
        raise AssertionError(f"{what} first bad record {b} at byte {col}: got "
                             f"{got[b].tobytes().hex()} want {want[b].tobytes().hex()}")
