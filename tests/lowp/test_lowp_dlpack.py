"""DLPack export/import: type codes, zero copy, packed bytes, DLPack's own packed order."""

import ctypes
import gc

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _dlpack as D
from subsets import default_few


@pytest.fixture(autouse=True)
def _collect_only_this_tests_objects():
    """Objects made before the test are moved out of the collector's reach for its duration
    (``gc.freeze``), so that each ``gc.collect()`` here scans only what the test made: in a test
    worker that has compiled hundreds of kernels a full collection took ~0.5 s, and this module
    collects ~80 times.  What the tests check (their own exports freed) is unchanged."""
    gc.freeze()
    yield
    gc.unfreeze()


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


class _Unversioned:
    """A producer wrapper whose ``__dlpack__`` takes no max_version: consumers fall back to the
    legacy unversioned capsule."""

    def __init__(self, obj):
        self.obj = obj

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        return self.obj.__dlpack__()


class _MaxVersion:
    """A producer wrapper that forwards a fixed max_version, whatever the consumer asks."""

    def __init__(self, obj, max_version):
        self.obj, self.max_version = obj, max_version

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, **kw):
        return self.obj.__dlpack__(max_version=self.max_version)


@pytest.fixture
def unraisable(monkeypatch):
    """Records everything reported through sys.unraisablehook ("Exception ignored ...")."""
    import sys
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(
        f"{u.err_msg}: {u.exc_type.__name__}: {u.exc_value}"))
    return seen


def _refused_by_numpy(producer, n=40):
    """np.from_dlpack(producer) n times; each must raise numpy's own error, not SystemError."""
    errors = set()
    for _ in range(n):
        with pytest.raises(Exception) as ei:
            np.from_dlpack(producer)
        assert not isinstance(ei.value, SystemError), ei.value
        errors.add((type(ei.value), str(ei.value)))
    return errors


@pytest.mark.parametrize("t", default_few([qk.bf16, qk.e4m3, qk.e5m2, qk.e8m0], {"BF16", "E8M0"}))
@pytest.mark.parametrize("how", ["versioned", "unversioned", "max_version_0", "max_version_1"])
def test_numpy_refusing_a_dtype_sees_its_own_error_and_nothing_leaks(t, how, unraisable):
    """numpy has no DLPack bfloat/fp8 types: it drops the capsule with its error pending.  The
    capsule destructor must keep that error (no SystemError, no 'Exception ignored') and free
    the export (issue 21)."""
    a = qk.Tensor(qk.astype(np.linspace(-2, 2, 8, dtype=np.float32), t))
    producer = {"versioned": a, "unversioned": _Unversioned(a),
                "max_version_0": _MaxVersion(a, (0, 8)),
                "max_version_1": _MaxVersion(a, (1, 0))}[how]
    gc.collect()
    before = len(D._LIVE)
    errors = _refused_by_numpy(producer)
    gc.collect()
    assert len(errors) == 1                                     # the same clean error each time
    (etype, msg), = errors
    assert issubclass(etype, (BufferError, TypeError, RuntimeError)) and "dtype" in msg.lower()
    assert unraisable == []
    assert len(D._LIVE) == before


@pytest.mark.parametrize("t", [qk.e2m1, qk.i4, qk.u4, qk.u1], ids=str)
@pytest.mark.parametrize("versioned", [True, False])
def test_numpy_refusing_dlpack_packed_is_clean_too(t, versioned, unraisable):
    a = qk.Tensor(np.arange(8, dtype=np.uint8), dtype=t)
    exp = a.dlpack_packed()
    gc.collect()
    before = len(D._LIVE)
    _refused_by_numpy(exp if versioned else _Unversioned(exp))
    gc.collect()
    assert unraisable == [] and len(D._LIVE) == before


@pytest.mark.parametrize("versioned", [True, False])
def test_consumed_and_dropped_capsules_are_freed_once(versioned, unraisable):
    """Consumer took ownership (renamed to used_dltensor[_versioned], deleter runs when its
    array dies), capsule dropped unused, capsule refused: each frees the export exactly once."""
    t = qk.Tensor(qk.astype(np.arange(8, dtype=np.float32), qk.f16))
    producer = t if versioned else _Unversioned(t)
    gc.collect()
    before = len(D._LIVE)
    arrays = [np.from_dlpack(producer) for _ in range(20)]
    assert len(D._LIVE) == before + 20
    assert all(np.shares_memory(x, t.storage) for x in arrays)
    del arrays
    gc.collect()
    assert len(D._LIVE) == before
    for _ in range(20):                                          # dropped unused
        t.__dlpack__(max_version=(1, 0) if versioned else None)
    backs = [qk.from_dlpack(producer) for _ in range(5)]         # numba_qk's own consumer
    assert len(D._LIVE) == before + 5
    del backs
    gc.collect()
    assert len(D._LIVE) == before and unraisable == []


_NUMPY_READONLY = ("Cannot export readonly array since signalling readonly is unsupported by "
                   "DLPack (supported by newer DLPack version).")


@pytest.mark.parametrize("t", [qk.f32, qk.bf16, qk.e4m3, qk.i4], ids=str)
def test_readonly_tensor_needs_a_versioned_capsule(t, unraisable):
    """Like numpy for a read-only ndarray: an unversioned capsule cannot say read-only, so the
    export is refused; a versioned one carries FLAG_READ_ONLY; copy=True exports a writable
    copy."""
    store = qk.Tensor(qk.astype(np.arange(8, dtype=np.float32), t)).storage.copy()
    store.flags.writeable = False
    a = qk.Tensor._wrap(store, t)
    ref = np.arange(4.0)
    ref.flags.writeable = False
    gc.collect()
    before = len(D._LIVE)
    for kw in ({}, {"max_version": None}, {"max_version": (0, 8)}, {"copy": False}):
        with pytest.raises(BufferError) as ei:
            a.__dlpack__(**kw)
        with pytest.raises(BufferError) as ni:
            ref.__dlpack__(**kw)
        assert str(ei.value) == str(ni.value) == _NUMPY_READONLY
    assert len(D._LIVE) == before
    info = capsule_info(a.__dlpack__(max_version=(1, 0)), True)
    assert info[2] == D.FLAG_READ_ONLY and info[3] == store.ctypes.data
    info = capsule_info(a.__dlpack__(copy=True), False)          # a writable copy: allowed
    assert info[3] != store.ctypes.data
    info = capsule_info(a.__dlpack__(max_version=(1, 0), copy=True), True)
    assert info[2] == D.FLAG_IS_COPIED
    if t in (qk.f32, qk.i4):                                     # numpy knows these dtypes
        got = np.from_dlpack(a)
        assert not got.flags.writeable and np.shares_memory(got, store)
        with pytest.raises(BufferError, match="readonly"):
            np.from_dlpack(_Unversioned(a))
        del got
    b = qk.from_dlpack(a)
    assert not b.storage.flags.writeable and np.shares_memory(b.storage, store)
    del b
    gc.collect()
    assert len(D._LIVE) == before and unraisable == []


def test_imported_tensor_keeps_the_producer_alive():
    """qk.from_dlpack's Tensor holds the producer's export until it dies: numpy used to collapse
    the keep-alive view out of the base chain, so the deleter ran at once and dropping the
    producer freed memory the Tensor still read (a segfault)."""
    import weakref
    x = np.arange(1 << 12, dtype=np.float32)
    alive = weakref.ref(x)
    t = qk.from_dlpack(x[::-2])                   # negative strides: the offset path as well
    del x
    gc.collect()
    assert alive() is not None
    assert t.storage.view(np.float32).tolist() == list(np.arange(1 << 12, dtype=np.float32)[::-2])
    u = t[1:]
    del t
    gc.collect()
    assert alive() is not None
    del u
    gc.collect()
    assert alive() is None


def _native_call_with_error_pending(fn_addr, arg):
    """Calls native ``fn_addr(arg)`` from native code with a RuntimeError('pending') set --
    as a C consumer on its error path would -- and returns to Python, which then raises it."""
    import llvmlite.binding as llvm
    from llvmlite import ir
    i64, ptr, void = ir.IntType(64), ir.IntType(8).as_pointer(), ir.VoidType()
    mod = ir.Module(name="pending_error_consumer")
    fn = ir.Function(mod, ir.FunctionType(void, [ptr]), name="consumer")
    b = ir.IRBuilder(fn.append_basic_block())

    def call(addr, ret, args, *vals):
        fty = ir.FunctionType(ret, args)
        return b.call(b.inttoptr(ir.Constant(i64, addr), fty.as_pointer()), vals)

    set_string = ctypes.cast(ctypes.pythonapi.PyErr_SetString, ctypes.c_void_p).value
    msg = ctypes.create_string_buffer(b"pending")
    call(set_string, void, [ptr, ptr], b.inttoptr(ir.Constant(i64, id(RuntimeError)), ptr),
         b.inttoptr(ir.Constant(i64, ctypes.addressof(msg)), ptr))
    call(fn_addr, void, [ptr], fn.args[0])
    b.ret_void()
    tm = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(mod)), tm)
    engine.finalize_object()
    ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(engine.get_function_address("consumer"))(arg)


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_and_destructor_keep_a_pending_error(versioned, unraisable):
    """The DLManagedTensor deleter and the capsule destructor may run with the consumer's
    error pending: they free the export and leave that error as it was."""
    t = qk.Tensor(qk.astype(np.arange(8, dtype=np.float32), qk.bf16))
    gc.collect()
    before = len(D._LIVE)
    cap = t.__dlpack__(max_version=(1, 0) if versioned else None)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    mptr = D._api.PyCapsule_GetPointer(cap, name)
    m = (D.DLManagedTensorVersioned if versioned else D.DLManagedTensor).from_address(mptr)
    D._api.PyCapsule_SetName(cap, b"used_" + name)             # consumed
    deleter = ctypes.cast(m.deleter, ctypes.c_void_p).value
    del m
    with pytest.raises(RuntimeError, match="^pending$"):
        _native_call_with_error_pending(deleter, mptr)
    assert len(D._LIVE) == before
    del cap                                                     # used_: the destructor is a no-op
    assert len(D._LIVE) == before
    cap = t.__dlpack__(max_version=(1, 0) if versioned else None)
    assert len(D._LIVE) == before + 1
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(cap))           # a reference only C holds
    addr = id(cap)
    del cap
    assert len(D._LIVE) == before + 1
    decref = ctypes.cast(ctypes.pythonapi.Py_DecRef, ctypes.c_void_p).value
    with pytest.raises(RuntimeError, match="^pending$"):        # the destructor runs in there
        _native_call_with_error_pending(decref, addr)
    gc.collect()
    assert len(D._LIVE) == before and unraisable == []


@pytest.mark.parametrize("mv", [(), (1,), "ab", 5, [1, 0], (1, 0, 0), ("a", "b"), (1.5, 0)],
                         ids=repr)
def test_bad_max_version_is_a_clean_type_error(mv):
    """Like numpy: max_version must be None or a two-int tuple; nothing is exported on error."""
    a = qk.Tensor(qk.astype(np.zeros(4, np.float32), qk.bf16))
    gc.collect()
    before = len(D._LIVE)
    for producer in (a, qk.Tensor(np.zeros(2, np.uint8), dtype=qk.i4).dlpack_packed()):
        with pytest.raises(TypeError, match="max_version|integer"):
            producer.__dlpack__(max_version=mv)
    assert len(D._LIVE) == before
    assert capsule_info(a.__dlpack__(max_version=(2, 0)), True)[0] == (4, 16, 1)


@pytest.mark.slow  # default run under 10 minutes (every type through numkong)
def test_numkong_consumer_takes_or_refuses_cleanly(unraisable):
    """NumKong (when installed) is a second consumer: it takes bf16/fp8/fp6 zero-copy and
    refuses e8m0 and DLPack's packed 4-/1-bit types with its own TypeError; either way the
    export is freed exactly once and nothing is reported as ignored."""
    nk = pytest.importorskip("numkong")
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(2, 16)
    gc.collect()
    before = len(D._LIVE)
    for t, name in ((qk.f32, "float32"), (qk.bf16, "bfloat16"), (qk.e4m3, "e4m3"),
                    (qk.e5m2, "e5m2"), (qk.e2m3, "e2m3"), (qk.e3m2, "e3m2")):
        a = qk.Tensor(qk.astype(x, t))
        got = [nk.from_dlpack(a) for _ in range(10)]
        assert all(str(g.dtype) == name and tuple(g.shape) == (2, 16) and
                   g.data_ptr == a.storage.ctypes.data for g in got)
        assert len(D._LIVE) == before + 10
        del got
        gc.collect()
        assert len(D._LIVE) == before
    refused = [qk.Tensor(qk.astype(x, qk.e8m0))] + [
        qk.Tensor(np.arange(8, dtype=np.uint8), dtype=t).dlpack_packed()
        for t in (qk.e2m1, qk.i4, qk.u4, qk.u1)]
    for producer in refused + [_Unversioned(p) for p in refused]:
        for _ in range(10):
            with pytest.raises(TypeError, match="unsupported DLPack dtype"):
                nk.from_dlpack(producer)
    gc.collect()
    assert len(D._LIVE) == before and unraisable == []


def test_exports_alive_at_interpreter_exit_are_freed_quietly():
    """Capsules and consumers' arrays that die at interpreter exit, after numba_qk._dlpack's
    namespace is cleared, still run their hooks: no 'Exception ignored', no crash."""
    import subprocess
    import sys
    code = (
        "import numpy as np, numba_qk as qk, numba_qk._dlpack as D\n"
        "t = qk.Tensor(qk.astype(np.zeros(8, np.float32), qk.bf16))\n"
        "f = qk.Tensor(qk.astype(np.zeros(8, np.float32), qk.f32))\n"
        "D._caps = [t.__dlpack__(max_version=(1, 0)), t.__dlpack__()]\n"
        "D._arrs = [np.from_dlpack(f), np.from_dlpack(f)]\n"
        "caps, arrs = [t.__dlpack__()], [np.from_dlpack(f)]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
