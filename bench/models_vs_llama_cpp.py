"""End to end: numba_qk.models against llama.cpp (llama-cpp-python) on GGUF files, 1 thread.

    PYTHONPATH=. python bench/models_vs_llama_cpp.py [MODEL.gguf ...] [--prompt 32] [--decode 32]
        [--repeat 3] [--llama-python /work/.native-ggml/bin/python] [--threads 1]

For each file: prompt processing (a batch of ``--prompt`` token ids, fresh context) and decode
(``--decode`` greedy tokens with the KV cache) in tokens/s, best of ``--repeat`` alternating runs
of both (numba_qk's first, cache-loading run not timed); llama.cpp runs in a subprocess
(tools/llama_cpp_ref.py) of the interpreter that has llama_cpp, with logits of the last
position only (as numba_qk's prompt pass here: the output head runs once).  Then where
numba_qk's decode time goes (wall time per token: quantized matmuls, activation
quantization, attention, the rest).  Writes bench/RESULTS_models.md with the machine
(lscpu's model name) and the date, keeping what follows its "## Agreement" heading.
Without MODEL: the two files of issue 23 from ~/.cache/numba_qk-models ($NUMBA_QK_MODELS).
"""

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name")), platform.processor())
    except OSError:
        name = platform.processor()
    return f"{name}, {os.cpu_count()} logical CPUs"


def prompt_ids(n_vocab, n, seed=0):
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(10, min(n_vocab, 30000), n)]


def run_llama(py, path, ids, n_decode, threads):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.npz"
        subprocess.run([py, str(ROOT / "tools" / "llama_cpp_ref.py"), str(path), "--out",
                        str(out), "--ids", ",".join(map(str, ids)), "--greedy",
                        str(n_decode + 1), "--threads", str(threads), "--last-logits"],
                       check=True)
        r = np.load(out)
        return len(ids) / float(r["prompt_s"]), int(r["decode_n"]) / float(r["decode_s"])


def run_ours(m, ids, n_decode):
    cache = m.new_cache(len(ids) + n_decode + 1)
    t = time.perf_counter()
    logits = m.forward(ids, cache, all_logits=False)[-1]
    t1 = time.perf_counter()
    tok = int(np.argmax(logits))
    for _ in range(n_decode):
        tok = int(np.argmax(m.forward([tok], cache, all_logits=False)[-1]))
    t2 = time.perf_counter()
    return len(ids) / (t1 - t), n_decode / (t2 - t1)


def breakdown(m, ids, n_decode):
    """Wall time per decoded token by part, timing the runner's calls (adds a little overhead)."""
    from numba_qk.models import _runner, kernels

    spent = {}

    def timed(key, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
        return wrapper

    class TimedBlocks:   # numba_qk.kernels as the runner sees it, its quantizers timed
        def __getattr__(self, name):
            fn = getattr(real_blocks, name)
            if name.startswith("quantize"):
                return timed("activation quantize", fn)
            return timed("embedding rows", fn) if name.startswith("dequantize") else fn

    real_blocks = _runner._blocks
    weights = [w for L in m.layers for w in (L.wq, L.wk, L.wv, L.wo, L.gate, L.up, L.down)]
    fused = [c for L in m.layers for c in (L.qkv_calls or []) + (L.glu_calls or [])
             if isinstance(c, _runner._Fused)]
    weights = list({id(w): w for w in weights + [m.output] + fused}.values())
    blocks = [w.block for w in weights]
    saved = {n: getattr(_runner, n) for n in ("gemv", "gemm", "get_rows")}
    attention = ("attention_step", "attention_prepare", "attention_split")
    saved_k = {n: getattr(kernels, n) for n in attention + ("residual_norm", "rms_norm",
                                                            "swiglu", "geglu")}
    try:
        for n, fn in saved.items():
            setattr(_runner, n, timed({"gemv": "matmul (gemv)", "gemm": "matmul (gemv)",
                                       "get_rows": "embedding rows"}[n], fn))
        for n, fn in saved_k.items():   # attention with threads: prepare, then split by heads
            setattr(kernels, n, timed("attention (q/k norms, RoPE, KV cache, softmax)"
                                      if n in attention else "norms, residual, GLU", fn))
        _runner._blocks = TimedBlocks()
        _runner._act_quantizer.cache_clear()   # looked up again through the timed blocks
        for w, b in zip(weights, blocks):
            if b is not None:
                w.block = timed("matmul (gemv)", b)
        m._decoder = None   # the one-token decoder takes its blocks when made: remade timed
        cache = m.new_cache(len(ids) + n_decode + 1)
        tok = int(np.argmax(m.forward(ids, cache, all_logits=False)[-1]))
        spent.clear()
        t = time.perf_counter()
        for _ in range(n_decode):
            tok = int(np.argmax(m.forward([tok], cache, all_logits=False)[-1]))
        total = time.perf_counter() - t
    finally:
        for n, fn in saved.items():
            setattr(_runner, n, fn)
        for n, fn in saved_k.items():
            setattr(kernels, n, fn)
        _runner._blocks = real_blocks
        _runner._act_quantizer.cache_clear()
        for w, b in zip(weights, blocks):
            w.block = b
        m._decoder = None
    parts = {k: v / n_decode for k, v in spent.items()}
    parts["Python, numpy, rest"] = total / n_decode - sum(parts.values())
    return total / n_decode, parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--llama-python", default="/work/.native-ggml/bin/python")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_models.md"))
    ap.add_argument("--note", default="", help="a sentence about the run (load, conditions)")
    a = ap.parse_args()
    from numba_qk import models

    root = Path(os.environ.get("NUMBA_QK_MODELS", Path.home() / ".cache" / "numba_qk-models"))
    paths = [Path(p) for p in a.models] or [root / n for n in DEFAULT]
    rows, notes = [], []
    for path in paths:
        m = models.load(path, threads=a.threads)
        ids = prompt_ids(m.n_vocab, a.prompt)
        run_ours(m, ids, 2)  # load numba's cache / compile
        ours, theirs = [], []
        for _ in range(a.repeat):
            ours.append(run_ours(m, ids, a.decode))
            theirs.append(run_llama(a.llama_python, path, ids, a.decode, a.threads))
        op, od = max(o[0] for o in ours), max(o[1] for o in ours)
        lp, ld = max(t[0] for t in theirs), max(t[1] for t in theirs)
        per_tok, parts = breakdown(m, ids, a.decode)
        rows.append(f"| {path.name} | {lp:.1f} | {op:.1f} | {op / lp:.2f}x | {ld:.1f} | "
                    f"{od:.1f} | {od / ld:.2f}x |")
        notes.append(f"- {path.name}: {per_tok * 1e3:.2f} ms per decoded token (timed calls): "
                     + ", ".join(f"{k} {v * 1e3:.2f} ms ({v / per_tok:.0%})"
                                 for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
        print(rows[-1]), print(notes[-1])
        sys.stdout.flush()
    when = datetime.datetime.now(datetime.timezone.utc)
    text = "\n".join([
        f"## Run of {when:%Y-%m-%d %H:%M} UTC",
        "",
        f"`bench/models_vs_llama_cpp.py` ({a.threads} thread{'s' if a.threads > 1 else ''}, "
        f"prompt = a batch of {a.prompt} token ids, decode = {a.decode} greedy tokens with the "
        f"KV cache, best of {a.repeat} alternating runs).",
        "",
        f"Machine: {machine()}; Python {platform.python_version()}; "
        f"{when:%Y-%m-%d %H:%M} UTC; load average at "
        f"the end {os.getloadavg()[0]:.1f}. "
        "llama.cpp: llama-cpp-python built -march=native (shared/tools/build-native-ggml.sh)."
        + (f" {a.note}" if a.note else ""),
        "",
        "| model | llama.cpp prompt tok/s | numba_qk prompt tok/s | ratio | llama.cpp decode "
        "tok/s | numba_qk decode tok/s | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Where numba_qk's decode time goes:",
        "",
        *notes,
        "",
    ])
    # the new run goes on top, under the title; every earlier section stays
    title = "# numba_qk.models vs llama.cpp, end to end\n"
    out = Path(a.out)
    old = out.read_text() if out.exists() else ""
    rest = old[len(title):].lstrip("\n") if old.startswith(title) else old
    out.write_text(title + "\n" + text + ("\n" + rest if rest else ""))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
