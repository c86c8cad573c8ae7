"""llama.cpp's command-line tools as oracles: ``llama-gguf-split``, ``llama-imatrix`` and
``llama-quantize``, built from the llama.cpp that llama-cpp-python 0.3.36 vendors (the same
source as the native ``llama_cpp`` of llama_oracle.py; see docs/llama-quantize.md for the build
commands). ``NUMBA_QK_LLAMA_TOOLS`` names the directory that holds the binaries (on the
project's machine /work/.llama-tools/bin); the tests that need one skip without it.

Also a tiny llama-architecture model with a small SentencePiece vocabulary (byte tokens, so
that ``llama-imatrix`` can tokenize any text) and all-F32 weights (so that every preset can quantize it without
``--allow-requantize``), optionally with experts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np

TOOLS = Path(os.environ["NUMBA_QK_LLAMA_TOOLS"]) if os.environ.get("NUMBA_QK_LLAMA_TOOLS") \
    else None


def tool(name: str):
    """The path of llama.cpp's ``name`` (``llama-gguf-split``, ...) in ``NUMBA_QK_LLAMA_TOOLS``,
    or None (no such variable, or no such executable there)."""
    if TOOLS is None:
        return None
    p = TOOLS / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def run(name: str, *args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool(name)), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def version(name: str) -> str:
    r = run(name, "--version")
    return (r.stdout + r.stderr).strip().splitlines()[0] if r.returncode == 0 else "?"


def vocab():
    """A SentencePiece vocabulary llama.cpp can tokenize any text with: ``<unk> <s> </s>``, the
    256 byte tokens, then ``▁``, ``▁t`` and ``▁t0`` ... ``▁t99`` (the words of
    :func:`write_text`). Returns (tokens, token types)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += ["\u2581", "\u2581t"] + [f"\u2581t{i}" for i in range(100)]
    return toks, [2, 3, 3] + [6] * 256 + [1] * (len(toks) - 259)


def write_vocab_model(path, *, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_layer=2,
                      n_expert=0, seed=0):
    """A llama model at ``path``: F32 matrices (random, seeded), F32 norms, untied output, the
    SentencePiece vocabulary of :func:`vocab`; ``n_expert`` > 0 gives every layer a mixture of
    experts (2 used)."""
    import gguf

    toks, types = vocab()
    n_vocab = len(toks)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("numba_qk imatrix model")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0)
    w.add_vocab_size(n_vocab)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def mat(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, scale=0.3))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(n_embd))
        w.add_tensor(b + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(b + "attn_k.weight", mat(head_dim * n_head_kv, n_embd))
        w.add_tensor(b + "attn_v.weight", mat(head_dim * n_head_kv, n_embd))
        w.add_tensor(b + "attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(b + "ffn_norm.weight", norm(n_embd))
        if n_expert:
            w.add_tensor(b + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            w.add_tensor(b + "ffn_gate_exps.weight", mat(n_expert, n_ff, n_embd))
            w.add_tensor(b + "ffn_up_exps.weight", mat(n_expert, n_ff, n_embd))
            w.add_tensor(b + "ffn_down_exps.weight", mat(n_expert, n_embd, n_ff))
        else:
            w.add_tensor(b + "ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(b + "ffn_up.weight", mat(n_ff, n_embd))
            w.add_tensor(b + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_text(path, n_words=600, seed=1):
    """A text of :func:`vocab`'s words (``t17 t5 t42 ...``), seeded."""
    rng = np.random.default_rng(seed)
    words = [f"t{int(i)}" for i in rng.integers(0, 100, n_words)]
    Path(path).write_text(" ".join(words) + "\n")
    return Path(path)


IMATRIX_ARGS = ("-c", "32", "-b", "32", "--chunks", "4", "-t", "2", "--no-ppl")


def make_imatrix(model, text, out, *extra) -> subprocess.CompletedProcess:
    """``llama-imatrix -m model -f text -o out`` over 4 chunks of 32 tokens (``extra``: more
    flags, such as ``--output-format dat`` or ``--process-output``)."""
    return run("llama-imatrix", "-m", model, "-f", text, "-o", out, *IMATRIX_ARGS, *extra)


def write_fixtures(d):
    """The committed fixtures of tests/io/data (``NUMBA_QK_LLAMA_TOOLS=DIR python
    tests/io/llama_tools.py``): llama-imatrix's GGUF and legacy outputs for
    ``write_vocab_model(seed=0)`` read with ``write_text(seed=1)`` (the text file named
    ``imatrix-text.txt``, so ``imatrix.datasets`` holds that name); the GGUF one with
    ``--process-output`` (an output.weight entry), and one of the MoE model (``n_expert=4``:
    per-expert counts)."""
    import tempfile

    d = Path(d)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = write_vocab_model(tmp / "m.gguf")
        moe = write_vocab_model(tmp / "moe.gguf", n_expert=4, n_ff=256)
        write_text(tmp / "imatrix-text.txt")
        for out, m, extra in (("imatrix-tiny.gguf", model, ("--process-output",)),
                              ("imatrix-tiny.dat", model, ("--output-format", "dat")),
                              ("imatrix-tiny-moe.gguf", moe, ())):
            r = subprocess.run([str(tool("llama-imatrix")), "-m", str(m), "-f",
                                "imatrix-text.txt", "-o", str(d / out), *IMATRIX_ARGS, *extra],
                               capture_output=True, text=True, cwd=tmp)
            if r.returncode != 0:
                raise SystemExit(r.stderr[-3000:])
            print(d / out, (d / out).stat().st_size)


if __name__ == "__main__":
    write_fixtures(Path(__file__).with_name("data"))
