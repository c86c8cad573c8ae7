"""gemv / gemm / matmul: every output bit-identical to quantized_dot, for any threads."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref
from numba_qk._registry import WEIGHTS

from numba_qk.testing.asserts import assert_same_f32
from records import random_q4_k, random_q8_k
from subsets import FAMILY_FEW, default_few

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def dots(w, xq):
    """The definition: one quantized_dot per (activation, row)."""
    return np.array([[qk.quantized_dot(w[r], x, lhs_format=Q4, rhs_format=Q8)
                      for r in range(w.shape[0])] for x in xq], dtype=np.float32)


def weights(rng, rows, g, wild=False):
    if wild:  # any bytes: NaN/inf/subnormal d and dmin, every scale pattern
        return rng.integers(0, 256, size=(rows, g, 144), dtype=np.uint8)
    return random_q4_k(rng, rows * g).reshape(rows, g, 144)


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16, 33])
@pytest.mark.parametrize("g", [1, 2, 17])
def test_gemv_equals_dot(rng, rows, g):
    w = weights(rng, rows, g, wild=rows == 9)
    xq = random_q8_k(rng, g)
    want = dots(w, xq[None])[0]
    for threads in (1, 2, 3, None):
        got = qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8, threads=threads)
        assert got.shape == (rows,) and got.dtype == np.float32
        assert_same_f32(got, want, f"threads={threads}")


@pytest.mark.parametrize("batch", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("rows, g", [(1, 1), (7, 2), (8, 17), (33, 2)])
def test_gemm_equals_dot(rng, batch, rows, g):
    w = weights(rng, rows, g, wild=batch == 9)
    xq = np.stack([random_q8_k(rng, g) for _ in range(batch)])
    want = dots(w, xq)
    for threads in (1, 2, None):
        got = qk.gemm(w, xq, lhs_format=Q4, rhs_format=Q8, threads=threads)
        assert got.shape == (batch, rows)
        assert_same_f32(got, want, f"threads={threads}")


def test_gemm_matches_the_oracle_on_any_bytes(rng):
    w = rng.integers(0, 256, size=(9, 2, 144), dtype=np.uint8)
    xq = rng.integers(0, 256, size=(8, 2, 292), dtype=np.uint8)
    got = qk.gemm(w, xq, lhs_format=Q4, rhs_format=Q8)
    for a in range(8):
        for r in range(9):
            assert_same_f32(got[a, r], ref.quantized_dot(w[r], xq[a]), f"[{a}, {r}]")


@pytest.mark.parametrize("batch", [None, 1, 5, 8, 10])
def test_matmul_quantizes_once_and_equals_dot(rng, batch):
    rows, g = 19, 3
    w = weights(rng, rows, g)
    shape = (g * 256,) if batch is None else (batch, g * 256)
    x = rng.standard_normal(shape).astype(np.float32)
    got = qk.matmul(w, x, lhs_format=Q4, threads=2)
    xq = qk.quantize(x.reshape(-1, 256), format=Q8).reshape(-1, g, 292)
    want = dots(w, xq)
    assert_same_f32(got, want[0] if batch is None else want)


def test_out_buffers_and_threads_give_identical_bits(rng):
    w = weights(rng, 40, 4)
    x = rng.standard_normal((3, 1024)).astype(np.float32)
    out = np.empty((3, 40), np.float32)
    assert qk.matmul(w, x, lhs_format=Q4, out=out) is out
    for t in (2, 4, None):
        assert_same_f32(qk.matmul(w, x, lhs_format=Q4, threads=t), out)
    outv = np.empty(40, np.float32)
    xq = qk.quantize(x[0].reshape(4, 256), format=Q8)
    assert qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8, out=outv) is outv
    assert_same_f32(outv, out[0])


def test_read_only_memmap_and_strided_weights(tmp_path, rng):
    w = weights(rng, 17, 3)
    xq = random_q8_k(rng, 3)
    want = dots(w, xq[None])[0]
    path = tmp_path / "w.bin"
    w.tofile(path)
    wm = np.memmap(path, dtype=np.uint8, mode="r", shape=w.shape)
    assert_same_f32(qk.gemv(wm, xq, lhs_format=Q4, rhs_format=Q8, threads=2), want)
    # every other row of a doubled table; records with strided bytes (portable loop)
    doubled = np.repeat(w, 2, axis=0)
    assert_same_f32(qk.gemv(doubled[::2], xq, lhs_format=Q4, rhs_format=Q8), want)
    wide = np.zeros((17, 3, 288), np.uint8)
    wide[:, :, ::2] = w
    assert_same_f32(qk.gemv(wide[:, :, ::2], xq, lhs_format=Q4, rhs_format=Q8), want)
    xs = np.stack([xq] * 9)
    assert_same_f32(qk.gemm(wide[:, :, ::2], xs, lhs_format=Q4, rhs_format=Q8),
                    np.stack([want] * 9))


def test_zero_records_per_row(rng):
    w = np.empty((5, 0, 144), np.uint8)
    got = qk.gemv(w, np.empty((0, 292), np.uint8), lhs_format=Q4, rhs_format=Q8)
    assert got.shape == (5,) and not got.view(np.uint32).any()
    got = qk.gemm(w, np.empty((3, 0, 292), np.uint8), lhs_format=Q4, rhs_format=Q8)
    assert got.shape == (3, 5) and not got.view(np.uint32).any()
    assert qk.matmul(w, np.empty((2, 0), np.float32), lhs_format=Q4).shape == (2, 5)
    assert qk.gemm(w, np.empty((0, 0, 292), np.uint8), lhs_format=Q4, rhs_format=Q8).shape == (0, 5)


# every format's batched and threaded kernels compile here: the formats of test_registry's
# gemm == dot by default (compiled there too), every format under -m slow
@pytest.mark.parametrize("fmt", default_few(WEIGHTS, FAMILY_FEW, name=lambda f: f.name))
def test_zero_weight_rows_any_batch_every_format(fmt):
    """No weight rows is an empty result for every batch and thread count (Q4_K's batched
    kernel sized its row block from the rows: batch >= 2 raised 'range() arg 3 must not be
    zero')."""
    act = qk.activation_format(fmt)
    span = fmt.block_size // act.block_size     # activation records per weight record (NVFP4 2, Q1_0 4)
    for g in (0, 1, 3):
        w = np.zeros((1, g, fmt.block_bytes), np.uint8)[:0]
        for batch in (1, 2, 8, 9):
            for threads in (1, 2):
                got = qk.matmul(w, np.ones((batch, g * fmt.block_size), np.float32),
                                lhs_format=fmt, threads=threads)
                assert got.shape == (batch, 0) and got.dtype == np.float32
                got = qk.gemm(w, np.zeros((batch, span * g, act.block_bytes), np.uint8),
                              lhs_format=fmt, rhs_format=act, threads=threads)
                assert got.shape == (batch, 0)
        assert qk.matmul(w, np.ones(g * fmt.block_size, np.float32), lhs_format=fmt).shape == (0,)


def test_errors(rng):
    w = weights(rng, 4, 2)
    xq = random_q8_k(rng, 2)
    with pytest.raises(TypeError, match="lhs_format: gemv expects numba_qk.quant.q4_k"):
        qk.gemv(w, xq, lhs_format="q4_k", rhs_format=Q8)
    with pytest.raises(TypeError, match="rhs_format: gemm expects"):
        qk.gemm(w, xq[None], lhs_format=Q4, rhs_format=Q4)
    with pytest.raises(ValueError, match=r"w: expected shape \[rows, G, 144\]"):
        qk.gemv(w[0], xq, lhs_format=Q4, rhs_format=Q8)
    with pytest.raises(TypeError, match="w: expected uint8"):
        qk.gemv(w.view(np.int8), xq, lhs_format=Q4, rhs_format=Q8)
    with pytest.raises(ValueError, match="w has 2, xq has 3"):
        qk.gemv(w, random_q8_k(rng, 3), lhs_format=Q4, rhs_format=Q8)
    with pytest.raises(ValueError, match=r"xq: expected shape \[batch, G, 292\]"):
        qk.gemm(w, xq, lhs_format=Q4, rhs_format=Q8)
    for bad, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError), ("2", TypeError),
                     (True, TypeError)):
        with pytest.raises(exc, match="threads"):
            qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8, threads=bad)
    with pytest.raises(TypeError, match="x: expected float32"):
        qk.matmul(w, np.zeros(512), lhs_format=Q4)
    with pytest.raises(ValueError, match=r"x: expected shape \[512\] or \[batch, 512\]"):
        qk.matmul(w, np.zeros(256, np.float32), lhs_format=Q4)
    with pytest.raises(TypeError, match="matmul expects numba_qk.quant.q4_k"):
        qk.matmul(w, np.zeros(512, np.float32), lhs_format=Q8)


def test_matmul_domain_error_names_row_and_block_and_leaves_out_alone(rng):
    w = weights(rng, 4, 2)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[2, 300] = np.nan
    out = np.full((3, 4), 7.0, np.float32)
    with pytest.raises(qk.QuantizationDomainError,
                       match=r"^activation row 2, block 1: x\[2, 300\] is nan;") as info:
        qk.matmul(w, x, lhs_format=Q4, out=out)
    assert (info.value.row, info.value.block) == (2, 1)
    assert (out == 7.0).all()
    with pytest.raises(qk.QuantizationDomainError, match=r"^block 1: x\[300\] is inf"):
        x[2, 300] = np.inf
        qk.matmul(w, x[2], lhs_format=Q4)


@pytest.mark.parametrize("fmt", default_few(WEIGHTS, FAMILY_FEW, name=lambda f: f.name))
def test_one_row_one_thread_matmul_is_one_compiled_call_with_the_same_bits(rng, fmt):
    """One activation row, one thread: ``matmul`` runs ``kernels.drive.quantize_then_gemv``
    (the quantizer and the gemv in one call); it gives the two building blocks' bits, names a bad block, and
    leaves ``out=`` alone on error."""
    from numba_qk import ops
    from numba_qk._registry import BY_FORMAT
    act = qk.formats.activation_format(fmt)
    g, rows = 3, 11
    w = rng.integers(0, 256, (rows, g, fmt.block_bytes), dtype=np.uint8)   # any bytes
    x = rng.standard_normal(g * fmt.block_size).astype(np.float32)
    calls = []
    plan = ops._PLANS[fmt]
    fused = plan.matvec()
    plan._matvec = lambda *a: calls.append(1) or fused(*a)
    try:
        got = qk.matmul(w, x, lhs_format=fmt)
        out = np.full(rows, 7.0, np.float32)
        assert qk.matmul(w, x, lhs_format=fmt, out=out) is out
        bad = x.copy()
        bad[-1] = np.inf
        with pytest.raises(qk.QuantizationDomainError,
                           match=rf"^block {g * fmt.block_size // act.block_size - 1}: "
                                 rf"x\[{x.size - 1}\] is inf"):
            qk.matmul(w, bad, lhs_format=fmt, out=out)
    finally:
        plan._matvec = fused
    assert len(calls) == 3
    xq = np.empty((x.size // act.block_size, act.block_bytes), np.uint8)
    assert BY_FORMAT[act].quantize(x.reshape(-1, act.block_size), xq) == -1
    want = np.empty(rows, np.float32)
    BY_FORMAT[fmt].gemv(w, xq, want)
    assert_same_f32(got, want)
    assert_same_f32(out, want)


# ---- the common case: recognised in one pass, everything else gets the full checks ----------

def test_plain_gemv_out_skips_check_out_and_refuses_what_it_refuses(rng, monkeypatch):
    """``gemv(..., out=)`` on one thread with a writeable float32 ``[rows]`` that shares no
    memory with the inputs skips ``check_out`` (``ops._plain_out``); every other ``out`` takes
    it and gets its error, left untouched: overlapping the weights or the activation, read-only,
    another dtype or shape."""
    from numba_qk import ops
    Q40, Q80 = qk.quant.q4_0, qk.quant.q8_0
    rows, g = 6, 2
    buf = np.zeros(rows * g * 18 + 64, np.uint8)
    w = buf[:rows * g * 18].reshape(rows, g, 18)
    w[...] = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32), Q40).reshape(
        rows, g, 18)
    xq = qk.quantize(rng.standard_normal((g, 32)).astype(np.float32), Q80)
    want = qk.gemv(w, xq, lhs_format=Q40, rhs_format=Q80)
    real_check_out = ops.check_out
    monkeypatch.setattr(ops, "check_out", _full_checks_fail)
    out = np.full(rows, 7.0, np.float32)
    assert qk.gemv(w, xq, lhs_format=Q40, rhs_format=Q80, out=out) is out
    assert_same_f32(out, want)
    monkeypatch.setattr(ops, "check_out", real_check_out)
    in_w = buf[:rows * 4].view(np.float32)               # the first weight bytes
    xq_buf = np.zeros(g * 34 + 64, np.uint8)
    xq2 = xq_buf[:g * 34].reshape(g, 34)
    xq2[...] = xq
    in_x = xq_buf[:rows * 4].view(np.float32)
    ro = np.full(rows, 7.0, np.float32)
    ro.flags.writeable = False
    for bad, err, match in ((in_w, ValueError, "overlaps an input"),
                            (in_x, ValueError, "overlaps an input"),
                            (ro, ValueError, "read-only"),
                            (np.zeros(rows, np.float64), TypeError, "expected dtype float32"),
                            (np.zeros(rows + 1, np.float32), ValueError, "expected shape")):
        before = bad.copy()
        with pytest.raises(err, match=match):
            qk.gemv(w, xq2 if bad is in_x else xq, lhs_format=Q40, rhs_format=Q80, out=bad)
        np.testing.assert_array_equal(bad.view(np.uint8), before.view(np.uint8))

def test_compiled_overlap_test_agrees_with_numpy(rng):
    """``kernels.drive.may_overlap`` (what the plain ``gemv(out=)`` runs in its one compiled
    call) bounds arrays as ``np.may_share_memory`` does: views of one buffer with positive,
    negative and zero-length strides, adjacent and empty spans, other buffers."""
    from numba_qk.kernels.drive import may_overlap
    buf = np.arange(4096, dtype=np.uint8)
    f32 = buf.view(np.float32)
    views = [buf[:0], buf[10:10], buf[:64], buf[64:128], buf[63:65], buf[::-1][:100],
             buf[4000:], buf.reshape(64, 64)[:, 3], buf.reshape(64, 64)[::-2, ::3],
             buf.reshape(16, 16, 16)[2:5, ::-1, 1:3], np.zeros(8, np.uint8)]
    views += [buf[a:b:c] for a, b, c in rng.integers(1, 300, (20, 3)) * [1, 10, 1] + [0, 0, 0]]
    floats = [f32[:16], f32[16:32], f32[::-1][:8], f32.reshape(32, 32)[::3, 5],
              np.zeros(4, np.float32)]
    for a in views:
        for b in views + floats:
            assert may_overlap(a, b) == np.may_share_memory(a, b), (a.shape, b.shape)
            assert may_overlap(b, a) == np.may_share_memory(b, a)


def _full_checks_fail(*args, **kwargs):
    raise AssertionError("the full checks ran for a plain call")


@pytest.mark.parametrize("fmt", [Q4, qk.quant.q4_0, qk.quant.nvfp4])
def test_plain_calls_skip_the_full_checks_with_the_same_bits(rng, monkeypatch, fmt):
    """numpy uint8 records of the right shapes (memory maps too) take the shortcut of issue
    23's fixed cost per call, and give the bits the fully checked call (a memoryview) gives."""
    from numba_qk import ops
    act = qk.formats.activation_format(fmt)
    span = fmt.block_size // act.block_size
    g, rows = 2, 9
    values = rng.standard_normal((rows * g, fmt.block_size)).astype(np.float32)
    w = qk.quantize(values, fmt).reshape(rows, g, fmt.block_bytes)
    x = rng.standard_normal((3, g * fmt.block_size)).astype(np.float32)
    xq = qk.quantize(x.reshape(-1, act.block_size), act).reshape(3, span * g, act.block_bytes)
    want = (qk.gemv(memoryview(w), memoryview(xq[1]), lhs_format=fmt, rhs_format=act),
            qk.gemm(memoryview(w), memoryview(xq), lhs_format=fmt, rhs_format=act),
            qk.matmul(memoryview(w), memoryview(x[1]), lhs_format=fmt),
            qk.matmul(memoryview(w), memoryview(x), lhs_format=fmt))
    for name in ("_product_operands", "check_records", "check_slot_in", "check_threads"):
        monkeypatch.setattr(ops, name, _full_checks_fail)
    for threads in (1, 2):
        got = (qk.gemv(w, xq[1], lhs_format=fmt, rhs_format=act, threads=threads),
               qk.gemm(w, xq, lhs_format=fmt, rhs_format=act, threads=threads),
               qk.matmul(w, x[1], lhs_format=fmt, threads=threads),
               qk.matmul(w.view(np.memmap), x, lhs_format=fmt, threads=threads))
        for a, b in zip(got, want):
            assert_same_f32(a, b)
    out = np.full(rows, 7.0, np.float32)
    assert qk.gemv(w, xq[1], lhs_format=fmt, rhs_format=act, out=out) is out
    assert_same_f32(out, want[0])


def test_the_shortcut_admits_nothing_the_full_checks_refuse(rng):
    """Each way of breaking one condition of a valid call leaves the shortcut (so the full
    checks run and name what is wrong); the valid call itself takes it."""
    from numba_qk import ops
    w = weights(rng, 4, 2)
    xq = random_q8_k(rng, 2)
    x = rng.standard_normal(512).astype(np.float32)
    assert ops._plain_records(w, xq, Q4, Q8, 1, 2) is ops._PLANS[Q4]
    assert ops._plain_records(w, xq[None], Q4, Q8, 3, 3) is ops._PLANS[Q4]
    assert ops._plain_matmul(w, x, Q4, 1) is ops._PLANS[Q4]
    assert ops._plain_matmul(w, np.stack([x, x]), Q4, 2) is ops._PLANS[Q4]
    bad_threads = (0, -1, True, 1.0, np.int64(1), None, "1")
    records = [(w.view(np.int8), xq, Q4, Q8), (w, xq.view(np.int8), Q4, Q8),
               (w[0], xq, Q4, Q8), (w[..., :-1], xq, Q4, Q8), (w, xq[:, :-1], Q4, Q8),
               (w, xq[:1], Q4, Q8), (w, random_q8_k(rng, 3), Q4, Q8), (w[None], xq, Q4, Q8),
               (w, xq, Q4, Q4), (w, xq, "q4_k", Q8), (w, xq, Q8, Q8), (w, xq, qk.f16, Q8),
               (w, xq, [Q4], Q8), (memoryview(w), xq, Q4, Q8), (w, memoryview(xq), Q4, Q8),
               (w.tolist(), xq, Q4, Q8), (w, xq, Q4, qk.quant.q8_0)]
    for args in records:
        assert ops._plain_records(*args, 1, 2) is None
    for t in bad_threads:
        assert ops._plain_records(w, xq, Q4, Q8, t, 2) is None
        assert ops._plain_matmul(w, x, Q4, t) is None
    assert ops._plain_records(w, xq, Q4, Q8, 1, 3) is None   # a gemv operand given to gemm
    for args in [(w.view(np.int8), x, Q4), (w, x.astype(np.float64), Q4), (w, x[:-1], Q4),
                 (w, x.reshape(1, 1, -1), Q4), (w, x[:256], Q4), (w[..., :-1], x, Q4),
                 (w, x, Q8), (w, x, "q4_k"), (w, x, qk.bf16), (w, memoryview(x), Q4),
                 (w, x.tolist(), Q4), (w[:, :1], x, Q4), (w, np.float32(1), Q4)]:
        assert ops._plain_matmul(*args, 1) is None
