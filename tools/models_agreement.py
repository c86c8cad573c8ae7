"""numba_qk.models against llama.cpp on the real GGUF models: logits on the same token ids
(batched prompt, every position), top-1 where llama.cpp's top-2 gap is clear of its own noise
(batched vs token-by-token), greedy generation.  Prints the figures and writes
tests/models/golden/real_<model>.npz (small: top-1, gaps, noise, top-64 logits, greedy).

    PYTHONPATH=. python tools/models_agreement.py [--llama-python /work/.native-ggml/bin/python]
        [--numerics ggml_cpu,canonical]

``--numerics`` lists the activation quantizers (``models.load(numerics=...)``) to measure, each
against the same llama.cpp run.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
PROMPT = ("<|im_start|>user\nWrite a short poem about the sea and explain why sailors love it."
          "<|im_end|>\n<|im_start|>assistant\n")
PROMPTS = {"smollm2": PROMPT,
           "gemma3": "<start_of_turn>user\nWrite a short poem about the sea and explain why "
                     "sailors love it.<end_of_turn>\n<start_of_turn>model\n"}
N_GEN = 32


def llama_ref(py, model, out, ids=None, text=None, greedy=0, stepwise=False):
    cmd = [py, str(ROOT / "tools" / "llama_cpp_ref.py"), str(model), "--out", str(out),
           "--greedy", str(greedy)]
    cmd += ["--text", text] if text is not None else ["--ids", ",".join(map(str, ids))]
    if stepwise:
        cmd.append("--stepwise")
    subprocess.run(cmd, check=True)
    return np.load(out)


def gaps(logits):
    s = np.sort(logits, axis=1)
    return s[:, -1] - s[:, -2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default="/work/.native-ggml/bin/python")
    ap.add_argument("--models", default=os.environ.get(
        "NUMBA_QK_MODELS", str(Path.home() / ".cache" / "numba_qk-models")))
    ap.add_argument("--numerics", default="ggml_cpu,canonical")
    a = ap.parse_args()
    from numba_qk import models

    for key, name in MODELS.items():
        path = Path(a.models) / name
        if not path.exists():
            print(f"{key}: {path} missing")
            continue
        with tempfile.TemporaryDirectory() as d:
            r = llama_ref(a.llama_python, path, Path(d) / "a.npz", text=PROMPTS[key],
                          greedy=N_GEN, stepwise=True)
            ids = [int(i) for i in r["ids"]]
            lc, greedy = r["logits"], [int(t) for t in r["greedy"]]
            r = dict(r)
            noise = float(np.abs(lc - r["stepwise"]).max())
            # llama.cpp's gaps along its own greedy continuation
            r2 = llama_ref(a.llama_python, path, Path(d) / "b.npz", ids=ids + greedy)
            gen_gap = gaps(r2["logits"][len(ids) - 1:len(ids) - 1 + N_GEN])
        gap = gaps(lc)
        thr = max(0.5, 2 * noise)
        clear = gap >= thr
        unclear = np.nonzero(gen_gap < thr)[0]
        greedy_clear = int(unclear[0]) if len(unclear) else N_GEN
        print(f"## {key}: {len(ids)} prompt tokens")
        for numerics in a.numerics.split(","):
            m = models.load(path, numerics=numerics)
            got = m.logits(ids)
            corr = np.array([np.corrcoef(got[t], lc[t])[0, 1] for t in range(len(ids))])
            top1 = got.argmax(1) == lc.argmax(1)
            ours = m.generate(ids, N_GEN)
            same = next((i for i in range(N_GEN) if ours[i] != greedy[i]), N_GEN)
            print(f"### numerics={numerics}")
            print(f"- logits correlation per position: median {np.median(corr):.5f}, "
                  f"min {corr.min():.5f}; max |diff| {np.abs(got - lc).max():.3f} "
                  f"(llama.cpp batched vs stepwise: {noise:.3f})")
            print(f"- top-1 equal: {top1.sum()}/{len(ids)} positions; where the gap is clear "
                  f"(>= {thr:.2f}): {top1[clear].sum()}/{clear.sum()}")
            print(f"- greedy {N_GEN} tokens: equal for the first {same}; llama.cpp's first "
                  f"unclear gap at step {greedy_clear}")
            sys.stdout.flush()
        # a fixed random sample of the vocabulary stands in for the full logits (kept small)
        sample = np.sort(np.random.default_rng(0).choice(lc.shape[1], 2048, replace=False))
        np.savez_compressed(
            ROOT / "tests" / "models" / "golden" / f"real_{key}.npz", ids=np.array(ids),
            top1=lc.argmax(1), gap=gap, noise=np.float32(noise), sample_ids=sample,
            sample=lc[:, sample], greedy=np.array(greedy), greedy_clear=np.int64(greedy_clear),
            greedy_text=r["greedy_text"])
        sys.stdout.flush()


if __name__ == "__main__":
    main()
