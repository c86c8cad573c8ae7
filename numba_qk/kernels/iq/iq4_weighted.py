"""IQ4_NL / IQ4_XS importance-weighted encoders: ggml's ``quantize_row_iq4_nl_impl`` as
``quantize_iq4_nl`` / ``quantize_iq4_xs`` call it with ``quant_weights`` (``ntry = 7``), the path
``ggml_quantize_chunk`` takes when it is given an importance matrix.  All ``@njit``.

``quantize_<t>_weighted(values, qw, out)``: f32 ``values`` ``[G, 32]`` / ``[G, 256]`` whose
blocks run along rows of ``len(qw)`` values; -1, or the first block holding a non-finite value
(nothing written then).  Per super-block of ``S`` values (32 for IQ4_NL, 256 for IQ4_XS)::

    sigma2 = (sum x^2) * (2 / S);  weight_i = qw_i * sqrtf(sigma2 + x_i * x_i)

then the search of ``iq4.py`` with these weights instead of ``x * x`` (and ``d = 0`` where the
weighted ``sum q^2`` is 0), and the same scale and code steps.
"""

import numpy as np

from numba_qk._jit import inline_kernel, kernel
from numba_qk.formats.iq import iq4_nl as _NL, iq4_xs as _XS
from numba_qk.kernels.iq.iq4 import block_scale_search, iq4_nl_store, iq4_xs_store
from numba_qk.kernels.kquants.common import first_nonfinite_block

_F0 = np.float32(0.0)


@kernel
def _weights(values, b, off, n, qw, qoff, weight):
    """``weight[j] = qw[qoff + j] * sqrtf(sigma2 + x_j^2)`` for the ``n`` values at ``off``,
    ``sigma2 = (sum x^2) * (2 / n)``."""
    sigma2 = _F0
    for j in range(n):
        xj = np.float32(values[b, off + j])
        sigma2 = np.float32(sigma2 + np.float32(xj * xj))
    sigma2 = np.float32(sigma2 * np.float32(np.float32(2.0) / np.float32(n)))
    for j in range(n):
        xj = np.float32(values[b, off + j])
        weight[j] = np.float32(np.float32(qw[qoff + j])
                               * np.float32(np.sqrt(np.float32(sigma2 + np.float32(xj * xj)))))


@kernel
def iq4_block_scale_weighted(values, b, off, L, weight, woff):
    """``iq4.iq4_block_scale`` with the weights ``weight[woff:woff+32]``."""
    return block_scale_search(values, b, off, L, weight, woff, True)


@inline_kernel
def _weighted_rows(values, qw, out, xs):
    """IQ4_XS (``xs``: records of 8 sub-blocks of 32) or IQ4_NL (records of 32) of ``values``
    ``[G, 256]`` / ``[G, 32]`` whose blocks run along rows of ``len(qw)``, weighted by ``qw``."""
    bad = first_nonfinite_block(values)
    if bad >= 0:
        return bad
    n = 256 if xs else 32
    per_row = qw.shape[0] // n
    L = np.zeros(n, np.int64)
    weight = np.zeros(n, np.float32)
    scales = np.zeros(8, np.float32)
    for b in range(values.shape[0]):
        _weights(values, b, 0, n, qw, n * (b % per_row), weight)
        if xs:
            for s in range(8):
                scales[s] = iq4_block_scale_weighted(values, b, 32 * s, L, weight, 32 * s)
            iq4_xs_store(values, b, out, L, scales)
        else:
            iq4_nl_store(values, b, out, L, iq4_block_scale_weighted(values, b, 0, L, weight, 0))
    return -1


@kernel
def quantize_iq4_nl_weighted(values, qw, out):
    """f32 ``values`` [G, 32] (rows of ``len(qw)`` values) -> IQ4_NL records, weighted by ``qw``."""
    return _weighted_rows(values, qw, out, False)


@kernel
def quantize_iq4_xs_weighted(values, qw, out):
    """f32 ``values`` [G, 256] (rows of ``len(qw)`` values) -> IQ4_XS records, weighted by ``qw``."""
    return _weighted_rows(values, qw, out, True)


# The weighted path per format: (kernel, what it reproduces), read by numba_qk._registry.
WEIGHTED = {
    _NL: (quantize_iq4_nl_weighted, "ggml quantize_iq4_nl with quant_weights (ntry = 7)"),
    _XS: (quantize_iq4_xs_weighted, "ggml quantize_iq4_xs with quant_weights (ntry = 7)"),
}
