"""MXFP4 / NVFP4 record layout for the kernels (``mxrec.py``, ``_simd_mxrec.py``): byte
offsets read from the schemas (``numba_qk.formats.mxrec``) and ggml's FP4 value table.  One
module below both, so that the portable loops and the SIMD tiles share them without importing
each other."""

import numpy as np

from numba_qk.formats.legacy import q8_0 as _Q8
from numba_qk.formats.mxrec import mxfp4 as _MX, nvfp4 as _NV

MX_E_AT = _MX.field("e").start       # the e8m0 scale byte
MX_QS_AT = _MX.field("qs").start     # 16 bytes of codes
NV_D_AT = _NV.field("d").start       # 4 ue4m3 sub-block scales
NV_QS_AT = _NV.field("qs").start     # 32 bytes of codes
Y_D_AT = _Q8.field("d").start        # Q8_0 f16 scale
Y_QS_AT = _Q8.field("qs").start      # Q8_0 int8 quants
MX_BLOCK = _MX.block_size            # 32
NV_BLOCK = _NV.block_size            # 64
NV_SUB = 16                          # NVFP4 sub-block (ggml's QK_NVFP4_SUB)
NV_NSUB = NV_BLOCK // NV_SUB         # 4
Y_BLOCK = _Q8.block_size             # 32: one NVFP4 record spans two Q8_0 records
LOW4 = np.uint8(0b0000_1111)   # the low nibble

# ggml's kvalues_fp4: e2m1 values doubled (codes 8..15 are the negatives; code 8 is +0)
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
KVALUES_F32 = KVALUES.astype(np.float32)
