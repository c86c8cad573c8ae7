"""The Q4_K x Q8_K gemv tile with AVX-512 VNNI (``dot._vnni_gemv`` over
``_simd_q4_k.accumulate_rows_x8_vnni``): the stored nibbles go straight into vpdpbusd against the
activation put in their order, vpackssdw + vpdpwssd apply the scales, the float steps run
lane-wise (lane = row).  Every output must equal the portable loops bit for bit (NaN == NaN) on
any bytes, adversarial fields, tile remainders, odd strides / alignments and read-only inputs."""

import numpy as np
import pytest

from numba_qk.testing.asserts import assert_same_f32
from records import F16_SPECIALS, F32_SPECIALS, random_q4_k, random_q8_k

import numba_qk as qk
from numba_qk.kernels.simd import base as _simd
from numba_qk.kernels.simd import q4_k as _simd_q4_k
from numba_qk.kernels.kquants import dot

needs_vnni = pytest.mark.skipif(not (_simd.HAVE_VNNI and _simd.HAVE_AVX512),
                                reason="no AVX-512 VNNI on this machine")


def _portable(w, x):
    out = np.empty(w.shape[0], np.float32)
    dot._gemv_loop(w, x, out)
    return out


def _vnni(w, x):
    out = np.full(w.shape[0], np.float32(12345.0))
    dot._vnni_gemv(w, x, out)
    return out


def _wild(rng, rows, g):
    """Any bytes, and ±0/inf/NaN/subnormal d and dmin in half of the records."""
    w = rng.integers(0, 256, size=(rows, g, 144), dtype=np.uint8)
    specials = list(F16_SPECIALS.values())
    for r in range(rows):
        for b in range(g):
            for at in (0, 2):
                if rng.random() < 0.5:
                    d = specials[rng.integers(len(specials))]
                    w[r, b, at:at + 2] = [d & 0xFF, d >> 8]
    return w


def _wild_act(rng, g):
    x = rng.integers(0, 256, size=(g, 292), dtype=np.uint8)
    specials = list(F32_SPECIALS.values())
    for b in range(g):
        if rng.random() < 0.5:
            x[b, 0:4] = np.frombuffer(np.uint32(specials[rng.integers(len(specials))]).tobytes(),
                                      np.uint8)
    return x


def test_activation_order_matches_the_stored_nibbles():
    """The layout argument of the kernel, checked on indices: byte k of stored 64-byte half h,
    low nibble, is element XL_h[k]; high nibble XH_h[k]; the scale pattern of each i16 lane
    after vpackssdw is the scale of the sub-block that lane's products belong to."""
    for h in range(2):
        xl = list(range(128 * h, 128 * h + 32)) + list(range(128 * h + 64, 128 * h + 96))
        xh = list(range(128 * h + 32, 128 * h + 64)) + list(range(128 * h + 96, 128 * h + 128))
        for k in range(64):
            j, i = divmod(64 * h + k, 32)   # stored chunk j, byte i: elements 64j + i, 64j + 32 + i
            assert xl[k] == 64 * j + i and xh[k] == 64 * j + 32 + i
        for part, src in ((0, xl), (1, xh)):
            pat = _simd_q4_k._gemv_vnni_pair_pattern(h, part)
            for c in range(4):              # packssdw block c: row A lanes 4c..4c+3, row B ..
                for e in range(8):
                    row, sb = pat[8 * c + e]
                    assert row == (e >= 4)
                    lane = 4 * c + e % 4
                    assert all(src[4 * lane + t] // 32 == sb for t in range(4))
    assert 4 * 15 * 128 <= 32767   # a lane sum (4 products) fits int16: the pack is exact


@needs_vnni
@pytest.mark.parametrize("rows, g", [(1, 1), (7, 3), (8, 1), (9, 2), (16, 5), (17, 17), (24, 4),
                                     (35, 3)])
def test_vnni_gemv_equals_the_loops_on_any_bytes(rng, rows, g):
    """One tile, tile + remainder rows, several prefetching tiles, G from 1 to 17."""
    w = _wild(rng, rows, g)
    x = _wild_act(rng, g)
    assert_same_f32(_vnni(w, x), _portable(w, x))


@needs_vnni
def test_vnni_gemv_extreme_codes_scales_and_bsums(rng):
    """All-0xFF weights (q = 15, sc = m = 63, the largest pack lanes) against q = -128 / 127,
    bsum at both int16 extremes, every 6-bit field at 0 and 63 alone, f16/f32 specials."""
    g = 4
    w = np.zeros((40, g, 144), np.uint8)
    w[0:8] = 0xFF
    w[8:16] = random_q4_k(rng, 8 * g).reshape(8, g, 144)
    w[12:16, :, 4:144] = 0xFF           # max scales and codes with finite d
    w[16:24, :, 16:] = 0xFF             # max codes, zero scales
    w[24:40] = random_q4_k(rng, 16 * g).reshape(16, g, 144)
    for r in range(24, 40):             # one 6-bit field at 63 (via its two bit groups), rest 0
        f = r - 24                      # sc[0..7] then m[0..7]
        w[r, :, 4:16] = 0
        s = f % 8
        if f < 8 and s < 4:
            w[r, :, 4 + s] = 63
        elif f < 8:
            w[r, :, 12 + s - 4] = 0x0F
            w[r, :, 4 + s - 4] = 0xC0
        elif s < 4:
            w[r, :, 8 + s] = 63
        else:
            w[r, :, 12 + s - 4] = 0xF0
            w[r, :, 8 + s - 4] = 0xC0
    for r, bits in enumerate([0x8000, 0x0000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF]):
        w[r + 8, 1, 0:2] = [bits & 0xFF, bits >> 8]
        w[r + 8, 2, 2:4] = [bits & 0xFF, bits >> 8]
    for xq, bsum in [(0x80, (0x00, 0x80)), (0x7F, (0xFF, 0x7F)), (0x80, (0xFF, 0x7F)),
                     (0x7F, (0x00, 0x80))]:
        x = random_q8_k(rng, g)
        x[:, 4:260] = xq
        x[:, 260:292:2] = bsum[0]
        x[:, 261:292:2] = bsum[1]
        assert_same_f32(_vnni(w, x), _portable(w, x))
    x = random_q8_k(rng, g)
    for b, bits in enumerate([0x80000000, 0x7F800000, 0x7FC00001, 0x00000001]):
        x[b, 0:4] = np.frombuffer(np.uint32(bits).tobytes(), np.uint8)
    assert_same_f32(_vnni(w, x), _portable(w, x))


@needs_vnni
def test_vnni_gemv_strided_readonly_unaligned_inputs(rng):
    """Read-only weights and activation at odd addresses; a row-strided weight matrix; record
    bytes with stride 2 go to the portable loops; all give the same bits."""
    g = 3
    w = random_q4_k(rng, 19 * g).reshape(19, g, 144)
    x = random_q8_k(rng, g)
    want = _portable(w, x)
    wbuf = np.zeros(w.size + 3, np.uint8)
    wodd = wbuf[3:].reshape(w.shape)
    wodd[:] = w
    wodd.flags.writeable = False
    xbuf = np.zeros(x.size + 1, np.uint8)
    xodd = xbuf[1:].reshape(x.shape)
    xodd[:] = x
    xodd.flags.writeable = False
    assert_same_f32(_vnni(wodd, xodd), want)
    rows2 = np.zeros((38, g, 144), np.uint8)
    rows2[::2] = w
    assert_same_f32(_vnni(rows2[::2], x), want)
    recs = np.zeros((19, 2 * g, 144), np.uint8)
    recs[:, ::2] = w
    assert_same_f32(_vnni(recs[:, ::2], x), want)
    wide = np.zeros((19, g, 288), np.uint8)
    wide[:, :, ::2] = w
    assert_same_f32(_vnni(wide[:, :, ::2], x), want)
    xwide = np.zeros((g, 584), np.uint8)
    xwide[:, ::2] = x
    assert_same_f32(_vnni(w, xwide[:, ::2]), want)


@needs_vnni
def test_vnni_gemv_equals_the_previous_simd_gemv(rng):
    w = _wild(rng, 27, 6)
    x = _wild_act(rng, 6)
    old = np.empty(27, np.float32)
    dot._simd_gemv(w, x, old)
    assert_same_f32(_vnni(w, x), old)


@pytest.mark.parametrize("rows", [0, 5, 16])
def test_public_gemv_kernel_and_g0(rng, rows):
    """``gemv_q4_k_q8_k`` (whichever kernel the CPU selects) equals the loops; G = 0 gives +0.0."""
    g = 2
    w = _wild(rng, rows, g)
    x = _wild_act(rng, g)
    out = np.full(rows, np.float32(7.0))
    dot.gemv_q4_k_q8_k(w, x, out)
    assert_same_f32(out, _portable(w, x))
    out0 = np.full(rows, np.float32(7.0))
    dot.gemv_q4_k_q8_k(np.zeros((rows, 0, 144), np.uint8), np.zeros((0, 292), np.uint8), out0)
    assert_same_f32(out0, np.zeros(rows, np.float32))


@pytest.mark.parametrize("threads", [1, 2])
def test_public_matmul_vector_threads(rng, threads):
    """``qk.matmul`` with one f32 activation row (quantized once, gemv) at 1 and 2 threads equals
    the portable loops on the quantized activation."""
    g = 3
    w = random_q4_k(rng, 21 * g).reshape(21, g, 144)
    xf = rng.standard_normal(256 * g).astype(np.float32)
    xq = qk.quantize(xf.reshape(-1, 256), format=qk.quant.q8_k)
    got = qk.matmul(w, xf, lhs_format=qk.quant.q4_k, threads=threads)
    assert_same_f32(np.asarray(got).reshape(-1), _portable(w, xq))
