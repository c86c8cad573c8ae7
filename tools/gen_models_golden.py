"""Regenerate tests/models/golden/tiny_<arch>.npz: write the tiny models of
tests/models/tiny_models.py (seeded, the same bytes every time) and record llama.cpp's logits
for tiny_models.PROMPT and 6 greedy tokens, with the file's sha256; and
tests/models/golden/tokenizer_tiny.json: llama.cpp's token ids of tiny_vocab.CORPUS for the
tiny models with tiny_vocab.VARIANTS' vocabularies (tools/llama_cpp_tokenize.py).  With
``--real DIR``, tests/models/golden/tokenizer_real.json: the same for tiny_vocab.REAL_CORPUS and
the two real models of tests/models/test_real_models.py found in DIR.

    PYTHONPATH=. python tools/gen_models_golden.py [--llama-python /work/.native-ggml/bin/python]
        [--only tokenizer|models] [--arch qwen2,qwen3] [--real ~/.cache/numba_qk-models]

``--arch`` (default: every architecture of tiny_models.SHAPES) limits which tiny_<arch>.npz are
written; ``--only models`` leaves the tokenizer goldens as they are.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "models"))

from tiny_models import PROMPT, SHAPES, sha256, write_tiny_model  # noqa: E402
from tiny_vocab import (CORPUS, CORPUS_BYTES, REAL_CORPUS, REAL_CORPUS_BYTES,  # noqa: E402
                        VARIANTS)

REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}


def llama_cpp_tokens(llama_python, path, texts, bytes_, tmp):
    import json

    src = Path(tmp) / "texts.json"
    out = Path(tmp) / "tokens.json"
    src.write_text(json.dumps([t.encode("utf-8").hex() for t in texts] + [b.hex() for b in bytes_]))
    subprocess.run([llama_python, str(ROOT / "tools" / "llama_cpp_tokenize.py"), str(path),
                    str(src), str(out)], check=True)
    return json.loads(out.read_text())


def tokenizer_goldens(a, out_dir):
    import json

    res = {}
    with tempfile.TemporaryDirectory() as d:
        for name, make in VARIANTS.items():
            path = write_tiny_model(Path(d) / f"{name}.gguf", "llama", vocab=make())
            r = llama_cpp_tokens(a.llama_python, path, CORPUS, CORPUS_BYTES, d)
            r["sha256"] = sha256(path)
            res[name] = r
            print("tokenizer", name, sum(len(c["ids"]["01"]) for c in r["cases"]), "ids")
    (out_dir / "tokenizer_tiny.json").write_text(json.dumps(res, separators=(",", ":")))
    if a.real:
        res = {}
        with tempfile.TemporaryDirectory() as d:
            for key, fname in REAL.items():
                path = Path(a.real).expanduser() / fname
                res[key] = llama_cpp_tokens(a.llama_python, path, REAL_CORPUS, REAL_CORPUS_BYTES,
                                            d)
        (out_dir / "tokenizer_real.json").write_text(json.dumps(res, separators=(",", ":")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default="/work/.native-ggml/bin/python")
    ap.add_argument("--only", choices=["tokenizer", "models"], default=None)
    ap.add_argument("--arch", default=",".join(SHAPES), help="comma-separated architectures")
    ap.add_argument("--real", default=None, help="folder of the two real models")
    a = ap.parse_args()
    out_dir = ROOT / "tests" / "models" / "golden"
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.only != "models":
        tokenizer_goldens(a, out_dir)
    if a.only == "tokenizer":
        return
    with tempfile.TemporaryDirectory() as d:
        for arch in a.arch.split(","):
            path = write_tiny_model(Path(d) / f"{arch}.gguf", arch)
            ref = Path(d) / f"{arch}.npz"
            subprocess.run([a.llama_python, str(ROOT / "tools" / "llama_cpp_ref.py"), str(path),
                            "--ids", ",".join(map(str, PROMPT)), "--greedy", "6",
                            "--out", str(ref)], check=True)
            r = np.load(ref)
            np.savez_compressed(out_dir / f"tiny_{arch}.npz", ids=r["ids"], logits=r["logits"],
                                greedy=r["greedy"], sha256=np.array(sha256(path)))
            print(arch, "greedy", list(r["greedy"]))


if __name__ == "__main__":
    main()
