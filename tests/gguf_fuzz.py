"""Fuzz numba_qk.gguf with deterministically mutated GGUF files; count hangs, crashes, tracebacks.

    python tests/gguf_fuzz.py --files 2000 --timeout 3 [--pythonpath DIR]

Each mutant is written to a temporary directory and handed to a worker process that opens it,
lists tensors and metadata and dequantizes every tensor under a per-file time limit (SIGALRM) and
an address-space limit.  The worker is restarted after a crash.  Outcomes per file:

    ok        opened and read
    rejected  a GGUFError (one-line, expected)
    other     any other exception (a traceback for a user)
    timeout   over the per-file limit (a hang)
    memory    MemoryError (unbounded allocation)
    crash     the worker died (segfault, abort)

``--pythonpath`` points the worker at another numba_qk checkout (used for the before/after
figures in docs/decisions/010-gguf-hardening.md).  The mutants are a function of the seed
only (``make_mutants``), shared with tests/io/test_gguf_hardening.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def make_seed_file(path) -> tuple[bytes, int]:
    """A small legal GGUF file with every KV kind and a few tensors; returns (bytes, header end)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    VT = gguf.GGUFValueType
    w.add_name("fuzz seed")
    w.add_uint32("seed.u32", 7)
    w.add_int64("seed.i64", -5)
    w.add_float32("seed.f32", 1.5)
    w.add_bool("seed.bool", True)
    w.add_key_value("seed.floats", [0.5 * i for i in range(16)], VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_key_value("seed.words", ["a", "bc", "def", "", "gh"], VT.ARRAY, sub_type=VT.STRING)
    rng = np.random.default_rng(0)
    T = gguf.GGMLQuantizationType
    w.add_tensor("f32.weight", rng.standard_normal((2, 256)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((2, 256)).astype(np.float16))
    w.add_tensor("norm.weight", np.ones(8, np.float32))
    w.add_tensor("q4k.weight", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=T.Q4_K)
    w.add_tensor("q80.weight", rng.integers(0, 128, (2, 68), dtype=np.uint8), raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = Path(path).read_bytes()
    end = int(gguf.GGUFReader(str(path)).data_offset)  # where the tensor data begins
    return data, end


EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def make_mutants(seed_bytes: bytes, header_end: int, n: int, seed: int = 1):
    """``n`` deterministic mutants of ``seed_bytes`` (most mutations inside the header)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        b = bytearray(seed_bytes)
        kind = i % 6
        if kind == 0:  # flip a few header bytes
            for _ in range(int(rng.integers(1, 5))):
                b[int(rng.integers(4, header_end))] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:  # an extreme u64 at a random header position
            at = int(rng.integers(4, header_end - 8))
            v = EXTREMES[int(rng.integers(0, len(EXTREMES)))]
            b[at:at + 8] = v.to_bytes(8, "little")
        elif kind == 2:  # a u32 (type codes, dims count) rewritten
            at = int(rng.integers(4, header_end - 4))
            v = int(rng.choice([0, 1, 4, 5, 8, 9, 10, 12, 13, 255, 2**31]))
            b[at:at + 4] = v.to_bytes(4, "little")
        elif kind == 3:  # truncation
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 4:  # bytes inserted or deleted in the header
            at = int(rng.integers(4, header_end))
            k = int(rng.integers(1, 9))
            if rng.integers(0, 2):
                b[at:at] = bytes(rng.integers(0, 256, k, dtype=np.uint8))
            else:
                del b[at:at + k]
        else:  # several of the above
            for _ in range(3):
                at = int(rng.integers(4, header_end - 8))
                b[at:at + 8] = EXTREMES[int(rng.integers(0, len(EXTREMES)))].to_bytes(8, "little")
        out.append(bytes(b))
    return out


WORKER = r"""
import os, resource, signal, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]) << 20, resource.RLIM_INFINITY))
from numba_qk import gguf
class Timeout(BaseException): pass
def on_alarm(*a): raise Timeout()
signal.signal(signal.SIGALRM, on_alarm)
timeout = float(sys.argv[1])
for line in sys.stdin:
    path = line.strip()
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with gguf.open(path) as f:
            _ = f.metadata
            for t in f.tensors:
                try:
                    f.dequantize(t.name)
                except gguf.GGUFError:
                    pass
        status = "ok"
    except Timeout:
        status = "timeout"
    except MemoryError:
        status = "memory"
    except gguf.GGUFError:
        status = "rejected"
    except BaseException as e:
        status = "other:" + type(e).__name__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(path, status, flush=True)
"""


def run(files: int, timeout: float, pythonpath: str | None, mem_mib: int = 4096, seed: int = 1):
    with tempfile.TemporaryDirectory(prefix="numba_qk-fuzz-") as tmp:
        data, header_end = make_seed_file(os.path.join(tmp, "seed.gguf"))
        paths = []
        for i, m in enumerate(make_mutants(data, header_end, files, seed)):
            p = os.path.join(tmp, f"m{i:05d}.gguf")
            Path(p).write_bytes(m)
            paths.append(p)
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        results = {}
        todo = list(paths)
        while todo:
            proc = subprocess.Popen([sys.executable, "-c", WORKER, str(timeout), str(mem_mib)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    env=env, stderr=subprocess.DEVNULL)
            out, _ = proc.communicate("\n".join(todo) + "\n")
            for line in out.splitlines():
                p, status = line.rsplit(" ", 1)
                results[p] = status
            done = set(results)
            todo = [p for p in todo if p not in done]
            if todo:  # the worker died on todo[0]
                results[todo[0]] = "crash"
                todo = todo[1:]
        counts = collections.Counter(s if not s.startswith("other:") else "other" for s in
                                     results.values())
        others = collections.Counter(s for s in results.values() if s.startswith("other:"))
        examples = {s: os.path.basename(p) for p, s in sorted(results.items())}
        return dict(files=files, timeout_s=timeout, counts=dict(counts), other=dict(others),
                    example=examples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--pythonpath")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(json.dumps(run(a.files, a.timeout, a.pythonpath, seed=a.seed), indent=1))


if __name__ == "__main__":
    main()
