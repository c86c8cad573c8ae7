"""Compare numba_qk.presets' per-tensor types with llama.cpp's own quantizer.

Builds small llama-architecture GGUF files with gguf-py's GGUFWriter (GQA, tied and untied
embeddings, row lengths that force fallbacks, 16 layers written in string order so that file
order differs from llama.cpp's layer order, an 8-expert MoE, an 80-layer GQA model that llama.cpp
types as 70B), quantizes each with ``llama_cpp.llama_model_quantize`` (llama-cpp-python built
from source, run as a subprocess with its own interpreter) for every preset, reads the output's
tensor types back and compares them, and the tensor order and ``general.file_type``, with
:func:`numba_qk.presets.plan`. Where llama.cpp refuses a preset (it needs an importance matrix,
or a type has no fallback), the plan must refuse too.

    python tools/compare_presets.py [--python /work/native-ggml/bin/python] [--presets Q4_K_M,...]
                                    [--models a,b] [--keep DIR] [--markdown FILE]

Exit status 0 when every compared preset agrees.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numba_qk import presets as P  # noqa: E402

DEFAULT_PYTHON = "/work/native-ggml/bin/python"

# name: (layers, n_embd, n_head, n_head_kv, n_ff, vocab, tied, dtype, n_expert, string_order, note)
MODELS = {
    "gqa4": (8, 256, 8, 2, 288, 512, False, np.float32, 0, False,
             "GQA 4, ffn rows 288 (K-quant -> legacy fallback), F32"),
    "tied160": (6, 160, 5, 5, 512, 256, True, np.float16, 0, False,
                "tied embeddings, n_embd 160 (output Q8_0, attn fallbacks), F16"),
    "l16gqa8": (16, 256, 8, 1, 272, 256, False, np.float16, 0, True,
                "16 layers in string order, GQA 8, ffn rows 272 (F16 fallback)"),
    "moe8": (4, 256, 8, 8, 256, 256, False, np.float16, 8, False,
             "8 experts (3-D expert tensors, layer from name)"),
    "l80gqa": (80, 256, 8, 2, 256, 256, False, np.float16, 0, False,
               "80 layers with GQA: LLM_TYPE_70B"),
}

# ftypes llama.cpp can run on these files without an importance matrix, plus the ones that must
# be refused (the plan must refuse them as well)
DEFAULT_PRESETS = [p.name for p in P.PRESETS]


def build_model(path: Path, spec, seed: int = 0):
    import gguf

    n_layer, n_embd, n_head, n_head_kv, n_ff, vocab, tied, dtype, n_expert, string_order, _ = spec
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0 if dtype == np.float32 else 1)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)

    tensors = []

    def t(name, *ne):  # ne order; numpy shape is reversed
        tensors.append((name, tuple(ne)))

    t("token_embd.weight", n_embd, vocab)
    t("output_norm.weight", n_embd)
    if not tied:
        t("output.weight", n_embd, vocab)
    t("rope_freqs.weight", head_dim // 2)
    for i in range(n_layer):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", n_embd)
        t(b + "attn_q.weight", n_embd, n_embd)
        t(b + "attn_k.weight", n_embd, head_dim * n_head_kv)
        t(b + "attn_v.weight", n_embd, head_dim * n_head_kv)
        t(b + "attn_output.weight", n_embd, n_embd)
        t(b + "ffn_norm.weight", n_embd)
        if n_expert:
            t(b + "ffn_gate_inp.weight", n_embd, n_expert)
            t(b + "ffn_gate_exps.weight", n_embd, n_ff, n_expert)
            t(b + "ffn_up_exps.weight", n_embd, n_ff, n_expert)
            t(b + "ffn_down_exps.weight", n_ff, n_embd, n_expert)
        else:
            t(b + "ffn_gate.weight", n_embd, n_ff)
            t(b + "ffn_up.weight", n_embd, n_ff)
            t(b + "ffn_down.weight", n_ff, n_embd)
    if string_order:
        tensors.sort(key=lambda x: x[0])
    out = []
    for name, ne in tensors:
        shape = tuple(reversed(ne))
        if name.endswith("norm.weight") or name == "rope_freqs.weight":
            arr = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            arr = (0.02 * rng.standard_normal(shape)).astype(dtype)
        w.add_tensor(name, arr)
        out.append(P.Tensor(name, ne, 0 if arr.dtype == np.float32 else 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


_ORACLE = r"""
import ctypes, json, sys
import llama_cpp
llama_cpp.llama_backend_init()
jobs = json.loads(sys.argv[1])
res = {}
for key, inp, out, ftype in jobs:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    if key.endswith(":COPY"):
        p.only_copy = True
    rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(p))
    res[key] = int(rc)
print("@@RESULT@@" + json.dumps(res))
"""


def run_oracle(python: str, jobs, log_path: Path):
    with open(log_path, "w") as log:
        r = subprocess.run([python, "-c", _ORACLE, json.dumps(jobs)], stdout=subprocess.PIPE,
                           stderr=log, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise RuntimeError(f"oracle failed (rc {r.returncode}); see {log_path}")


def _read_str(f):
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8")


def _skip_value(f, vt):
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vt in sizes:
        return f.read(sizes[vt])
    if vt == 8:
        return _read_str(f)
    if vt == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        return [_skip_value(f, et) for _ in range(n)]
    raise ValueError(f"bad GGUF value type {vt}")


def read_types(path: Path):
    """[(name, ne, type)] in file order and general.file_type, by a minimal GGUF header parser
    (gguf-py's reader rejects type ids it does not know, such as Q2_0)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not GGUF")
        _ver, n_t, n_kv = struct.unpack("<IQQ", f.read(20))
        ftype = None
        for _ in range(n_kv):
            key = _read_str(f)
            (vt,) = struct.unpack("<I", f.read(4))
            raw = _skip_value(f, vt)
            if key == "general.file_type":
                ftype = struct.unpack("<I", raw)[0]
        out = []
        for _ in range(n_t):
            name = _read_str(f)
            (nd,) = struct.unpack("<I", f.read(4))
            ne = struct.unpack(f"<{nd}Q", f.read(8 * nd))
            typ, _off = struct.unpack("<IQ", f.read(12))
            out.append((name, tuple(ne), typ))
    return out, ftype


def read_types_gguf_py(path: Path):
    import gguf

    r = gguf.GGUFReader(str(path))
    return [(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type)) for t in r.tensors]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=DEFAULT_PYTHON)
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--keep", default=None, help="directory to keep the files in")
    ap.add_argument("--markdown", default=None, help="write the table as markdown here")
    args = ap.parse_args(argv)

    presets = [P.find_preset(x) for x in args.presets.split(",") if x]
    models = [m for m in args.models.split(",") if m]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="presets-"))
    work.mkdir(parents=True, exist_ok=True)

    rows = []
    all_ok = True
    for mname in models:
        spec = MODELS[mname]
        src = work / f"{mname}.gguf"
        t0 = time.time()
        tensors = build_model(src, spec)
        meta = {"general.architecture": "llama", "llama.block_count": spec[0],
                "llama.attention.head_count": spec[2], "llama.attention.head_count_kv": spec[3],
                "llama.expert_count": spec[8]}
        jobs = []
        for p in presets:
            jobs.append([f"{mname}:{p.name}", str(src), str(work / f"{mname}-{p.name}.gguf"), p.ftype])
        res = run_oracle(args.python, jobs, work / f"{mname}-oracle.log")
        dt = time.time() - t0
        for p in presets:
            key = f"{mname}:{p.name}"
            out = work / f"{mname}-{p.name}.gguf"
            try:
                pl = P.plan(p, meta, tensors)
                perr = None
            except P.PresetError as e:
                pl, perr = None, str(e)
            if res[key] != 0:
                ok = pl is None
                rows.append((mname, p.name, len(tensors), "-", "llama.cpp refused; plan "
                             + ("refused too" if ok else "did NOT refuse"), ok))
                all_ok &= ok
                continue
            if pl is None:
                rows.append((mname, p.name, len(tensors), "-", f"plan refused ({perr}) but "
                             "llama.cpp quantized", False))
                all_ok = False
                continue
            got, ftype = read_types(out)
            try:
                via = read_types_gguf_py(out)
                assert via == got, "gguf-py and the header parser disagree"
                reader = "gguf-py"
            except (ValueError, KeyError):
                reader = "header parser (gguf-py does not know a type)"
            want = [(t.name, t.ne, t.target) for t in pl.tensors]
            equal = sum(1 for a, b in zip(got, want) if a == b) if len(got) == len(want) else 0
            order_ok = [g[0] for g in got] == [w[0] for w in want]
            bad = [(a[0], P.GGML_TYPE_NAMES.get(a[2]), P.GGML_TYPE_NAMES.get(b[2]))
                   for a, b in zip(got, want) if a != b]
            ft_ok = ftype == pl.kv.get("general.file_type", ftype)
            ok = equal == len(want) and order_ok and ft_ok
            all_ok &= ok
            mix = {}
            for g in got:
                k = P.GGML_TYPE_NAMES.get(g[2], str(g[2]))
                mix[k] = mix.get(k, 0) + 1
            detail = ", ".join(f"{v} {k}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))
            if not ok:
                detail += f"; order {'ok' if order_ok else 'DIFFERS'}; file_type {ftype}; " \
                          f"first differences (name, llama.cpp, plan): {bad[:4]}"
            rows.append((mname, p.name, len(want), equal, detail, ok))
            if not args.keep:
                out.unlink(missing_ok=True)
        print(f"# {mname}: {spec[-1]} ({dt:.1f} s)", file=sys.stderr)

    hdr = "| model | preset | tensors | equal | types in llama.cpp's file / outcome | agree |"
    lines = [hdr, "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {'yes' if r[5] else 'NO'} |")
    table = "\n".join(lines)
    print(table)
    n_ok = sum(r[5] for r in rows)
    print(f"\n{n_ok} of {len(rows)} (model, preset) pairs agree")
    if args.markdown:
        Path(args.markdown).write_text(table + f"\n\n{n_ok} of {len(rows)} (model, preset) pairs agree\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
