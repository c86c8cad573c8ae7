"""``@njit`` building blocks for every record format, one naming pattern (issue 22).

For a weight format ``f`` and its activation format ``a`` (``numba_qk.activation_format(f)``:
Q4_K/Q2_K/Q3_K/Q5_K/Q6_K/TQ1_0/TQ2_0/IQ4_XS and the grid IQ formats -> Q8_K,
Q4_0/Q5_0/Q8_0/MXFP4/NVFP4/IQ4_NL/Q1_0/Q2_0 -> Q8_0,
Q4_1/Q5_1 -> Q8_1)::

    dot_<f>_<a>(w_row, xq) -> float32   w_row uint8 [G, bytes_f], xq uint8 [G', bytes_a]
    gemv_<f>_<a>(w, xq, out)            w uint8 [rows, G, bytes_f], out float32 [rows]
    dequantize_<f>(w, out)              w uint8 [G, bytes_f], out float32 [G * block_f]
    quantize_<f>(x, out) -> int         x float32 [G * block_f], out uint8 [G, bytes_f]

``G' = G`` except for NVFP4 and Q2_0 (64 values per record), whose activation is ``2G`` Q8_0
records, and Q1_0 (128 values), ``4G``.
Q8_K and Q8_1 are activation-only formats: they get dequantize / quantize, no dot / gemv; the
grid IQ formats (IQ2_XXS ... IQ1_M) get dot / gemv / dequantize, and quantize for IQ3_XXS,
IQ3_S, IQ2_S and IQ1_M (the encoders that need an importance matrix, IQ2_XXS / IQ2_XS /
IQ1_S, are ``quantize_<f>_weighted(x, qw, out)`` of ``numba_qk.kernels.iq.iq2_encode`` /
``iq1_encode``).  ``quantize`` returns -1 on success, else the index of the first
out-of-domain block (a non-finite value; for Q8_K also an extreme too small to invert; for
the grid IQ encoders also a block on which ggml's grid search aborts), and then writes
nothing.
Every result equals the public operation's (``quantized_dot``, ``gemv``, ``dequantize``,
``quantize``) bit for bit: each block is a thin wrapper over the registry's own kernel for
that format (``numba_qk._registry.BINDINGS``), so no numerics live here.

Array contract (the caller validates; nothing is checked here, the public functions do):
uint8 records with the format's record size as last axis, matching ``G`` (``2G`` for NVFP4's and
Q2_0's activation, ``4G`` for Q1_0's), ``rows`` outputs.  The flat float32 arrays (``x`` of
quantize, ``out`` of dequantize) must be C-contiguous (they are viewed as ``[G, block]`` with ``reshape``: numba
refuses to compile a non-contiguous one, and raises ValueError when the size is not
``G * block``).

Three names of the pattern predate this module and keep their signatures: ``dot_q4_k_q8_k``
and ``gemv_q4_k_q8_k`` (``kernels/kquants/dot.py``) fit it; ``quantize_q8_k`` (``kernels/kquants/q8_k.py``)
takes ``values`` float32 ``[G, 256]`` (2-D) -- in ``@njit`` code pass ``x.reshape(-1, 256)``.

Why plain module-level functions, written out per format (generated once from a template,
then committed as source): each is an ordinary ``@kernel`` (the JIT policy, ``cache=True``)
whose on-disk cache entry is keyed like any other top-level function of this file (its
qualified name, bytecode and this file's stamp); the kernel it calls is a module global,
resolved at compile time and compiled into it.  A factory looping over the formats (its
closures cache too since decision 044) or ``exec`` from a template would hide the names from
readers, linters and IDEs.  The wrapped kernel is compiled into each
wrapper; ``_jit.DependencyCache`` keys the wrappers' cache on the sources of the modules
imported here too, so an edit to a wrapped kernel's module recompiles them.
"""

from numba_qk.formats import quant
from numba_qk.kernels.legacy import kernels as _legacy
from numba_qk.kernels.fp4 import mxrec as _fp4
from numba_qk.kernels.iq import iq4 as _iq4
from numba_qk.kernels.kquants import q2_k as _k2
from numba_qk.kernels.kquants import q3_k as _k3
from numba_qk.kernels.kquants import q5_k as _k5
from numba_qk.kernels.kquants import q6_k as _k6
from numba_qk.kernels.ternary import tq as _ktq
from numba_qk.kernels.lowbit import q1q2 as _klow
from numba_qk.kernels.iq import grid as _kiqg
from numba_qk.kernels.iq import iq3_encode as _kiq3e
from numba_qk.kernels.iq import iq2_encode as _kiq2e
from numba_qk.kernels.iq import iq1_encode as _kiq1e
from numba_qk._jit import kernel
from numba_qk.kernels.kquants.q4_k import q4_k_dequantize_records as _q4_k_dequantize
from numba_qk.kernels.kquants.q4_k_encode import quantize_q4_k as _q4_k_quantize
from numba_qk.kernels.kquants.q8_k import q8_k_dequantize_records as _q8_k_dequantize

__all__ = [
    "dequantize_q8_k", "dequantize_q4_k", "quantize_q4_k", "dot_q4_0_q8_0", "gemv_q4_0_q8_0",
    "dequantize_q4_0", "quantize_q4_0", "dot_q4_1_q8_1", "gemv_q4_1_q8_1", "dequantize_q4_1",
    "quantize_q4_1", "dot_q5_0_q8_0", "gemv_q5_0_q8_0", "dequantize_q5_0", "quantize_q5_0",
    "dot_q5_1_q8_1", "gemv_q5_1_q8_1", "dequantize_q5_1", "quantize_q5_1", "dot_q8_0_q8_0",
    "gemv_q8_0_q8_0", "dequantize_q8_0", "quantize_q8_0", "dequantize_q8_1", "quantize_q8_1",
    "dot_q2_k_q8_k", "gemv_q2_k_q8_k", "dequantize_q2_k", "quantize_q2_k", "dot_q3_k_q8_k",
    "gemv_q3_k_q8_k", "dequantize_q3_k", "quantize_q3_k", "dot_q5_k_q8_k", "gemv_q5_k_q8_k",
    "dequantize_q5_k", "quantize_q5_k", "dot_q6_k_q8_k", "gemv_q6_k_q8_k", "dequantize_q6_k",
    "quantize_q6_k", "dot_mxfp4_q8_0", "gemv_mxfp4_q8_0", "dequantize_mxfp4", "quantize_mxfp4",
    "dot_nvfp4_q8_0", "gemv_nvfp4_q8_0", "dequantize_nvfp4", "quantize_nvfp4",
    "dot_iq4_nl_q8_0", "gemv_iq4_nl_q8_0", "dequantize_iq4_nl", "quantize_iq4_nl",
    "dot_iq4_xs_q8_k", "gemv_iq4_xs_q8_k", "dequantize_iq4_xs", "quantize_iq4_xs",
    "dot_tq1_0_q8_k", "gemv_tq1_0_q8_k", "dequantize_tq1_0", "quantize_tq1_0",
    "dot_tq2_0_q8_k", "gemv_tq2_0_q8_k", "dequantize_tq2_0", "quantize_tq2_0",
    # the grid IQ formats (quantize_<f>: IQ3_XXS, IQ3_S, IQ2_S, IQ1_M; IQ2_XXS/IQ2_XS/IQ1_S
    # need an imatrix)
    "dot_iq2_xxs_q8_k", "gemv_iq2_xxs_q8_k", "dequantize_iq2_xxs",
    "dot_iq2_xs_q8_k", "gemv_iq2_xs_q8_k", "dequantize_iq2_xs",
    "dot_iq3_xxs_q8_k", "gemv_iq3_xxs_q8_k", "dequantize_iq3_xxs", "quantize_iq3_xxs",
    "dot_iq1_s_q8_k", "gemv_iq1_s_q8_k", "dequantize_iq1_s",
    "dot_iq3_s_q8_k", "gemv_iq3_s_q8_k", "dequantize_iq3_s", "quantize_iq3_s",
    "dot_iq2_s_q8_k", "gemv_iq2_s_q8_k", "dequantize_iq2_s", "quantize_iq2_s",
    "dot_iq1_m_q8_k", "gemv_iq1_m_q8_k", "dequantize_iq1_m", "quantize_iq1_m",
    "dot_q1_0_q8_0", "gemv_q1_0_q8_0", "dequantize_q1_0", "quantize_q1_0",
    "dot_q2_0_q8_0", "gemv_q2_0_q8_0", "dequantize_q2_0", "quantize_q2_0",
]

# The registry's kernels, as module globals (numba resolves a global at compile time; an
# attribute of a Python object it cannot).  tests/conformance/test_njit_blocks.py checks that each wrapper
# calls exactly the kernel the registry binds for its format and slot.


def _legacy_kernels(fmt):
    e = _legacy.ENTRIES[fmt]
    return e.dequantize, e.quantize, e.dot, e.gemv


_q4_0_dequantize, _q4_0_quantize, _q4_0_dot, _q4_0_gemv = _legacy_kernels(quant.q4_0)
_q4_1_dequantize, _q4_1_quantize, _q4_1_dot, _q4_1_gemv = _legacy_kernels(quant.q4_1)
_q5_0_dequantize, _q5_0_quantize, _q5_0_dot, _q5_0_gemv = _legacy_kernels(quant.q5_0)
_q5_1_dequantize, _q5_1_quantize, _q5_1_dot, _q5_1_gemv = _legacy_kernels(quant.q5_1)
_q8_0_dequantize, _q8_0_quantize, _q8_0_dot, _q8_0_gemv = _legacy_kernels(quant.q8_0)
_q8_1_dequantize, _q8_1_quantize = _legacy_kernels(quant.q8_1)[:2]
_q2_k_dequantize, _q2_k_quantize = _k2.dequantize_q2_k, _k2.quantize_q2_k
_q2_k_dot, _q2_k_gemv = _k2.dot_q2_k_q8_k, _k2.gemv_q2_k_q8_k
_q3_k_dequantize, _q3_k_quantize = _k3.dequantize_q3_k, _k3.quantize_q3_k
_q3_k_dot, _q3_k_gemv = _k3.dot_q3_k_q8_k, _k3.gemv_q3_k_q8_k
_q5_k_dequantize, _q5_k_quantize = _k5.dequantize_q5_k, _k5.quantize_q5_k
_q5_k_dot, _q5_k_gemv = _k5.dot_q5_k_q8_k, _k5.gemv_q5_k_q8_k
_q6_k_dequantize, _q6_k_quantize = _k6.dequantize_q6_k, _k6.quantize_q6_k
_q6_k_dot, _q6_k_gemv = _k6.dot_q6_k_q8_k, _k6.gemv_q6_k_q8_k
_mxfp4_dequantize, _mxfp4_quantize = _fp4.dequantize_mxfp4, _fp4.quantize_mxfp4
_mxfp4_dot, _mxfp4_gemv = _fp4.dot_mxfp4_q8_0_fast, _fp4.gemv_mxfp4_q8_0
_nvfp4_dequantize, _nvfp4_quantize = _fp4.dequantize_nvfp4, _fp4.quantize_nvfp4
_nvfp4_dot, _nvfp4_gemv = _fp4.dot_nvfp4_q8_0, _fp4.gemv_nvfp4_q8_0
_iq4_nl_dequantize, _iq4_nl_quantize = _iq4.dequantize_iq4_nl, _iq4.quantize_iq4_nl
_iq4_nl_dot, _iq4_nl_gemv = _iq4.dot_iq4_nl_q8_0, _iq4.gemv_iq4_nl_q8_0
_iq4_xs_dequantize, _iq4_xs_quantize = _iq4.dequantize_iq4_xs, _iq4.quantize_iq4_xs
_iq4_xs_dot, _iq4_xs_gemv = _iq4.dot_iq4_xs_q8_k, _iq4.gemv_iq4_xs_q8_k
_tq1_0_dequantize, _tq1_0_quantize = _ktq.dequantize_tq1_0, _ktq.quantize_tq1_0
_tq1_0_dot, _tq1_0_gemv = _ktq.dot_tq1_0_q8_k, _ktq.gemv_tq1_0_q8_k
_tq2_0_dequantize, _tq2_0_quantize = _ktq.dequantize_tq2_0, _ktq.quantize_tq2_0
_tq2_0_dot, _tq2_0_gemv = _ktq.dot_tq2_0_q8_k, _ktq.gemv_tq2_0_q8_k
_q1_0_dequantize, _q1_0_quantize = _klow.dequantize_q1_0, _klow.quantize_q1_0
_q1_0_dot, _q1_0_gemv = _klow.dot_q1_0_q8_0, _klow.gemv_q1_0_q8_0
_q2_0_dequantize, _q2_0_quantize = _klow.dequantize_q2_0, _klow.quantize_q2_0
_q2_0_dot, _q2_0_gemv = _klow.dot_q2_0_q8_0, _klow.gemv_q2_0_q8_0
_iq2_xxs_dequantize = _kiqg.dequantize_iq2_xxs
_iq2_xxs_dot, _iq2_xxs_gemv = _kiqg.dot_iq2_xxs_q8_k, _kiqg.gemv_iq2_xxs_q8_k
_iq2_xs_dequantize = _kiqg.dequantize_iq2_xs
_iq2_xs_dot, _iq2_xs_gemv = _kiqg.dot_iq2_xs_q8_k, _kiqg.gemv_iq2_xs_q8_k
_iq3_xxs_dequantize, _iq3_xxs_quantize = _kiqg.dequantize_iq3_xxs, _kiq3e.quantize_iq3_xxs
_iq3_xxs_dot, _iq3_xxs_gemv = _kiqg.dot_iq3_xxs_q8_k, _kiqg.gemv_iq3_xxs_q8_k
_iq1_s_dequantize = _kiqg.dequantize_iq1_s
_iq1_s_dot, _iq1_s_gemv = _kiqg.dot_iq1_s_q8_k, _kiqg.gemv_iq1_s_q8_k
_iq3_s_dequantize, _iq3_s_quantize = _kiqg.dequantize_iq3_s, _kiq3e.quantize_iq3_s
_iq3_s_dot, _iq3_s_gemv = _kiqg.dot_iq3_s_q8_k, _kiqg.gemv_iq3_s_q8_k
_iq2_s_dequantize, _iq2_s_quantize = _kiqg.dequantize_iq2_s, _kiq2e.quantize_iq2_s
_iq2_s_dot, _iq2_s_gemv = _kiqg.dot_iq2_s_q8_k, _kiqg.gemv_iq2_s_q8_k
_iq1_m_dequantize, _iq1_m_quantize = _kiqg.dequantize_iq1_m, _kiq1e.quantize_iq1_m
_iq1_m_dot, _iq1_m_gemv = _kiqg.dot_iq1_m_q8_k, _kiqg.gemv_iq1_m_q8_k
# ---- Q8_K --------------------------------------------------------------------------------------


@kernel
def dequantize_q8_k(w, out):
    """Q8_K records w uint8 [G, 292] -> out float32 [G * 256] (C-contiguous)."""
    _q8_k_dequantize(w, out.reshape(w.shape[0], 256))


# ---- Q4_K --------------------------------------------------------------------------------------


@kernel
def dequantize_q4_k(w, out):
    """Q4_K records w uint8 [G, 144] -> out float32 [G * 256] (C-contiguous)."""
    _q4_k_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_q4_k(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q4_K records out uint8 [G, 144]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q4_k_quantize(x.reshape(out.shape[0], 256), out)


# ---- Q4_0 --------------------------------------------------------------------------------------


@kernel
def dot_q4_0_q8_0(w_row, xq):
    """Q4_0 x Q8_0 dot: w_row uint8 [G, 18], xq uint8 [G, 34] -> float32."""
    return _q4_0_dot(w_row, xq)


@kernel
def gemv_q4_0_q8_0(w, xq, out):
    """out[r] = dot_q4_0_q8_0(w[r], xq): w uint8 [rows, G, 18], xq uint8 [G, 34], out float32
    [rows]."""
    _q4_0_gemv(w, xq, out)


@kernel
def dequantize_q4_0(w, out):
    """Q4_0 records w uint8 [G, 18] -> out float32 [G * 32] (C-contiguous)."""
    _q4_0_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q4_0(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q4_0 records out uint8 [G, 18]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q4_0_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q4_1 --------------------------------------------------------------------------------------


@kernel
def dot_q4_1_q8_1(w_row, xq):
    """Q4_1 x Q8_1 dot: w_row uint8 [G, 20], xq uint8 [G, 36] -> float32."""
    return _q4_1_dot(w_row, xq)


@kernel
def gemv_q4_1_q8_1(w, xq, out):
    """out[r] = dot_q4_1_q8_1(w[r], xq): w uint8 [rows, G, 20], xq uint8 [G, 36], out float32
    [rows]."""
    _q4_1_gemv(w, xq, out)


@kernel
def dequantize_q4_1(w, out):
    """Q4_1 records w uint8 [G, 20] -> out float32 [G * 32] (C-contiguous)."""
    _q4_1_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q4_1(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q4_1 records out uint8 [G, 20]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q4_1_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q5_0 --------------------------------------------------------------------------------------


@kernel
def dot_q5_0_q8_0(w_row, xq):
    """Q5_0 x Q8_0 dot: w_row uint8 [G, 22], xq uint8 [G, 34] -> float32."""
    return _q5_0_dot(w_row, xq)


@kernel
def gemv_q5_0_q8_0(w, xq, out):
    """out[r] = dot_q5_0_q8_0(w[r], xq): w uint8 [rows, G, 22], xq uint8 [G, 34], out float32
    [rows]."""
    _q5_0_gemv(w, xq, out)


@kernel
def dequantize_q5_0(w, out):
    """Q5_0 records w uint8 [G, 22] -> out float32 [G * 32] (C-contiguous)."""
    _q5_0_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q5_0(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q5_0 records out uint8 [G, 22]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q5_0_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q5_1 --------------------------------------------------------------------------------------


@kernel
def dot_q5_1_q8_1(w_row, xq):
    """Q5_1 x Q8_1 dot: w_row uint8 [G, 24], xq uint8 [G, 36] -> float32."""
    return _q5_1_dot(w_row, xq)


@kernel
def gemv_q5_1_q8_1(w, xq, out):
    """out[r] = dot_q5_1_q8_1(w[r], xq): w uint8 [rows, G, 24], xq uint8 [G, 36], out float32
    [rows]."""
    _q5_1_gemv(w, xq, out)


@kernel
def dequantize_q5_1(w, out):
    """Q5_1 records w uint8 [G, 24] -> out float32 [G * 32] (C-contiguous)."""
    _q5_1_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q5_1(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q5_1 records out uint8 [G, 24]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q5_1_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q8_0 --------------------------------------------------------------------------------------


@kernel
def dot_q8_0_q8_0(w_row, xq):
    """Q8_0 x Q8_0 dot: w_row uint8 [G, 34], xq uint8 [G, 34] -> float32."""
    return _q8_0_dot(w_row, xq)


@kernel
def gemv_q8_0_q8_0(w, xq, out):
    """out[r] = dot_q8_0_q8_0(w[r], xq): w uint8 [rows, G, 34], xq uint8 [G, 34], out float32
    [rows]."""
    _q8_0_gemv(w, xq, out)


@kernel
def dequantize_q8_0(w, out):
    """Q8_0 records w uint8 [G, 34] -> out float32 [G * 32] (C-contiguous)."""
    _q8_0_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q8_0(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q8_0 records out uint8 [G, 34]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q8_0_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q8_1 --------------------------------------------------------------------------------------


@kernel
def dequantize_q8_1(w, out):
    """Q8_1 records w uint8 [G, 36] -> out float32 [G * 32] (C-contiguous)."""
    _q8_1_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_q8_1(x, out):
    """x float32 [G * 32] (C-contiguous) -> Q8_1 records out uint8 [G, 36]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q8_1_quantize(x.reshape(out.shape[0], 32), out)


# ---- Q2_K --------------------------------------------------------------------------------------


@kernel
def dot_q2_k_q8_k(w_row, xq):
    """Q2_K x Q8_K dot: w_row uint8 [G, 84], xq uint8 [G, 292] -> float32."""
    return _q2_k_dot(w_row, xq)


@kernel
def gemv_q2_k_q8_k(w, xq, out):
    """out[r] = dot_q2_k_q8_k(w[r], xq): w uint8 [rows, G, 84], xq uint8 [G, 292], out float32
    [rows]."""
    _q2_k_gemv(w, xq, out)


@kernel
def dequantize_q2_k(w, out):
    """Q2_K records w uint8 [G, 84] -> out float32 [G * 256] (C-contiguous)."""
    _q2_k_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_q2_k(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q2_K records out uint8 [G, 84]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q2_k_quantize(x.reshape(out.shape[0], 256), out)


# ---- Q3_K --------------------------------------------------------------------------------------


@kernel
def dot_q3_k_q8_k(w_row, xq):
    """Q3_K x Q8_K dot: w_row uint8 [G, 110], xq uint8 [G, 292] -> float32."""
    return _q3_k_dot(w_row, xq)


@kernel
def gemv_q3_k_q8_k(w, xq, out):
    """out[r] = dot_q3_k_q8_k(w[r], xq): w uint8 [rows, G, 110], xq uint8 [G, 292], out float32
    [rows]."""
    _q3_k_gemv(w, xq, out)


@kernel
def dequantize_q3_k(w, out):
    """Q3_K records w uint8 [G, 110] -> out float32 [G * 256] (C-contiguous)."""
    _q3_k_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_q3_k(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q3_K records out uint8 [G, 110]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q3_k_quantize(x.reshape(out.shape[0], 256), out)


# ---- Q5_K --------------------------------------------------------------------------------------


@kernel
def dot_q5_k_q8_k(w_row, xq):
    """Q5_K x Q8_K dot: w_row uint8 [G, 176], xq uint8 [G, 292] -> float32."""
    return _q5_k_dot(w_row, xq)


@kernel
def gemv_q5_k_q8_k(w, xq, out):
    """out[r] = dot_q5_k_q8_k(w[r], xq): w uint8 [rows, G, 176], xq uint8 [G, 292], out float32
    [rows]."""
    _q5_k_gemv(w, xq, out)


@kernel
def dequantize_q5_k(w, out):
    """Q5_K records w uint8 [G, 176] -> out float32 [G * 256] (C-contiguous)."""
    _q5_k_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_q5_k(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q5_K records out uint8 [G, 176]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q5_k_quantize(x.reshape(out.shape[0], 256), out)


# ---- Q6_K --------------------------------------------------------------------------------------


@kernel
def dot_q6_k_q8_k(w_row, xq):
    """Q6_K x Q8_K dot: w_row uint8 [G, 210], xq uint8 [G, 292] -> float32."""
    return _q6_k_dot(w_row, xq)


@kernel
def gemv_q6_k_q8_k(w, xq, out):
    """out[r] = dot_q6_k_q8_k(w[r], xq): w uint8 [rows, G, 210], xq uint8 [G, 292], out float32
    [rows]."""
    _q6_k_gemv(w, xq, out)


@kernel
def dequantize_q6_k(w, out):
    """Q6_K records w uint8 [G, 210] -> out float32 [G * 256] (C-contiguous)."""
    _q6_k_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_q6_k(x, out):
    """x float32 [G * 256] (C-contiguous) -> Q6_K records out uint8 [G, 210]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q6_k_quantize(x.reshape(out.shape[0], 256), out)


# ---- MXFP4 -------------------------------------------------------------------------------------


@kernel
def dot_mxfp4_q8_0(w_row, xq):
    """MXFP4 x Q8_0 dot: w_row uint8 [G, 17], xq uint8 [G, 34] -> float32."""
    return _mxfp4_dot(w_row, xq)


@kernel
def gemv_mxfp4_q8_0(w, xq, out):
    """out[r] = dot_mxfp4_q8_0(w[r], xq): w uint8 [rows, G, 17], xq uint8 [G, 34], out float32
    [rows]."""
    _mxfp4_gemv(w, xq, out)


@kernel
def dequantize_mxfp4(w, out):
    """MXFP4 records w uint8 [G, 17] -> out float32 [G * 32] (C-contiguous)."""
    _mxfp4_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_mxfp4(x, out):
    """x float32 [G * 32] (C-contiguous) -> MXFP4 records out uint8 [G, 17]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _mxfp4_quantize(x.reshape(out.shape[0], 32), out)


# ---- NVFP4 -------------------------------------------------------------------------------------


@kernel
def dot_nvfp4_q8_0(w_row, xq):
    """NVFP4 x Q8_0 dot: w_row uint8 [G, 36], xq uint8 [2G, 34] -> float32."""
    return _nvfp4_dot(w_row, xq)


@kernel
def gemv_nvfp4_q8_0(w, xq, out):
    """out[r] = dot_nvfp4_q8_0(w[r], xq): w uint8 [rows, G, 36], xq uint8 [2G, 34], out float32
    [rows]."""
    _nvfp4_gemv(w, xq, out)


@kernel
def dequantize_nvfp4(w, out):
    """NVFP4 records w uint8 [G, 36] -> out float32 [G * 64] (C-contiguous)."""
    _nvfp4_dequantize(w, out.reshape(w.shape[0], 64))


@kernel
def quantize_nvfp4(x, out):
    """x float32 [G * 64] (C-contiguous) -> NVFP4 records out uint8 [G, 36]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _nvfp4_quantize(x.reshape(out.shape[0], 64), out)


# ---- IQ4_NL ------------------------------------------------------------------------------------


@kernel
def dot_iq4_nl_q8_0(w_row, xq):
    """IQ4_NL x Q8_0 dot: w_row uint8 [G, 18], xq uint8 [G, 34] -> float32."""
    return _iq4_nl_dot(w_row, xq)


@kernel
def gemv_iq4_nl_q8_0(w, xq, out):
    """out[r] = dot_iq4_nl_q8_0(w[r], xq): w uint8 [rows, G, 18], xq uint8 [G, 34], out float32
    [rows]."""
    _iq4_nl_gemv(w, xq, out)


@kernel
def dequantize_iq4_nl(w, out):
    """IQ4_NL records w uint8 [G, 18] -> out float32 [G * 32] (C-contiguous)."""
    _iq4_nl_dequantize(w, out.reshape(w.shape[0], 32))


@kernel
def quantize_iq4_nl(x, out):
    """x float32 [G * 32] (C-contiguous) -> IQ4_NL records out uint8 [G, 18]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _iq4_nl_quantize(x.reshape(out.shape[0], 32), out)


# ---- IQ4_XS ------------------------------------------------------------------------------------


@kernel
def dot_iq4_xs_q8_k(w_row, xq):
    """IQ4_XS x Q8_K dot: w_row uint8 [G, 136], xq uint8 [G, 292] -> float32."""
    return _iq4_xs_dot(w_row, xq)


@kernel
def gemv_iq4_xs_q8_k(w, xq, out):
    """out[r] = dot_iq4_xs_q8_k(w[r], xq): w uint8 [rows, G, 136], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq4_xs_gemv(w, xq, out)


@kernel
def dequantize_iq4_xs(w, out):
    """IQ4_XS records w uint8 [G, 136] -> out float32 [G * 256] (C-contiguous)."""
    _iq4_xs_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_iq4_xs(x, out):
    """x float32 [G * 256] (C-contiguous) -> IQ4_XS records out uint8 [G, 136]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _iq4_xs_quantize(x.reshape(out.shape[0], 256), out)


# ---- TQ1_0 -------------------------------------------------------------------------------------


@kernel
def dot_tq1_0_q8_k(w_row, xq):
    """TQ1_0 x Q8_K dot: w_row uint8 [G, 54], xq uint8 [G, 292] -> float32."""
    return _tq1_0_dot(w_row, xq)


@kernel
def gemv_tq1_0_q8_k(w, xq, out):
    """out[r] = dot_tq1_0_q8_k(w[r], xq): w uint8 [rows, G, 54], xq uint8 [G, 292], out
    float32 [rows]."""
    _tq1_0_gemv(w, xq, out)


@kernel
def dequantize_tq1_0(w, out):
    """TQ1_0 records w uint8 [G, 54] -> out float32 [G * 256] (C-contiguous)."""
    _tq1_0_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_tq1_0(x, out):
    """x float32 [G * 256] (C-contiguous) -> TQ1_0 records out uint8 [G, 54]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _tq1_0_quantize(x.reshape(out.shape[0], 256), out)


# ---- TQ2_0 -------------------------------------------------------------------------------------


@kernel
def dot_tq2_0_q8_k(w_row, xq):
    """TQ2_0 x Q8_K dot: w_row uint8 [G, 66], xq uint8 [G, 292] -> float32."""
    return _tq2_0_dot(w_row, xq)


@kernel
def gemv_tq2_0_q8_k(w, xq, out):
    """out[r] = dot_tq2_0_q8_k(w[r], xq): w uint8 [rows, G, 66], xq uint8 [G, 292], out
    float32 [rows]."""
    _tq2_0_gemv(w, xq, out)


@kernel
def dequantize_tq2_0(w, out):
    """TQ2_0 records w uint8 [G, 66] -> out float32 [G * 256] (C-contiguous)."""
    _tq2_0_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_tq2_0(x, out):
    """x float32 [G * 256] (C-contiguous) -> TQ2_0 records out uint8 [G, 66]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _tq2_0_quantize(x.reshape(out.shape[0], 256), out)

# ---- IQ2_XXS ---------------------------------------------------------------------------------


@kernel
def dot_iq2_xxs_q8_k(w_row, xq):
    """IQ2_XXS x Q8_K dot: w_row uint8 [G, 66], xq uint8 [G, 292] -> float32."""
    return _iq2_xxs_dot(w_row, xq)


@kernel
def gemv_iq2_xxs_q8_k(w, xq, out):
    """out[r] = dot_iq2_xxs_q8_k(w[r], xq): w uint8 [rows, G, 66], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq2_xxs_gemv(w, xq, out)


@kernel
def dequantize_iq2_xxs(w, out):
    """IQ2_XXS records w uint8 [G, 66] -> out float32 [G * 256] (C-contiguous)."""
    _iq2_xxs_dequantize(w, out.reshape(w.shape[0], 256))

# ---- IQ2_XS ----------------------------------------------------------------------------------


@kernel
def dot_iq2_xs_q8_k(w_row, xq):
    """IQ2_XS x Q8_K dot: w_row uint8 [G, 74], xq uint8 [G, 292] -> float32."""
    return _iq2_xs_dot(w_row, xq)


@kernel
def gemv_iq2_xs_q8_k(w, xq, out):
    """out[r] = dot_iq2_xs_q8_k(w[r], xq): w uint8 [rows, G, 74], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq2_xs_gemv(w, xq, out)


@kernel
def dequantize_iq2_xs(w, out):
    """IQ2_XS records w uint8 [G, 74] -> out float32 [G * 256] (C-contiguous)."""
    _iq2_xs_dequantize(w, out.reshape(w.shape[0], 256))

# ---- IQ3_XXS ---------------------------------------------------------------------------------


@kernel
def dot_iq3_xxs_q8_k(w_row, xq):
    """IQ3_XXS x Q8_K dot: w_row uint8 [G, 98], xq uint8 [G, 292] -> float32."""
    return _iq3_xxs_dot(w_row, xq)


@kernel
def gemv_iq3_xxs_q8_k(w, xq, out):
    """out[r] = dot_iq3_xxs_q8_k(w[r], xq): w uint8 [rows, G, 98], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq3_xxs_gemv(w, xq, out)


@kernel
def dequantize_iq3_xxs(w, out):
    """IQ3_XXS records w uint8 [G, 98] -> out float32 [G * 256] (C-contiguous)."""
    _iq3_xxs_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_iq3_xxs(x, out):
    """x float32 [G * 256] (C-contiguous) -> IQ3_XXS records out uint8 [G, 98]; -1, or the
    first block holding a non-finite value or too large for ggml's grid search (out untouched
    then)."""
    return _iq3_xxs_quantize(x.reshape(out.shape[0], 256), out)

# ---- IQ1_S -----------------------------------------------------------------------------------


@kernel
def dot_iq1_s_q8_k(w_row, xq):
    """IQ1_S x Q8_K dot: w_row uint8 [G, 50], xq uint8 [G, 292] -> float32."""
    return _iq1_s_dot(w_row, xq)


@kernel
def gemv_iq1_s_q8_k(w, xq, out):
    """out[r] = dot_iq1_s_q8_k(w[r], xq): w uint8 [rows, G, 50], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq1_s_gemv(w, xq, out)


@kernel
def dequantize_iq1_s(w, out):
    """IQ1_S records w uint8 [G, 50] -> out float32 [G * 256] (C-contiguous)."""
    _iq1_s_dequantize(w, out.reshape(w.shape[0], 256))

# ---- IQ3_S -----------------------------------------------------------------------------------


@kernel
def dot_iq3_s_q8_k(w_row, xq):
    """IQ3_S x Q8_K dot: w_row uint8 [G, 110], xq uint8 [G, 292] -> float32."""
    return _iq3_s_dot(w_row, xq)


@kernel
def gemv_iq3_s_q8_k(w, xq, out):
    """out[r] = dot_iq3_s_q8_k(w[r], xq): w uint8 [rows, G, 110], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq3_s_gemv(w, xq, out)


@kernel
def dequantize_iq3_s(w, out):
    """IQ3_S records w uint8 [G, 110] -> out float32 [G * 256] (C-contiguous)."""
    _iq3_s_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_iq3_s(x, out):
    """x float32 [G * 256] (C-contiguous) -> IQ3_S records out uint8 [G, 110]; -1, or the
    first block holding a non-finite value or too large for ggml's grid search (out untouched
    then)."""
    return _iq3_s_quantize(x.reshape(out.shape[0], 256), out)

# ---- IQ2_S -----------------------------------------------------------------------------------


@kernel
def dot_iq2_s_q8_k(w_row, xq):
    """IQ2_S x Q8_K dot: w_row uint8 [G, 82], xq uint8 [G, 292] -> float32."""
    return _iq2_s_dot(w_row, xq)


@kernel
def gemv_iq2_s_q8_k(w, xq, out):
    """out[r] = dot_iq2_s_q8_k(w[r], xq): w uint8 [rows, G, 82], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq2_s_gemv(w, xq, out)


@kernel
def dequantize_iq2_s(w, out):
    """IQ2_S records w uint8 [G, 82] -> out float32 [G * 256] (C-contiguous)."""
    _iq2_s_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_iq2_s(x, out):
    """x float32 [G * 256] (C-contiguous) -> IQ2_S records out uint8 [G, 82] (ggml's
    quantize_iq2_s, no importance matrix); -1, or the first block holding a non-finite value
    or on which ggml's grid search aborts (out untouched then)."""
    return _iq2_s_quantize(x.reshape(out.shape[0], 256), out)

# ---- IQ1_M -----------------------------------------------------------------------------------


@kernel
def dot_iq1_m_q8_k(w_row, xq):
    """IQ1_M x Q8_K dot: w_row uint8 [G, 56], xq uint8 [G, 292] -> float32."""
    return _iq1_m_dot(w_row, xq)


@kernel
def gemv_iq1_m_q8_k(w, xq, out):
    """out[r] = dot_iq1_m_q8_k(w[r], xq): w uint8 [rows, G, 56], xq uint8 [G, 292], out
    float32 [rows]."""
    _iq1_m_gemv(w, xq, out)


@kernel
def dequantize_iq1_m(w, out):
    """IQ1_M records w uint8 [G, 56] -> out float32 [G * 256] (C-contiguous)."""
    _iq1_m_dequantize(w, out.reshape(w.shape[0], 256))


@kernel
def quantize_iq1_m(x, out):
    """x float32 [G * 256] (C-contiguous) -> IQ1_M records out uint8 [G, 56] (ggml's
    quantize_iq1_m, no importance matrix); -1, or the first block holding a non-finite value
    or on which ggml's grid search aborts (out untouched then)."""
    return _iq1_m_quantize(x.reshape(out.shape[0], 256), out)

# ---- Q1_0 -------------------------------------------------------------------------------------


@kernel
def dot_q1_0_q8_0(w_row, xq):
    """Q1_0 x Q8_0 dot: w_row uint8 [G, 18], xq uint8 [4G, 34] -> float32."""
    return _q1_0_dot(w_row, xq)


@kernel
def gemv_q1_0_q8_0(w, xq, out):
    """out[r] = dot_q1_0_q8_0(w[r], xq): w uint8 [rows, G, 18], xq uint8 [4G, 34], out
    float32 [rows]."""
    _q1_0_gemv(w, xq, out)


@kernel
def dequantize_q1_0(w, out):
    """Q1_0 records w uint8 [G, 18] -> out float32 [G * 128] (C-contiguous)."""
    _q1_0_dequantize(w, out.reshape(w.shape[0], 128))


@kernel
def quantize_q1_0(x, out):
    """x float32 [G * 128] (C-contiguous) -> Q1_0 records out uint8 [G, 18]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q1_0_quantize(x.reshape(out.shape[0], 128), out)

# ---- Q2_0 -------------------------------------------------------------------------------------


@kernel
def dot_q2_0_q8_0(w_row, xq):
    """Q2_0 x Q8_0 dot: w_row uint8 [G, 18], xq uint8 [2G, 34] -> float32."""
    return _q2_0_dot(w_row, xq)


@kernel
def gemv_q2_0_q8_0(w, xq, out):
    """out[r] = dot_q2_0_q8_0(w[r], xq): w uint8 [rows, G, 18], xq uint8 [2G, 34], out
    float32 [rows]."""
    _q2_0_gemv(w, xq, out)


@kernel
def dequantize_q2_0(w, out):
    """Q2_0 records w uint8 [G, 18] -> out float32 [G * 64] (C-contiguous)."""
    _q2_0_dequantize(w, out.reshape(w.shape[0], 64))


@kernel
def quantize_q2_0(x, out):
    """x float32 [G * 64] (C-contiguous) -> Q2_0 records out uint8 [G, 18]; -1, or the
    first block holding a non-finite value (out untouched then)."""
    return _q2_0_quantize(x.reshape(out.shape[0], 64), out)
