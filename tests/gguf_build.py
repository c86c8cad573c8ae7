"""A byte-level GGUF builder for the tests: legal files and hostile ones, field by field.

Written from the GGUF layout (header, key-value entries, tensor infos, aligned data) so tests
control every count, length, type and offset -- gguf-py's writer refuses most hostile values.
"""

from __future__ import annotations

import struct

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, \
    FLOAT64 = range(13)
_CODES = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
          BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}


def s(text, o="<") -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack(o + "Q", len(b)) + b


def value(vtype, v, o="<") -> bytes:
    if vtype == STRING:
        return s(v, o)
    return struct.pack(o + _CODES[vtype], v)


def kv(key, vtype, v, o="<") -> bytes:
    """One entry; for ARRAY, ``v`` is (item_type, [items])."""
    head = s(key, o) + struct.pack(o + "I", vtype)
    if vtype == ARRAY:
        itype, items = v
        return head + array_body(itype, items, o)
    return head + value(vtype, v, o)


def array_body(itype, items, o="<", count=None) -> bytes:
    n = len(items) if count is None else count
    body = struct.pack(o + "IQ", itype, n)
    return body + b"".join(value(itype, v, o) for v in items)


def nested_array_kv(key, depth, o="<") -> bytes:
    """An array of arrays ... ``depth`` deep, the innermost holding one UINT8."""
    body = struct.pack(o + "IQ", UINT8, 1) + b"\x07"
    for _ in range(depth - 1):
        body = struct.pack(o + "IQ", ARRAY, 1) + body
    return s(key, o) + struct.pack(o + "I", ARRAY) + body


def tensor_info(name, ne, ggml_type, offset, o="<") -> bytes:
    return (s(name, o) + struct.pack(o + "I", len(ne)) + struct.pack(o + f"{len(ne)}Q", *ne)
            + struct.pack(o + "IQ", ggml_type, offset))


def pad(n, a):
    return (-n) % a


def build(kvs=(), tensors=(), *, alignment=32, version=3, o="<", n_kv=None, n_tensors=None,
          offsets=None) -> bytes:
    """``tensors``: (name, ne, ggml_type, data bytes).  Offsets are laid out as ggml does (each
    tensor padded to ``alignment``) unless ``offsets`` gives them; ``n_kv``/``n_tensors``
    override the declared counts."""
    kvs = list(kvs)
    infos, blobs, off = [], [], 0
    for i, (name, ne, t, data) in enumerate(tensors):
        at = off if offsets is None else offsets[i]
        infos.append(tensor_info(name, ne, t, at, o))
        blobs.append((at, data))
        off += len(data) + pad(len(data), alignment)
    head = b"GGUF" + struct.pack(o + "IQQ", version,
                                 len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    head += bytes(pad(len(head), alignment))
    data = bytearray()
    for at, blob in blobs:
        if at > 1 << 24:
            continue  # a hostile offset: the bytes are not placed
        if len(data) < at:
            data += bytes(at - len(data))
        data[at:at + len(blob)] = blob
    if tensors:
        data += bytes(pad(len(data), alignment))
    return head + bytes(data)
