"""Every fast path equals the portable definition bit for bit (SIMD vs loops, strided records)."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.kernels.kquants import dot as dot_mod
from numba_qk._registry import WEIGHTS
from numba_qk.kernels.simd.base import HAVE_AVX2

from numba_qk.testing.asserts import assert_same_f32
from records import random_q4_k, random_q8_k
from subsets import default_few

needs_simd = pytest.mark.skipif(not HAVE_AVX2, reason="no AVX2/F16C on this machine")


@needs_simd
def test_simd_record_sums_equal_loop_on_any_bytes(rng):
    from numba_qk.kernels.simd.q4_k import q4_k_q8_k_sums_avx2
    from numba import njit

    @njit(cache=False)
    def simd_all(w, x, out):
        for b in range(w.shape[0]):
            s, t = q4_k_q8_k_sums_avx2(w, b * w.strides[0], x, b * x.strides[0])
            out[b, 0] = s
            out[b, 1] = t

    @njit(cache=False)
    def loop_all(w, x, out):
        for b in range(w.shape[0]):
            s, t = dot_mod.record_sums_loop(w, b, x, b)
            out[b, 0] = s
            out[b, 1] = t

    for _ in range(4):
        w = rng.integers(0, 256, size=(512, 144), dtype=np.uint8)
        x = rng.integers(0, 256, size=(512, 292), dtype=np.uint8)
        w[:64, 4:144] = 0xFF      # largest scales and quants
        x[:32, 4:260] = 0x80      # q = -128
        x[32:64, 4:260] = 0x7F    # q = 127
        a = np.empty((512, 2), np.int64)
        b = np.empty((512, 2), np.int64)
        simd_all(w, x, a)
        loop_all(w, x, b)
        assert (a == b).all(), np.flatnonzero((a != b).any(axis=1))[:5]


@needs_simd
def test_simd_f16_load_equals_exact_decoder():
    from numba import njit
    from numba_qk.kernels._bits import f16_to_f32
    from numba_qk.kernels.simd.base import load_f16_fpext

    @njit(cache=False)
    def both(buf, out):
        for h in range(65536):
            buf[0] = h & 0xFF
            buf[1] = h >> 8
            out[h, 0] = load_f16_fpext(buf, 0)
            out[h, 1] = f16_to_f32(np.uint16(h))

    out = np.empty((65536, 2), np.float32)
    both(np.zeros(2, np.uint8), out)
    fast, exact = out[:, 0], out[:, 1]
    same = (fast.view(np.uint32) == exact.view(np.uint32)) | (np.isnan(fast) & np.isnan(exact))
    assert same.all()


@needs_simd  # without AVX2 both sides are the portable loop: skip, not pass
def test_records_with_strided_bytes_take_the_loop_and_agree(rng):
    g = 12
    w = random_q4_k(rng, g)
    x = random_q8_k(rng, g)
    want = qk.quantized_dot(w, x, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k)
    w2 = np.zeros((g, 288), np.uint8)
    w2[:, ::2] = w
    x2 = np.zeros((g, 584), np.uint8)
    x2[:, 1::2] = x
    assert w2[:, ::2].strides[1] == 2
    assert_same_f32(qk.quantized_dot(w2[:, ::2], x2[:, 1::2], lhs_format=qk.quant.q4_k,
                                     rhs_format=qk.quant.q8_k), want)


def test_gemv_kernel_rows_equal_dot(rng):
    from numba_qk.kernels import gemv_q4_k_q8_k

    for rows, g in ((1, 1), (7, 2), (8, 17), (33, 3)):
        w = random_q4_k(rng, rows * g).reshape(rows, g, 144)
        x = random_q8_k(rng, g)
        out = np.empty(rows, np.float32)
        gemv_q4_k_q8_k(w, x, out)
        for r in range(rows):
            assert_same_f32(out[r], qk.quantized_dot(w[r], x, lhs_format=qk.quant.q4_k,
                                                     rhs_format=qk.quant.q8_k), f"row {r}")


@needs_simd  # without AVX2 both sides are the portable loop: skip, not pass
# by default Q4_1 (Q8_1-paired legacy tiles), NVFP4 (FP4 records) and IQ4_NL; the K-quant tiles'
# fast paths against the portable definition in tests/kquants/test_kquants_fast.py, Q4_0 and the
# other legacy tiles also in tests/simd/test_legacy_vnni*.py; all under -m slow
@pytest.mark.parametrize("name", default_few([f.name.lower() for f in WEIGHTS],
                                             {"q4_1", "nvfp4", "iq4_nl"}))
def test_legacy_fast_paths_equal_loops_on_any_bytes(name, rng):
    """SIMD (unit-stride records) vs portable loops (strided record bytes), dot/gemv/gemm, for
    every weight format of the registry (the name is historical: Q4_K runs it too)."""
    f = getattr(qk.quant, name)
    act = qk.activation_format(f)
    rows, g = 19, 5   # legacy / IQ4_NL gemm: one band of 16 rows in the lanes and 3 more
    w = rng.integers(0, 256, (rows, g, f.block_bytes), dtype=np.uint8)
    gx = g * (f.block_size // act.block_size)  # NVFP4: two Q8_0 records per weight record
    x = rng.integers(0, 256, (9, gx, act.block_bytes), dtype=np.uint8)
    w_s = np.zeros((rows, g, 2 * f.block_bytes), np.uint8)
    w_s[:, :, ::2] = w
    x_s = np.zeros((9, gx, 2 * act.block_bytes), np.uint8)
    x_s[:, :, 1::2] = x
    w2, x2 = w_s[:, :, ::2], x_s[:, :, 1::2]
    for r in range(rows):
        assert_same_f32(qk.quantized_dot(w[r], x[0], lhs_format=f, rhs_format=act),
                        qk.quantized_dot(w2[r], x2[0], lhs_format=f, rhs_format=act))
    assert_same_f32(qk.gemv(w, x[0], lhs_format=f, rhs_format=act),
                    qk.gemv(w2, x2[0], lhs_format=f, rhs_format=act))
    assert_same_f32(qk.gemm(w, x, lhs_format=f, rhs_format=act),
                    qk.gemm(w2, x2, lhs_format=f, rhs_format=act))
