"""GGUF files: zero-copy quantized tensors, accelerated matvec, a Q4_K converter.

Needs the optional extra ``gguf`` (``pip install 'numba_qk[gguf]'``: gguf-py's ``GGUFReader``
and ``GGUFWriter``).

>>> from numba_qk import gguf
>>> with gguf.open("model.gguf") as f:                          # doctest: +SKIP
...     for t in f.tensors: print(t.name, t.shape, t.type_name, t.accelerated)
...     y = f.matmul("blk.0.attn_q.weight", x)                    # x: f32 [K] or [batch, K]

Tensors of a numba_qk weight format (Q4_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are exposed as typed
records ``u8 [rows, G, block_bytes]`` over the read-only memory map -- never copied -- and
``matmul`` runs the composed kernels on them (activations quantized once to the paired format;
every output bit-identical to ``quantized_dot`` on that row).  Shapes are reported in numpy
order (GGUF stores ``ne0`` first; ``shape[-1]`` here is ``ne0``).
"""

from __future__ import annotations

import os
import tempfile
from builtins import open as builtins_open
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import _registry
from . import formats as _formats
from .formats import quant
from .ops import dequantize as _dequantize
from .ops import matmul as _matmul
from .ops import quantize as _quantize

__all__ = ["GGUFError", "TensorInfo", "GGUFFile", "open", "quantize_file", "write_demo_model",
           "ACCELERATED"]

# Weight formats with a composed matmul (the rest of numba_qk's formats are activations).
ACCELERATED = _registry.WEIGHTS


class GGUFError(ValueError):
    """A GGUF file that cannot be read or used: the message says what and where."""


def _gguf():
    try:
        import gguf  # gguf-py
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("numba_qk.gguf needs gguf-py: pip install 'numba_qk[gguf]' "
                          "(or pip install gguf)") from e
    return gguf


class TensorInfo(NamedTuple):
    """One tensor of a GGUF file."""

    name: str
    shape: tuple          # numpy order (rows first; the last axis is GGUF's ne0)
    ggml_type: int        # GGML type id
    type_name: str        # e.g. "Q4_K", "F32", "IQ2_XXS"
    format: object        # numba_qk Format / ScalarType, or None if numba_qk does not model it
    nbytes: int
    accelerated: bool     # a numba_qk weight format: records + matmul

    @property
    def bits_per_weight(self) -> float:
        n = int(np.prod(self.shape)) if self.shape else 1
        return self.nbytes * 8 / n if n else 0.0


def _fmt_for(type_id: int):
    try:
        return _formats.from_ggml_type(type_id)
    except KeyError:
        return None


class GGUFFile:
    """An open GGUF file (memory-mapped read-only).  Use as a context manager or call close()."""

    def __init__(self, path):
        gguf = _gguf()
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFError(f"{self.path}: no such file")
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: not a regular file")
        with builtins_open(self.path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (it starts with {magic!r}, "
                            f"not b'GGUF')")
        try:
            self._reader = gguf.GGUFReader(self.path, "r")
        except (ValueError, IndexError, OverflowError, KeyError, struct_error()) as e:
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF file ({_reason(e)})") from None
        size = self.path.stat().st_size
        self._tensors = {}
        for t in self._reader.tensors:
            end = t.data_offset + t.n_bytes
            if end > size or t.data.nbytes != t.n_bytes:
                raise GGUFError(f"{self.path}: tensor {t.name!r} needs bytes [{t.data_offset}, "
                                f"{end}) but the file has {size} bytes (truncated file, or a "
                                f"byte size that does not match its shape and type)")
            type_id = int(t.tensor_type)
            fmt = _fmt_for(type_id)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            info = TensorInfo(t.name, shape, type_id, t.tensor_type.name, fmt, int(t.n_bytes),
                              fmt in ACCELERATED)
            self._tensors[t.name] = (info, t)

    # -- listing --------------------------------------------------------------------------
    @property
    def tensors(self) -> list:
        return [info for info, _ in self._tensors.values()]

    def tensor(self, name: str) -> TensorInfo:
        return self._entry(name)[0]

    @property
    def metadata(self) -> dict:
        """Key-value metadata as Python values (GGUF.* bookkeeping keys left out)."""
        out = {}
        for name, field in self._reader.fields.items():
            if name.startswith("GGUF."):
                continue
            try:
                out[name] = field.contents()
            except Exception:  # pragma: no cover - exotic field types
                out[name] = None
        return out

    def _entry(self, name):
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    # -- data -----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes/values as stored (gguf-py's read-only memory-map view)."""
        return self._entry(name)[1].data

    def records(self, name: str) -> np.ndarray:
        """Zero-copy typed records ``u8 [rows, G, block_bytes]`` of a block-quantized tensor
        (rows = product of all but the last axis)."""
        info, t = self._entry(name)
        fmt = info.format
        if fmt is None or not fmt.is_quantized:
            raise GGUFError(f"tensor {name!r} is {info.type_name}, not a block-quantized format "
                            f"numba_qk models")
        data = t.data
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        g = info.shape[-1] // fmt.block_size
        view = data.reshape(rows, g, fmt.block_bytes)  # a view: the memmap is contiguous
        assert np.shares_memory(view, data)
        return view

    def dequantize(self, name: str) -> np.ndarray:
        """float32 values in the tensor's numpy shape.  numba_qk's formats and F32/F16/BF16 are
        decoded by numba_qk; other GGML types are delegated to gguf-py's numpy codecs where it
        has one (``GGUFError`` otherwise)."""
        info, t = self._entry(name)
        fmt = info.format
        if fmt is not None and fmt.is_quantized:
            recs = self.records(name)
            return _dequantize(recs.reshape(-1, fmt.block_bytes), fmt).reshape(info.shape)
        if fmt is _formats.f32:
            return np.array(t.data, dtype=np.float32).reshape(info.shape)
        if fmt is _formats.f16:
            return np.asarray(t.data).astype(np.float32).reshape(info.shape)
        if fmt is _formats.bf16:
            bits = np.ascontiguousarray(t.data).view(np.uint16).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(info.shape)
        gguf = _gguf()
        try:
            return np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type),
                              dtype=np.float32).reshape(info.shape)
        except NotImplementedError:
            raise GGUFError(f"tensor {name!r}: {info.type_name} is not supported by numba_qk "
                            f"and gguf-py has no decoder for it") from None

    def matmul(self, name: str, x, *, out=None, threads=1) -> np.ndarray:
        """``W @ x`` for a 2-D tensor of a numba_qk weight format and float32 activations
        ``x`` ``[K]`` or ``[batch, K]`` (``K`` = the tensor's last axis): numba_qk.matmul on the
        zero-copy records."""
        info = self.tensor(name)
        if not info.accelerated:
            raise GGUFError(f"tensor {name!r} is {info.type_name}: not accelerated by numba_qk "
                            f"(accelerated: {', '.join(f.name for f in ACCELERATED)}); use "
                            f"dequantize() instead")
        return _matmul(self.records(name), x, lhs_format=info.format, out=out, threads=threads)

    matvec = matmul

    # -- lifetime -------------------------------------------------------------------------
    def close(self):
        self._tensors = {}
        reader = getattr(self, "_reader", None)
        if reader is not None:
            mm = getattr(reader, "data", None)
            self._reader = None
            if mm is not None and hasattr(mm, "_mmap") and mm._mmap is not None:
                try:
                    mm._mmap.close()
                except (BufferError, ValueError):
                    pass  # views still alive elsewhere keep the map; the OS frees it later

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def struct_error():
    import struct

    return struct.error


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def open(path) -> GGUFFile:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a GGUF file read-only (memory-mapped)."""
    return GGUFFile(path)


# ------------------------------------------------------------------------------------- writing

def _copy_metadata(reader, writer):
    """Copy every key-value pair but GGUF.* bookkeeping and the architecture (the writer adds it)."""
    gguf = _gguf()
    VT = gguf.GGUFValueType
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        main = field.types[0]
        value = field.contents()
        if main == VT.ARRAY:
            writer.add_key_value(name, value, main, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, main)


def _architecture(reader) -> str:
    field = reader.fields.get("general.architecture")
    return field.contents() if field is not None else "unknown"


class ConvertedTensor(NamedTuple):
    name: str
    shape: tuple
    type_before: str
    type_after: str
    bytes_before: int
    bytes_after: int
    rms_error: Optional[float]  # relative RMS error of the converted tensor, None if kept


def quantize_file(src, dst, *, to=quant.q4_k, progress: Optional[Callable[[str], None]] = None):
    """Convert the F32/F16/BF16 2-D tensors of ``src`` whose rows are whole ``to`` blocks to
    ``to`` (Q4_K: bit-identical to ggml's reference quantizer), keep every other tensor and all
    metadata, and write ``dst`` atomically (a temporary file renamed on success; nothing is
    written to ``dst`` on error).  Returns a list of ``ConvertedTensor``."""
    gguf = _gguf()
    if to not in ACCELERATED or to not in _registry.QUANTIZABLE:
        raise TypeError(f"quantize_file: 'to' must be a weight format, got {to!r}")
    dst = Path(dst)
    results = []
    with GGUFFile(src) as f:
        reader = f._reader
        fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent or ".")
        os.close(fd)
        try:
            writer = gguf.GGUFWriter(tmp, _architecture(reader))
            _copy_metadata(reader, writer)
            infos = f.tensors
            for k, info in enumerate(infos):
                t = f._tensors[info.name][1]
                convert = (info.format in (_formats.f32, _formats.f16, _formats.bf16)
                           and len(info.shape) == 2 and info.shape[-1] % to.block_size == 0)
                if convert:
                    values = f.dequantize(info.name)
                    blocks = values.reshape(-1, to.block_size)
                    recs = _quantize(blocks, format=to)
                    back = _dequantize(recs, to).reshape(values.shape)
                    denom = float(np.sqrt(np.mean(values.astype(np.float64) ** 2))) or 1.0
                    rms = float(np.sqrt(np.mean((back.astype(np.float64) - values) ** 2))) / denom
                    data = recs.reshape(info.shape[0], -1)
                    writer.add_tensor(info.name, data, raw_dtype=gguf.GGMLQuantizationType(to.ggml_type))
                    item = ConvertedTensor(info.name, info.shape, info.type_name, to.name,
                                           info.nbytes, int(recs.nbytes), rms)
                else:
                    # as stored: gguf-py maps a uint8 byte shape back to the element shape
                    writer.add_tensor(info.name, np.asarray(t.data), raw_dtype=t.tensor_type)
                    item = ConvertedTensor(info.name, info.shape, info.type_name, info.type_name,
                                           info.nbytes, info.nbytes, None)
                results.append(item)
                if progress:
                    progress(f"[{k + 1}/{len(infos)}] {info.name} {'x'.join(map(str, info.shape))} "
                             f"{item.type_before} -> {item.type_after}"
                             + (f" (relative RMS error {item.rms_error:.4f})"
                                if item.rms_error is not None else " (kept)"))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            os.replace(tmp, dst)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return results


def write_demo_model(path, *, dim: int = 512, seed: int = 0) -> Path:
    """Write a small model-shaped GGUF file (the CLI's embedded default): F32, F16 and BF16
    matrices with 256-multiple rows, a 1-D norm, a Q4_K and a Q8_0 matrix, and an IQ2_XXS matrix
    (random bytes) that numba_qk does not accelerate.  ``dim`` (a multiple of 256) is the model
    width; the FFN is twice as wide."""
    gguf = _gguf()
    if dim < 256 or dim % 256:
        raise ValueError(f"dim must be a positive multiple of 256, got {dim}")
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("numba_qk demo model")
    w.add_context_length(512)
    w.add_embedding_length(dim)
    w.add_block_count(1)
    w.add_key_value("numba_qk.generator", "numba_qk.gguf.write_demo_model", gguf.GGUFValueType.STRING)
    T = gguf.GGMLQuantizationType

    def mat(rows, cols, scale=0.02):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    d, ff = dim, 2 * dim
    w.add_tensor("token_embd.weight", mat(256, d))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(d, np.float32))
    w.add_tensor("blk.0.attn_q.weight", mat(d, d))
    w.add_tensor("blk.0.ffn_up.weight", mat(ff, d).astype(np.float16))
    bf = mat(d, ff).view(np.uint32)
    bf16 = ((bf + 0x7FFF + ((bf >> 16) & 1)) >> 16).astype(np.uint16)  # RNE to bfloat16
    w.add_tensor("blk.0.ffn_down.weight", bf16.view(np.uint8).reshape(d, 2 * ff),
                 raw_dtype=T.BF16)  # gguf-py maps the byte shape [d, 2*ff] to [d, ff]
    q4 = _quantize(mat(d, d).reshape(-1, 256), format=quant.q4_k).reshape(d, -1)
    w.add_tensor("blk.0.attn_k.weight", q4, raw_dtype=T.Q4_K)
    q8 = _quantize(mat(d, d).reshape(-1, 32), format=quant.q8_0).reshape(d, -1)
    w.add_tensor("blk.0.attn_v.weight", q8, raw_dtype=T.Q8_0)
    iq2 = rng.integers(0, 256, (256, d // 256, 66), dtype=np.uint8)
    iq2[:, :, 0:2] = 0  # d = 0 keeps the random IQ2_XXS bytes finite when dequantized
    w.add_tensor("output.weight", iq2.reshape(256, -1), raw_dtype=T.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
