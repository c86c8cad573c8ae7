"""GGUF files: zero-copy quantized tensors, accelerated matvec, a Q4_K converter.

Needs the optional extra ``gguf`` (``pip install 'numba_qk[gguf]'``: gguf-py's GGML type table
and numpy codecs).  numba_qk reads and writes the GGUF layout itself: the header is validated
completely and within bounds on open, and ``quantize_file`` streams (see docs/gguf.md's
reliability notes).

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

import hashlib
import mmap
import os
import secrets
import signal
import stat
import struct
import threading
from builtins import open as builtins_open
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from . import _registry
from . import formats as _formats
from .errors import QuantizationDomainError
from .formats import quant
from .formats.ggml_types import GGML_TYPE_NAMES, GGMLType
from .ops import dequantize as _dequantize
from .ops import matmul as _matmul
from .ops import quantize as _quantize

__all__ = ["GGUFError", "TensorInfo", "GGUFFile", "open", "quantize_file", "plan_file",
           "write_demo_model", "ACCELERATED", "accelerate_gguf_py", "restore_gguf_py",
           "GGUF_PY_ROUTED"]

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
    accelerated: bool     # records() + matmul: a numba_qk weight format, little-endian file

    @property
    def bits_per_weight(self) -> float:
        n = int(np.prod(self.shape)) if self.shape else 1
        return self.nbytes * 8 / n if n else 0.0


def _fmt_for(type_id: int):
    try:
        return _formats.from_ggml_type(type_id)
    except KeyError:
        return None


# ---------------------------------------------------------------------------------- the header
#
# numba_qk parses the GGUF header itself (gguf-py's GGUFReader loops over declared lengths and
# reads past the end of the file as empty arrays, so a 1 KB file could claim 2^63 array items).
# Every declared count and length is checked against the bytes that remain *before* anything is
# read or allocated; the parse is iterative (no recursion) and its work is bounded by the file
# size.  Arrays of arrays are rejected (ggml's own reader rejects them too).

GGML_MAX_DIMS = 4
_STRING, _ARRAY = 8, 9
# GGUF value type -> (name, numpy dtype code, size in bytes)
_SCALARS = {0: ("UINT8", "u1", 1), 1: ("INT8", "i1", 1), 2: ("UINT16", "u2", 2),
            3: ("INT16", "i2", 2), 4: ("UINT32", "u4", 4), 5: ("INT32", "i4", 4),
            6: ("FLOAT32", "f4", 4), 7: ("BOOL", "u1", 1), 10: ("UINT64", "u8", 8),
            11: ("INT64", "i8", 8), 12: ("FLOAT64", "f8", 8)}
_VT_NAMES = {k: v[0] for k, v in _SCALARS.items()} | {_STRING: "STRING", _ARRAY: "ARRAY"}
# GGML types stored as plain numpy elements (the rest are viewed as bytes, as gguf-py does)
_ELEMENT_DTYPES = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4",
                   "I64": "i8"}
# Where gguf-py's size table differs from ggml: block_q8_1 is {f16 d, f16 s, i8 qs[32]} in ggml
# (36 bytes, what numba_qk's Q8_1 records are); gguf-py still has the old 2 x f32 layout (40).
_SIZE_OVERRIDES = {GGMLType.Q8_1: (32, 36)}


def _type_table():
    gguf = _gguf()
    table = {}
    for t, (bs, ts) in gguf.GGML_QUANT_SIZES.items():
        table[int(t)] = (t.name, int(bs), int(ts))
    for t, (bs, ts) in _SIZE_OVERRIDES.items():
        if t in table:
            table[t] = (table[t][0], bs, ts)
    return table


class _KV(NamedTuple):
    key: str
    vtype: int
    itype: Optional[int]   # element type of an array
    count: int             # array length (1 for scalars and strings)
    value_at: int          # where the value (array: its first element) starts
    start: int             # the whole entry (key included): bytes [start, end)
    end: int


class _TensorEntry(NamedTuple):
    info: TensorInfo
    ne: tuple              # GGUF order (ne0 first), as stored
    start: int             # absolute byte range in the file
    end: int
    block_size: int
    type_size: int


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _Parser:
    """Bounded, iterative GGUF header parser over a read-only buffer."""

    def __init__(self, buf, size: int, where: str):
        self.buf, self.size, self.where, self.pos = buf, size, where, 0
        self.order = "<"

    def fail(self, what: str):
        raise GGUFError(f"{self.where}: truncated or corrupt GGUF file ({what})")

    def need(self, n: int, what: str):
        if n < 0 or self.pos + n > self.size:
            self.fail(f"{what} at byte {self.pos} needs {n} bytes, only "
                      f"{self.size - self.pos} remain")

    def uint(self, nbytes: int, what: str) -> int:
        self.need(nbytes, what)
        v = int.from_bytes(self.buf[self.pos:self.pos + nbytes],
                           "little" if self.order == "<" else "big")
        self.pos += nbytes
        return v

    def string(self, what: str, strict: bool = True):
        n = self.uint(8, f"length of {what}")
        self.need(n, f"{what} of {n} bytes")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        if not strict:
            return raw
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at byte {self.pos - n} is not valid UTF-8")

    def skip_value(self, vtype: int, key: str):
        """Step over one value; returns (itype, count, value_at)."""
        if vtype in _SCALARS:
            size = _SCALARS[vtype][2]
            self.need(size, f"value of {key!r}")
            at = self.pos
            self.pos += size
            return None, 1, at
        if vtype == _STRING:
            at = self.pos
            self.string(f"value of {key!r}", strict=False)
            return None, 1, at
        if vtype != _ARRAY:
            self.fail(f"key {key!r} has unknown value type {vtype}")
        itype = self.uint(4, f"element type of {key!r}")
        count = self.uint(8, f"length of {key!r}")
        at = self.pos
        remain = self.size - self.pos
        if itype == _ARRAY:
            raise GGUFError(f"{self.where}: key {key!r} is an array of arrays, which numba_qk "
                            f"does not read (ggml rejects them too)")
        if itype in _SCALARS:
            size = _SCALARS[itype][2]
            if count > remain // size:
                self.fail(f"key {key!r} declares {count} {_VT_NAMES[itype]} items but only "
                          f"{remain} bytes remain")
            self.pos += count * size
            return itype, count, at
        if itype != _STRING:
            self.fail(f"key {key!r} is an array of unknown value type {itype}")
        if count > remain // 8:
            self.fail(f"key {key!r} declares {count} strings but only {remain} bytes remain")
        buf, pos, size = self.buf, self.pos, self.size
        unpack = struct.Struct(self.order + "Q").unpack_from
        for i in range(count):  # each length is checked before the next one is read
            if pos + 8 > size:
                self.pos = pos
                self.fail(f"string {i} of {key!r} runs past the end of the file")
            n = unpack(buf, pos)[0]
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.fail(f"string {i} of {key!r} declares {n} bytes but only {size - pos} "
                          f"remain")
            pos += n
        self.pos = pos
        return itype, count, at


def _parse(buf, size: int, where: str):
    p = _Parser(buf, size, where)
    p.need(4, "magic")
    p.pos = 4
    version = p.uint(4, "version")
    if version & 0xFFFF == 0 and version:  # written on a machine of the other byte order
        p.order = ">"
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in (2, 3):
        raise GGUFError(f"{where}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors = p.uint(8, "tensor count")
    n_kv = p.uint(8, "key-value count")
    remain = size - p.pos
    if n_kv > remain // 13:  # the smallest entry: key length (8), type (4), a 1-byte value
        p.fail(f"{n_kv} key-value pairs declared but only {remain} bytes remain")
    kvs = {}
    for _ in range(n_kv):
        start = p.pos
        key = p.string("key")
        vtype = p.uint(4, f"value type of {key!r}")
        itype, count, at = p.skip_value(vtype, key)
        if key in kvs:
            raise GGUFError(f"{where}: key {key!r} appears twice (at bytes {kvs[key].start} and "
                            f"{start})")
        kvs[key] = _KV(key, vtype, itype, count, at, start, p.pos)

    alignment = 32
    if "general.alignment" in kvs:
        kv = kvs["general.alignment"]
        if kv.vtype != 4:
            raise GGUFError(f"{where}: general.alignment is {_VT_NAMES[kv.vtype]}, not UINT32")
        alignment = int.from_bytes(buf[kv.value_at:kv.value_at + 4],
                                   "little" if p.order == "<" else "big")
        if alignment == 0 or alignment & (alignment - 1):
            raise GGUFError(f"{where}: general.alignment is {alignment}, not a power of two")

    remain = size - p.pos
    if n_tensors > remain // 24:  # name length, n_dims, type, offset
        p.fail(f"{n_tensors} tensors declared but only {remain} bytes remain")
    table = _type_table()
    raw_infos = []
    names = set()
    for i in range(n_tensors):
        name = p.string(f"name of tensor {i}")
        if name in names:
            raise GGUFError(f"{where}: tensor name {name!r} appears twice")
        names.add(name)
        n_dims = p.uint(4, f"dimension count of {name!r}")
        if n_dims > GGML_MAX_DIMS:
            raise GGUFError(f"{where}: tensor {name!r} has {n_dims} dimensions (at most "
                            f"{GGML_MAX_DIMS})")
        ne = tuple(p.uint(8, f"dimensions of {name!r}") for _ in range(n_dims))
        type_id = p.uint(4, f"type of {name!r}")
        offset = p.uint(8, f"data offset of {name!r}")
        raw_infos.append((name, ne, type_id, offset))
    data_start = _align(p.pos, alignment)

    entries = {}
    for name, ne, type_id, offset in raw_infos:
        if type_id not in table:
            raise GGUFError(f"{where}: tensor {name!r} has unknown GGML type {type_id}")
        type_name, bs, ts = table[type_id]
        nelem = 1
        for d in ne:
            if d >= 2**63:
                raise GGUFError(f"{where}: tensor {name!r} has a negative dimension ({d - 2**64})")
            nelem *= d
        if nelem >= 2**63:
            raise GGUFError(f"{where}: tensor {name!r} has {nelem} elements (over 2^63)")
        ne0 = ne[0] if ne else 1
        if ne0 % bs:
            raise GGUFError(f"{where}: tensor {name!r} is {type_name} (blocks of {bs}) but its "
                            f"rows have {ne0} elements")
        nbytes = nelem // bs * ts
        if offset % alignment:
            raise GGUFError(f"{where}: tensor {name!r} has data offset {offset}, not a multiple "
                            f"of the alignment {alignment}")
        start = data_start + offset
        end = start + nbytes
        if end > size:
            raise GGUFError(f"{where}: truncated or corrupt GGUF file: tensor {name!r} needs "
                            f"bytes [{start}, {end}) but the file has {size} bytes (truncated "
                            f"file, or a byte size that does not match its shape and type)")
        fmt = _fmt_for(type_id)
        shape = tuple(reversed(ne))
        # records()/matmul read little-endian block records only
        info = TensorInfo(name, shape, type_id, type_name, fmt, nbytes,
                          fmt in ACCELERATED and p.order == "<")
        entries[name] = _TensorEntry(info, ne, start, end, bs, ts)
    spans = sorted((e.start, e.end, n) for n, e in entries.items() if e.end > e.start)
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise GGUFError(f"{where}: tensors {n0!r} (bytes [{s0}, {e0})) and {n1!r} (bytes "
                            f"[{s1}, {e1})) overlap")
    return dict(version=version, order=p.order, kvs=kvs, alignment=alignment,
                data_start=data_start, header_end=p.pos, tensors=entries)


def _kv_value(buf, kv: _KV, order: str):
    """The Python value of one key-value entry (arrays as lists)."""
    byteorder = "little" if order == "<" else "big"

    def text(raw):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def strings(at, count):
        out = []
        for _ in range(count):
            n = int.from_bytes(buf[at:at + 8], byteorder)
            out.append(text(bytes(buf[at + 8:at + 8 + n])))
            at += 8 + n
        return out

    def scalars(t, at, count):
        _, code, size = _SCALARS[t]
        arr = np.frombuffer(bytes(buf[at:at + count * size]), dtype=np.dtype(order + code))
        return arr.astype(bool).tolist() if t == 7 else arr.tolist()

    if kv.vtype == _ARRAY:
        if kv.itype == _STRING:
            return strings(kv.value_at, kv.count)
        return scalars(kv.itype, kv.value_at, kv.count)
    if kv.vtype == _STRING:
        return strings(kv.value_at, 1)[0]
    return scalars(kv.vtype, kv.value_at, 1)[0]


class GGUFFile:
    """An open GGUF file (memory-mapped read-only).  Use as a context manager or call close().

    Arrays returned by ``records()``, ``raw()`` and ``matmul()``'s inputs are views of the memory
    map and keep it alive: ``close()`` releases the file's own reference, and the map is unmapped
    only when the last view is gone.  The header is validated completely on open (see
    docs/gguf.md's reliability notes); a file whose bytes change while it is open is not supported.
    """

    def __init__(self, path):
        _gguf()
        self.path = Path(path)
        self._mm = None
        self._fh = None
        self._tensors = {}
        where = str(self.path)
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):  # (opening a FIFO would block)
                raise GGUFError(f"{where}: not a regular file")
            fh = builtins_open(self.path, "rb")
        except FileNotFoundError:
            raise GGUFError(f"{where}: no such file") from None
        except IsADirectoryError:
            raise GGUFError(f"{where}: not a regular file") from None
        try:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise GGUFError(f"{where}: not a regular file")
            size = st.st_size
            magic = fh.read(4)
            if magic != b"GGUF":
                raise GGUFError(f"{where}: not a GGUF file (it starts with {magic!r}, "
                                f"not b'GGUF')")
            if size < 24:
                raise GGUFError(f"{where}: truncated or corrupt GGUF file ({size} bytes, shorter "
                                f"than the 24-byte header)")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            fh.close()
            raise
        self._fh, self._mm, self._size, self._stat = fh, mm, size, st
        try:
            h = _parse(mm, size, where)
        except BaseException:
            self.close()
            raise
        self.version = h["version"]
        self.big_endian = h["order"] == ">"
        self.alignment = h["alignment"]
        self.data_offset = h["data_start"]
        self._order = h["order"]
        self._kvs = h["kvs"]
        self._header_end = h["header_end"]
        self._tensors = h["tensors"]

    # -- listing --------------------------------------------------------------------------
    @property
    def tensors(self) -> list:
        return [e.info for e in self._tensors.values()]

    def tensor(self, name: str) -> TensorInfo:
        return self._entry(name).info

    @property
    def metadata(self) -> dict:
        """Key-value metadata as Python values (arrays as lists), in file order."""
        mm = self._map()
        return {k: _kv_value(mm, kv, self._order) for k, kv in self._kvs.items()}

    def _entry(self, name) -> _TensorEntry:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def _map(self):
        if self._mm is None:
            raise GGUFError(f"{self.path}: the file is closed")
        return self._mm

    def _bytes(self, e: _TensorEntry) -> np.ndarray:
        """u8 [nbytes] read-only view of the map; its base chain holds the map."""
        mm = self._map()
        n = e.end - e.start
        if n == 0:
            empty = np.zeros(0, np.uint8)
            empty.flags.writeable = False
            return empty
        return np.frombuffer(mm, dtype=np.uint8, count=n, offset=e.start)

    # -- data -----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The tensor's data as stored, a read-only view of the memory map: F32/F16/F64/I8..I64
        as numpy elements in numpy shape (byte order as stored), every other type as bytes
        ``u8 [..., row_bytes]`` (gguf-py's layout)."""
        e = self._entry(name)
        data = self._bytes(e)
        shape = e.info.shape
        code = _ELEMENT_DTYPES.get(e.info.type_name)
        if code is not None:
            return data.view(np.dtype(self._order + code)).reshape(shape)
        if not shape:
            return data
        return data.reshape(shape[:-1] + (shape[-1] // e.block_size * e.type_size,))

    def records(self, name: str) -> np.ndarray:
        """Zero-copy typed records ``u8 [rows, G, block_bytes]`` of a block-quantized tensor
        (rows = product of all but the last axis).  A read-only view of the memory map that
        keeps the map alive (valid after ``close()``)."""
        e = self._entry(name)
        info, fmt = e.info, e.info.format
        if fmt is None or not fmt.is_quantized:
            raise GGUFError(f"tensor {name!r} is {info.type_name}, not a block-quantized format "
                            f"numba_qk models")
        if self.big_endian:
            raise GGUFError(f"{self.path}: tensor {name!r}: big-endian GGUF file; numba_qk reads "
                            f"block records in little-endian files only")
        rows = int(np.prod(info.shape[:-1], dtype=object)) if len(info.shape) > 1 else 1
        g = info.shape[-1] // fmt.block_size
        return self._bytes(e).reshape(rows, g, fmt.block_bytes)

    def dequantize(self, name: str) -> np.ndarray:
        """float32 values in the tensor's numpy shape.  numba_qk's formats and F32/F16/BF16 are
        decoded by numba_qk; other GGML types are delegated to gguf-py's numpy codecs where it
        has one (``GGUFError`` otherwise)."""
        e = self._entry(name)
        info, fmt = e.info, e.info.format
        if fmt is not None and fmt.is_quantized:
            recs = self.records(name)
            flat = recs.reshape(-1, fmt.block_bytes)
            if flat.shape[0] == 0:
                return np.zeros(info.shape, np.float32)
            return _dequantize(flat, fmt).reshape(info.shape)
        if fmt is _formats.f32 or fmt is _formats.f16:  # a new array, as for every type
            return np.array(self.raw(name), dtype=np.float32).reshape(info.shape)
        if fmt is _formats.bf16:
            bits = self._bytes(e).view(np.dtype(self._order + "u2")).astype(np.uint32) << 16
            return bits.view(np.float32).reshape(info.shape)
        if self.big_endian:
            raise GGUFError(f"tensor {name!r}: {info.type_name} in a big-endian GGUF file is not "
                            f"supported")
        gguf = _gguf()
        try:
            return np.asarray(gguf.quants.dequantize(np.asarray(self.raw(name)),
                                                     gguf.GGMLQuantizationType(info.ggml_type)),
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
    @property
    def closed(self) -> bool:
        return self._mm is None

    def close(self):
        """Release the file.  Views handed out earlier stay valid: the map is unmapped now if
        none is alive, else when the last one is garbage-collected (never under a live view)."""
        mm, fh = self._mm, self._fh
        self._mm = self._fh = None
        if mm is not None:
            try:
                mm.close()  # refuses (BufferError) while a numpy view still exports the buffer
            except BufferError:
                pass
        if fh is not None:
            fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open(path) -> GGUFFile:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a GGUF file read-only (memory-mapped)."""
    return GGUFFile(path)


# ------------------------------------------------------------------------------------- writing

class ConvertedTensor(NamedTuple):
    name: str
    shape: tuple
    type_before: str
    type_after: str
    bytes_before: int
    bytes_after: int
    rms_error: Optional[float]  # relative RMS error of the converted tensor, None if kept


# f32 values handled per conversion step: bounds quantize_file's working set (about 6x this:
# the input chunk, f32 values, records, the decoded check values and two float64 temporaries).
CHUNK_BYTES = 8 << 20
TEMP_MARK = ".numba_qk-tmp-"


#: Longest file name (bytes) most file systems take (NAME_MAX).
_NAME_MAX = 255
# a temp name is the prefix + "<pid>-<8 hex>" (pid at most 7 digits on Linux, 10 elsewhere)
_TEMP_SUFFIX_MAX = 10 + 1 + 8


def _temp_prefix(dst: Path) -> str:
    """Prefix of ``dst``'s temp files: ``.<name>.numba_qk-tmp-``, or, where that would make a
    name longer than NAME_MAX (an output name of over 226 bytes), ``.<hash of the name>…``."""
    prefix = "." + dst.name + TEMP_MARK
    if len(os.fsencode(prefix)) + _TEMP_SUFFIX_MAX > _NAME_MAX:
        digest = hashlib.sha256(os.fsencode(dst.name)).hexdigest()[:24]
        prefix = "." + digest + TEMP_MARK
    return prefix


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale_temps(dst: Path, say) -> None:
    """Remove temporary files of earlier runs for the same OUT whose process is gone (a run
    killed with SIGKILL cannot clean up).  Only regular files we own, named exactly like ours."""
    prefix = _temp_prefix(dst)
    try:
        names = os.listdir(dst.parent)
    except OSError:
        return
    for n in names:
        if not n.startswith(prefix):
            continue
        pid_text = n[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        path = dst.parent / n
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != getattr(os, "getuid", lambda: st.st_uid)():
            continue
        pid = int(pid_text)
        if pid != os.getpid() and not _pid_alive(pid):
            try:
                os.unlink(path)
                say(f"removed a stale temporary file {path} (left by process {pid}, which is "
                    f"no longer running)")
            except OSError:
                pass
        elif pid != os.getpid():
            say(f"note: {path} belongs to process {pid}, still running (another conversion to "
                f"the same output?)")


_KINDS = [(stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device")]


def _check_destination(dst: Path, src_stat) -> None:
    """OUT must be a new name or an existing regular file that is not the input."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        if not dst.parent.is_dir():
            raise GGUFError(f"{dst}: the output directory {dst.parent} does not exist") from None
        return
    for test, kind in _KINDS:
        if test(st.st_mode):
            target = ""
            if kind == "a symbolic link":
                target = f" to {os.readlink(dst)}"
                try:
                    if os.path.samestat(os.stat(dst), src_stat):
                        raise GGUFError(f"{dst}: the output is the input file (through a "
                                        f"symbolic link); refusing to overwrite the input")
                except OSError:
                    pass
            raise GGUFError(f"{dst}: the output exists and is {kind}{target}; refusing to "
                            f"replace it (remove it, or name a regular file)")
    if os.path.samestat(st, src_stat):
        raise GGUFError(f"{dst}: the output is the input file; refusing to overwrite the input")


class _Terminated(BaseException):
    pass


class _SignalCleanup:
    """While writing: SIGTERM/SIGHUP (when they would kill the process) first remove the
    temporary file, then kill the process as before.  Main thread only (Python's rule)."""

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __init__(self):
        self.saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                if signal.getsignal(s) == signal.SIG_DFL:
                    self.saved[s] = signal.signal(s, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise _Terminated(signum)

    def restore(self):
        for s, h in self.saved.items():
            signal.signal(s, h)
        self.saved = {}

    def __exit__(self, exc_type, exc, tb):
        self.restore()
        if exc_type is _Terminated:  # the temp file is gone (caller's cleanup); die as before
            signal.raise_signal(exc.args[0])
        return False


def _f32_chunk(raw: np.ndarray, fmt) -> np.ndarray:
    if fmt is _formats.f32:
        return raw.view("<f4")
    if fmt is _formats.f16:
        return raw.view("<f2").astype(np.float32)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)  # bf16


def _pread_into(fd: int, buf: np.ndarray, offset: int, where: str) -> None:
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [view[done:]], offset + done)
        else:  # pragma: no cover - platforms without preadv (macOS < 11)
            chunk = os.pread(fd, len(view) - done, offset + done)
            n = len(chunk)
            view[done:done + n] = chunk
        if n <= 0:
            raise GGUFError(f"{where}: the file shrank while being read")
        done += n


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while len(view):
        n = os.write(fd, view)
        view = view[n:]


def _convert_stream(f, e: _TensorEntry, to, out_fd: int) -> tuple:
    """Quantize one F32/F16/BF16 tensor to ``to`` block-chunk by block-chunk, writing the
    records as they are produced.  Returns (bytes written, relative RMS error)."""
    fmt, bs = e.info.format, to.block_size
    esize = 4 if fmt is _formats.f32 else 2
    nblocks = int(np.prod(e.info.shape, dtype=object)) // bs
    step = max(1, CHUNK_BYTES // (bs * 4))
    inbuf = np.empty(min(step, max(nblocks, 1)) * bs * esize, np.uint8)
    recs_buf = np.empty((min(step, max(nblocks, 1)), to.block_bytes), np.uint8)
    back_buf = np.empty((min(step, max(nblocks, 1)), bs), np.float32)
    sum_sq = sum_err = 0.0
    written = 0
    fd = f._fh.fileno()
    for b0 in range(0, nblocks, step):
        nb = min(step, nblocks - b0)
        raw = inbuf[:nb * bs * esize]
        _pread_into(fd, raw, e.start + b0 * bs * esize, str(f.path))
        values = _f32_chunk(raw, fmt).reshape(nb, bs)
        recs = recs_buf[:nb]
        try:
            _quantize(values, format=to, out=recs)
        except QuantizationDomainError as err:
            raise GGUFError(f"{f.path}: tensor {e.info.name!r}: block {b0 + err.block} (of "
                            f"{nblocks}): {err.reason}") from None
        back = _dequantize(recs, to, out=back_buf[:nb])
        v64 = values.astype(np.float64)
        sum_sq += float(np.dot(v64.ravel(), v64.ravel()))
        v64 -= back
        sum_err += float(np.dot(v64.ravel(), v64.ravel()))
        del v64
        _write_all(out_fd, recs)
        written += recs.nbytes
    n = nblocks * bs
    rms = (sum_err / n) ** 0.5 / ((sum_sq / n) ** 0.5 or 1.0) if n else 0.0
    return written, rms


def _copy_stream(f, e: _TensorEntry, out_fd: int) -> int:
    n = e.end - e.start
    buf = np.empty(min(n, CHUNK_BYTES), np.uint8)
    fd = f._fh.fileno()
    for o in range(0, n, CHUNK_BYTES):
        k = min(CHUNK_BYTES, n - o)
        _pread_into(fd, buf[:k], e.start + o, str(f.path))
        _write_all(out_fd, buf[:k])
    return n


def _cast_stream(f, e: _TensorEntry, to, out_fd: int) -> int:
    """Convert one F32/F16/BF16 tensor to the float type ``to`` (F32, F16 or BF16) in chunks,
    with ggml's conversions (``ggml_fp32_to_fp16_row`` / ``ggml_fp32_to_bf16_row``): F16 by IEEE
    round-to-nearest-even (overflow to inf; every NaN becomes sign | 0x7E00),
    BF16 by ggml's ``ggml_compute_fp32_to_bf16`` (nearest-even on the top 16 bits, NaN kept
    quiet).  Returns the bytes written."""
    fmt = e.info.format
    esize = 4 if fmt is _formats.f32 else 2
    n = int(np.prod(e.info.shape, dtype=object))
    step = max(1, CHUNK_BYTES // 4)
    inbuf = np.empty(min(step, max(n, 1)) * esize, np.uint8)
    written = 0
    fd = f._fh.fileno()
    for i0 in range(0, n, step):
        k = min(step, n - i0)
        raw = inbuf[:k * esize]
        _pread_into(fd, raw, e.start + i0 * esize, str(f.path))
        values = _f32_chunk(raw, fmt)
        if to is _formats.f32:
            out = values
        elif to is _formats.f16:
            with np.errstate(over="ignore", invalid="ignore"):
                out = values.astype("<f2").view("<u2")
            u = values.view(np.uint32)
            nan = (u & 0x7FFFFFFF) > 0x7F800000  # ggml: NaN -> sign | 0x7E00, payload dropped
            out = np.where(nan, ((u >> 16) & 0x8000) | 0x7E00, out).astype("<u2")
        else:  # bf16
            u = values.view(np.uint32)
            nan = (u & 0x7FFFFFFF) > 0x7F800000
            r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
            out = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r).astype("<u2")
        _write_all(out_fd, out)
        written += out.nbytes
    return written


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode("utf-8")
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


def plan_file(src, preset, **options):
    """llama.cpp's per-tensor choice for a GGUF file under a ``llama-quantize`` preset (see
    :func:`numba_qk.presets.plan`; ``options`` are its keywords, e.g. ``pure=True``).  Reads
    only the header.  Returns a :class:`numba_qk.presets.Plan`."""
    from . import presets

    with GGUFFile(src) as f:
        tensors = [(e.info.name, e.ne, e.info.ggml_type) for e in f._tensors.values()]
        return presets.plan(preset, f.metadata, tensors, **options)


def _preset_jobs(f, plan):
    """(entry, target) in the plan's order; target None = copy unchanged."""
    jobs = []
    for t in plan.tensors:
        e = f._tensors[t.name]
        if not t.convert:
            jobs.append((e, None))
            continue
        target = _fmt_for(t.target)
        name = GGML_TYPE_NAMES.get(t.target, str(t.target))
        if e.info.format not in (_formats.f32, _formats.f16, _formats.bf16):
            raise GGUFError(f"{f.path}: tensor {t.name!r} is {e.info.type_name}; numba_qk "
                            f"converts F32/F16/BF16 tensors only (no requantizing)")
        if not (target in (_formats.f32, _formats.f16, _formats.bf16)
                or (target in ACCELERATED and target in _registry.QUANTIZABLE)):
            raise GGUFError(f"{f.path}: preset {plan.preset.name} gives tensor {t.name!r} type "
                            f"{name} ({t.reason}), which numba_qk cannot encode yet")
        jobs.append((e, target))
    return jobs


def _single_format_jobs(f, to):
    jobs = []
    for e in f._tensors.values():
        info = e.info
        convert = (info.format in (_formats.f32, _formats.f16, _formats.bf16)
                   and len(info.shape) == 2 and info.shape[-1] % to.block_size == 0)
        jobs.append((e, to if convert else None))
    return jobs


def _target_nbytes(e: _TensorEntry, target) -> int:
    if target is None:
        return e.end - e.start
    return int(np.prod(e.info.shape, dtype=object)) // target.block_size * target.block_bytes


def quantize_file(src, dst, *, to=None, preset=None,
                  progress: Optional[Callable[[str], None]] = None, **preset_options):
    """Convert a GGUF file and write ``dst``.  Two modes:

    * ``to=FORMAT`` (default ``quant.q4_k``): every F32/F16/BF16 2-D tensor whose rows are
      whole ``to`` blocks becomes ``to`` (bit-identical to ggml's reference quantizer); every
      other tensor and all metadata are kept byte for byte, in file order.
    * ``preset=NAME`` (``"Q4_K_M"``, ``"q5_k_m"``, ``"Q4_K"`` = Q4_K_M, …): llama.cpp's
      ``llama-quantize`` preset -- each tensor gets the type llama.cpp's rules give it
      (:func:`plan_file`; ``preset_options`` are :func:`numba_qk.presets.plan`'s keywords such
      as ``pure=True``), tensors are written in llama.cpp's order, and ``general.file_type`` /
      ``general.quantization_version`` are set as llama.cpp sets them.  A preset that needs a
      type numba_qk cannot encode, or an importance matrix, is refused before anything is
      written.

    Both modes honour the input's ``general.alignment``.  Streaming: each tensor is converted
    and written in chunks (``CHUNK_BYTES`` of f32 values at a time), so memory use does not grow
    with the tensor or file size.  Atomic: the output goes to ``.DST.numba_qk-tmp-PID-XXXX``
    beside ``dst`` (mode from the umask), is fsync'ed and renamed over ``dst`` on success; on
    any error, Ctrl-C, SIGTERM or SIGHUP the temporary file is removed and ``dst`` is untouched.
    Temporary files left by a killed run (SIGKILL) are removed by the next run to the same
    ``dst``.  Refuses (``GGUFError``) when ``dst`` is the input (same inode, through any path or
    link), a symbolic link, or not a regular file; refuses big-endian input files.  Returns a
    list of ``ConvertedTensor`` in the order written."""
    if preset is not None and to is not None:
        raise TypeError("quantize_file: give either 'to' (one format) or 'preset', not both")
    if preset_options and preset is None:
        raise TypeError(f"quantize_file: {', '.join(sorted(preset_options))} apply to presets "
                        f"only")
    if preset is None:
        to = quant.q4_k if to is None else to
        if to not in ACCELERATED or to not in _registry.QUANTIZABLE:
            raise TypeError(f"quantize_file: 'to' must be a weight format, got {to!r}")
    say = progress or (lambda line: None)
    dst = Path(dst)
    results = []
    with GGUFFile(src) as f:
        if f.big_endian:
            raise GGUFError(f"{f.path}: big-endian GGUF files are not supported by quantize "
                            f"(convert it to little-endian first)")
        kv_set = {}
        if preset is not None:
            from . import presets

            tensors = [(e.info.name, e.ne, e.info.ggml_type) for e in f._tensors.values()]
            try:
                the_plan = presets.plan(preset, f.metadata, tensors, **preset_options)
            except presets.PresetError as err:
                raise GGUFError(f"{f.path}: {err}") from None
            jobs = _preset_jobs(f, the_plan)
            kv_set = dict(the_plan.kv)
        else:
            jobs = _single_format_jobs(f, to)
        _check_destination(dst, f._stat)
        _clean_stale_temps(dst, say)
        mm = f._map()
        plan = [(e, target, target.ggml_type if target is not None else e.info.ggml_type,
                 _target_nbytes(e, target)) for e, target in jobs]
        # the header: counts, the key-value entries byte for byte (keys a preset sets are
        # removed and appended anew, as llama.cpp's gguf_set_val does), then the tensor infos
        kvs = [mm[kv.start:kv.end] for k, kv in f._kvs.items() if k not in kv_set]
        kvs += [_kv_u32(k, v) for k, v in kv_set.items()]
        head = bytearray(b"GGUF")
        head += struct.pack("<IQQ", 3, len(plan), len(kvs))
        for raw in kvs:
            head += raw
        offset = 0
        for e, _, type_id, nbytes in plan:
            name = e.info.name.encode("utf-8")
            head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(e.ne))
            head += struct.pack(f"<{len(e.ne)}Q", *e.ne) + struct.pack("<IQ", type_id, offset)
            offset = _align(offset + nbytes, f.alignment)
        head += bytes(_align(len(head), f.alignment) - len(head))

        tmp = dst.parent / f"{_temp_prefix(dst)}{os.getpid()}-{secrets.token_hex(4)}"
        guard = _SignalCleanup()
        with guard:
            fd = -1
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                fd = os.open(tmp, flags, 0o666)  # the umask decides the mode, as for any file
                _write_all(fd, head)
                for k, (e, target, _, nbytes) in enumerate(plan):
                    info = e.info
                    rms = None
                    if target is None:
                        written = _copy_stream(f, e, fd)
                    elif target.is_quantized:
                        written, rms = _convert_stream(f, e, target, fd)
                    else:
                        written = _cast_stream(f, e, target, fd)
                    if written != nbytes:  # pragma: no cover - an internal invariant
                        raise GGUFError(f"{info.name}: wrote {written} bytes, planned {nbytes}")
                    _write_all(fd, bytes(_align(nbytes, f.alignment) - nbytes))
                    item = ConvertedTensor(info.name, info.shape, info.type_name,
                                           target.name if target is not None else info.type_name,
                                           info.nbytes, nbytes, rms)
                    results.append(item)
                    say(f"[{k + 1}/{len(plan)}] {info.name} {'x'.join(map(str, info.shape))} "
                        f"{item.type_before} -> {item.type_after}"
                        + (f" (relative RMS error {item.rms_error:.4f})"
                           if item.rms_error is not None else
                           " (kept)" if target is None else ""))
                os.fsync(fd)
                os.close(fd)
                fd = -1
                os.replace(tmp, dst)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        try:  # make the rename itself durable
            dfd = os.open(dst.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
    return results


# ----------------------------------------------------------------------------- gguf-py backend

# Formats whose gguf-py codecs numba_qk can stand in for, bit for bit (tests/io/test_gguf_py_accel.py
# checks each against gguf-py's own output).  Dequantize: every weight format gguf-py decodes.
# Quantize: the legacy formats (gguf-py's numpy encoders, themselves ggml's _ref except for the
# sign of a zero extreme, below) and the K-quants, which gguf-py cannot encode
# (NotImplementedError) and numba_qk encodes as ggml's quantize_row_*_ref; MXFP4 (gguf-py's
# numpy encoder gives ggml's bytes, tested) and NVFP4 (gguf-py decodes only; its decoder equals
# ggml's, tested).  Not routed: Q8_1
# (gguf-py sizes it 40 B, ggml 36 B, and has no codec), Q8_K (no gguf-py codec; numba_qk's Q8_K
# quantizer is spec 000's, not ggml's).
GGUF_PY_ROUTED = tuple(f for f in _registry.WEIGHTS)
_GGUF_PY_ORIGINAL: dict = {}   # {"quantize": fn, "dequantize": fn} while accelerated
_GGUF_PY_LOCK = threading.Lock()  # accelerate/restore are check-then-patch sequences
_SIGNED_ZERO_FALLBACK = (quant.q4_0, quant.q4_1, quant.q5_0, quant.q5_1)


def _gguf_py_routes():
    g = _gguf()
    return {int(getattr(g.GGMLQuantizationType, f.name)): f for f in GGUF_PY_ROUTED}


def _gguf_py_records(data, fmt):
    """``data`` as a plain uint8 ndarray view of ``fmt`` records when gguf-py would read it as
    such, else None (gguf-py's own code then runs and gives its own result or error).

    gguf-py accepts any ndarray, subclasses included (``GGUFReader`` hands out ``np.memmap``
    rows), reinterprets it with ``.view(np.uint8)``, and computes its output shape from the
    *unviewed* shape: so a byte-sized dtype (uint8/int8) whose last axis is contiguous is
    routed; wider dtypes (gguf-py: "Output array is the wrong shape"), a strided last axis
    ("the last axis must be contiguous") and bad row sizes stay gguf-py's."""
    if (not isinstance(data, np.ndarray) or data.dtype.itemsize != 1 or data.ndim == 0
            or data.size == 0 or data.shape[-1] % fmt.block_bytes
            or data.strides[-1] != 1):
        return None
    return data.view(np.ndarray).view(np.uint8)


def _routed_dequantize(original, routes):
    def dequantize(data, qtype):
        fmt = routes.get(_as_int(qtype))
        arr = None if fmt is None else _gguf_py_records(data, fmt)
        if arr is None:
            return original(data, qtype)
        shape = (*arr.shape[:-1], arr.shape[-1] // fmt.block_bytes * fmt.block_size)
        rec = np.ascontiguousarray(arr).reshape(-1, fmt.block_bytes)
        return _dequantize(rec, fmt).reshape(shape)
    dequantize.__wrapped__ = original
    dequantize.__doc__ = "gguf-py's dequantize, routed through numba_qk (accelerate_gguf_py)."
    return dequantize


def _routed_quantize(original, routes):
    def quantize(data, qtype):
        fmt = routes.get(_as_int(qtype))
        if (fmt is None or fmt not in _registry.QUANTIZABLE or not isinstance(data, np.ndarray)
                or data.ndim == 0 or data.size == 0 or data.shape[-1] % fmt.block_size):
            return original(data, qtype)  # other types, lazy tensors, gguf-py's own errors
        x = np.ascontiguousarray(data.view(np.ndarray).astype(np.float32, copy=False)
                                 ).reshape(-1, fmt.block_size)
        try:
            rec = _quantize(x, format=fmt)
        except QuantizationDomainError:
            return original(data, qtype)  # non-finite values: gguf-py's own (non-ggml) bytes
        if fmt in _SIGNED_ZERO_FALLBACK:
            # gguf-py takes its extremes with numpy (argmax |x|, min, max), whose choice between
            # -0.0 and +0.0 is not ggml's C loop's: blocks whose extreme is a zero take gguf-py's
            # own bytes (blocks are independent).
            amb = (x.min(axis=1) == 0) | (x.max(axis=1) == 0)
            if amb.any():
                rec[amb] = np.asarray(original(x[amb], qtype)).reshape(-1, fmt.block_bytes)
        return rec.reshape(*data.shape[:-1], data.shape[-1] // fmt.block_size * fmt.block_bytes)
    quantize.__wrapped__ = original
    quantize.__doc__ = "gguf-py's quantize, routed through numba_qk (accelerate_gguf_py)."
    return quantize


def _as_int(qtype):
    try:
        return int(qtype)
    except (TypeError, ValueError):
        return None


def accelerate_gguf_py() -> tuple:
    """Route gguf-py's ``gguf.quants.quantize`` / ``dequantize`` (and the ``gguf.quantize`` /
    ``gguf.dequantize`` re-exports) through numba_qk for the formats in ``GGUF_PY_ROUTED``:
    same bytes and values as gguf-py, faster.  ndarray subclasses (``GGUFReader``'s memmaps)
    are routed as plain views; every other type, lazy tensors, non-finite inputs and inputs
    gguf-py reads another way or rejects (``_gguf_py_records``) still go to gguf-py's own code.
    Idempotent and thread-safe; ``restore_gguf_py()`` undoes it.  Code
    that bound the functions before the call (``from gguf.quants import dequantize``) keeps the
    originals.  Returns the routed formats."""
    g = _gguf()
    with _GGUF_PY_LOCK:
        if _GGUF_PY_ORIGINAL:
            return GGUF_PY_ROUTED
        routes = _gguf_py_routes()
        q, dq = g.quants.quantize, g.quants.dequantize
        _GGUF_PY_ORIGINAL.update(quantize=q, dequantize=dq)
        new_q, new_dq = _routed_quantize(q, routes), _routed_dequantize(dq, routes)
        for mod in (g.quants, g):
            if getattr(mod, "quantize", None) is q:
                mod.quantize = new_q
            if getattr(mod, "dequantize", None) is dq:
                mod.dequantize = new_dq
    return GGUF_PY_ROUTED


def restore_gguf_py() -> None:
    """Undo ``accelerate_gguf_py`` (a no-op when not accelerated)."""
    with _GGUF_PY_LOCK:
        if not _GGUF_PY_ORIGINAL:
            return
        g = _gguf()
        for name, original in _GGUF_PY_ORIGINAL.items():
            for mod in (g.quants, g):
                if getattr(getattr(mod, name, None), "__wrapped__", None) is original:
                    setattr(mod, name, original)
        _GGUF_PY_ORIGINAL.clear()


def write_demo_model(path, *, dim: int = 512, seed: int = 0) -> Path:
    """Write a small model-shaped GGUF file (the CLI's embedded default): F32, F16 and BF16
    matrices with 256-multiple rows, a 1-D norm, a Q4_K and a Q8_0 matrix, and an IQ2_XXS matrix
    (random bytes, d = 0; numba_qk has no IQ2_XXS encoder).  ``dim`` (a multiple of 256) is the model
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
