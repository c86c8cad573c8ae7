"""The Q4_K x Q8_K gemm on AMX-INT8 (``dot._amx_gemm_blocked``, used by ``gemm_q4_k_q8_k`` for
batch >= 9 where ``HAVE_AMX``): 16 rows x 16 activations per tile step, the scale folded into
the weight bytes (q * sc split into two u8 tiles), bsum split into its two bytes, the float
steps lane-wise.  Every output must equal the portable loops bit for bit (NaN == NaN) on any
bytes, adversarial fields, and shapes that are not multiples of the 16 x 16 tile."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numba_qk.testing.asserts import assert_same_f32
from records import extreme_q4_k_q8_k, random_q4_k, random_q8_k
from test_gemm_vnni import _portable, _wild, _wild_acts

from numba_qk.kernels.simd import amx_q4_k as _amx_q4_k
from numba_qk.kernels.kquants import dot

needs_amx = pytest.mark.skipif(not dot.HAVE_AMX, reason="no AMX-INT8 (or no tile permission)")


def _amx(w, x, row_bytes=dot._AMX_ROW_BYTES, act_bytes=dot._AMX_ACT_BYTES):
    out = np.full((x.shape[0], w.shape[0]), np.float32(12345.0))
    dot._amx_gemm_blocked(w, x, out, row_bytes, act_bytes)
    return out


def test_amx_layouts_cover_every_byte_once():
    """The activation tile (B layout: element e of activation n at 64 (e >> 2) + 4 n + (e & 3))
    is a bijection onto the 4096 quant bytes, likewise the 16 bsum bytes onto 256; the blocks do
    not overlap; the bounds that make the int32 tiles exact hold."""
    q = sorted(64 * (e >> 2) + 4 * n + (e & 3) for n in range(16) for e in range(256))
    assert q == list(range(4096))
    bs = sorted(64 * (j >> 2) + 4 * n + (j & 3) for n in range(16) for j in range(16))
    assert bs == list(range(256))
    m = _amx_q4_k
    assert (m.ACT_BLO_AT, m.ACT_BHI_AT, m.ACT_DS_AT, m.AMX_ACT_BYTES) == (4096, 4352, 4608, 4672)
    assert (m.DEC_H_AT, m.DEC_M_AT, m.DEC_D_AT, m.DEC_DMIN_AT) == (4096, 8192, 8448, 8512)
    assert m.DEC_DMIN_AT + 64 == m.AMX_DEC_BYTES
    assert 15 * 63 >> 8 == 3 and 256 * 255 * 128 + 256 * 256 * 3 * 128 < 2 ** 31
    assert 16 * 63 * 255 + 256 * 16 * 63 * 128 < 2 ** 31


@needs_amx
@pytest.mark.parametrize("batch", [1, 15, 16, 17, 33])
@pytest.mark.parametrize("rows, g", [(1, 1), (15, 3), (17, 2), (33, 5)])
def test_amx_gemm_equals_the_loops_on_any_bytes(rng, batch, rows, g):
    """Random bytes everywhere (every scale/min pattern, any bsum), f16/f32 specials in d, dmin
    and ds; batch and rows on both sides of the 16 x 16 tile, G = 1."""
    w = _wild(rng, rows, g)
    x = _wild_acts(rng, batch, g)
    assert_same_f32(_amx(w, x), _portable(w, x))


@needs_amx
def test_amx_gemm_folds_in_record_order(rng):
    """Realistic records (finite scales, activations quantized from N(0, 1) floats), G = 9:
    each (row, activation) pair must fold its record values left to right from v_0 (rounding
    differs in another order, so a reordered or reseeded fold shows here)."""
    import numba_qk as qk

    g = 9
    w = random_q4_k(rng, 19 * g).reshape(19, g, 144)
    xf = (rng.standard_normal((18, g * 256)) * np.exp(rng.standard_normal((18, g * 256)))
          ).astype(np.float32)
    x = qk.quantize(xf.reshape(-1, 256), format=qk.quant.q8_k).reshape(18, g, 292)
    want = _portable(w, x)
    assert np.isfinite(want).all()
    assert_same_f32(_amx(w, x), want)
    # the check can fail: summing the same record values in reverse changes some bits
    vals = np.empty((g, 18, 19), np.float32)
    for b in range(g):
        dot._gemm_loop(w[:, b:b + 1], x[:, b:b + 1], vals[b])
    rev = vals[g - 1].copy()
    for b in range(g - 2, -1, -1):
        rev = (rev + vals[b]).astype(np.float32)
    assert (rev.view(np.uint32) != want.view(np.uint32)).any()


@needs_amx
def test_amx_gemm_extreme_codes_and_scales(rng):
    """All-0xFF weights (q = 15, sc = m = 63: q * sc = 945, the high byte 3) against
    q = -128 / 127, bsum at both int16 extremes and with every high/low byte sign, ±0, inf, NaN
    and subnormal d / dmin / ds."""
    w, x = extreme_q4_k_q8_k(rng)
    assert_same_f32(_amx(w, x), _portable(w, x))


@needs_amx
@pytest.mark.parametrize("row_bytes, act_bytes", [
    (1, 1 << 30), (2 * 3 * _amx_q4_k.AMX_DEC_BYTES, 1), (1 << 30, 2 * 3 * _amx_q4_k.AMX_ACT_BYTES)])
def test_amx_gemm_row_and_activation_blocks(rng, row_bytes, act_bytes):
    """Row blocks of one and of two 16-row groups (decoded weights reused per block, the last
    group partial) and activation chunks of one and of two 16-activation blocks (accumulators
    reused per chunk, the last chunk partial): the same bits as one block."""
    w = _wild(rng, 50, 3)
    x = _wild_acts(rng, 53, 3)
    assert_same_f32(_amx(w, x, row_bytes, act_bytes), _portable(w, x))


@needs_amx
def test_amx_gemm_strided_readonly_unaligned_inputs(rng):
    """Activations with byte stride 2, a non-contiguous batch axis, read-only and at an odd
    address; weights read-only at an odd address; weights with strided record bytes take the
    portable loops."""
    g = 2
    w = random_q4_k(rng, 18 * g).reshape(18, g, 144)
    x = np.stack([random_q8_k(rng, g) for _ in range(17)])
    want = _portable(w, x)
    wide = np.zeros((17, g, 584), np.uint8)
    wide[:, :, ::2] = x
    assert_same_f32(_amx(w, wide[:, :, ::2]), want)
    every_other = np.zeros((34, g, 292), np.uint8)
    every_other[::2] = x
    assert_same_f32(_amx(w, every_other[::2]), want)
    buf = np.zeros(x.size + 1, np.uint8)
    odd = buf[1:].reshape(x.shape)
    odd[:] = x
    odd.flags.writeable = False
    wbuf = np.zeros(w.size + 3, np.uint8)
    wodd = wbuf[3:].reshape(w.shape)
    wodd[:] = w
    wodd.flags.writeable = False
    assert_same_f32(_amx(wodd, odd), want)
    wwide = np.zeros((18, g, 288), np.uint8)
    wwide[:, :, ::2] = w
    assert_same_f32(_amx(wwide[:, :, ::2], x), want)


@needs_amx
@pytest.mark.parametrize("batch", [8, 9])
def test_amx_gemm_dispatch_both_sides_of_the_threshold(rng, batch):
    """The public kernel around the AMX threshold (8: the VNNI/AVX kernels, 9: AMX)."""
    assert dot._AMX_MIN_BATCH == 9
    w = _wild(rng, 9, 2)
    x = _wild_acts(rng, batch, 2)
    out = np.empty((batch, 9), np.float32)
    dot.gemm_q4_k_q8_k(w, x, out)
    assert_same_f32(out, _portable(w, x))


@needs_amx
def test_gemm_without_amx(tmp_path):
    """NUMBA_QK_NO_AMX=1 turns the tile path off (HAVE_AMX False) and the public gemm at a
    batch that would take it still equals the portable loops; fresh process and numba cache.
    (Without AMX the default run already takes that path: tested in-process.)"""
    env = dict(os.environ, NUMBA_QK_NO_AMX="1", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "tests" / "simd"), str(root / "tests"),
                                         str(root), env.get("PYTHONPATH", "")])
    script = (
        "import numpy as np\n"
        "from numba_qk.kernels.kquants import dot\n"
        "from test_gemm_vnni import _portable, _wild, _wild_acts\n"
        "from numba_qk.testing.asserts import assert_same_f32\n"
        "assert not dot.HAVE_AMX\n"
        "rng = np.random.default_rng(5)\n"
        "w, x = _wild(rng, 17, 2), _wild_acts(rng, 18, 2)\n"
        "out = np.empty((18, 17), np.float32)\n"
        "dot.gemm_q4_k_q8_k(w, x, out)\n"
        "assert_same_f32(out, _portable(w, x))\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-2000:]
