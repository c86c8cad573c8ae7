"""Run llama.cpp's own quantizer (``llama_cpp.llama_model_quantize`` of a natively built
llama-cpp-python, in its own interpreter) with llama-quantize's parameters, as the oracle for
byte-identity tests. ``NUMBA_QK_LLAMA_CPP_PYTHON`` names the interpreter; without it, the
``.native-ggml`` virtual environment that ``shared/tools/build-native-ggml.sh`` makes by default,
in the repository or beside it (:data:`LLAMA_PY`, the one default the tests use);
:func:`available` says whether it works.

What llama-quantize's main() adds on top of ``llama_model_quantize`` (its parsing, the
``quantize.imatrix.*`` keys) is passed here already done: kv overrides as (key, type, value),
tensor types as (pattern, ggml type id), the imatrix as {name: f32 list}.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

def _default_interpreter() -> str:
    root = Path(__file__).resolve().parents[2]
    for d in (root, root.parent):
        py = d / ".native-ggml" / "bin" / "python"
        if py.exists():
            return str(py)
    return str(root / ".native-ggml" / "bin" / "python")


LLAMA_PY = os.environ.get("NUMBA_QK_LLAMA_CPP_PYTHON") or _default_interpreter()

_SCRIPT = r'''
import ctypes, json, sys
import llama_cpp as L
a = json.loads(sys.stdin.read())
p = L.llama_model_quantize_default_params()
p.ftype = a["ftype"]; p.nthread = a.get("nthread", 2)
for k in ("allow_requantize", "pure", "keep_split", "dry_run", "only_copy"):
    if k in a: setattr(p, k, a[k])
if "quantize_output_tensor" in a: p.quantize_output_tensor = a["quantize_output_tensor"]
if a.get("output_tensor_type") is not None: p.output_tensor_type = a["output_tensor_type"]
if a.get("token_embedding_type") is not None: p.token_embedding_type = a["token_embedding_type"]
keep = []
kvs = a.get("kv_overrides") or []
if kvs:
    arr = (L.llama_model_kv_override * (len(kvs) + 1))()
    tags = {"int": 0, "float": 1, "bool": 2, "str": 3}
    for i, (key, kind, val) in enumerate(kvs):
        arr[i].key = key.encode()
        arr[i].tag = tags[kind]
        if kind == "int": arr[i].value.val_i64 = int(val)
        elif kind == "float": arr[i].value.val_f64 = float(val)
        elif kind == "bool": arr[i].value.val_bool = bool(val)
        else: arr[i].value.val_str = val.encode()
    arr[len(kvs)].key = b""
    p.kv_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_kv_override)); keep.append(arr)
tts = a.get("tensor_types") or []
if tts:
    arr = (L.llama_model_tensor_override * (len(tts) + 1))()
    for i, (pat, t) in enumerate(tts):
        b = ctypes.c_char_p(pat.encode()); keep.append(b)
        arr[i].pattern = b.value; arr[i].type = t
    arr[len(tts)].pattern = None
    p.tt_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_tensor_override)); keep.append(arr)
im = a.get("imatrix") or {}
if im:
    arr = (L.llama_model_imatrix_data * (len(im) + 1))()
    for i, (name, vals) in enumerate(im.items()):
        buf = (ctypes.c_float * len(vals))(*vals); keep.append(buf)
        arr[i].name = name.encode(); arr[i].data = buf; arr[i].size = len(vals)
    arr[len(im)].name = None
    p.imatrix = ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data)); keep.append(arr)
pr = a.get("prune_layers") or []
if pr:
    arr = (ctypes.c_int32 * (len(pr) + 1))(*pr, -1); keep.append(arr)
    p.prune_layers = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int32))
sys.exit(L.llama_model_quantize(a["src"].encode(), a["dst"].encode(), ctypes.byref(p)))
'''


def available() -> bool:
    if not Path(LLAMA_PY).exists():
        return False
    r = subprocess.run([LLAMA_PY, "-c", "import llama_cpp"], capture_output=True)
    return r.returncode == 0


def quantize(src, dst, ftype: int, **params) -> subprocess.CompletedProcess:
    """``llama_model_quantize(src, dst, params)``; returns the finished process (returncode 0
    on success, llama.cpp's log in stderr)."""
    arg = dict(params, src=str(src), dst=str(dst), ftype=int(ftype))
    return subprocess.run([LLAMA_PY, "-c", _SCRIPT], input=json.dumps(arg), capture_output=True,
                          text=True)
