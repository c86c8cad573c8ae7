"""ggml's FP4 records (MXFP4, NVFP4) side by side with ggml, one process, one thread.

    python bench/compare_mxrec.py [--quick]             # NUMBA_QK_GGML_LIB=... for a native build

The rows of ``bench/compare_kquants.py`` for ``qk.quant.mxfp4`` and ``qk.quant.nvfp4``: matvec
4096x4096 (``numba_qk.matmul(threads=1)`` vs ``ggml_mul_mat``, 1 thread; both quantize the
vector to Q8_0 inside the call), hot and DRAM-streamed; encode 1 M values (``numba_qk.quantize``
vs ggml ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref``, and whether the bytes are equal);
dequantize the matrix (numba_qk vs gguf-py vs ggml ``dequantize_row_*``); gguf-py's own codecs
with and without ``numba_qk.gguf.accelerate_gguf_py()``; ggml in each weight layout it offers
(the fastest valid one named).  Writes bench/RESULTS_mxrec.md.  Extra arguments go to
compare_kquants (a later ``--out`` wins).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_kquants  # noqa: E402

if __name__ == "__main__":
    names = ",".join(compare_kquants.FP4_NAMES)
    sys.argv[1:1] = ["--formats", names, "--gguf-py-formats", names,
                     "--out", str(Path(__file__).resolve().parent / "RESULTS_mxrec.md")]
    sys.exit(compare_kquants.main())
