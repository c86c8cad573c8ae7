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

def _m(n_layer, n_embd, n_head, n_head_kv, n_ff, vocab, note, tied=False, dtype=np.float32,
       n_expert=0, string_order=False, arch="llama"):
    return dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                vocab=vocab, note=note, tied=tied, dtype=dtype, n_expert=n_expert,
                string_order=string_order, arch=arch)


MODELS = {
    "gqa4": _m(8, 256, 8, 2, 288, 512, "GQA 4, ffn rows 288 (K-quant -> legacy fallback), F32"),
    "tied160": _m(6, 160, 5, 5, 512, 256, "tied embeddings, n_embd 160 (output Q8_0, attn "
                  "fallbacks), F16", tied=True, dtype=np.float16),
    "l16gqa8": _m(16, 256, 8, 1, 272, 256, "16 layers in string order, GQA 8, ffn rows 272 "
                  "(F16 fallback)", dtype=np.float16, string_order=True),
    "moe8": _m(4, 256, 8, 8, 256, 256, "8 experts (3-D expert tensors, layer from name)",
               dtype=np.float16, n_expert=8),
    "falcon": _m(16, 256, 8, 1, 512, 256, "falcon: fused attn_qkv, falcon-only rules, no "
                 "ffn_gate", dtype=np.float16, arch="falcon"),
    "l80gqa": _m(80, 256, 8, 2, 256, 256, "80 layers with GQA: LLM_TYPE_70B", dtype=np.float16),
}

# llama-quantize options to compare (--variant): plan() keyword arguments, types as ids
T = P.GGML_TYPES
VARIANTS = {
    "default": {},
    "pure": {"pure": True},
    "leave-output": {"leave_output_tensor": True},
    "output-embd-types": {"output_tensor_type": T["Q5_K"], "token_embedding_type": T["Q8_0"]},
    "tensor-types": {"tensor_types": [[r"blk\.[0-2]\.attn_v", T["Q8_0"]],
                                      [r"ffn_(up|gate)", T["Q5_K"]], ["attn_q", T["Q6_K"]]]},
}

# ftypes llama.cpp can run on these files without an importance matrix, plus the ones that must
# be refused (the plan must refuse them as well)
DEFAULT_PRESETS = [p.name for p in P.PRESETS]


def build_model(path: Path, spec, seed: int = 0, alignment=None):
    """An F32/F16 model of ``spec``'s shape at ``path`` (random weights); ``alignment``: a
    ``general.alignment`` other than GGUF's default 32."""
    import gguf

    n_layer, n_embd, n_head, n_head_kv = (spec[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv"))
    n_ff, vocab, dtype, n_expert, arch = (spec[k] for k in ("n_ff", "vocab", "dtype", "n_expert", "arch"))
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if arch == "falcon":
        w.add_layer_norm_eps(1e-5)
    else:
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
    if not spec["tied"]:
        t("output.weight", n_embd, vocab)
    if arch != "falcon":
        t("rope_freqs.weight", head_dim // 2)
    for i in range(n_layer):
        b = f"blk.{i}."
        t(b + "attn_norm.weight", n_embd)
        if arch == "falcon":
            t(b + "attn_norm.bias", n_embd)
            t(b + "attn_qkv.weight", n_embd, n_embd + 2 * head_dim * n_head_kv)
            t(b + "attn_output.weight", n_embd, n_embd)
            t(b + "ffn_up.weight", n_embd, n_ff)
            t(b + "ffn_down.weight", n_ff, n_embd)
            continue
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
    if spec["string_order"]:
        tensors.sort(key=lambda x: x[0])
    out = []
    for name, ne in tensors:
        shape = tuple(reversed(ne))
        if len(ne) == 1:
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
jobs = json.loads(sys.stdin.read())
res = {}
keep = []
for key, inp, out, ftype, imat, opts in jobs:
    print("@@JOB@@ " + key, file=sys.stderr, flush=True)
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    if key.endswith(":COPY"):
        p.only_copy = True
    p.pure = bool(opts.get("pure", False))
    p.quantize_output_tensor = not opts.get("leave_output_tensor", False)
    if opts.get("output_tensor_type") is not None:
        p.output_tensor_type = opts["output_tensor_type"]
    if opts.get("token_embedding_type") is not None:
        p.token_embedding_type = opts["token_embedding_type"]
    if opts.get("tensor_types"):
        tt = (llama_cpp.llama_model_tensor_override * (len(opts["tensor_types"]) + 1))()
        for i, (pat, typ) in enumerate(opts["tensor_types"]):
            tt[i].pattern = pat.encode()
            tt[i].type = typ
        tt[len(opts["tensor_types"])].pattern = None
        keep.append(tt)
        p.tt_overrides = ctypes.cast(tt, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
    if imat:
        # a positive importance matrix for every tensor: entry i weighs column i by 1 + i % 7
        arr = (llama_cpp.llama_model_imatrix_data * (len(imat) + 1))()
        for i, (name, size) in enumerate(imat):
            data = (ctypes.c_float * size)(*[1.0 + (j % 7) for j in range(size)])
            nm = ctypes.create_string_buffer(name.encode())
            keep += [data, nm]
            arr[i].name = ctypes.cast(nm, ctypes.c_char_p)
            arr[i].data = ctypes.cast(data, ctypes.POINTER(ctypes.c_float))
            arr[i].size = size
        arr[len(imat)].name = None
        keep.append(arr)
        p.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(p))
    res[key] = int(rc)
print("@@RESULT@@" + json.dumps(res))
"""


def run_oracle(python: str, jobs, log_path: Path):
    with open(log_path, "w") as log:
        r = subprocess.run([python, "-c", _ORACLE], input=json.dumps(jobs),
                           stdout=subprocess.PIPE, stderr=log, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
            errors, offending, key = {}, {}, None
            for ln in log_path.read_text(errors="replace").splitlines():
                if ln.startswith("@@JOB@@ "):
                    key = ln.split(" ", 1)[1]
                elif "offending tensor:" in ln and key is not None:
                    offending[key] = ln.split("offending tensor:", 1)[1].strip()
                elif "failed to quantize:" in ln and key is not None:
                    errors[key] = ln.split("failed to quantize:", 1)[1].strip()
            for k, name in offending.items():
                errors[k] = f"{errors.get(k, '?')}, offending tensor {name}"
            return res, errors
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
    ap.add_argument("--variant", default="default", choices=sorted(VARIANTS),
                    help="llama-quantize options to apply on both sides")
    ap.add_argument("--imatrix", action="store_true",
                    help="give llama.cpp an importance matrix (and plan(imatrix=True))")
    args = ap.parse_args(argv)

    presets = [P.find_preset(x) for x in args.presets.split(",") if x]
    models = [m for m in args.models.split(",") if m]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="presets-"))
    work.mkdir(parents=True, exist_ok=True)

    opts = VARIANTS[args.variant]
    rows = []
    all_ok = True
    for mname in models:
        spec = MODELS[mname]
        src = work / f"{mname}.gguf"
        t0 = time.time()
        tensors = build_model(src, spec)
        arch = spec["arch"]
        meta = {"general.architecture": arch, f"{arch}.block_count": spec["n_layer"],
                f"{arch}.attention.head_count": spec["n_head"],
                f"{arch}.attention.head_count_kv": spec["n_head_kv"],
                f"{arch}.expert_count": spec["n_expert"]}
        imat = None
        if args.imatrix:
            imat = [[t.name, t.ne[0] * (t.ne[2] if len(t.ne) > 2 else 1)] for t in tensors
                    if len(t.ne) > 1]
        jobs = []
        for p in presets:
            jobs.append([f"{mname}:{p.name}", str(src), str(work / f"{mname}-{p.name}.gguf"),
                         p.ftype, imat, opts])
        res, errors = run_oracle(args.python, jobs, work / f"{mname}-oracle.log")
        dt = time.time() - t0
        for p in presets:
            key = f"{mname}:{p.name}"
            out = work / f"{mname}-{p.name}.gguf"
            try:
                pl = P.plan(p, meta, tensors, imatrix=args.imatrix,
                            **{k: ([tuple(x) for x in v] if k == "tensor_types" else v)
                               for k, v in opts.items()})
                perr = None
            except P.PresetError as e:
                pl, perr = None, str(e)
            if res[key] != 0:
                why = errors.get(key, "?")
                # the same refusal: an importance matrix needed, or no fallback type
                same = (("imatrix" in why) == ("importance matrix" in (perr or ""))
                        and ("fallback" in why) == ("fallback" in (perr or "")))
                if "offending tensor " in why:   # the same first tensor, in llama.cpp's order
                    same &= f"tensor {why.rsplit('offending tensor ', 1)[1]} " in (perr or "")
                ok = pl is None and same
                rows.append((mname, p.name, len(tensors), "-", f"llama.cpp refused ({why}); plan "
                             + (f"refused too ({perr})" if ok else "did NOT refuse"), ok))
                all_ok &= ok
                continue
            if pl is None:
                rows.append((mname, p.name, len(tensors), "-", f"plan refused ({perr}) but "
                             "llama.cpp quantized", False))
                all_ok = False
                continue
            got, ftype = read_types(out)
            try:   # gguf-py where it knows every type id; it must agree with the header parser
                via = read_types_gguf_py(out)
            except (ValueError, KeyError):
                via = got
            if via != got:
                raise RuntimeError(f"{out}: gguf-py and the header parser disagree")
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
        print(f"# {mname}: {spec['note']} ({dt:.1f} s)", file=sys.stderr)

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
