"""Run GGUF language models end to end through numba_qk's kernels.

>>> from numba_qk import models
>>> m = models.load("SmolLM2-135M-Instruct.Q4_1.gguf")        # doctest: +SKIP
>>> m.logits([1, 2, 3]).shape                                  # doctest: +SKIP
(3, 49152)
>>> m.generate([1, 2, 3], 8)                                   # doctest: +SKIP
>>> ids = m.tokenize("Hello world")                            # doctest: +SKIP
>>> m.detokenize(m.generate(ids, 8))                           # doctest: +SKIP

Architectures: ``llama`` (SmolLM2, Llama 3, Mistral and kin), ``gemma3``, ``qwen2`` (Qwen2,
Qwen2.5: q/k/v biases) and ``qwen3`` (dense Qwen3: per-head q/k norms).  Weights stay in
the file's memory map (numba_qk's zero-copy records); nothing is dequantized up front, and
embeddings are looked up row by row.  With one thread on AVX-512 VNNI, Q4_0/Q4_1/Q5_0 and Q4_K
weights are also copied once, at the first decoded token or by ``m.warmup()``, into
row-interleaved tiles (the kernels' x8 / x16 layouts) that the one-token matvecs read: same
bits, ~1.5-2x faster; batches read the memory map.  ``warmup()`` (run by ``python -m numba_qk
generate`` before it starts timing, as llama.cpp's programs warm up) also loads the compiled
kernels.  Every quantized matmul runs numba_qk's ``gemv``/``gemm``;
activations are quantized once per weight group sharing them (q/k/v, gate/up) with numba_qk's
``quantize(..., numerics=...)``: by default ``"ggml_cpu"``, the records of ggml's x86 CPU
quantizers that llama.cpp runs on activations (bit for bit), so that logits and greedy tokens
follow llama.cpp's as closely as the kernels' own fold order allows; ``load(path,
numerics="canonical")`` uses numba_qk's default quantizers instead (ggml's ``_ref`` numerics,
which differ in a few blocks per thousand).  The elementwise parts are in
:mod:`numba_qk.models.kernels`.

``load(path, threads=N)``: a batch of at least 64 tokens (a prompt) runs as N consecutive parts
of its tokens, one a thread, each through every layer with one-thread products; a part's
attention waits only for the earlier parts' K/V of the same layer, and the last token's
vocabulary product runs after the parts on all N threads.  Smaller batches and one token
(decoding) split the products' rows, the attention heads (and a batch's GLU and residual rows
and activation quantization) instead, with N - 1 standing helper threads that wait for the
next product in compiled code (``numba_qk._threads.Helpers``; they sleep after 2 ms without
one); when decoding, a matrix of under 2 M weights is split only if timing both ways during the
first tokens finds that faster.
The logits are the same bits whatever N (every step but attention reads one token, attention
heads are independent, and attention reads the same cache).

Text goes through the file's own vocabulary as llama.cpp's does (``Model.tokenize`` /
``Model.detokenize``, in plain Python: byte-level BPE with the ``tokenizer.ggml.pre``
pre-tokenizer, or SentencePiece with byte fallback; ids equal llama.cpp's, see ``_vocab``).
"""

from ._runner import Model, load

__all__ = ["Model", "load"]
