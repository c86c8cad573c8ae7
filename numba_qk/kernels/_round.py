"""Every named rounding helper, in one place (all ``@njit``, callable from user code).

Each kernel spells a rounding step by one of these names, never as an inline expression:

* ``round_half_even(x)`` -- nearest integer to an f32, ties to even (``rint``), as f32.
* ``saturate_i8(r)``     -- clamp an integral f32 to [-128, 127], convert to int8.
* ``nearest_int(f)``     -- ggml's magic-number rounding: the low 23 bits of
  ``R32(f + 12582912)`` minus 2**22 (ties to even for |f| < 2**22, ggml's garbage beyond).
* ``roundf(x)``          -- C ``roundf``: nearest, halves away from zero.
* ``c_int8(t)``          -- C's ``(int8_t)t`` of an f32 as x86 compilers emit it.
* ``f32_to_f16_bits(x)`` -- IEEE binary16 bits of an f32, nearest-even (ggml's
  ``GGML_FP32_TO_FP16``, numpy's ``astype(float16)``): ``f16.f32_to_f16_bits_ggml``, named
  here by its old name (``f16.py`` tables every f16/bf16 conversion and its NaN rule).
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.f16 import f32_to_f16_bits_ggml as f32_to_f16_bits  # noqa: F401

_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer in the mantissa


@kernel
def round_half_even(x):
    """Nearest integer to float32 ``x``, ties to even, as float32 (``-0.5 -> -0.0``)."""
    return np.float32(np.rint(np.float32(x)))


@kernel
def saturate_i8(r):
    """Clamp an integral float32 to [-128, 127] and convert to int8 (input must not be NaN)."""
    return np.int8(np.int32(min(max(np.float32(r), np.float32(-128.0)), np.float32(127.0))))


@kernel
def nearest_int(f):
    """ggml's ``nearest_int``: round f32 ``f`` through the mantissa of ``R32(f + 1.5 * 2**23)``."""
    val = np.float32(np.float32(f) + _MAGIC)
    return np.int32((val.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000))


@kernel
def roundf(x):
    """C roundf: nearest, halves away from zero (exact: computed in float64)."""
    a = np.floor(abs(np.float64(x)) + 0.5)
    return -a if x < 0 else a


@kernel
def c_int8(t):
    """``(int8_t)t`` for float32 ``t`` as C compilers emit it on x86: a 32-bit truncating
    conversion (``cvttss2si``; NaN and out-of-range give INT_MIN) keeping the low byte.  ggml
    reaches NaN/inf here when a block's ``d`` is so small that ``id = 1/d`` overflows.
    (Written with selects, not branches, so loops over it vectorize.)"""
    t = np.float32(t)
    ok = (t >= np.float32(-2147483648.0)) & (t < np.float32(2147483648.0))  # False for NaN
    i = np.int32(t if ok else np.float32(0.0))
    i = i if ok else np.int32(-2147483648)
    return np.int32(np.int8(np.uint8(i & 0xFF)))
