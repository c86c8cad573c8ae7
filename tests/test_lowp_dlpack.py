"""DLPack export/import: type codes, zero copy, packed bytes, DLPack's own packed order."""

import ctypes
import gc

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _dlpack as D


def capsule_info(cap, versioned):
    name = b"dltensor_versioned" if versioned else b"dltensor"
    ptr = D._api.PyCapsule_GetPointer(cap, name)
    m = (D.DLManagedTensorVersioned if versioned else D.DLManagedTensor).from_address(ptr)
    dl = m.dl_tensor
    return ((dl.dtype.code, dl.dtype.bits, dl.dtype.lanes),
            tuple(dl.shape[i] for i in range(dl.ndim)), m.flags if versioned else None, dl.data)


@pytest.mark.parametrize("t, code, bits", [
    (qk.bf16, 4, 16), (qk.e4m3, 10, 8), (qk.e5m2, 12, 8), (qk.e8m0, 14, 8), (qk.e2m3, 15, 6),
    (qk.e3m2, 16, 6), (qk.f32, 2, 32), (qk.f16, 2, 16), (qk.i8, 0, 8), (qk.u8, 1, 8),
    (qk.i32, 0, 32), (qk.i4, 1, 8), (qk.u4, 1, 8), (qk.u1, 1, 8), (qk.e2m1, 1, 8)], ids=str)
def test_export_type_codes_and_roundtrip(t, code, bits):
    x = np.linspace(-4, 4, 32, dtype=np.float32).reshape(2, 16)
    a = qk.astype(x, t)
    a = a if isinstance(a, qk.Tensor) else qk.Tensor(a)
    info = capsule_info(a.__dlpack__(max_version=(1, 0)), True)
    assert info[0] == (code, bits, 1)
    assert info[1] == a.storage.shape                      # packed: last extent counts bytes
    assert info[2] == (D.FLAG_SUBBYTE_PADDED if bits == 6 else 0)
    assert info[3] == a.storage.ctypes.data                # zero copy
    b = qk.from_dlpack(a)
    assert b.dtype is (t if t.block_size == 1 else qk.u8)  # packed types arrive as their bytes
    assert np.shares_memory(b.storage, a.storage)
    assert np.array_equal(b.storage.view(np.uint8), a.storage.view(np.uint8))
    assert a.__dlpack_device__() == (1, 0)


def test_packed_consumer_gets_high_nibble_first_bytes():
    p = qk.astype(np.arange(16) % 8, qk.i4)
    got = np.from_dlpack(p)
    assert got.dtype == np.uint8 and got.shape == (8,)
    assert got.tolist() == [0x01, 0x23, 0x45, 0x67] * 2
    assert qk.Tensor(got, dtype=qk.i4).codes().tolist() == (np.arange(16) % 8).tolist()


def test_numpy_from_dlpack_and_back():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = qk.from_dlpack(x)
    assert t.dtype is qk.f32 and t.shape == (3, 2) and np.shares_memory(t.storage, x)
    assert np.array_equal(np.from_dlpack(t), x)
    h = qk.astype(x, qk.f16)
    assert np.array_equal(np.from_dlpack(qk.Tensor(h)), h)


def test_fp6_needs_versioned_and_bf16_numpy_refuses():
    e = qk.astype(np.zeros(4, np.float32), qk.e2m3)
    with pytest.raises(BufferError, match="versioned"):
        e.__dlpack__()
    with pytest.raises(BufferError, match="CPU"):
        e.__dlpack__(max_version=(1, 0), dl_device=(2, 0))


def test_unconsumed_capsules_are_freed():
    t = qk.astype(np.zeros(8, np.float32), qk.bf16)
    before = len(D._LIVE)
    caps = [t.__dlpack__(max_version=(1, 0)) for _ in range(5)] + [t.__dlpack__()]
    assert len(D._LIVE) == before + 6
    del caps
    gc.collect()
    assert len(D._LIVE) == before


class _PackedProducer:
    """A producer exporting codes in DLPack's own packed layout (element 0 in the low bits)."""

    def __init__(self, codes, code, bits, padded=False):
        self.codes, self.code, self.bits, self.padded = codes, code, bits, padded

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, max_version=None, **kw):
        per = 8 // self.bits
        c = np.asarray(self.codes, np.uint8)
        if self.padded:
            raw = c.copy()
        else:
            raw = np.zeros(-(-c.size // per), np.uint8)
            for i, v in enumerate(c):
                raw[i // per] |= v << (self.bits * (i % per))
        self.raw = raw
        m = D.DLManagedTensorVersioned()
        m.version = D.DLPackVersion(1, 1)
        m.flags = D.FLAG_SUBBYTE_PADDED if self.padded else 0
        self.shape = (ctypes.c_int64 * 1)(c.size)
        m.dl_tensor.data = raw.ctypes.data
        m.dl_tensor.device = D.DLDevice(1, 0)
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype = D.DLDataType(self.code, self.bits, 1)
        m.dl_tensor.shape = self.shape
        m.dl_tensor.strides = None
        self.m = m
        return D._api.PyCapsule_New(ctypes.addressof(m), b"dltensor_versioned", None)


@pytest.mark.parametrize("padded", [False, True])
def test_import_dlpack_packed_order(padded):
    codes = np.array([1, 2, 3, 4, 0xF, 0x8, 0, 7])
    t = qk.from_dlpack(_PackedProducer(codes, D.kDLFloat4_e2m1fn, 4, padded))
    assert t.dtype is qk.e2m1 and t.shape == (8,)
    assert t.codes().tolist() == codes.tolist()
    assert t.storage.tolist() == [0x12, 0x34, 0xF8, 0x07]            # re-packed high-first
    i = qk.from_dlpack(_PackedProducer(codes, D.kDLInt, 4, padded))
    assert i.dtype is qk.i4 and i.codes().tolist() == codes.tolist()
    bits = np.array([1, 0, 0, 1, 1, 1, 0, 1] * 2)
    u = qk.from_dlpack(_PackedProducer(bits, D.kDLUInt, 1, padded))
    assert u.dtype is qk.u1 and np.array_equal(u.storage, np.packbits(bits))


@pytest.mark.parametrize("t, code, bits", [(qk.e2m1, D.kDLFloat4_e2m1fn, 4), (qk.i4, D.kDLInt, 4),
                                           (qk.u4, D.kDLUInt, 4), (qk.u1, D.kDLUInt, 1)], ids=str)
@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_packed_export_low_bits_first(t, code, bits, versioned):
    """Tensor.dlpack_packed(): DLPack's packed sub-byte dtype, shape in elements, element 0 in
    the low bits, a copy; numba_qk's importer reads it back to the same codes."""
    per = 8 // bits
    codes = np.random.default_rng(bits).integers(0, 1 << bits, (3, 8 * per))
    a = qk.Tensor(np.packbits(codes.astype(np.uint8), axis=-1) if t is qk.u1 else
                  ((codes[..., 0::2] << 4) | codes[..., 1::2]).astype(np.uint8), dtype=t)
    assert a.codes().tolist() == codes.tolist()
    view = a[1:]                                                # a view: export its codes
    exp = view.dlpack_packed()
    assert exp.__dlpack_device__() == (1, 0)
    cap = exp.__dlpack__(max_version=(1, 1)) if versioned else exp.__dlpack__()
    info = capsule_info(cap, versioned)
    assert info[0] == (code, bits, 1)
    assert info[1] == (2, codes.shape[1])                       # elements, not bytes
    if versioned:
        assert info[2] == D.FLAG_IS_COPIED
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (codes[1:].size // per)).from_address(info[3]))
    flat = codes[1:].reshape(-1)
    expect = [sum(int(flat[i * per + k]) << (bits * k) for k in range(per))
              for i in range(flat.size // per)]
    assert raw.tolist() == expect                               # element 0 in the low bits
    back = qk.from_dlpack(view.dlpack_packed())
    assert back.dtype is t and back.codes().tolist() == codes[1:].tolist()
    assert not np.shares_memory(back.storage, a.storage)
    with pytest.raises(BufferError, match="always a copy"):
        exp.__dlpack__(copy=False)
    with pytest.raises(TypeError, match="not a packed sub-byte type"):
        qk.Tensor(np.zeros(4, np.uint8), dtype=qk.e4m3).dlpack_packed()


def test_scaled_elements_export_as_float4():
    x = np.linspace(-6, 6, 64, dtype=np.float32).reshape(2, 32)
    for fmt in (qk.mx.mxfp4, qk.mx.nvfp4):
        st = qk.astype(x, fmt)
        cap = st.elements.dlpack_packed().__dlpack__(max_version=(1, 1))
        info = capsule_info(cap, True)
        assert info[0] == (D.kDLFloat4_e2m1fn, 4, 1) and info[1] == (2, 32)
        back = qk.from_dlpack(st.elements.dlpack_packed())
        assert back.dtype is qk.e2m1
        assert back.codes().tolist() == st.elements.codes().tolist()
        dec = qk.astype(qk.ScaledTensor(back, st.block_scales, fmt, st.tensor_scale), qk.f32)
        assert np.array_equal(dec.view(np.uint32), qk.astype(st, qk.f32).view(np.uint32))
