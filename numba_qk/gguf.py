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
import re
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
from .tensor import Tensor

__all__ = ["GGUFError", "TensorInfo", "GGUFFile", "open", "quantize_file", "plan_file",
           "split_path", "split_prefix", "split_file", "merge_file", "read_imatrix", "Imatrix",
           "parse_kv_override",
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
# Types of llama.cpp 0.3.36's ggml that gguf-py (0.19) does not size: block_q2_0 is
# {f16 d, u8 qs[16]} per 64 values (ggml-common.h); the Q2_0 preset gives it
_SIZE_MISSING = {GGMLType.Q2_0: ("Q2_0", 64, 18)}


def _type_table():
    gguf = _gguf()
    table = {}
    for t, (bs, ts) in gguf.GGML_QUANT_SIZES.items():
        table[int(t)] = (t.name, int(bs), int(ts))
    for t, (bs, ts) in _SIZE_OVERRIDES.items():
        if t in table:
            table[t] = (table[t][0], bs, ts)
    for t, entry in _SIZE_MISSING.items():
        table.setdefault(int(t), entry)
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
    shard: int = 0         # which file of a split model (0: the first, or the only one)


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


# ------------------------------------------------------------------------------ split models

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"


def split_suffix(idx: int, count: int) -> str:
    return f"-{idx + 1:05d}-of-{count:05d}.gguf"


def split_path(prefix, idx: int, count: int) -> str:
    """llama.cpp's ``llama_split_path``: ``<prefix>-0000K-of-0000N.gguf`` for shard ``idx``
    (0-based) of ``count``."""
    return f"{prefix}{split_suffix(idx, count)}"


def split_prefix(path, idx: int, count: int):
    """llama.cpp's ``llama_split_prefix``: ``path`` without ``-0000K-of-0000N.gguf``, or None
    when it does not end so."""
    path = str(path)
    suffix = split_suffix(idx, count)
    if len(path) <= len(suffix) or not path.endswith(suffix):
        return None
    return path[:-len(suffix)]


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
        self._shards = []      # [(fh, mm, size, stat, path)], the first is this file
        self._tensors = {}
        try:
            fh, mm, size, st = self._open_one(self.path)
            self._shards.append((fh, mm, size, st, self.path))
            self._fh, self._mm, self._size, self._stat = fh, mm, size, st
            h = _parse(mm, size, str(self.path))
            self.version = h["version"]
            self.big_endian = h["order"] == ">"
            self.alignment = h["alignment"]
            self.data_offset = h["data_start"]
            self._order = h["order"]
            self._kvs = h["kvs"]
            self._header_end = h["header_end"]
            self._tensors = h["tensors"]
            self._open_splits()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open_one(path: Path):
        where = str(path)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # (opening a FIFO would block)
                raise GGUFError(f"{where}: not a regular file")
            fh = builtins_open(path, "rb")
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
        return fh, mm, size, st

    def _split_int(self, kvs, buf, order, key, where):
        kv = kvs.get(key)
        if kv is None:
            return None
        if kv.vtype not in _SCALARS or kv.vtype in (6, 7, 12):
            raise GGUFError(f"{where}: {key} is {_VT_NAMES.get(kv.vtype, kv.vtype)}, not an "
                            f"integer")
        return int(_kv_value(buf, kv, order))

    def _open_splits(self):
        """A split model (``split.count`` > 1, llama.cpp's ``gguf-split`` layout): open every
        shard, ``<prefix>-0000K-of-0000N.gguf``, and index all their tensors, with the checks
        of llama.cpp's loader (opened by the first shard, every shard present with its own
        ``split.no``, no tensor twice, ``split.tensors.count`` tensors in all)."""
        where = str(self.path)
        n = self._split_int(self._kvs, self._mm, self._order, SPLIT_COUNT, where)
        if n is None or n <= 1:
            return
        no = self._split_int(self._kvs, self._mm, self._order, SPLIT_NO, where)
        if no is None:
            raise GGUFError(f"{where}: split model ({SPLIT_COUNT} {n}) without {SPLIT_NO}")
        if no != 0:
            raise GGUFError(f"{where}: shard {no + 1} of a {n}-file split model; open the first "
                            f"shard ({split_path(split_prefix(where, no, n) or '<prefix>', 0, n)})")
        prefix = split_prefix(where, 0, n)
        if prefix is None:
            raise GGUFError(f"{where}: a split model ({SPLIT_COUNT} {n}) whose file name does not "
                            f"end in {split_suffix(0, n)!r} (llama.cpp's naming, which it needs "
                            f"to find the other shards)")
        want = self._split_int(self._kvs, self._mm, self._order, SPLIT_TENSORS_COUNT, where)
        if want is None:
            raise GGUFError(f"{where}: split model without {SPLIT_TENSORS_COUNT}")
        for idx in range(1, n):
            path = Path(split_path(prefix, idx, n))
            if not path.exists():
                raise GGUFError(f"{where}: shard {idx + 1} of {n} is missing: no file {path}")
            fh, mm, size, st = self._open_one(path)
            self._shards.append((fh, mm, size, st, path))
            h = _parse(mm, size, str(path))
            if h["order"] != self._order:
                raise GGUFError(f"{path}: byte order differs from the first shard's")
            got = self._split_int(h["kvs"], mm, h["order"], SPLIT_NO, str(path))
            if got is None:
                raise GGUFError(f"{path}: missing key {SPLIT_NO} in shard {idx + 1} of {n}")
            if got != idx:
                raise GGUFError(f"{path}: {SPLIT_NO} is {got}, expected {idx} (shard {idx + 1} of "
                                f"{n})")
            for name, e in h["tensors"].items():
                if name in self._tensors:
                    raise GGUFError(f"{path}: tensor {name!r} is also in shard "
                                    f"{self._tensors[name].shard + 1}")
                self._tensors[name] = e._replace(shard=idx)
        if want != len(self._tensors):
            raise GGUFError(f"{where}: {SPLIT_TENSORS_COUNT} is {want} but the {n} shards hold "
                            f"{len(self._tensors)} tensors")

    @property
    def split_paths(self) -> list:
        """The files of this model: ``[path]``, or every shard of a split model in order."""
        return [sh[4] for sh in self._shards]

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

    def _fd(self, e: _TensorEntry) -> int:
        """The file descriptor holding ``e``'s data."""
        self._map()
        return self._shards[e.shard][0].fileno()

    def _bytes(self, e: _TensorEntry) -> np.ndarray:
        """u8 [nbytes] read-only view of the map; its base chain holds the map."""
        self._map()
        mm = self._shards[e.shard][1]
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
        zero-copy records.  F16/BF16 tensors (little-endian files) run numba_qk.matmul with
        ``lhs_format=numba_qk.f16`` / ``bf16`` on the zero-copy codes (docs/halfmat.md)."""
        info = self.tensor(name)
        if (info.format is _formats.f16 or info.format is _formats.bf16) and not self.big_endian:
            return self._float_matmul(name, info, x, out, threads)
        if not info.accelerated:
            raise GGUFError(f"tensor {name!r} is {info.type_name}: not accelerated by numba_qk "
                            f"(accelerated: {', '.join(f.name for f in ACCELERATED)}, and F16/"
                            f"BF16 in little-endian files); use dequantize() instead")
        return _matmul(self.records(name), x, lhs_format=info.format, out=out, threads=threads)

    def _float_matmul(self, name, info, x, out, threads):
        """F16/BF16 tensors: numba_qk.matmul on a zero-copy view of the codes (docs/halfmat.md;
        rows = product of all but the last axis)."""
        e = self._entry(name)
        k = info.shape[-1] if info.shape else 1
        codes = self._bytes(e).view(np.uint16).reshape(-1, k)
        if info.format is _formats.f16:
            w = codes.view(np.float16)
        else:
            w = Tensor(codes, dtype=_formats.bf16)
        return _matmul(w, x, lhs_format=info.format, out=out, threads=threads)

    matvec = matmul

    # -- lifetime -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._mm is None

    def close(self):
        """Release the file.  Views handed out earlier stay valid: the map is unmapped now if
        none is alive, else when the last one is garbage-collected (never under a live view)."""
        shards = self._shards or [(self._fh, self._mm, None, None, None)]
        self._mm = self._fh = None
        self._shards = []
        for fh, mm, *_ in shards:
            if mm is not None:
                try:
                    mm.close()  # refuses (BufferError) while a numpy view still exports it
                except BufferError:
                    pass
            if fh is not None:
                fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open(path) -> GGUFFile:  # noqa: A001 - mirrors builtins.open on purpose
    """Open a GGUF file read-only (memory-mapped).  A split model (llama.cpp's
    ``<prefix>-00001-of-0000N.gguf`` shards, ``split.count`` > 1) is opened by its first shard
    and shows every tensor of every shard; ``metadata`` is the first shard's."""
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
    """OUT must be a new name or an existing regular file that is not the input (``src_stat``:
    the input's stat, or a list of them, one per shard)."""
    if isinstance(src_stat, list):
        for one in src_stat:
            _check_destination(dst, one)
        return
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
    fd = f._fd(e)
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
    fd = f._fd(e)
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
    fd = f._fd(e)
    for i0 in range(0, n, step):
        k = min(step, n - i0)
        raw = inbuf[:k * esize]
        _pread_into(fd, raw, e.start + i0 * esize, str(f.path))
        out = _cast_values(_f32_chunk(raw, fmt), to)
        _write_all(out_fd, out)
        written += out.nbytes
    return written


def _cast_values(values: np.ndarray, to) -> np.ndarray:
    """f32 values as ``to`` (F32, F16 or BF16) with ggml's conversions (see _cast_stream)."""
    if to is _formats.f32:
        return values
    if to is _formats.f16:
        with np.errstate(over="ignore", invalid="ignore"):
            out = values.astype("<f2").view("<u2")
        u = values.view(np.uint32)
        nan = (u & 0x7FFFFFFF) > 0x7F800000  # ggml: NaN -> sign | 0x7E00, payload dropped
        return np.where(nan, ((u >> 16) & 0x8000) | 0x7E00, out).astype("<u2")
    u = values.view(np.uint32)  # bf16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), r).astype("<u2")


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


# --------------------------------------------------------------- llama-quantize's extra options

_KV_TYPES = {"int": 4, "float": 6, "bool": 7, "str": _STRING}   # as written: u32, f32, bool, str


def _kv_entry(key: str, vtype: int, value) -> bytes:
    """One GGUF key-value entry, little-endian, as ggml's gguf_set_val_* writes it."""
    k = key.encode("utf-8")
    head = struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype)
    if vtype == _STRING:
        v = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return head + struct.pack("<Q", len(v)) + v
    code = {2: "<H", 4: "<I", 5: "<i", 6: "<f", 7: "<B"}[vtype]
    return head + struct.pack(code, value)


_ATOL = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")
_ATOF = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)"
                   r"(?:[pP][+-]?\d+)?|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|"
                   r"nan(?:\([0-9A-Za-z_]*\))?))", re.IGNORECASE)


def _atol(text: str) -> int:
    m = _ATOL.match(text)
    v = int(m.group(1)) if m else 0
    return (v + 2**63) % 2**64 - 2**63


def _atof(text: str) -> float:
    m = _ATOF.match(text)
    if not m:
        return 0.0
    t = m.group(1)
    low = t.lower().lstrip("+-")
    if low.startswith("0x"):
        sign = -1.0 if t.startswith("-") else 1.0
        body = t.lstrip("+-")
        if "p" not in body.lower():
            body += "p0"
        try:
            return sign * float.fromhex(body)
        except OverflowError:
            return sign * float("inf")
    if low.startswith("nan"):
        return float("-nan") if t.startswith("-") else float("nan")
    return float(t)


def parse_kv_override(text: str) -> tuple:
    """``KEY=TYPE:VALUE`` as llama.cpp's ``string_parse_kv_override`` reads it: TYPE ``int``
    (``atol``), ``float`` (``atof``), ``bool`` (``true``/``false``) or ``str`` (at most 127
    bytes). Returns ``(key, type, value)``; ``GGUFError`` with llama.cpp's reason otherwise."""
    sep = text.find("=")
    if sep < 0 or len(text[:sep].encode("utf-8")) >= 128:
        raise GGUFError(f"malformed KV override {text!r}")
    key, rest = text[:sep], text[sep + 1:]
    if rest.startswith("int:"):
        return key, "int", _atol(rest[4:])
    if rest.startswith("float:"):
        return key, "float", _atof(rest[6:])
    if rest.startswith("bool:"):
        if rest[5:] in ("true", "false"):
            return key, "bool", rest[5:] == "true"
        raise GGUFError(f"invalid boolean value for KV override {text!r}")
    if rest.startswith("str:"):
        if len(rest[4:].encode("utf-8")) > 127:
            raise GGUFError(f"malformed KV override {text!r}, value cannot exceed 127 chars")
        return key, "str", rest[4:]
    raise GGUFError(f"invalid type for KV override {text!r}")


def _override_entry(key: str, kind: str, value) -> tuple:
    """(raw entry, the value llama.cpp's loader sees) of one override (llama-quant.cpp writes
    int as u32 of |value|, float as f32)."""
    if kind == "int":
        v = abs(int(value)) & 0xFFFFFFFF
        return _kv_entry(key, 4, v), int(value)
    if kind == "float":
        with np.errstate(over="ignore"):
            f32 = np.float32(value)
        return _kv_entry(key, 6, float(f32)), float(value)
    if kind == "bool":
        return _kv_entry(key, 7, 1 if value else 0), bool(value)
    if kind == "str":
        raw = value.encode("utf-8")[:127]
        return _kv_entry(key, _STRING, raw), raw.decode("utf-8", "replace")
    raise GGUFError(f"invalid type for KV override {key!r}: {kind!r}")


def _as_override(o) -> tuple:
    if isinstance(o, str):
        return parse_kv_override(o)
    key, kind, value = o
    return str(key), str(kind), value


# target types whose ggml quantize_* ignores the importance matrix (or that are plain casts)
_IMATRIX_UNUSED = {GGMLType.F32, GGMLType.F16, GGMLType.BF16,
                   *(f.ggml_type for f in _registry.IMATRIX_IGNORED)}


def _encode(values: np.ndarray, to, out: np.ndarray, weights) -> None:
    """Encode f32 blocks ``values`` [n, block_size] into ``out``; ``weights`` (the importance
    matrix row, ``ne0`` values, or None) go to the encoder as its ``imatrix`` argument,
    row-aligned: ``values`` hold whole rows when ``weights`` is given."""
    _quantize(values, format=to, imatrix=weights, out=out)


def _rows_stream(f, e: _TensorEntry, to, out_fd: int, weights) -> tuple:
    """Convert one tensor of any type numba_qk decodes (F32/F16/BF16, or a quantized format:
    requantizing) to ``to`` row-chunk by row-chunk: decode to f32 as ggml's ``to_float`` /
    ``ggml_*_to_fp32_row`` do, then encode (with the expert's importance-matrix slice when
    ``weights`` is given) or cast. Returns (bytes written, relative RMS error or None)."""
    src = e.info.format
    ne = tuple(e.ne) + (1,) * (3 - len(e.ne))
    ne0 = ne[0]
    nrows = int(np.prod(ne[1:], dtype=object))
    per_expert = ne[1]
    row_src = ne0 // e.block_size * e.type_size
    step = max(1, CHUNK_BYTES // max(1, ne0 * 4))
    fd = f._fd(e)
    written = 0
    sum_sq = sum_err = 0.0
    r0 = 0
    while r0 < nrows:
        n = min(step, nrows - r0, per_expert - r0 % per_expert)
        raw = np.empty(n * row_src, np.uint8)
        _pread_into(fd, raw, e.start + r0 * row_src, str(f.path))
        if src in (_formats.f32, _formats.f16, _formats.bf16):
            values = _f32_chunk(raw, src)
        else:
            values = _dequantize(raw.reshape(-1, src.block_bytes), src).reshape(-1)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if to.is_quantized:
            blocks = values.reshape(-1, to.block_size)
            recs = np.empty((blocks.shape[0], to.block_bytes), np.uint8)
            w = None
            if weights is not None:
                w = weights[(r0 // per_expert) * ne0:(r0 // per_expert + 1) * ne0]
            try:
                _encode(blocks, to, recs, w)
            except QuantizationDomainError as err:
                raise GGUFError(f"{f.path}: tensor {e.info.name!r}: row chunk at {r0}: "
                                f"{err.reason}") from None
            back = _dequantize(recs, to)
            v64 = blocks.astype(np.float64)
            sum_sq += float(np.dot(v64.ravel(), v64.ravel()))
            v64 -= back
            sum_err += float(np.dot(v64.ravel(), v64.ravel()))
            out = recs
        else:
            out = _cast_values(values, to)
        _write_all(out_fd, out)
        written += out.nbytes
        r0 += n
    if not to.is_quantized:
        return written, None
    m = nrows * ne0
    rms = (sum_err / m) ** 0.5 / ((sum_sq / m) ** 0.5 or 1.0) if m else 0.0
    return written, rms


class _Out(NamedTuple):
    """One output file: its path, its key-value entries (raw), its alignment and its tensors
    as (entry, name written, target format or None = copy, type id, bytes, imatrix weights)."""

    path: Path
    kvs: list
    alignment: int
    items: list


def _header(out: _Out) -> bytes:
    head = bytearray(b"GGUF")
    head += struct.pack("<IQQ", 3, len(out.items), len(out.kvs))
    for raw in out.kvs:
        head += raw
    offset = 0
    for e, name, _, type_id, nbytes, _ in out.items:
        raw_name = name.encode("utf-8")
        head += struct.pack("<Q", len(raw_name)) + raw_name + struct.pack("<I", len(e.ne))
        head += struct.pack(f"<{len(e.ne)}Q", *e.ne) + struct.pack("<IQ", type_id, offset)
        offset = _align(offset + nbytes, out.alignment)
    head += bytes(_align(len(head), out.alignment) - len(head))
    return bytes(head)


def _write_outputs(f, outs, say, n_total: int) -> list:
    """Write every output file to a temporary file beside it, then rename them all (atomic per
    file; on any error or signal every temporary file is removed and no output is touched)."""
    results = []
    temps = []
    k = 0
    guard = _SignalCleanup()
    with guard:
        try:
            for out in outs:
                tmp = out.path.parent / (f"{_temp_prefix(out.path)}{os.getpid()}-"
                                         f"{secrets.token_hex(4)}")
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                fd = os.open(tmp, flags, 0o666)  # the umask decides the mode, as for any file
                temps.append([tmp, fd])
                _write_all(fd, _header(out))
                for e, name, target, _, nbytes, weights in out.items:
                    info = e.info
                    rms = None
                    if target is None:
                        written = _copy_stream(f, e, fd)
                    elif weights is not None or info.format not in (
                            _formats.f32, _formats.f16, _formats.bf16):
                        written, rms = _rows_stream(f, e, target, fd, weights)
                    elif target.is_quantized:
                        written, rms = _convert_stream(f, e, target, fd)
                    else:
                        written = _cast_stream(f, e, target, fd)
                    if written != nbytes:  # pragma: no cover - an internal invariant
                        raise GGUFError(f"{info.name}: wrote {written} bytes, planned {nbytes}")
                    _write_all(fd, bytes(_align(nbytes, out.alignment) - nbytes))
                    item = ConvertedTensor(name, info.shape, info.type_name,
                                           target.name if target is not None else info.type_name,
                                           info.nbytes, nbytes, rms)
                    results.append(item)
                    k += 1
                    say(f"[{k}/{n_total}] {name} {'x'.join(map(str, info.shape))} "
                        f"{item.type_before} -> {item.type_after}"
                        + (f" (relative RMS error {item.rms_error:.4f})"
                           if item.rms_error is not None else
                           " (kept)" if target is None else ""))
                os.fsync(fd)
                os.close(fd)
                temps[-1][1] = -1
            for (tmp, _), out in zip(temps, outs):
                os.replace(tmp, out.path)
        except BaseException:
            for tmp, fd in temps:
                if fd >= 0:
                    os.close(fd)
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
    for parent in {out.path.parent for out in outs}:
        try:  # make the renames themselves durable
            dfd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
    return results


def quantize_file(src, dst, *, to=None, preset=None,
                  progress: Optional[Callable[[str], None]] = None, dry_run: bool = False,
                  kv_overrides=(), prune_layers=(), keep_split: bool = False, imatrix=None,
                  split_max_tensors: Optional[int] = None, split_max_size: Optional[int] = None,
                  **preset_options):
    """Convert a GGUF file (or a split model, by its first shard) and write ``dst``.  Two modes:

    * ``to=FORMAT`` (default ``quant.q4_k``): every F32/F16/BF16 2-D tensor whose rows are
      whole ``to`` blocks becomes ``to`` (bit-identical to ggml's reference quantizer); every
      other tensor and all metadata are kept byte for byte, in file order.
    * ``preset=NAME`` (``"Q4_K_M"``, ``"q5_k_m"``, ``"Q4_K"`` = Q4_K_M, …): llama.cpp's
      ``llama-quantize`` preset -- each tensor gets the type llama.cpp's rules give it
      (:func:`plan_file`; ``preset_options`` are :func:`numba_qk.presets.plan`'s keywords such
      as ``pure=True``, ``allow_requantize=True``), tensors are written in llama.cpp's order,
      and ``general.file_type`` / ``general.quantization_version`` are set as llama.cpp sets
      them.  A preset that needs a type numba_qk cannot encode, or an importance matrix, is
      refused before anything is written.  llama-quantize's other options, as it applies them:
      ``dry_run`` (plan and sizes; nothing is written, ``dst`` may be None),
      ``kv_overrides`` (``"KEY=TYPE:VALUE"`` strings or ``(key, type, value)``, type ``int``
      / ``float`` / ``bool`` / ``str``), ``prune_layers`` (layer numbers), ``keep_split``
      (one output file per input shard, named ``<dst prefix>-0000K-of-0000N.gguf``) and
      ``imatrix`` (an :class:`Imatrix` from :func:`read_imatrix`, or ``{tensor name: f32
      weights}``; it also adds llama-quantize's ``quantize.imatrix.*`` keys when an
      :class:`Imatrix` is given).  ``allow_requantize=True`` dequantizes an already
      quantized tensor to f32 as ggml does and encodes it anew.  ``split_max_tensors`` /
      ``split_max_size`` write the result as ``gguf-split --split`` would split it (``dst`` is
      then the prefix of ``<dst>-0000K-of-0000N.gguf``, as for ``keep_split``).

    Both modes honour the input's ``general.alignment``.  Streaming: each tensor is converted
    and written in chunks (``CHUNK_BYTES`` of f32 values at a time), so memory use does not grow
    with the tensor or file size.  Atomic: each output goes to ``.DST.numba_qk-tmp-PID-XXXX``
    beside it (mode from the umask), is fsync'ed, and all are renamed over their names once
    every one is written; on any error, Ctrl-C, SIGTERM or SIGHUP the temporary files are
    removed and no output is touched.
    Temporary files left by a killed run (SIGKILL) are removed by the next run to the same
    ``dst``.  Refuses (``GGUFError``) when ``dst`` is the input (same inode, through any path or
    link), a symbolic link, or not a regular file; refuses big-endian input files.  Returns a
    list of ``ConvertedTensor`` in the order written (planned, for ``dry_run``)."""
    if preset is not None and to is not None:
        raise TypeError("quantize_file: give either 'to' (one format) or 'preset', not both")
    extra = dict(dry_run=dry_run, kv_overrides=kv_overrides, prune_layers=prune_layers,
                 keep_split=keep_split, imatrix=imatrix, split_max_tensors=split_max_tensors,
                 split_max_size=split_max_size)
    _check_split_limits(split_max_tensors, split_max_size, "quantize_file")
    if keep_split and (split_max_tensors is not None or split_max_size is not None):
        raise TypeError("quantize_file: keep_split and split_max_* exclude each other")
    used = sorted(k for k, v in extra.items() if v is not None and v is not False
                  and not (isinstance(v, (tuple, list)) and not v))
    if (preset_options or used) and preset is None:
        raise TypeError(f"quantize_file: {', '.join(sorted(preset_options) + used)} apply to "
                        f"presets only")
    if preset is None:
        to = quant.q4_k if to is None else to
        if to not in ACCELERATED or to not in _registry.QUANTIZABLE:
            raise TypeError(f"quantize_file: 'to' must be a weight format, got {to!r}")
        if to in _registry.REQUIRES_IMATRIX:
            raise TypeError(f"quantize_file: {to.name} needs an importance matrix, which only "
                            f"presets take (preset=..., imatrix=...)")
    if dst is None and not dry_run:
        raise TypeError("quantize_file: dst is required (except with dry_run=True)")
    say = progress or (lambda line: None)
    with GGUFFile(src) as f:
        if f.big_endian:
            raise GGUFError(f"{f.path}: big-endian GGUF files are not supported by quantize "
                            f"(convert it to little-endian first)")
        if preset is None:
            dst = Path(dst)
            jobs = _single_format_jobs(f, to)
            mm = f._map()
            kvs = [mm[kv.start:kv.end] for kv in f._kvs.values()]
            items = [(e, e.info.name, t, t.ggml_type if t is not None else e.info.ggml_type,
                      _target_nbytes(e, t), None) for e, t in jobs]
            outs = [_Out(dst, kvs, f.alignment, items)]
        else:
            outs = _preset_outputs(f, dst, preset, say, extra, preset_options)
            if dry_run:
                return outs
        stats = [sh[3] for sh in f._shards]
        for out in outs:
            _check_destination(out.path, stats)
        for out in outs:
            _clean_stale_temps(out.path, say)
        return _write_outputs(f, outs, say, sum(len(o.items) for o in outs))


def _preset_outputs(f, dst, preset, say, extra, preset_options):
    """The output files of a preset conversion (or, for a dry run, the planned results)."""
    from . import presets

    imatrix = extra["imatrix"]
    weights_by_name = None
    if imatrix is not None:
        if isinstance(imatrix, bool):
            raise TypeError("quantize_file: imatrix takes the importance matrix (read_imatrix's "
                            "Imatrix, or {tensor name: weights}); plan_file(imatrix=True) plans "
                            "without one")
        weights_by_name = {str(k): np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
                           for k, v in (imatrix.weights if isinstance(imatrix, Imatrix)
                                        else imatrix).items()}
        for name, w in weights_by_name.items():
            bad = ~np.isfinite(w)
            if bad.any():
                raise GGUFError(f"imatrix contains non-finite value {w[bad][0]:f} (entry "
                                f"{name!r})")
        if not weights_by_name:
            weights_by_name = None
    overrides = [_as_override(o) for o in extra["kv_overrides"]]
    if isinstance(imatrix, Imatrix) and weights_by_name is not None:
        overrides += imatrix.kv_overrides(len(weights_by_name))
    prune = sorted(set(int(i) for i in extra["prune_layers"]))
    if any(i < 0 for i in prune):
        raise GGUFError(f"--prune-layers: invalid layer id {prune[0]}")
    keep_split = extra["keep_split"]
    dry_run = extra["dry_run"]

    entries = list(f._tensors.values())
    renamed, n_blocks = presets.prune_names([e.info.name for e in entries], prune)
    kept = [e for e in entries if renamed[e.info.name] is not None]
    if keep_split:  # llama.cpp: sorted by (shard, offset), processed in that order
        kept.sort(key=lambda e: (e.shard, e.start))
    md = dict(f.metadata)
    for key, kind, value in overrides:       # the loader reads hyper-parameters through them
        md[key] = _override_entry(key, kind, value)[1]
    tensors = [(renamed[e.info.name], e.ne, e.info.ggml_type) for e in kept]
    try:
        the_plan = presets.plan(preset, md, tensors, imatrix=weights_by_name is not None,
                                dry_run=dry_run, keep_order=keep_split, **preset_options)
    except presets.PresetError as err:
        raise GGUFError(f"{f.path}: {err}") from None
    by_new = {renamed[e.info.name]: e for e in kept}

    # the key-value entries: copied, then set/removed in llama-quant.cpp's order
    mm = f._map()
    kvs = {k: mm[kv.start:kv.end] for k, kv in f._kvs.items()}

    def set_kv(key, raw):
        kvs.pop(key, None)
        kvs[key] = raw

    ftype = (presets.guess_ftype(f.metadata, tensors) if the_plan.preset.copy_only
             else the_plan.preset.ftype)
    set_kv("general.quantization_version", _kv_u32("general.quantization_version",
                                                   the_plan.kv["general.quantization_version"]))
    set_kv("general.file_type", _kv_u32("general.file_type", ftype))
    for key in (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT):
        kvs.pop(key, None)
    for key, kind, value in overrides:
        set_kv(key, _override_entry(key, kind, value)[0])
    if prune:
        arch = md.get("general.architecture", "")
        set_kv(f"{arch}.block_count", _kv_u32(f"{arch}.block_count", n_blocks))

    # each tensor: its target, its importance-matrix weights
    table = _type_table()
    orig_of = {v: k for k, v in renamed.items() if v is not None}
    items = []
    limit = None   # the first thing numba_qk cannot do yet, raised after llama.cpp's own checks
    for t in the_plan.tensors:
        e = by_new[t.name]
        target = None
        weights = None
        if t.convert:
            target = _fmt_for(t.target)
            tname = GGML_TYPE_NAMES.get(t.target, str(t.target))
            src_fmt = e.info.format
            if src_fmt not in (_formats.f32, _formats.f16, _formats.bf16) and not dry_run:
                if (src_fmt is None or not src_fmt.is_quantized) and limit is None:
                    limit = (f"{f.path}: tensor {t.name!r} is {e.info.type_name}; numba_qk "
                             f"cannot decode it (no requantizing from it)")
            if not (target in (_formats.f32, _formats.f16, _formats.bf16)
                    or (target in ACCELERATED and target in _registry.QUANTIZABLE)):
                if not dry_run and limit is None:
                    limit = (f"{f.path}: preset {the_plan.preset.name} gives tensor "
                             f"{t.name!r} type {tname} ({t.reason}), which numba_qk "
                             f"cannot encode yet")
            if weights_by_name is not None:
                w = weights_by_name.get(orig_of[t.name])
                ne2 = e.ne[2] if len(e.ne) > 2 else 1
                if w is None:
                    say(f"did not find weights for {t.name}")
                elif w.size == e.ne[0] * ne2:
                    weights = w
                elif t.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
                    raise GGUFError(f"imatrix size {w.size} is different from tensor size "
                                    f"{e.ne[0] * ne2} for {t.name}")
                else:
                    say(f"imatrix size {w.size} is different from tensor size {e.ne[0] * ne2} "
                        f"for {t.name}")
            if weights is None and t.requires_imatrix and not dry_run:
                raise GGUFError(f"Missing importance matrix for tensor {t.name} in a very "
                                f"low-bit quantization")
            if weights is not None and t.target in _IMATRIX_UNUSED:
                weights = None           # ggml's quantizer for this type ignores it
        _, bs, ts = table[t.target]
        nbytes = (e.end - e.start if not t.convert else   # (target is None also for a type
                  int(np.prod(e.info.shape, dtype=object)) // bs * ts)   # it cannot encode)
        items.append((e, t.name, target, t.target, nbytes, weights))
    if limit is not None:
        raise GGUFError(limit)

    if dry_run:
        return _dry_run(items, say, the_plan.will_require_imatrix and weights_by_name is None)

    if keep_split:
        n_split = max(e.shard for e in kept) + 1 if kept else 1
        base = str(dst)   # the prefix, as llama_model_quantize takes it
        outs = []
        for i in range(n_split):
            skv = dict(kvs) if i == 0 else {}
            if n_split > 1:
                skv.pop(SPLIT_NO, None); skv.pop(SPLIT_COUNT, None)
                skv.pop(SPLIT_TENSORS_COUNT, None)
                skv[SPLIT_NO] = _kv_entry(SPLIT_NO, 2, i)
                skv[SPLIT_COUNT] = _kv_entry(SPLIT_COUNT, 2, n_split)
                skv[SPLIT_TENSORS_COUNT] = _kv_entry(SPLIT_TENSORS_COUNT, 5, len(items))
            outs.append(_Out(Path(split_path(base, i, n_split)), list(skv.values()),
                             f.alignment if i == 0 else 32,
                             [it for it in items if it[0].shard == i]))
        return outs
    if extra["split_max_tensors"] is not None or extra["split_max_size"] is not None:
        groups = _shard_groups(items, extra["split_max_tensors"], extra["split_max_size"])
        return _split_outs(str(dst), list(kvs.values()), groups, f.alignment)
    return [_Out(Path(dst), list(kvs.values()), f.alignment, items)]


def _dry_run(items, say, warn_imatrix: bool) -> list:
    """llama-quantize --dry-run: each tensor's planned size; nothing read or written."""
    results = []
    for k, (e, name, target, type_id, nbytes, _) in enumerate(items):
        info = e.info
        after = GGML_TYPE_NAMES.get(type_id, str(type_id))
        results.append(ConvertedTensor(name, info.shape, info.type_name, after, info.nbytes,
                                       nbytes, None))
        say(f"[{k + 1}/{len(items)}] {name} {'x'.join(map(str, info.shape))} "
            f"{info.type_name} -> {after}: {info.nbytes / 2**20:.2f} MiB -> "
            f"{nbytes / 2**20:.2f} MiB" + ("" if type_id != info.ggml_type else " (kept)"))
    if warn_imatrix:
        say("WARNING: dry run completed successfully, but actually completing this "
            "quantization will require an imatrix!")
    return results


def _shard_groups(items, max_tensors, max_size, no_tensor_first_split: bool = False) -> list:
    """gguf-split's grouping of (entry, name, ...) items, in order (``split_strategy``): a new
    shard after every ``max_tensors`` tensors, or before the tensor that would take the shard's
    data (each tensor padded to 32 bytes) over ``max_size`` bytes -- a tensor larger than
    ``max_size`` gets a shard of its own, except the first tensor: there gguf-split would leave
    a shard without tensors and refuses ("one of splits have 0 tensors"), and so does this.
    ``no_tensor_first_split``: the first shard holds only the key-value pairs."""
    groups: list = [[]] + ([[]] if no_tensor_first_split else [])
    size = 0
    for i, it in enumerate(items):
        nb = _align(it[4], 32)
        split = (size + nb > max_size) if max_size is not None else (
            0 < i and i % max_tensors == 0)
        if split:
            if not groups[-1]:
                raise GGUFError(f"split: tensor {it[1]!r} takes {nb} bytes (padded to 32), more "
                                f"than the split size {max_size}, and would leave shard "
                                f"{len(groups)} without tensors; gguf-split refuses this too "
                                f"(\"one of splits have 0 tensors\"): raise the size")
            groups.append([])
            size = nb
        else:
            size += nb
        groups[-1].append(it)
    return groups


def _split_outs(prefix, kvs: list, groups, alignment: int) -> list:
    """gguf-split's files: every key in the first, then in each ``split.no`` (u16),
    ``split.tensors.count`` (i32), ``split.count`` (u16)."""
    n, total = len(groups), sum(len(g) for g in groups)
    outs = []
    for i, group in enumerate(groups):
        skv = list(kvs) if i == 0 else []
        skv += [_kv_entry(SPLIT_NO, 2, i), _kv_entry(SPLIT_TENSORS_COUNT, 5, total),
                _kv_entry(SPLIT_COUNT, 2, n)]
        outs.append(_Out(Path(split_path(prefix, i, n)), skv, alignment if i == 0 else 32,
                         group))
    return outs


def _check_split_limits(max_tensors, max_size, what="split_file"):
    if max_tensors is not None and max_size is not None:
        raise TypeError(f"{what}: give max_tensors or max_size, not both")
    if (max_tensors is not None and max_tensors < 1) or (max_size is not None and max_size < 1):
        raise ValueError(f"{what}: the split limit must be positive")


def split_file(src, prefix, *, max_tensors: Optional[int] = None, max_size: Optional[int] = None,
               no_tensor_first_split: bool = False, dry_run: bool = False,
               progress: Optional[Callable[[str], None]] = None) -> list:
    """Split a GGUF file as llama.cpp's ``gguf-split --split`` does: shards
    ``<prefix>-0000K-of-0000N.gguf`` of at most ``max_tensors`` tensors (``--split-max-tensors``)
    or ``max_size`` bytes of tensor data (``--split-max-size``; each tensor counted padded to 32
    bytes; a tensor larger than that gets a shard of its own, unless it is the first tensor,
    which gguf-split refuses), tensors in file order and kept byte for byte; the first shard
    holds every key-value pair, each shard ``split.no`` (u16), ``split.tensors.count`` (i32)
    and ``split.count`` (u16), in gguf-split's order. ``no_tensor_first_split``
    (``--no-tensor-first-split``): the first shard holds only the key-value pairs. Atomic as
    :func:`quantize_file`. Returns the shard paths. A split model given by its first shard is
    split as a whole (gguf-split would split only the shard it is given). ``progress`` first
    gets gguf-split's plan (``n_split: N``, then ``split 0000K: n_tensors = T, total_size =
    SM`` per shard: header and tensor bytes in whole megabytes); ``dry_run`` (``--dry-run``)
    stops there and writes nothing."""
    if (max_tensors is None) == (max_size is None):
        raise TypeError("split_file: give exactly one of max_tensors and max_size")
    _check_split_limits(max_tensors, max_size)
    say = progress or (lambda line: None)
    with GGUFFile(src) as f:
        if f.big_endian:
            raise GGUFError(f"{f.path}: big-endian GGUF files are not supported")
        entries = sorted(f._tensors.values(), key=lambda e: (e.shard, e.start))
        items = [(e, e.info.name, None, e.info.ggml_type, e.end - e.start, None)
                 for e in entries]
        mm = f._map()
        kvs = [mm[kv.start:kv.end] for k, kv in f._kvs.items()
               if k not in (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)]
        groups = _shard_groups(items, max_tensors, max_size, no_tensor_first_split)
        outs = _split_outs(prefix, kvs, groups, f.alignment)
        say(f"n_split: {len(outs)}")
        for i, out in enumerate(outs):   # gguf-split's print_info: meta size + ggml_nbytes
            total = len(_header(out)) + sum(it[4] for it in out.items)
            say(f"split {i + 1:05d}: n_tensors = {len(out.items)}, "
                f"total_size = {total // 1000 // 1000}M")
        if dry_run:
            return [out.path for out in outs]
        stats = [sh[3] for sh in f._shards]
        for out in outs:
            _check_destination(out.path, stats)
            _clean_stale_temps(out.path, say)
        _write_outputs(f, outs, say, len(entries))
    return [out.path for out in outs]


def merge_file(src, dst, *, dry_run: bool = False,
               progress: Optional[Callable[[str], None]] = None) -> Path:
    """Merge a split model, given by its first shard, into one file as llama.cpp's
    ``gguf-split --merge`` does: the first shard's key-value pairs with ``split.count`` set to
    0 (u16, moved to the end; ``split.no`` and ``split.tensors.count`` stay, so the file is not
    taken for a split model again), then every shard's tensors in order, kept byte for byte.
    Atomic as :func:`quantize_file`; ``dst`` may exist (it is replaced). Returns ``dst``.
    ``dry_run``: every shard opened and checked, nothing written."""
    say = progress or (lambda line: None)
    dst = Path(dst)
    with GGUFFile(src) as f:
        if f.big_endian:
            raise GGUFError(f"{f.path}: big-endian GGUF files are not supported")
        n = f._split_int(f._kvs, f._mm, f._order, SPLIT_COUNT, str(f.path))
        if n is None:
            raise GGUFError(f"{f.path}: input file does not contain {SPLIT_COUNT} metadata "
                            f"(not a split model)")
        if n < 1:
            raise GGUFError(f"{f.path}: input file does not contain a valid split count {n} "
                            f"(a merged file: gguf-split refuses to merge it again)")
        if n == 1 and split_prefix(f.path, 0, 1) is None:
            raise GGUFError(f"{f.path}: a split model ({SPLIT_COUNT} 1) whose file name does "
                            f"not end in {split_suffix(0, 1)!r}")
        entries = sorted(f._tensors.values(), key=lambda e: (e.shard, e.start))
        items = [(e, e.info.name, None, e.info.ggml_type, e.end - e.start, None)
                 for e in entries]
        mm = f._map()
        kvs = [mm[kv.start:kv.end] for k, kv in f._kvs.items() if k != SPLIT_COUNT]
        kvs.append(_kv_entry(SPLIT_COUNT, 2, 0))
        out = _Out(dst, kvs, f.alignment, items)
        if dry_run:
            return dst
        _check_destination(dst, [sh[3] for sh in f._shards])
        _clean_stale_temps(dst, say)
        _write_outputs(f, [out], say, len(entries))
    return dst


# -------------------------------------------------------------------------- importance matrices

class Imatrix:
    """An importance matrix as llama-quantize loads it (:func:`read_imatrix`): ``weights``
    ``{tensor name: f32 array}`` (``ne0`` values per row, times the experts of a 3-D tensor),
    ``datasets``, ``chunk_count``, ``chunk_size``, ``is_legacy`` (the old binary ``.dat``
    format) and ``path`` (as given: llama-quantize writes it to ``quantize.imatrix.file``)."""

    def __init__(self, path, weights, datasets=(), chunk_count=0, chunk_size=0,
                 is_legacy=False):
        self.path = str(path)
        self.weights = dict(weights)
        self.datasets = list(datasets)
        self.chunk_count = int(chunk_count)
        self.chunk_size = int(chunk_size)
        self.is_legacy = bool(is_legacy)

    def __repr__(self):
        return (f"Imatrix({self.path!r}, {len(self.weights)} entries, datasets="
                f"{self.datasets!r}, chunk_count={self.chunk_count})")

    def kv_overrides(self, n_entries=None) -> list:
        """The keys llama-quantize adds to the output when it uses this matrix:
        ``quantize.imatrix.file`` / ``.dataset`` (the first; each at most 127 bytes) /
        ``.entries_count`` / ``.chunks_count`` (when positive), as (key, type, value)."""
        def c127(text):
            return text.encode("utf-8")[:127].decode("utf-8", "ignore")

        out = [("quantize.imatrix.file", "str", c127(self.path))]
        if self.datasets:
            out.append(("quantize.imatrix.dataset", "str", c127(self.datasets[0])))
        n = len(self.weights) if n_entries is None else n_entries
        out.append(("quantize.imatrix.entries_count", "int", n))
        if self.chunk_count > 0:
            out.append(("quantize.imatrix.chunks_count", "int", self.chunk_count))
        return out


def _imatrix_gguf(path, where):
    sums, counts = {}, {}
    with GGUFFile(path) as f:
        if not f._tensors:
            raise GGUFError(f"{where}: no data in file (no tensors)")
        md = f.metadata
        datasets = []
        kv = f._kvs.get("imatrix.datasets")
        if kv is not None and kv.vtype == _ARRAY and kv.itype == _STRING:
            datasets = list(md["imatrix.datasets"])
        has_meta = all(k in f._kvs for k in ("imatrix.datasets", "imatrix.chunk_count",
                                             "imatrix.chunk_size"))
        chunk = {}
        for key in ("imatrix.chunk_count", "imatrix.chunk_size"):
            kv = f._kvs.get(key)
            if kv is not None and kv.vtype != 4:
                raise GGUFError(f"{where}: {key} is {_VT_NAMES.get(kv.vtype)}, not UINT32 "
                                f"(llama.cpp aborts on it)")
            chunk[key] = int(md[key]) if kv is not None else 0
        for t in f.tensors:
            if t.name.endswith(".in_sum2"):
                sums[t.name[:-8]] = t
            elif t.name.endswith(".counts"):
                counts[t.name[:-7]] = t
        if not has_meta:
            raise GGUFError(f"{where}: missing imatrix metadata (imatrix.datasets, "
                            f"imatrix.chunk_count, imatrix.chunk_size)")
        weights = {}
        for name in sorted(set(sums) | set(counts), key=lambda n: n.encode("utf-8")):
            s, c = sums.get(name), counts.get(name)
            if s is None or c is None:
                raise GGUFError(f"{where}: mismatched sums and counts for {name}")
            if s.type_name != "F32" or c.type_name != "F32":
                raise GGUFError(f"{where}: sums and counts for {name} must be F32")
            sv = np.asarray(f.raw(s.name), dtype="<f4").reshape(-1)
            cv = np.asarray(f.raw(c.name), dtype="<f4").reshape(-1)
            # std::lround, then (float) of the int64
            cnt = np.where(cv >= 0, np.floor(cv.astype(np.float64) + 0.5),
                           np.ceil(cv.astype(np.float64) - 0.5)).astype(np.float32)
            if cnt.size == 0:
                raise GGUFError(f"{where}: no counts for entry {name!r}")
            ne0 = sv.size // cnt.size
            w = np.zeros(sv.size, np.float32)
            for j in range(cnt.size):
                seg = slice(j * ne0, (j + 1) * ne0)
                w[seg] = sv[seg] / cnt[j] if cnt[j] > 0 else np.float32(1)
            weights[name] = w
    return Imatrix(where, weights, datasets, chunk["imatrix.chunk_count"],
                   chunk["imatrix.chunk_size"], False)


def _imatrix_legacy(data: bytes, where):
    pos = 0

    def i32(what):
        nonlocal pos
        if pos + 4 > len(data):
            raise GGUFError(f"{where}: {what}")
        v = struct.unpack_from("<i", data, pos)[0]
        pos += 4
        return v

    if len(data) < 4 or struct.unpack_from("<i", data, 0)[0] < 1:
        raise GGUFError(f"{where}: no data in file")
    n = i32("no data in file")
    weights = {}
    for i in range(n):
        ln = i32(f"failed reading name for entry {i + 1}")
        if ln < 0 or pos + ln > len(data):
            raise GGUFError(f"{where}: failed reading name for entry {i + 1}")
        name = data[pos:pos + ln].split(b"\0", 1)[0].decode("utf-8", "replace")
        pos += ln
        ncall = i32(f"failed reading number of values for entry {i}")
        nval = i32(f"failed reading number of values for entry {i}")
        if nval < 1:
            raise GGUFError(f"{where}: failed reading number of values for entry {i}")
        if pos + 4 * nval > len(data):
            raise GGUFError(f"{where}: failed reading data for entry {i}")
        sums = np.frombuffer(data, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval
        weights[name] = sums / np.float32(ncall) if ncall > 0 else sums.copy()
    chunk_count, datasets = 0, []
    if pos < len(data):   # optional trailer: chunk count, dataset name
        if pos + 4 <= len(data):
            chunk_count = struct.unpack_from("<i", data, pos)[0]
            pos += 4
            if pos + 4 <= len(data):
                ln = struct.unpack_from("<i", data, pos)[0]
                pos += 4
                if 0 < ln and pos + ln <= len(data):
                    datasets.append(data[pos:pos + ln].split(b"\0", 1)[0]
                                    .decode("utf-8", "replace"))
        else:
            chunk_count = 0
    return Imatrix(where, weights, datasets, chunk_count, 0, True)


def read_imatrix(path, include=(), exclude=()) -> Imatrix:
    """Read an importance-matrix file as llama-quantize does (``load_imatrix`` /
    ``prepare_imatrix`` of tools/quantize/quantize.cpp, ``common_imatrix_load``): the GGUF
    format of today's ``llama-imatrix`` (``<tensor>.in_sum2`` and ``<tensor>.counts`` F32
    tensors; ``imatrix.datasets``, ``imatrix.chunk_count`` and ``imatrix.chunk_size`` must be
    present; weights = sums / counts per expert, 1 where a count is 0) or the legacy binary
    ``.dat`` format (weights = sums / ncall). ``exclude`` drops the entries whose name contains
    any of the strings, ``include`` keeps only those that contain one (llama-quantize's
    ``--exclude-weights`` / ``--include-weights``; not both). ``GGUFError`` with llama.cpp's
    reason when the file cannot be used."""
    include, exclude = list(include), list(exclude)
    if include and exclude:
        raise GGUFError("--include-weights and --exclude-weights cannot be used together")
    where = str(path)
    try:
        with builtins_open(path, "rb") as fh:
            magic = fh.read(4)
            fh.seek(0)
            data = None if magic == b"GGUF" else fh.read()
    except OSError as e:
        raise GGUFError(f"{where}: failed to load imatrix ({e.strerror or e})") from None
    im = _imatrix_gguf(path, where) if data is None else _imatrix_legacy(data, where)
    if exclude:
        im.weights = {k: v for k, v in im.weights.items() if not any(x in k for x in exclude)}
    if include:
        im.weights = {k: v for k, v in im.weights.items() if any(x in k for x in include)}
    return im


# ----------------------------------------------------------------------------- gguf-py backend

# Formats whose gguf-py codecs numba_qk can stand in for, bit for bit (tests/io/test_gguf_py_accel.py
# checks each against gguf-py's own output).  Dequantize: every weight format gguf-py decodes.
# Quantize: the legacy formats (gguf-py's numpy encoders, themselves ggml's _ref except for the
# sign of a zero extreme, below) and the K-quants, which gguf-py cannot encode
# (NotImplementedError) and numba_qk encodes as ggml's quantize_row_*_ref; MXFP4 (gguf-py's
# numpy encoder gives ggml's bytes, tested) and NVFP4 (gguf-py decodes only; its decoder equals
# ggml's, tested).  Not routed: Q8_1
# (gguf-py sizes it 40 B, ggml 36 B, and has no codec), Q8_K (no gguf-py codec; numba_qk's Q8_K
# quantizer is spec 000's, not ggml's), Q1_0 and Q2_0 (gguf-py 0.19 has no codec for Q1_0 and
# no Q2_0 type: nothing of gguf-py's to stand in for; numba_qk's GGUF reader decodes both).
_NOT_IN_GGUF_PY = (quant.q1_0, quant.q2_0)
GGUF_PY_ROUTED = tuple(f for f in _registry.WEIGHTS if f not in _NOT_IN_GGUF_PY)
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
        if (fmt is None or fmt not in _registry.QUANTIZABLE or fmt in _registry.REQUIRES_IMATRIX
                or not isinstance(data, np.ndarray)
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
