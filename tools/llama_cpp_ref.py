"""Reference figures from llama.cpp (llama-cpp-python), run in the interpreter that has it
(e.g. /work/.native-ggml/bin/python, built by shared/tools/build-native-ggml.sh):

    python tools/llama_cpp_ref.py MODEL --ids 1,2,3 --out ref.npz [--greedy N] [--stepwise]
        [--threads 1] [--bench-decode N]

Writes ``logits`` (batched prompt, every position, f32 [T, n_vocab]), ``greedy`` (N greedy
tokens after the prompt, from llama.cpp's own logits), ``stepwise`` (the prompt's logits one
token at a time, to measure llama.cpp's own noise), and timings ``prompt_s``/``decode_s``.
Needs only numpy and llama_cpp, so numba_qk's tools can call it in another venv.
"""

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--ids", default="")
    ap.add_argument("--text", default=None, help="tokenize this (BOS added) instead of --ids")
    ap.add_argument("--out", required=True)
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--stepwise", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--last-logits", action="store_true",
                    help="logits of the last position only (for timing: no output head over "
                         "the whole prompt; ``logits`` then holds zeros before the last row)")
    a = ap.parse_args()
    import llama_cpp

    n_ctx = 512
    if a.text is None:
        ids = [int(s) for s in a.ids.split(",")]
        n_ctx = max(64, len(ids) + a.greedy + 8)
    llm = llama_cpp.Llama(a.model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=a.threads,
                          n_threads_batch=a.threads, logits_all=not a.last_logits, verbose=False)
    if a.text is not None:
        ids = llm.tokenize(a.text.encode(), add_bos=True, special=True)
    res = {"n_threads": a.threads}
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    res["prompt_s"] = time.perf_counter() - t
    res["logits"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
    greedy = []
    t = time.perf_counter()
    for _ in range(a.greedy):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(tok)
        if len(greedy) == a.greedy:
            break
        llm.eval([tok])
    res["decode_s"] = time.perf_counter() - t
    res["decode_n"] = max(len(greedy) - 1, 0)
    res["greedy"] = np.array(greedy, dtype=np.int64)
    res["greedy_text"] = np.array(llm.detokenize(greedy).decode("utf-8", "replace"))
    if a.stepwise:
        llm.reset()
        for i in ids:
            llm.eval([i])
        res["stepwise"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
    res["ids"] = np.array(ids, dtype=np.int64)
    np.savez(a.out, **res)


if __name__ == "__main__":
    main()
