"""Regenerate tests/models/golden/tiny_<arch>.npz: write the tiny models of
tests/models/tiny_models.py (seeded, the same bytes every time) and record llama.cpp's logits
for tiny_models.PROMPT and 6 greedy tokens, with the file's sha256.

    PYTHONPATH=. python tools/gen_models_golden.py [--llama-python /work/.native-ggml/bin/python]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "models"))

from tiny_models import PROMPT, sha256, write_tiny_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-python", default="/work/.native-ggml/bin/python")
    a = ap.parse_args()
    out_dir = ROOT / "tests" / "models" / "golden"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for arch in ("llama", "gemma3"):
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
