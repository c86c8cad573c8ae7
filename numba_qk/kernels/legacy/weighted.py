"""The legacy formats' importance-weighted encoders: ggml's ``quantize_row_q{4_0,4_1,5_0,5_1}_impl``,
the path ``ggml_quantize_chunk`` takes when it is given an importance matrix (one f32 weight per
column of the row).  All ``@njit``.  Without an importance matrix ggml uses the reference
quantizers (``legacy/kernels.py``); Q8_0 ignores the importance matrix in ggml.

``quantize_<t>_weighted(values, qw, out)``: f32 ``values`` ``[G, 32]`` whose blocks run along
rows of ``n_per_row = len(qw)`` values (``G * 32`` a multiple of it); -1, or the first block
holding a non-finite value (nothing written then).  Per row (every float step one f32 rounding
in C's order)::

    sigma2 = (sum over the whole row of x^2) / n_per_row
    weight_i = qw_i * sqrtf(sigma2 + x_i * x_i)
    Q4_0 / Q5_0:  d = make_qx_quants(32, 8 / 16, rmse_type 1, weight)   quants l + 8 / l + 16
    Q4_1 / Q5_1:  (d, the_min) = make_qkx3_quants(32, 15 / 31, weight); m = -the_min

(the searches of ``kernels/kquants/weighted.py``).
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats import legacy as _declared
from numba_qk.kernels.kquants.common import first_nonfinite_block, store_f16
from numba_qk.kernels.kquants.weighted import (imatrix_weights, lanes_scratch, make_qkx3_lanes_w,
                                               make_qx_lanes_w)

_Q4_0, _Q4_1, _Q5_0, _Q5_1 = (_declared.q4_0, _declared.q4_1, _declared.q5_0, _declared.q5_1)
_F0 = np.float32(0.0)


def _at(fmt, name):
    return next((f.start for f in fmt.fields if f.name == name), -1)


Q40_D, Q40_QS = _at(_Q4_0, "d"), _at(_Q4_0, "qs")
Q41_D, Q41_M, Q41_QS = _at(_Q4_1, "d"), _at(_Q4_1, "m"), _at(_Q4_1, "qs")
Q50_D, Q50_QH, Q50_QS = _at(_Q5_0, "d"), _at(_Q5_0, "qh"), _at(_Q5_0, "qs")
Q51_D, Q51_M, Q51_QH, Q51_QS = _at(_Q5_1, "d"), _at(_Q5_1, "m"), _at(_Q5_1, "qh"), _at(_Q5_1, "qs")
# (d, m, qs, qh) offsets per ``kind`` of ``_rows`` (-1: no such field)
_FIELDS = ((Q40_D, -1, Q40_QS, -1), (Q41_D, Q41_M, Q41_QS, -1), (Q50_D, -1, Q50_QS, Q50_QH),
           (Q51_D, Q51_M, Q51_QS, Q51_QH))


@inline_kernel
def _pack5(out, b, qs_at, qh_at, L):
    """Q5_0/Q5_1 quants 0..31: low nibbles at ``qs_at``, fifth bits as a little-endian u32."""
    qh = np.uint32(0)
    for j in range(16):
        xi0 = np.uint32(L[j])
        xi1 = np.uint32(L[j + 16])
        out[b, qs_at + j] = np.uint8((xi0 & np.uint32(0xF)) | ((xi1 & np.uint32(0xF)) << np.uint32(4)))
        qh |= ((xi0 & np.uint32(0x10)) >> np.uint32(4)) << np.uint32(j)
        qh |= ((xi1 & np.uint32(0x10)) >> np.uint32(4)) << np.uint32(j + 16)
    for k in range(4):
        out[b, qh_at + k] = np.uint8((qh >> np.uint32(8 * k)) & np.uint32(0xFF))


@inline_kernel
def _rows(values, qw, out, kind):
    """The rows of ``values`` (``len(qw) // 32`` blocks each) in order; ``kind``: 0 Q4_0,
    1 Q4_1, 2 Q5_0, 3 Q5_1."""
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    per_row = qw.shape[0] // 32
    d_at, m_at, qs_at, qh_at = _FIELDS[kind]
    weight = np.zeros(32, np.float32)
    L = np.zeros(32, np.int32)
    xt, wt, Lt, scr, Lx = lanes_scratch()
    scales = np.zeros(16, np.float32)
    mins = np.zeros(16, np.float32)
    for r0 in range(0, values.shape[0], per_row):
        sum_x2 = _F0
        for b in range(r0, r0 + per_row):
            for j in range(32):
                xj = np.float32(values[b, j])
                sum_x2 = np.float32(sum_x2 + np.float32(xj * xj))
        sigma2 = np.float32(sum_x2 / np.float32(qw.shape[0]))
        for c0 in range(0, per_row, 16):   # up to 16 blocks of the row side by side
            nl = min(16, per_row - c0)
            for jb in range(nl):
                imatrix_weights(values, r0 + c0 + jb, 0, 32, qw, 32 * (c0 + jb), sigma2, weight)
                for i in range(32):
                    xt[i, jb] = values[r0 + c0 + jb, i]
                    wt[i, jb] = weight[i]
            if kind == 0 or kind == 2:      # make_qx_quants(32, 8 / 16)
                make_qx_lanes_w(xt, wt, 32, nl, 8 if kind == 0 else 16, Lt, scales, scr)
            else:                           # make_qkx3_quants(32, 15 / 31)
                make_qkx3_lanes_w(xt, wt, 32, nl, 15 if kind == 1 else 31, Lt, Lx, scales, mins, scr)
            for jb in range(nl):
                b = r0 + c0 + jb
                for i in range(32):
                    L[i] = Lt[i, jb]
                store_f16(out, b, d_at, scales[jb])
                if kind == 1 or kind == 3:
                    store_f16(out, b, m_at, np.float32(-mins[jb]))
                if kind < 2:
                    for j in range(16):
                        out[b, qs_at + j] = np.uint8((L[j] | (L[j + 16] << 4)) & 0xFF)
                else:
                    _pack5(out, b, qs_at, qh_at, L)
    return -1


def _weighted(kind):
    """``quantize_<t>_weighted`` of ``_KINDS[kind]``: ``_rows`` of that ``kind``."""
    fmt = _KINDS[kind]

    def quantize(values, qw, out):
        return _rows(values, qw, out, kind)
    quantize.__name__ = quantize.__qualname__ = f"quantize_{fmt.name.lower()}_weighted"
    quantize.__doc__ = (f"f32 ``values`` [G, 32] (rows of ``len(qw)`` values) -> {fmt.name} "
                        f"records, weighted by ``qw``.")
    return kernel(quantize)


_KINDS = (_Q4_0, _Q4_1, _Q5_0, _Q5_1)   # by the ``kind`` of ``_rows``
_ENTRIES = tuple(_weighted(kind) for kind in range(len(_KINDS)))
quantize_q4_0_weighted, quantize_q4_1_weighted, quantize_q5_0_weighted, quantize_q5_1_weighted = (
    _ENTRIES)

# The weighted path per format: (kernel, what it reproduces), read by numba_qk._registry.
WEIGHTED = {fmt: (entry, f"ggml quantize_{fmt.name.lower()} with quant_weights "
                         f"(quantize_row_{fmt.name.lower()}_impl)")
            for fmt, entry in zip(_KINDS, _ENTRIES)}
