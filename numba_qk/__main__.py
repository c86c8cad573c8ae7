"""``python -m numba_qk`` -- the demo / self-check on an embedded default input.

It builds a deterministic sample (Q4_K weights, f32 activations), quantizes the activations to
Q8_K, runs ``quantized_dot`` and a composed GEMV, checks every result bit for bit against the
slow reference oracle, and prints the results and the throughput.  Exit status 0 means every
check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _sample(rows: int, groups: int, seed: int):
    """Deterministic Q4_K weight records [rows, G, 144] and f32 activations [G, 256]."""
    from numba_qk.samples import activations, q4_k_weights

    return q4_k_weights(rows, groups, seed), activations(groups, seed + 1)


def _best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _hex(v) -> str:
    return f"0x{int(np.asarray(v, np.float32).view(np.uint32)):08x}"


def demo(rows: int, groups: int, seed: int, check_rows: int) -> int:
    import numba_qk as qk
    from numba_qk.testing.reference import core as ref

    Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k
    w, x = _sample(rows, groups, seed)
    print(f"numba_qk {qk.__version__}: sample of {rows} Q4_K rows x {groups} records "
          f"({groups * 256} elements per row, {w.nbytes / 2**20:.2f} MiB of weights), seed {seed}")

    t0 = time.perf_counter()
    xq = qk.quantize(x, format=Q8)
    dot0 = qk.quantized_dot(w[0], xq, lhs_format=Q4, rhs_format=Q8, acc_dtype=qk.f32)
    out = np.empty(rows, np.float32)
    out = qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8)
    out_mt = qk.matmul(w, x.ravel(), lhs_format=Q4, threads=None)
    first = time.perf_counter() - t0
    print(f"first calls (compile, or load from numba's on-disk cache): {first:.2f} s")

    failures = 0
    want_q = ref.quantize(x)
    same = int((want_q == xq).all(axis=1).sum())
    print(f"quantize -> Q8_K: {same}/{groups} records bit-identical to the reference")
    failures += groups - same

    want0 = ref.quantized_dot(w[0], xq)
    ok = _hex(want0) == _hex(dot0)
    print(f"quantized_dot(row 0) = {float(dot0):.9g} ({_hex(dot0)}); reference "
          f"{float(want0):.9g} ({_hex(want0)}): {'bit-identical' if ok else 'MISMATCH'}")
    failures += not ok

    n = min(rows, check_rows)
    bad = [r for r in range(n) if _hex(ref.quantized_dot(w[r], xq)) != _hex(out[r])]
    bad += [r for r in range(rows) if _hex(out_mt[r]) != _hex(out[r])]
    print(f"gemv: {n - len(bad)}/{n} checked rows bit-identical to the reference; "
          f"multi-threaded matmul identical on all {rows} rows: {'yes' if not bad else 'NO'}"
          + (f"; first bad row {bad[0]}" if bad else ""))
    failures += len(bad)
    print(f"gemv out[:4] = {np.array2string(out[:4], precision=6)}")

    t_q = _best_time(lambda: qk.quantize(x, format=Q8), 20)
    t_d = _best_time(lambda: qk.quantized_dot(w[0], xq, lhs_format=Q4, rhs_format=Q8), 50)
    t_g = _best_time(lambda: qk.gemv(w, xq, lhs_format=Q4, rhs_format=Q8, out=out), 10)
    t_m = _best_time(lambda: qk.matmul(w, x.ravel(), lhs_format=Q4, threads=None), 10)
    print("throughput (single thread, best of repeats):")
    print(f"  quantize      {x.nbytes / t_q / 1e9:7.2f} GB/s of f32 input   "
          f"({t_q * 1e6:9.1f} us for {groups} blocks)")
    print(f"  quantized_dot {w[0].nbytes / t_d / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_d * 1e6:9.1f} us for G={groups}, incl. API checks)")
    print(f"  gemv          {w.nbytes / t_g / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_g * 1e3:9.3f} ms, {t_g / w.shape[0] / groups * 1e9:.1f} ns per record)")
    print(f"  matmul, {os.cpu_count()} thr {w.nbytes / t_m / 1e9:7.2f} GB/s of Q4_K bytes  "
          f"({t_m * 1e3:9.3f} ms, f32 x quantized inside)")
    if failures:
        print(f"FAILED: {failures} mismatches against the reference", file=sys.stderr)
        return 1
    print("all checks bit-exact: OK")
    print("next: python -m numba_qk inspect | quantize | bench [FILE.gguf]  (GGUF files; the "
          "gguf extra)")
    return 0


# ------------------------------------------------------------------------------ GGUF commands

def _default_model(tmp: str, dim: int = 512) -> str:
    from numba_qk.gguf import write_demo_model

    path = os.path.join(tmp, "numba_qk-demo.gguf")
    write_demo_model(path, dim=dim)
    print(f"(no FILE given: using the embedded demo model, written to {path})", file=sys.stderr)
    return path


def _demo_llama(tmp: str) -> str:
    from numba_qk.models.demo import write_demo_model

    path = os.path.join(tmp, "numba_qk-demo-llama.gguf")
    write_demo_model(path)
    print(f"(no MODEL given: using the embedded demo model, a tiny llama with random weights, "
          f"written to {path}; its text is noise)", file=sys.stderr)
    return path


def _human(n: int) -> str:
    from numba_qk.quantize_cli import human_size

    return human_size(n)


def _quantizable_weights() -> list:
    """CLI names of the weight formats numba_qk can quantize to (from the registry; --type
    takes no importance matrix, so not those that need one)."""
    from numba_qk import _registry

    return [f._attr for f in _registry.WEIGHTS
            if f in _registry.QUANTIZABLE and f not in _registry.REQUIRES_IMATRIX]


def _summary(caps) -> str:
    """One line of what numba_qk does with a format (numba_qk.capabilities)."""
    parts = [name for name in ("quantize", "dequantize", "decode") if getattr(caps, name)]
    if caps.quantize and "requires an importance matrix" in caps.quantizer:
        parts[0] = "quantize (with imatrix)"
    if caps.dot_partner is not None:
        parts.append(f"dot with {caps.dot_partner.name}, gemv/gemm/matmul")
    elif caps.matmul:
        parts.append("gemv/gemm/matmul as weights")
    if caps.activation_of:
        parts.append("activations of " + "/".join(f.name for f in caps.activation_of))
    return ", ".join(parts) if parts else "no kernels (stored values only)"


def cmd_inspect(path: str) -> int:
    from numba_qk import gguf

    with gguf.open(path) as f:
        rows = [(t.name, "x".join(map(str, t.shape)), t.type_name, _human(t.nbytes),
                 f"{t.bits_per_weight:.2f}", "yes" if t.accelerated else "no")
                for t in f.tensors]
        head = ("tensor", "shape", "format", "bytes", "bits/weight", "accelerated")
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        print(f"{path}: {len(rows)} tensors, {len(f.metadata)} metadata keys")
        for r in [head] + rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        total = sum(t.nbytes for t in f.tensors)
        acc = sum(t.nbytes for t in f.tensors if t.accelerated)
        print(f"total {_human(total)}; accelerated by numba_qk: {_human(acc)}")
        import numba_qk as qk

        seen = {}
        for t in f.tensors:
            seen.setdefault(t.type_name, t.format)
        print("formats (numba_qk.capabilities):")
        for name, fmt in seen.items():
            print(f"  {name}: " + (_summary(qk.capabilities(fmt)) if fmt is not None
                                   else "not modelled by numba_qk"))
    return 0


def cmd_bench(path: str, repeat: int) -> int:
    from numba_qk import gguf

    ncores = os.cpu_count() or 1
    with gguf.open(path) as f:
        tensors = [t for t in f.tensors if t.accelerated and len(t.shape) == 2]
        if not tensors:
            print(f"{path}: no tensors in a numba_qk weight format", file=sys.stderr)
            return 1
        print(f"matvec per accelerated tensor (f32 x quantized inside; best of {repeat}):")
        print(f"{'tensor':32} {'format':6} {'shape':>12} {'1 thread':>18} {f'{ncores} threads':>18}")
        rng = np.random.default_rng(0)
        for t in tensors:
            x = rng.standard_normal(t.shape[-1]).astype(np.float32)
            cols = []
            for threads in (1, ncores):
                dt = _best_time(lambda: f.matmul(t.name, x, threads=threads), repeat)
                cols.append(f"{dt * 1e3:7.3f} ms {t.nbytes / dt / 1e9:5.1f} GB/s")
            print(f"{t.name:32} {t.type_name:6} {'x'.join(map(str, t.shape)):>12} "
                  f"{cols[0]:>18} {cols[1]:>18}")
    return 0


def cmd_generate(path: str, tokens, n: int, threads: int, as_json: bool, prompt=None) -> int:
    import json
    import time

    from numba_qk import models

    m = None
    if prompt is not None:
        # as llama.cpp's programs tokenize a prompt: BOS where the file asks for it, special
        # tokens written in the text ("<|im_start|>") parsed as such
        m = models.load(path, threads=threads)
        ids = m.tokenize(prompt, add_bos=True, special=True)
        if not ids:
            raise ValueError("the prompt gives no tokens (and the model adds no BOS)")
    else:
        try:
            ids = [int(t) for t in tokens.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"--tokens takes comma-separated token ids, got {tokens!r}") \
                from None
        if not ids:
            raise ValueError("--tokens: at least one prompt token id is needed")
    m = m or models.load(path, threads=threads)
    bad = [i for i in ids if not 0 <= i < m.n_vocab]
    if bad:
        raise ValueError(f"--tokens: id {bad[0]} is outside the vocabulary (0..{m.n_vocab - 1})")
    out = []
    text = m.vocab.decoder() if m.vocab.tokens else str   # ids when the file has no vocabulary
    m.warmup()   # as llama.cpp's programs: kernels loaded, tile copies made, before the clock
    t0 = time.perf_counter()
    t_first = None
    for tok in m.stream(ids, n):
        if t_first is None:
            t_first = time.perf_counter()
        out.append(tok)
        if not as_json:
            print(text(tok) if m.vocab.tokens else f"{tok} ", end="", flush=True)
    t1 = time.perf_counter()
    prompt_s = (t_first or t1) - t0
    decode_tps = (len(out) - 1) / (t1 - t_first) if len(out) > 1 else None
    if as_json:
        print(json.dumps({"prompt_tokens": ids, "tokens": out,
                          "text": m.detokenize(out) if m.vocab.tokens else None,
                          "prompt_tokens_per_s": len(ids) / prompt_s,
                          "decode_tokens_per_s": decode_tps}))
    else:
        print()
        print(f"prompt: {len(ids)} tokens, {len(ids) / prompt_s:.1f} tokens/s; decode: "
              + (f"{decode_tps:.1f} tokens/s" if decode_tps else "-"), file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m numba_qk",
        description="numba_qk: exact Numba kernels for GGUF block-quantized formats. Without a "
                    "command: a demo that checks quantize, quantized_dot and a GEMV bit for bit "
                    "against the reference oracle.")
    parser.add_argument("--rows", type=int, default=512, help="demo: weight rows (default 512)")
    parser.add_argument("--groups", type=int, default=16,
                        help="demo: records per row, 256 elements each (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="demo: sample seed (default 0)")
    parser.add_argument("--check-rows", type=int, default=32,
                        help="demo: GEMV rows checked against the slow reference (default 32)")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="the default: bit-exact self-check and throughput")
    p_inspect = sub.add_parser("inspect", help="list a GGUF file's tensors")
    p_inspect.add_argument("file", nargs="?", help="GGUF file (default: the embedded demo model)")
    from numba_qk import quantize_cli

    p_quant = quantize_cli.add_parser(sub, _quantizable_weights())
    from numba_qk import split_cli

    split_cli.add_parser(sub)
    p_bench = sub.add_parser("bench", help="matvec speed per accelerated tensor")
    p_bench.add_argument("file", nargs="?", help="GGUF file (default: the embedded demo model)")
    p_bench.add_argument("--repeat", type=int, default=20, help="timed repeats (default 20)")
    p_gen = sub.add_parser("generate",
                           help="run a GGUF model (llama, gemma3, qwen2, qwen3): greedy tokens")
    p_gen.add_argument("model", nargs="?",
                       help="GGUF model file (architecture llama, gemma3, qwen2 or qwen3; "
                            "default: the embedded demo model, a tiny llama with random weights)")
    p_gen.add_argument("prompt", nargs="?",
                       help="prompt text, tokenized with the file's vocabulary as llama.cpp "
                            "does (BOS where the file asks for it; special tokens such as "
                            "<|im_start|> written in the text are parsed)")
    p_gen.add_argument("--tokens",
                       help="prompt token ids, comma-separated, instead of PROMPT (the output "
                            "is text from the file's vocabulary)")
    p_gen.add_argument("-n", type=int, default=16, help="new tokens (default 16)")
    p_gen.add_argument("--threads", type=int, default=1, help="threads per matmul (default 1)")
    p_gen.add_argument("--json", action="store_true",
                       help="one JSON object: prompt_tokens, tokens, text, "
                            "prompt_tokens_per_s, decode_tokens_per_s")
    for p in (p_inspect, p_quant, p_bench):
        p.add_argument("--demo-dim", type=int, default=512,
                       help="width of the embedded demo model used when no file is given "
                            "(a multiple of 256; default 512)")
    args = parser.parse_args(argv)

    if args.command in (None, "demo"):
        if args.rows < 1 or args.groups < 1 or args.check_rows < 0:
            parser.error("--rows and --groups must be >= 1, --check-rows >= 0")
        return demo(args.rows, args.groups, args.seed, args.check_rows)

    import tempfile

    from numba_qk.gguf import GGUFError

    try:
        with tempfile.TemporaryDirectory(prefix="numba_qk-") as tmp:
            if args.command == "inspect":
                return cmd_inspect(args.file or _default_model(tmp, args.demo_dim))
            if args.command == "quantize":
                return quantize_cli.run(args, parser, lambda: _default_model(tmp, args.demo_dim))
            if args.command == "gguf-split":
                return split_cli.run(args, parser)
            if args.command == "generate":
                if args.n < 1 or args.threads < 1:
                    parser.error("-n and --threads must be >= 1")
                if args.prompt is not None and args.tokens is not None:
                    parser.error("generate takes a PROMPT or --tokens (one of them)")
                model, prompt = args.model, args.prompt
                if model is None:
                    model = _demo_llama(tmp)
                    if prompt is None and args.tokens is None:
                        from numba_qk.models.demo import DEMO_PROMPT

                        prompt = DEMO_PROMPT
                elif prompt is None and args.tokens is None:
                    parser.error("generate MODEL takes a PROMPT or --tokens (one of them)")
                return cmd_generate(model, args.tokens, args.n, args.threads, args.json, prompt)
            if args.repeat < 1:
                parser.error("--repeat must be >= 1")
            return cmd_bench(args.file or _default_model(tmp, args.demo_dim), args.repeat)
    except (GGUFError, OSError, ImportError, KeyError, TypeError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"numba-qk {args.command}: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
