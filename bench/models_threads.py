"""numba_qk.models with 1 and 2 threads (issue 23's "two threads >= 1.6x one thread").

    PYTHONPATH=. python bench/models_threads.py [MODEL.gguf ...] [--prompt 32] [--decode 32]
        [--repeat 5] [--threads 2]

Prompt (one batch of ``--prompt`` ids, fresh context) and decode (``--decode`` greedy tokens with
the KV cache) tokens/s, best and median of ``--repeat`` runs alternating the thread counts in one process
(the first, cache-loading run not timed).  The adaptive thread count is switched off, so the
asked-for count runs even if another process is busy: run it on a quiet machine, and give the
load average with the figures.  Without MODEL: the two files of issue 23 from
~/.cache/numba_qk-models ($NUMBA_QK_MODELS).
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models_vs_llama_cpp import DEFAULT, prompt_ids, run_ours  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from numba_qk import _threads, models

    _threads.ADAPTIVE = False
    d = Path(os.environ.get("NUMBA_QK_MODELS", Path.home() / ".cache" / "numba_qk-models"))
    paths = a.models or [str(d / n) for n in DEFAULT]
    counts = (1, a.threads)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for path in paths:
        ms = {n: models.load(path, threads=n) for n in counts}
        ids = prompt_ids(ms[1].n_vocab, a.prompt)
        runs = {n: [] for n in counts}
        for rep in range(a.repeat + 1):
            for n in counts:
                p, dec = run_ours(ms[n], ids, a.decode)
                if rep:
                    runs[n].append((p, dec))
        for what, stat in (("best", max), ("median", statistics.median)):
            b1 = [stat(r[i] for r in runs[1]) for i in (0, 1)]
            bn = [stat(r[i] for r in runs[a.threads]) for i in (0, 1)]
            print(f"{Path(path).name} ({what} of {a.repeat}): prompt {b1[0]:.1f} -> {bn[0]:.1f} "
                  f"tok/s ({bn[0] / b1[0]:.2f}x), decode {b1[1]:.1f} -> {bn[1]:.1f} tok/s "
                  f"({bn[1] / b1[1]:.2f}x), {a.threads} threads vs 1")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
