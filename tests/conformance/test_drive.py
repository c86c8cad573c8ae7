"""The shared driver (``numba_qk.kernels.drive``) with its SIMD slots optional: a format that
registers only its portable row dot (ggml's ``_generic`` tier), or the dot and a record value
without tiles, gets dot / gemv / gemm that equal the full format's bit for bit -- 8-row tiles,
leftover rows and activations, strided records and G = 0 included."""

import numpy as np
import pytest

from subsets import default_few

import numba_qk as qk
from numba_qk.formats import activation_format
from numba_qk.kernels import drive
from numba_qk.kernels.legacy import kernels as legacy

SLOTS = {"portable": ("loop_dot",), "value": ("loop_dot", "value"),
         "tiles": ("loop_dot", "value", "rows_x8", "acts_x8")}
_BASE = 1 << 20    # driver codes of the test formats: far from every GGML type id


def _bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


# the portable dot alone by default (a format with no SIMD slot works end to end); the tile and
# value slots are what every fast format's own tests run; each set of slots under -m slow
@pytest.mark.parametrize("slots", default_few(list(SLOTS), {"portable"}))
def test_optional_slots_give_the_same_bits(rng, slots):
    fmt = qk.quant.q4_1
    full = drive._IMPL[fmt.ggml_type]
    code = _BASE + list(SLOTS).index(slots)
    drive.register(code, record_block=full["record_block"], **{k: full[k] for k in SLOTS[slots]})
    dot, gemv, gemm = drive.kernels_for(code)
    act = activation_format(fmt)
    rows, g, batch = 19, 5, 11          # two 8-row tiles + 3 rows, one 8-activation tile + 3
    w = qk.quantize(rng.standard_normal((rows * g, 32)).astype(np.float32),
                    format=fmt).reshape(rows, g, -1)
    xs = qk.quantize(rng.standard_normal((batch * g, 32)).astype(np.float32),
                     format=act).reshape(batch, g, -1)
    for ww, xx in ((w, xs), (np.asfortranarray(w), xs), (w[::-1], np.asfortranarray(xs)),
                   (w[:, :0], xs[:, :0])):
        want = np.zeros((batch, rows), np.float32)   # the portable loops (G = 0: +0.0)
        for a in range(batch if ww.shape[1] else 0):
            legacy.gemv_loop(legacy.CODES[fmt], ww, xx[a], want[a])
        got = np.full((batch, rows), np.nan, np.float32)
        gemm(ww, xx, got)
        assert (_bits(got) == _bits(want)).all()
        got_v = np.full(rows, np.nan, np.float32)
        gemv(ww, xx[2], got_v)
        assert (_bits(got_v) == _bits(want[2])).all()
        assert _bits(dot(ww[4], xx[2])) == _bits(want[2, 4])


def test_register_refuses_a_second_binding():
    full = drive._IMPL[qk.quant.q8_0.ggml_type]
    with pytest.raises(AssertionError, match="bound twice"):
        drive.register(qk.quant.q8_0.ggml_type, loop_dot=full["loop_dot"])
    with pytest.raises(KeyError):
        drive.kernels_for(_BASE - 1)
