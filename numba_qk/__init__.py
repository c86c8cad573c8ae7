"""numba_qk: exact, fast Numba kernels for llama.cpp/GGUF block-quantized formats.

>>> import numpy as np, numba_qk as qk
>>> x = np.ones((2, 256), np.float32)
>>> xq = qk.quantize(x, format=qk.quant.q8_k)          # u8 [2, 292]
>>> w = np.zeros((2, 144), np.uint8)                      # two Q4_K records
>>> float(qk.quantized_dot(w, xq, lhs_format=qk.quant.q4_k, rhs_format=qk.quant.q8_k,
...                        acc_dtype=qk.f32))
0.0
"""

from ._registry import Capabilities, capabilities
from .errors import NumbaQKError, QuantizationDomainError
from .formats import (Field, Format, ScalarType, activation_format, bf16, f16, f32, from_ggml_type,
                      i8, i32, quant)
from .ops import (
    BlockFields,
    Q2KFields,
    Q3KFields,
    Q4KFields,
    Q5KFields,
    Q6KFields,
    MXFP4Fields,
    NVFP4Fields,
    IQ4NLFields,
    IQ4XSFields,
    Q8KFields,
    TQFields,
    IQGridFields,
    LowBitFields,
    decode,
    dequantize,
    find_invalid_records,
    gemm,
    gemv,
    get_rows,
    matmul,
    matmul_many,
    quantize,
    quantized_dot,
)

from .repack import REPACK_FORMATS, Repacked, repack

# spec 004: low-precision element types, Tensor, astype (numba_qk.dtypes / tensor / cast)
from .dtypes import Scalar, e2m1, e2m3, e3m2, e4m3, e5m2, e8m0, from_name, i4, u1, u4, u8
from .tensor import Tensor
from .cast import astype, dot
from ._dlpack import from_dlpack

# spec 004 part 2: block-scaled formats (numba_qk.mx) and ScaledTensor
from . import mx
from .formats.mx import ScaledFormat
from .scaled import ScaledTensor

__version__ = "0.1.0"

__all__ = [
    "quant", "f32", "f16", "bf16", "i8", "i32", "Format", "ScalarType", "Field",
    "from_ggml_type", "activation_format", "BlockFields",
    "quantize", "quantized_dot", "decode", "dequantize", "find_invalid_records",
    "gemv", "gemm", "matmul", "repack", "Repacked", "REPACK_FORMATS", "Q4KFields", "Q8KFields", "NumbaQKError", "QuantizationDomainError", "__version__",
    "capabilities", "Capabilities", "Q2KFields", "Q3KFields", "Q5KFields", "Q6KFields", "MXFP4Fields", "NVFP4Fields",
    "IQ4NLFields", "IQ4XSFields", "TQFields", "IQGridFields", "LowBitFields",
    "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "e8m0", "u8", "i4", "u4", "u1", "from_name", "Scalar",
    "Tensor", "astype", "dot", "from_dlpack",
    "mx", "ScaledFormat", "ScaledTensor",
    "matmul_many", "get_rows",
]
