"""DLPack export (``Tensor.__dlpack__``) and import (``numba_qk.from_dlpack``), CPU only.

Type codes (DLPack 1.x ``DLDataTypeCode``):

==========  ==============================  =====================================================
numba_qk    exported as                     notes
==========  ==============================  =====================================================
f32/f16     kDLFloat 32/16
bf16        kDLBfloat 16
e4m3        kDLFloat8_e4m3fn 8
e5m2        kDLFloat8_e5m2 8
e8m0        kDLFloat8_e8m0fnu 8
e2m3/e3m2   kDLFloat6_e2m3fn/e3m2fn 6       one per byte: needs a versioned capsule with the
                                            IS_SUBBYTE_TYPE_PADDED flag (unversioned: BufferError)
i8/u8/i32   kDLInt 8 / kDLUInt 8 / kDLInt 32
i4/u4/u1    kDLUInt 8, the storage BYTES    zero-copy; last extent counts bytes; element 0 is in
e2m1                                        the HIGH nibble / MSB (numba_qk's order, spec 004)
==========  ==============================  =====================================================

Packed types are exported as their whole bytes (spec 004: "DLPack exposes the whole bytes")
rather than as DLPack's packed sub-byte types, whose order is the opposite (element 0 in the low
bits) and whose shape counts elements: a zero-copy export cannot be both.  Consumers therefore
get uint8 bytes in numba_qk's nibble order from ``__dlpack__``.  ``Tensor.dlpack_packed()``
(:class:`PackedExport`) is the other choice: a copy in DLPack's packed layout --
kDLFloat4_e2m1fn bits=4 for e2m1 (e.g. a ScaledTensor's ``.elements``), kDLInt/kDLUInt bits=4
for i4/u4, kDLUInt bits=1 for u1 -- with the shape in elements and element 0 in the LOW nibble
/ bit (PyTorch's float4_e2m1fn_x2 and ONNX's int4 order).  Import accepts DLPack's own packed layout
(kDLFloat4_e2m1fn bits=4, or kDLInt/kDLUInt bits=4/1, packed low-bits-first or padded one per
byte) and converts it, by a copy, to numba_qk's order.

Lifetime: every export is freed exactly once -- when the consumer takes it (renames the capsule
"used_dltensor[_versioned]") by the deleter it calls later, otherwise (refused, or dropped
unused) by the capsule's destructor.  Both run through a small native guard that keeps a
pending exception intact (see ``_native_guard``): numpy refuses bf16/fp8/e8m0 by raising and
then dropping the capsule, and must see its own error.  A read-only Tensor exports through a
versioned capsule only (READ_ONLY flag); an unversioned request raises numpy's BufferError.
"""

from __future__ import annotations

import ctypes
import operator

import numpy as np

from . import dtypes as _d
from . import tensor as _tensor
from ._convert import convert
from .formats.scalars import (kDLBfloat, kDLBool, kDLFloat, kDLFloat4_e2m1fn,  # noqa: F401
                               kDLFloat6_e2m3fn, kDLFloat6_e3m2fn, kDLFloat8_e4m3fn,
                               kDLFloat8_e5m2, kDLFloat8_e8m0fnu, kDLInt, kDLUInt)
from .tensor import Tensor, storage_dtype

__all__ = ["to_dlpack", "from_dlpack"]

kDLCPU = 1
# the DLDataTypeCode values (kDLInt ...) are declared with the element types (formats.scalars)
FLAG_READ_ONLY, FLAG_IS_COPIED, FLAG_SUBBYTE_PADDED = 1, 2, 4

# numba_qk type -> exported DLPack dtype: the row's own, or the storage bytes of a packed type
_EXPORT = {t: (kDLUInt, 8) if t.is_packed else t.spec.dlpack for t in _d.ALL_TYPES}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Exported structs stay alive here until their deleter runs (keyed by struct address).
_LIVE: dict[int, tuple] = {}


_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


# raw-pointer prototypes: a capsule being destroyed must not be turned into a Python reference
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))


def _make_callbacks(live, is_valid, get_pointer):
    """The two ctypes callbacks.  They reach what they use through their closure, not module
    globals: capsules and consumers' arrays may die at interpreter exit, after this module's
    namespace has been cleared."""

    @_Deleter
    def deleter(addr):
        live.pop(addr, None)

    @_CapsuleDestructor
    def capsule_destructor(capsule_ptr):
        """An unconsumed capsule (name still 'dltensor'/'dltensor_versioned': dropped unused,
        or refused by the consumer) frees its struct; a consumed one ('used_...') leaves that
        to the deleter, which the consumer calls when it is done."""
        for name in (b"dltensor", b"dltensor_versioned"):
            if is_valid(capsule_ptr, name):
                live.pop(get_pointer(capsule_ptr, name), None)

    return deleter, capsule_destructor


_py_deleter, _py_capsule_destructor = _make_callbacks(_LIVE, _IsValidRaw, _GetPointerRaw)


def _immortal(obj):
    """Keeps ``obj`` alive for the life of the process (one reference never dropped): exports
    may outlive this module at interpreter exit, and their hooks must still be there."""
    _api.Py_IncRef(ctypes.py_object(obj))
    return obj


def _native_guard(callback, name):
    """The address of a native ``void name(void *)`` that takes the GIL (PyGILState_Ensure),
    sets aside any pending exception (PyErr_Fetch), calls the ctypes ``callback``, puts the
    exception back (PyErr_Restore) and releases the GIL.

    Why native: a consumer may drop our capsule with its own error pending (numpy does when it
    refuses a dtype: it raises, then Py_DECREFs the capsule, as the DLPack protocol allows).  A
    ctypes Python callback cannot run in that state -- its first C-API call trips over the
    pending error, the callback "fails", ctypes reports "Exception ignored" and *clears* the
    consumer's error (numpy then returns NULL without an exception: SystemError), and the
    export is never freed.  Nor could Python code put the error back: a callback returning
    with an exception set is itself an error.  So the save/restore lives in a few lines of
    LLVM IR (llvmlite, which numba already needs), compiled once on first export."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    def addr(f):
        return ctypes.cast(f, ctypes.c_void_p).value

    i32, i64, ptr, void = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer(), \
        ir.VoidType()
    mod = ir.Module(name=f"numba_qk_dlpack_{name}")
    fn = ir.Function(mod, ir.FunctionType(void, [ptr]), name=name)
    b = ir.IRBuilder(fn.append_basic_block())

    def call(f, ret, args, *vals):
        fty = ir.FunctionType(ret, args)
        return b.call(b.inttoptr(ir.Constant(i64, addr(f)), fty.as_pointer()), vals)

    gil = call(_api.PyGILState_Ensure, i32, [])
    slots = [b.alloca(ptr) for _ in range(3)]
    call(_api.PyErr_Fetch, void, [ptr.as_pointer()] * 3, *slots)
    call(callback, void, [ptr], fn.args[0])
    call(_api.PyErr_Restore, void, [ptr] * 3, *[b.load(s) for s in slots])
    call(_api.PyGILState_Release, void, [i32], gil)
    b.ret_void()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine()
    m = llvm.parse_assembly(str(mod))
    m.verify()
    engine = llvm.create_mcjit_compiler(m, tm)
    engine.finalize_object()
    _ENGINES.append(_immortal(engine))          # the code lives as long as the engine
    return engine.get_function_address(name)


_ENGINES: list = []
_HOOKS: list = []          # [capsule destructor address, DLManagedTensor deleter], once built


def _hooks():
    """(capsule destructor, deleter) for new exports: the native guards around the Python
    callbacks, or -- should llvmlite fail to JIT here -- the bare callbacks (correct whenever
    no exception is pending, the pre-issue-21 behaviour)."""
    if not _HOOKS:
        try:
            hooks = [_native_guard(_py_capsule_destructor, "numba_qk_dlpack_capsule_destructor"),
                     _Deleter(_native_guard(_py_deleter, "numba_qk_dlpack_deleter"))]
        except Exception:                       # pragma: no cover - llvmlite without a JIT
            hooks = [ctypes.cast(_py_capsule_destructor, ctypes.c_void_p).value, _py_deleter]
        _immortal(_py_deleter), _immortal(_py_capsule_destructor)
        _HOOKS[:] = hooks
    return _HOOKS


def _wants_versioned(max_version) -> bool:
    """True when the consumer's max_version (None or a (major, minor) tuple, as numpy checks
    it) allows a versioned DLPack 1.x capsule."""
    if max_version is None:
        return False
    if not isinstance(max_version, tuple) or len(max_version) != 2:
        raise TypeError("max_version must be None or a tuple with two elements.")
    major, _ = (operator.index(v) for v in max_version)
    return major >= 1


def to_dlpack(t: Tensor, *, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule viewing ``t``'s storage (versioned when the consumer asks for >= 1.0).

    A read-only Tensor needs a versioned capsule, which carries DLPack's READ_ONLY flag; an
    unversioned one cannot say read-only, so -- like numpy for a read-only ndarray -- that
    export raises BufferError (``copy=True`` exports a writable copy instead).  The export is
    freed exactly once, whether the consumer takes it (and later calls the deleter), refuses
    it, or drops it unused; a consumer's pending error survives the capsule's destructor."""
    if stream is not None:
        raise BufferError("numba_qk Tensors live on the CPU: stream must be None")
    if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
        raise BufferError(f"numba_qk Tensors live on the CPU; cannot export to {dl_device}")
    if copy is True:
        t = t.copy()
    versioned = _wants_versioned(max_version)
    code, bits = _EXPORT[t.dtype]
    flags = 0
    if bits == 6:
        if not versioned:
            raise BufferError(f"{t.dtype.name} is one code per byte (DLPack bits=6, padded): "
                              f"that needs a versioned DLPack capsule (max_version >= (1, 0))")
        flags |= FLAG_SUBBYTE_PADDED
    store = t.storage
    if not store.flags.writeable:
        if not versioned:           # numpy's own refusal for a read-only ndarray, word for word
            raise BufferError("Cannot export readonly array since signalling readonly is "
                              "unsupported by DLPack (supported by newer DLPack version).")
        flags |= FLAG_READ_ONLY
    if copy is True:
        flags |= FLAG_IS_COPIED
    isz = store.dtype.itemsize
    if any(s % isz for s in store.strides):
        raise BufferError("cannot export a Tensor whose strides are not whole elements")
    return _capsule(store, code, bits, store.shape, [s // isz for s in store.strides], flags,
                    versioned)


# numba_qk packed type -> DLPack's packed sub-byte dtype (element 0 in the LOW bits)
_EXPORT_PACKED = {t: t.spec.dlpack for t in _d.PACKED_TYPES}


class PackedExport:
    """What :meth:`numba_qk.Tensor.dlpack_packed` returns: a DLPack producer of the Tensor's
    codes in DLPack's own packed sub-byte layout -- dtype kDLFloat4_e2m1fn / kDLInt / kDLUInt
    with bits 4 (or 1 for u1), shape counting *elements*, C-contiguous, element 0 in the LOW
    nibble / least significant bit (the order PyTorch's float4_e2m1fn_x2 and ONNX int4 use;
    numba_qk's own storage has it in the high nibble).  The data is a fresh copy (DLPack flag
    IS_COPIED on versioned capsules): the two orders cannot share bytes."""

    def __init__(self, t: Tensor):
        if t.dtype not in _EXPORT_PACKED:
            raise TypeError(f"dlpack_packed: {t.dtype.name} is not a packed sub-byte type "
                            f"(i4, u4, e2m1, u1); use __dlpack__")
        self.dtype, self.shape = t.dtype, tuple(t.shape)
        code_bits = _EXPORT_PACKED[t.dtype][1]
        per = 8 // code_bits
        codes = np.asarray(t.codes(), np.uint8).reshape(-1)       # logical order, any view
        grid = codes.reshape(-1, per) if codes.size else np.zeros((0, per), np.uint8)
        raw = np.zeros(grid.shape[0], np.uint8)
        for k in range(per):                                      # element 0 in the low bits
            raw |= grid[:, k] << np.uint8(code_bits * k)
        self.data = raw

    def __dlpack_device__(self):
        return (kDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is not None:
            raise BufferError("numba_qk Tensors live on the CPU: stream must be None")
        if dl_device is not None and tuple(dl_device) != (kDLCPU, 0):
            raise BufferError(f"numba_qk Tensors live on the CPU; cannot export to {dl_device}")
        if copy is False:
            raise BufferError("dlpack_packed: DLPack's packed order is always a copy of "
                              "numba_qk's bytes; use __dlpack__ for the zero-copy bytes")
        versioned = _wants_versioned(max_version)
        code, bits = _EXPORT_PACKED[self.dtype]
        return _capsule(self.data, code, bits, self.shape, _c_strides(self.shape),
                        FLAG_IS_COPIED, versioned)


def _capsule(store, code, bits, shape, strides, flags, versioned):
    """A DLPack capsule for ``store``'s memory (kept alive until the consumer's deleter runs)
    with the given dtype, shape and strides (in elements of the DLPack dtype)."""
    ndim = len(shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*strides)
    if versioned:
        m = DLManagedTensorVersioned()
        m.version = DLPackVersion(1, 1)
        m.flags = flags
    else:
        m = DLManagedTensor()
    dl = m.dl_tensor
    dl.data = store.ctypes.data if store.size else None
    dl.device = DLDevice(kDLCPU, 0)
    dl.ndim = ndim
    dl.dtype = DLDataType(code, bits, 1)
    dl.shape = shape
    dl.strides = strides
    dl.byte_offset = 0
    destructor, deleter = _hooks()
    m.manager_ctx = None
    m.deleter = deleter
    addr = ctypes.addressof(m)
    _LIVE[addr] = (m, shape, strides, store)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return _api.PyCapsule_New(addr, name, destructor)


# DLPack dtype -> numba_qk type: every row's own (packed ones in DLPack's sub-byte layout), and
# bool bytes read as u8
_IMPORT = {t.spec.dlpack: t for t in _d.ALL_TYPES} | {(kDLBool, 8): _d.u8}


class _Owner:
    """Holds an imported DLPack tensor; calls the producer's deleter when collected."""

    def __init__(self, mptr, versioned, capsule):
        self.mptr, self.versioned, self.capsule = mptr, versioned, capsule

    def __del__(self):
        cls = DLManagedTensorVersioned if self.versioned else DLManagedTensor
        m = cls.from_address(self.mptr)
        deleter = ctypes.cast(m.deleter, ctypes.c_void_p).value
        if deleter:
            _Deleter(deleter)(self.mptr)


def from_dlpack(obj) -> "Tensor | np.ndarray":
    """A Tensor viewing a DLPack producer's CPU memory (zero-copy), or a converted copy for
    DLPack's packed sub-byte layouts (element 0 in the low bits)."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(obj).__name__} has no __dlpack__")
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (kDLCPU, 0)
    if int(dev[0]) != kDLCPU:
        raise BufferError(f"from_dlpack: only CPU tensors are supported, got device {tuple(dev)}")
    try:
        cap = obj.__dlpack__(max_version=(1, 1))
    except TypeError:
        cap = obj.__dlpack__()
    versioned = bool(_api.PyCapsule_IsValid(cap, b"dltensor_versioned"))
    name = b"dltensor_versioned" if versioned else b"dltensor"
    if not versioned and not _api.PyCapsule_IsValid(cap, name):
        raise BufferError("from_dlpack: not an unconsumed DLPack capsule")
    mptr = _api.PyCapsule_GetPointer(cap, name)
    m = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(mptr)
    flags = m.flags if versioned else 0
    if versioned and m.version.major > 1:
        raise BufferError(f"from_dlpack: DLPack major version {m.version.major} not supported")
    _api.PyCapsule_SetName(cap, b"used_dltensor_versioned" if versioned else b"used_dltensor")
    owner = _Owner(mptr, versioned, cap)
    dl = m.dl_tensor
    key = (dl.dtype.code, dl.dtype.bits)
    if dl.dtype.lanes != 1 or key not in _IMPORT:
        raise BufferError(f"from_dlpack: unsupported DLPack dtype code={dl.dtype.code} "
                          f"bits={dl.dtype.bits} lanes={dl.dtype.lanes}")
    t = _IMPORT[key]
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    padded = bool(flags & FLAG_SUBBYTE_PADDED)
    unit = 1 if dl.dtype.bits < 8 and not padded and dl.dtype.bits != 6 else \
        max(1, dl.dtype.bits // 8)
    if dl.dtype.bits == 6 and not padded:
        raise BufferError("from_dlpack: bit-packed fp6 is not supported (numba_qk stores fp6 one "
                          "per byte); export it padded")
    strides = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides else None
    base = (dl.data or 0) + dl.byte_offset
    sub = dl.dtype.bits < 8 and dl.dtype.bits != 6
    if sub and not padded:                        # DLPack packed: element 0 in the low bits
        per = 8 // dl.dtype.bits
        n = int(np.prod(shape, dtype=np.int64))
        if strides is not None and any(st != c for st, c in zip(strides, _c_strides(shape))):
            raise BufferError("from_dlpack: strided packed sub-byte tensors are not supported")
        nbytes = -(-n // per)
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(base)) if nbytes \
            else np.zeros(0, np.uint8)
        shifts = np.arange(0, 8, dl.dtype.bits, dtype=np.uint8)
        codes = ((raw[:, None] >> shifts) & np.uint8((1 << dl.dtype.bits) - 1)).reshape(-1)[:n]
        result = convert(_code_tensor_source(codes.reshape(shape), t), t)
        del owner, raw
        return result
    itemsize = unit
    if strides is None:
        strides = _c_strides(shape)
    extent = 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides)) if all(shape) else 0
    lo = sum((s - 1) * st for s, st in zip(shape, strides) if st < 0) if all(shape) else 0
    sd = np.dtype(f"u{itemsize}")
    if extent:
        buf = (ctypes.c_uint8 * (extent * itemsize)).from_address(base + lo * itemsize)
        # the owner rides on the ctypes buffer: every view's base chain ends there (an ndarray
        # in between would be collapsed away by numpy, freeing the producer's memory early)
        buf._dlpack_owner = owner
        flat = np.frombuffer(buf, sd)
        arr = np.lib.stride_tricks.as_strided(flat[-lo:] if lo else flat, shape,
                                              [st * itemsize for st in strides])
    else:
        arr = np.zeros(shape, sd)
    del owner
    if flags & FLAG_READ_ONLY:
        arr.flags.writeable = False
    if sub:                                       # padded u1/i4/u4/e2m1: one code per byte
        return convert(_code_tensor_source(np.array(arr), t), t)
    return Tensor._wrap(arr.view(storage_dtype(t)), t)


def _c_strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.insert(0, acc)
        acc *= s
    return tuple(out)


def _code_tensor_source(codes, t):
    """ml_dtypes-free source for astype: one code per byte of packed type t, as values."""
    if t is _d.i4:
        return ((codes.astype(np.int8) ^ 8) - 8).astype(np.int8)
    if t is _d.e2m1:
        vals = np.array([float(_d.Scalar._make(_d.e2m1, c)) for c in range(16)], np.float32)
        return vals[codes]
    return codes.astype(np.uint8)


# Tensor.__dlpack__ / Tensor.dlpack_packed reach this module through the array types' table
_tensor.OPERATIONS.update(to_dlpack=to_dlpack, dlpack_packed=PackedExport)
