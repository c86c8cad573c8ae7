"""Replay of HF transformers' GGUF loading on real files: gguf-py's ``GGUFReader``, then
``gguf.dequantize(tensor.data, tensor.tensor_type)`` over every tensor (what
``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`` does), with gguf-py's own
codecs and with ``numba_qk.gguf.accelerate_gguf_py()``; checks the two give the same bits.

    python bench/gguf_py_replay.py MODEL.gguf [MODEL.gguf ...] [--repeat N] [--json OUT]

Models: ``../shared/tools/fetch-models.sh`` fetches SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M.
Each configuration runs ``--repeat`` times alternately (gguf-py, numba_qk, gguf-py, ...) and
the best time of each is reported; numba_qk's first (compiling or cache-loading) pass is a
warm-up and not timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter

import numpy as np

import gguf
from numba_qk import gguf as qg


def replay(reader):
    """Every tensor dequantized as transformers does; returns {name: float32 array}."""
    out = {}
    with np.errstate(all="ignore"):
        for t in reader.tensors:
            out[t.name] = gguf.dequantize(t.data, t.tensor_type)
    return out


def timed(reader, accelerated):
    (qg.accelerate_gguf_py if accelerated else qg.restore_gguf_py)()
    t0 = time.perf_counter()
    res = replay(reader)
    return time.perf_counter() - t0, res


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    for path in args.models:
        reader = gguf.GGUFReader(path)
        types = Counter(t.tensor_type.name for t in reader.tensors)
        routed = {f.name for f in qg.GGUF_PY_ROUTED}
        timed(reader, True)                                  # numba_qk warm-up (compile/cache)
        best = {False: float("inf"), True: float("inf")}
        ref = got = None
        for _ in range(args.repeat):
            for acc in (False, True):
                dt, res = timed(reader, acc)
                best[acc] = min(best[acc], dt)
                if acc:
                    got = res
                else:
                    ref = res
        qg.restore_gguf_py()
        differ = [n for n in ref if not same_bits(ref[n], got[n])]
        row = {"model": path.rsplit("/", 1)[-1], "tensors": len(ref),
               "types": dict(types), "routed_tensors": sum(v for k, v in types.items() if k in routed),
               "gguf_py_s": best[False], "numba_qk_s": best[True],
               "speedup": best[False] / best[True], "bit_identical": not differ,
               "differing_tensors": differ}
        rows.append(row)
        print(f"{row['model']}: {row['tensors']} tensors ({row['routed_tensors']} routed; "
              f"{', '.join(f'{k} {v}' for k, v in sorted(types.items()))})")
        print(f"  gguf-py {best[False]:.3f} s   accelerated {best[True]:.3f} s   "
              f"({row['speedup']:.1f}x)   outputs bit-identical: {not differ}")
    info = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
            "numpy": np.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
