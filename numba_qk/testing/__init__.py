"""Tools for checking numba_qk bit for bit: oracles, the ggml bridge and bit-level assertions.

* ``numba_qk.testing.reference`` -- the slow oracles, written from the specs and ggml's C text,
  sharing no code with the kernels; one entry point per record format
  (``reference.dequantize(fmt, record)``, ``reference.dot(fmt, w, x)``,
  ``reference.quantize(fmt, block)``) over the family modules ``core`` (spec 000's Q4_K/Q8_K
  and ggml's legacy formats), ``kquants``, ``mxrec``, ``lowp`` (element types) and ``mx``
  (block-scaled tensors).
* ``numba_qk.testing.ggml`` -- ggml's own C functions through ctypes (needs the optional
  ``libggml-python`` or a ggml build; ``load()`` returns None without one).
* ``numba_qk.testing.asserts`` -- ``assert_same_f32`` (bits, NaN matches NaN),
  ``assert_same_records`` (bytes), ``bits_equal``; re-exported here.

For tests, benchmarks and the CLI's self-check only: nothing else in numba_qk imports this
package (tests/package/test_layering.py).  It ships in the wheel because ``numba_qk.reference`` (a
documented path) and ``python -m numba_qk`` use the oracles.
"""

from .asserts import assert_same_f32, assert_same_records, bits_equal

__all__ = ["assert_same_f32", "assert_same_records", "bits_equal"]
