"""The Q4_K x Q8_K gemm with AVX-512 VNNI (``dot._vnni_gemm``): the row-lane kernel
(``_rows16_gemm_blocked``, batch >= 2; weights decoded once per call into 16-row groups, one i32
lane per weight row, the activation dword a broadcast operand) and the gemv kernel for batch 1.

vpdpbusd does the exact integer work, the float steps run lane-wise across activations.  Every
output must equal the portable loops bit for bit (NaN == NaN) on any bytes, adversarial fields
and odd shapes / strides / alignments."""

import numpy as np
import pytest

from numba_qk.testing.asserts import assert_same_f32
from records import F16_SPECIALS, F32_SPECIALS, extreme_q4_k_q8_k, random_q4_k, random_q8_k

from numba_qk.kernels.simd import base as _simd
from numba_qk.kernels.simd import q4_k as _simd_q4_k
from numba_qk.kernels.kquants import dot

needs_vnni = pytest.mark.skipif(not (_simd.HAVE_VNNI and _simd.HAVE_AVX512),
                                reason="no AVX-512 VNNI on this machine")


def _portable(w, x):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    dot._gemm_loop(w, x, out)
    return out


KERNELS = ["rows16"]


def _vnni(w, x, kernel="rows16", row_bytes=1 << 20, record_block=8):
    out = np.full((x.shape[0], w.shape[0]), np.float32(12345.0))
    fn = {"rows16": dot._rows16_gemm_blocked}[kernel]
    fn(w, x, out, row_bytes, record_block)
    return out


def _wild(rng, rows, g):
    """Any bytes: NaN/inf/subnormal/±0 d and dmin, every scale pattern, max codes."""
    w = rng.integers(0, 256, size=(rows, g, 144), dtype=np.uint8)
    specials = list(F16_SPECIALS.values())
    for r in range(rows):
        for b in range(g):
            if rng.random() < 0.5:
                d = specials[rng.integers(len(specials))]
                w[r, b, 0:2] = [d & 0xFF, d >> 8]
            if rng.random() < 0.5:
                d = specials[rng.integers(len(specials))]
                w[r, b, 2:4] = [d & 0xFF, d >> 8]
    return w


def _wild_acts(rng, batch, g):
    x = rng.integers(0, 256, size=(batch, g, 292), dtype=np.uint8)
    specials = list(F32_SPECIALS.values())
    for a in range(batch):
        for b in range(g):
            if rng.random() < 0.5:
                x[a, b, 0:4] = np.frombuffer(
                    np.uint32(specials[rng.integers(len(specials))]).tobytes(), np.uint8)
    return x


@needs_vnni
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("batch", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("rows, g", [(1, 1), (7, 3), (9, 9), (16, 17)])
def test_vnni_gemm_equals_the_loops_on_any_bytes(rng, kernel, batch, rows, g):
    w = _wild(rng, rows, g)
    x = _wild_acts(rng, batch, g)
    assert_same_f32(_vnni(w, x, kernel), _portable(w, x))


@needs_vnni
@pytest.mark.parametrize("batch", [1, 2, 3, 8, 31, 32, 33])
def test_vnni_gemm_dispatch_every_path(rng, batch):
    """The VNNI dispatcher (``_vnni_gemm``: the public kernel where there is no AMX, or with
    ``NUMBA_QK_NO_AMX=1``): gemv for batch 1, the row-lane kernel with its 8/4/2/1 activation
    tiles above, and the public kernel."""
    w = _wild(rng, 9, 2)
    x = _wild_acts(rng, batch, 2)
    out = np.empty((batch, 9), np.float32)
    dot._vnni_gemm(w, x, out)
    assert_same_f32(out, _portable(w, x))
    dot.gemm_q4_k_q8_k(w, x, out)
    assert_same_f32(out, _portable(w, x))


@needs_vnni
@pytest.mark.parametrize("kernel", KERNELS)
def test_vnni_gemm_extreme_codes_and_scales(rng, kernel):
    """All-0xFF weights (q = 15, sc = m = 63) against q = -128 / 127 activations: the largest
    lane sums (|.| = 30720 before the int16 pack) and bsum at both int16 extremes."""
    w, x = extreme_q4_k_q8_k(rng)
    assert_same_f32(_vnni(w, x, kernel), _portable(w, x))


@needs_vnni
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("row_bytes, record_block", [(1, 1), (384 * 7 * 8, 2), (384 * 7 * 16, 3)])
def test_vnni_gemm_row_and_record_blocks(rng, kernel, row_bytes, record_block):
    """Row blocks smaller than the matrix (accumulators and decoded weights reused per block)
    and record blocks that do not divide G: the same bits as one block."""
    w = _wild(rng, 29, 7)
    x = _wild_acts(rng, 13, 7)
    assert_same_f32(_vnni(w, x, kernel, row_bytes, record_block), _portable(w, x))


@pytest.mark.slow  # default run under 10 minutes (22 s of compiles; test_legacy_vnni and test_fast_paths keep strided/read-only VNNI cases by default)
@needs_vnni
@pytest.mark.parametrize("kernel", KERNELS)
def test_vnni_gemm_strided_readonly_unaligned_inputs(rng, kernel):
    """Activations with byte stride 2, a non-contiguous batch axis, read-only and at an odd
    address; weights read-only at an odd address.  Weights whose record bytes are strided go
    to the portable loops."""
    g = 5
    w = random_q4_k(rng, 9 * g).reshape(9, g, 144)
    x = np.stack([random_q8_k(rng, g) for _ in range(11)])
    want = _portable(w, x)
    wide = np.zeros((11, g, 584), np.uint8)
    wide[:, :, ::2] = x
    assert_same_f32(_vnni(w, wide[:, :, ::2], kernel), want)
    every_other = np.zeros((22, g, 292), np.uint8)
    every_other[::2] = x
    assert_same_f32(_vnni(w, every_other[::2], kernel), want)
    buf = np.zeros(x.size + 1, np.uint8)
    odd = buf[1:].reshape(x.shape)
    odd[:] = x
    odd.flags.writeable = False
    wbuf = np.zeros(w.size + 3, np.uint8)
    wodd = wbuf[3:].reshape(w.shape)
    wodd[:] = w
    wodd.flags.writeable = False
    assert_same_f32(_vnni(wodd, odd, kernel), want)
    wwide = np.zeros((9, g, 288), np.uint8)
    wwide[:, :, ::2] = w
    assert_same_f32(_vnni(wwide[:, :, ::2], x, kernel), want)


@needs_vnni
@pytest.mark.parametrize("kernel", KERNELS)
def test_vnni_gemm_equals_the_previous_simd_gemm(rng, kernel):
    """The pmaddubsw tile kernel (kept for CPUs without VNNI) and the VNNI ones agree."""
    w = _wild(rng, 24, 4)
    x = _wild_acts(rng, 19, 4)
    old = np.empty((19, 24), np.float32)
    dot._simd_gemm(w, x, old)
    assert_same_f32(_vnni(w, x, kernel), old)


@needs_vnni
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 23])
@pytest.mark.parametrize("rows, g", [(1, 1), (15, 2), (16, 1), (17, 3), (45, 5)])
def test_rows16_gemm_tiles_and_partial_groups(rng, batch, rows, g):
    """The row-lane kernel: every activation-tile decomposition (8, 4, 2, 1), row groups of 16
    with a zero-padded partial last group, G = 1, any bytes."""
    w = _wild(rng, rows, g)
    x = _wild_acts(rng, batch, g)
    assert_same_f32(_vnni(w, x, "rows16"), _portable(w, x))


@needs_vnni
@pytest.mark.parametrize("row_bytes, record_block", [(1, 1), (5248 * 5 * 2, 2), (5248 * 5 * 3, 4)])
def test_rows16_gemm_row_and_record_blocks(rng, row_bytes, record_block):
    """Row blocks of 1, 2, 3 groups of 16 over 45 rows (the last block partial, its last group
    zero-padded) and record blocks that do not divide G = 5."""
    w = _wild(rng, 45, 5)
    x = _wild_acts(rng, 21, 5)
    assert_same_f32(_vnni(w, x, "rows16", row_bytes, record_block), _portable(w, x))


def _small_bsums(rng, batch, g):
    """Any bytes, but every bsum in [-16384, 16383] (pair sums fit an int16): the row-lane
    kernel's pair-sum T path; the first records' bsum pairs at the int16 edges of that path."""
    x = _wild_acts(rng, batch, g)
    bs = rng.integers(-16384, 16384, size=(batch, g, 16)).astype(np.int16)
    bs[0, 0, 0:2] = -16384                 # pair sum -32768
    bs[-1, -1, 14:16] = [16383, 16384 - 1]  # pair sum 32766
    bs[0, -1, 2:4] = [32767, 0]            # pair sum 32767
    bs[-1, 0, 4:6] = [-32768, 0]           # pair sum -32768
    x[:, :, 260:292] = bs.view(np.uint8).reshape(batch, g, 32)
    return x


@needs_vnni
@pytest.mark.parametrize("batch", [1, 3, 8, 13])
def test_rows16_gemm_pair_sum_path(rng, batch):
    """T from the int16 pair sums (every pair sum fits, down to -32768 and up to 32767) and
    from the stored bsum (forced) give the portable loops' bits; records a quantizer writes
    take the pair-sum path."""
    w = _wild(rng, 35, 3)
    x = _small_bsums(rng, batch, 3)
    b2 = np.empty(batch * 3 * 16, np.uint8)
    assert dot._pair_bsums(x, b2)
    want = _portable(w, x)
    for ok in (True, False):
        out = np.full((batch, 35), np.float32(12345.0))
        dot._rows16_gemm_blocked(w, x, out, 1 << 19, 8, ok)
        assert_same_f32(out, want, f"pair sums {ok}")
    we, xe = extreme_q4_k_q8_k(rng)   # extreme weights and quants, pair sums that fit
    xe[:, :, 260:292] = _small_bsums(rng, xe.shape[0], 3)[:, :, 260:292]
    assert dot._pair_bsums(xe, np.empty(xe.shape[0] * 3 * 16, np.uint8))
    out = np.empty((xe.shape[0], we.shape[0]), np.float32)
    dot._rows16_gemm_blocked(we, xe, out, 1 << 19, 8)
    assert_same_f32(out, _portable(we, xe), "extreme")
    import numba_qk as qk
    xq = qk.quantize(rng.standard_normal((batch * 3, 256)).astype(np.float32) * 50,
                     format=qk.quant.q8_k).reshape(batch, 3, 292)
    assert dot._pair_bsums(xq, b2)


@pytest.mark.parametrize("bits, fits", [((16384, 16383), True), ((16384, 16384), False),
                                        ((-16384, -16384), True), ((-16384, -16385), False),
                                        ((-32768, -1), False), ((32767, 1), False)])
def test_pair_bsums_decides_at_the_int16_edges(rng, bits, fits):
    """One pair sum just inside / outside int16 decides the path for the whole call."""
    x = _small_bsums(rng, 4, 2)
    bs = x[:, :, 260:292].copy().view(np.int16)
    bs[2, 1, 6:8] = bits
    x[:, :, 260:292] = bs.view(np.uint8)
    b2 = np.empty(4 * 2 * 16, np.uint8)
    assert dot._pair_bsums(x, b2) == fits
    if _simd.HAVE_VNNI and _simd.HAVE_AVX512:
        w = _wild(rng, 17, 2)
        out = np.empty((4, 17), np.float32)
        dot._rows16_gemm_blocked(w, x, out, 1 << 19, 8)
        assert_same_f32(out, _portable(w, x))


def test_rows16_layout():
    """The row-lane kernel's decoded record: 64 k-steps of 16 rows' dwords, then 8 scale and
    8 min lane vectors, then d and dmin, within R16_BYTES (a multiple of 64)."""
    m = _simd_q4_k
    assert m.R16_Q_AT + 64 * 64 == m.R16_SC_AT
    assert m.R16_SC_AT + 8 * 64 == m.R16_M_AT
    assert m.R16_M_AT + 8 * 64 == m.R16_D_AT
    assert m.R16_D_AT + 64 == m.R16_DMIN_AT and m.R16_DMIN_AT + 64 == m.R16_M2_AT
    assert m.R16_M2_AT + 4 * 64 == m.R16_BYTES and m.R16_BYTES % 64 == 0
    # a sub-block sum of 32 products u4 x i8 and its scaled sum stay exact in int32
    assert 32 * 15 * 128 * 63 * 8 < 2 ** 31


@pytest.mark.parametrize("batch", [8, 33])
def test_public_gemm_and_matmul_any_threads(rng, batch):
    """qk.gemm / qk.matmul through the row-parallel driver (each chunk repacks the activations;
    rows not a multiple of 8 per chunk) equal the portable loops for every thread count."""
    import numba_qk as qk

    w = _wild(rng, 21, 3)
    x = _wild_acts(rng, batch, 3)
    want = _portable(w, x)
    for threads in (1, 2, 3):
        got = qk.gemm(w, x, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k, threads=threads)
        assert_same_f32(got, want, f"threads={threads}")
    wl = random_q4_k(rng, 21 * 3).reshape(21, 3, 144)
    xf = rng.standard_normal((batch, 3 * 256)).astype(np.float32)
    xq = qk.quantize(xf.reshape(-1, 256), format=qk.quant.q8_k).reshape(batch, 3, 292)
    for threads in (1, 2):
        assert_same_f32(qk.matmul(wl, xf, lhs_format=qk.quant.q4_k, threads=threads),
                        _portable(wl, xq), f"matmul threads={threads}")
