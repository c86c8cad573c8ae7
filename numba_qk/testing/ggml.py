"""ggml's own C functions through ctypes, for cross-checks (tests) and baselines (bench/).

Home: ``numba_qk.testing.ggml`` (was ``numba_qk._ggml_ctypes``, kept as an alias).  Optional:
it needs ggml's shared libraries, from the package ``libggml-python``
(prebuilt, AVX2) or from a folder given to ``load(libdir)`` (e.g. a ``-march=native`` build),
which numba_qk never requires; ``load()`` returns None when they are absent.  With a build that
has the backend registry it also reports the build's features (``ggml_backend_get_features``) and
lists the CPU device's extra buffer types (CPU_REPACK, AMX), whose weight layouts ``matvec(...,
buft=...)`` measures through ``ggml_backend_graph_compute``.  Exposes ggml's
reference quantizers and dequantizers (``ggml_get_type_traits``), ``ggml_quantize_chunk`` (with an
optional importance matrix), its CPU quantizers and
``vec_dot`` kernels (``ggml_get_type_traits_cpu``) and a ``ggml_mul_mat`` graph.
"""

from __future__ import annotations

import ctypes as C
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from numba_qk.formats.ggml_types import GGMLType

GGML_TYPE_F32, GGML_TYPE_Q4_K, GGML_TYPE_Q8_K = GGMLType.F32, GGMLType.Q4_K, GGMLType.Q8_K


class _InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


class _Traits(C.Structure):
    _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64),
                ("blck_size_interleave", C.c_int64), ("type_size", C.c_size_t),
                ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                ("from_float_ref", C.c_void_p)]


class _TraitsCPU(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p),
                ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


_FROM_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
_TO_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
_VEC_DOT = C.CFUNCTYPE(None, C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                       C.c_void_p, C.c_size_t, C.c_int)


class _Feature(C.Structure):
    _fields_ = [("name", C.c_char_p), ("value", C.c_char_p)]


_GET_FEATURES = C.CFUNCTYPE(C.POINTER(_Feature), C.c_void_p)
_GET_EXTRA_BUFTS = C.CFUNCTYPE(C.POINTER(C.c_void_p), C.c_void_p)
CPU_HAS = ("sse3", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2", "avx512", "avx512_vbmi",
           "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "llamafile")


_PROBING = "NUMBA_QK_GGML_PROBING_AMX"


def _amx_failure(libdir: Path):
    """None if a small batched product with its weights in ggml's AMX buffer type runs in a
    child process, else why not.  ggml's AMX ``mul_mat`` segfaults on some machines
    (llama.cpp issue 20824, unfixed; seen on a 2-vCPU Intel Xeon VM): there llama.cpp itself
    crashes, so a baseline built that way is built without AMX, and the bench leaves it out."""
    code = ("import sys, numpy as np\n"
            "from numba_qk.testing.ggml import load\n"
            "g = load(sys.argv[1])\n"
            "w = np.zeros((64, 2, 18), np.uint8)\n"
            "y = g.matvec(w, batch=8, type_id=2, buft='AMX')(np.ones((8, 64), np.float32))\n"
            "print('ok' if y.shape == (8, 64) else 'bad shape')\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(libdir)], capture_output=True,
                           text=True, timeout=120, env={**os.environ, _PROBING: "1"})
    except subprocess.TimeoutExpired:
        return "ggml's AMX product did not finish in 120 s"
    if r.returncode == 0 and r.stdout.strip().endswith("ok"):
        return None
    how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
    return f"ggml's AMX product failed in a child process ({how})"


# Weight types each extra buffer type converts (others would not be converted, or crash ggml's
# CPU_REPACK upload): ggml-cpu/repack.cpp and amx/common.h of the ggml these were written against.
EXTRA_BUFT_TYPES = {
    "CPU_REPACK": {GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL},
    "AMX": {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K,
            GGMLType.Q6_K, GGMLType.IQ4_XS},
}


class GGML:
    def __init__(self, libdir: Path, version: str):
        self.version = version
        self.libdir = Path(libdir)
        self.base = C.CDLL(str(libdir / "libggml-base.so"), mode=C.RTLD_GLOBAL)
        self.cpu = C.CDLL(str(libdir / "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
        cpu, base = self.cpu, self.base
        cpu.ggml_cpu_init()
        cpu.ggml_get_type_traits_cpu.restype = C.POINTER(_TraitsCPU)
        cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
        t4 = cpu.ggml_get_type_traits_cpu(GGML_TYPE_Q4_K).contents
        t8 = cpu.ggml_get_type_traits_cpu(GGML_TYPE_Q8_K).contents
        assert t4.vec_dot_type == GGML_TYPE_Q8_K
        self._vec_dot = _VEC_DOT(t4.vec_dot)
        self._q8_from_float = _FROM_FLOAT(t8.from_float)
        base.ggml_get_type_traits.restype = C.POINTER(_Traits)
        base.ggml_get_type_traits.argtypes = [C.c_int]
        base.ggml_init.restype = C.c_void_p
        base.ggml_init.argtypes = [_InitParams]
        base.ggml_new_tensor_1d.restype = C.c_void_p
        base.ggml_new_tensor_1d.argtypes = [C.c_void_p, C.c_int, C.c_int64]
        base.ggml_new_tensor_2d.restype = C.c_void_p
        base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
        base.ggml_mul_mat.restype = C.c_void_p
        base.ggml_mul_mat.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
        base.ggml_new_graph.restype = C.c_void_p
        base.ggml_new_graph.argtypes = [C.c_void_p]
        base.ggml_build_forward_expand.argtypes = [C.c_void_p, C.c_void_p]
        base.ggml_get_data.restype = C.c_void_p
        base.ggml_get_data.argtypes = [C.c_void_p]
        base.ggml_free.argtypes = [C.c_void_p]
        cpu.ggml_graph_compute_with_ctx.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
        self.features = {name: bool(getattr(cpu, f"ggml_cpu_has_{name}")())
                         for name in CPU_HAS if hasattr(cpu, f"ggml_cpu_has_{name}")}
        self.build_features: dict[str, str] = {}
        self.extra_bufts: dict[str, int] = {}
        self.dropped_bufts: dict[str, str] = {}   # extra buffer types left out, and why
        self.dev = None
        self._backends: dict[int, int] = {}
        try:
            self._init_backend()
        except (AttributeError, OSError):  # an older ggml without the backend registry
            self.dev = None

    def _init_backend(self):
        cpu, base = self.cpu, self.base
        cpu.ggml_backend_cpu_reg.restype = C.c_void_p
        base.ggml_backend_reg_get_proc_address.restype = C.c_void_p
        base.ggml_backend_reg_get_proc_address.argtypes = [C.c_void_p, C.c_char_p]
        base.ggml_backend_reg_dev_get.restype = C.c_void_p
        base.ggml_backend_reg_dev_get.argtypes = [C.c_void_p, C.c_size_t]
        base.ggml_backend_buft_name.restype = C.c_char_p
        base.ggml_backend_buft_name.argtypes = [C.c_void_p]
        for name, res, args in (
                ("ggml_backend_dev_buffer_type", C.c_void_p, [C.c_void_p]),
                ("ggml_backend_dev_init", C.c_void_p, [C.c_void_p, C.c_char_p]),
                ("ggml_backend_buft_alloc_buffer", C.c_void_p, [C.c_void_p, C.c_size_t]),
                ("ggml_backend_buft_get_alloc_size", C.c_size_t, [C.c_void_p, C.c_void_p]),
                ("ggml_backend_buft_get_alignment", C.c_size_t, [C.c_void_p]),
                ("ggml_backend_buffer_get_base", C.c_void_p, [C.c_void_p]),
                ("ggml_backend_buffer_free", None, [C.c_void_p]),
                ("ggml_backend_tensor_alloc", C.c_int, [C.c_void_p, C.c_void_p, C.c_void_p]),
                ("ggml_backend_tensor_set", None, [C.c_void_p, C.c_void_p, C.c_size_t,
                                                   C.c_size_t]),
                ("ggml_backend_graph_compute", C.c_int, [C.c_void_p, C.c_void_p]),
                ("ggml_backend_free", None, [C.c_void_p]),
                ("ggml_nbytes", C.c_size_t, [C.c_void_p]),
                ("ggml_tensor_overhead", C.c_size_t, []),
                ("ggml_graph_overhead", C.c_size_t, [])):
            f = getattr(base, name)
            f.restype, f.argtypes = res, args
        cpu.ggml_backend_cpu_set_n_threads.argtypes = [C.c_void_p, C.c_int]
        reg = cpu.ggml_backend_cpu_reg()
        self.dev = base.ggml_backend_reg_dev_get(reg, 0)
        addr = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
        if addr:
            feats = _GET_FEATURES(addr)(reg)
            i = 0
            while feats[i].name:
                self.build_features[feats[i].name.decode()] = feats[i].value.decode()
                i += 1
        addr = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if addr:
            bufts = _GET_EXTRA_BUFTS(addr)(self.dev)
            i = 0
            while bufts[i]:
                self.extra_bufts[base.ggml_backend_buft_name(bufts[i]).decode()] = bufts[i]
                i += 1
        if "AMX" in self.extra_bufts and os.environ.get(_PROBING) is None:
            reason = _amx_failure(self.libdir)
            if reason:
                del self.extra_bufts["AMX"]
                self.dropped_bufts["AMX"] = reason

    def _traits(self, type_id):
        return self.base.ggml_get_type_traits(type_id).contents

    def quantize_ref(self, type_id: int, x: np.ndarray) -> np.ndarray:
        """ggml's reference quantizer (``quantize_row_*_ref``) for f32 ``x`` [G, block]."""
        t = self._traits(type_id)
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros((x.shape[0], t.type_size), np.uint8)
        _FROM_FLOAT(t.from_float_ref)(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def quantize_chunk(self, type_id: int, x: np.ndarray, imatrix=None) -> np.ndarray:
        """ggml's ``ggml_quantize_chunk(type, x, dst, 0, nrows, n_per_row, imatrix)`` (the path
        llama.cpp's quantizer takes; ``quantize_<t>`` of ggml-quants.c) for f32 rows ``x``
        [nrows, n_per_row]; ``imatrix``: None or f32 [n_per_row] (one weight per column).
        Returns the records as uint8 [nrows * n_per_row // block, type_size]."""
        t = self._traits(type_id)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] % t.blck_size:
            raise ValueError(f"quantize_chunk: rows of whole blocks of {t.blck_size} expected, "
                             f"got {x.shape}")
        qc = self.base.ggml_quantize_chunk
        qc.restype = C.c_size_t
        qc.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64,
                       C.c_void_p]
        nrows, n_per_row = x.shape
        out = np.zeros((nrows * n_per_row // t.blck_size, t.type_size), np.uint8)
        qw = None
        if imatrix is not None:
            qw = np.ascontiguousarray(imatrix, dtype=np.float32)
            if qw.shape != (n_per_row,):
                raise ValueError(f"quantize_chunk: imatrix of {n_per_row} weights expected, "
                                 f"got {qw.shape}")
        qc(int(type_id), x.ctypes.data, out.ctypes.data, 0, nrows, n_per_row,
           None if qw is None else qw.ctypes.data)
        return out

    def dequantize(self, type_id: int, records: np.ndarray) -> np.ndarray:
        """ggml's ``dequantize_row_*`` for records [G, bytes]."""
        t = self._traits(type_id)
        records = np.ascontiguousarray(records)
        out = np.empty((records.shape[0], t.blck_size), np.float32)
        _TO_FLOAT(t.to_float)(records.ctypes.data, out.ctypes.data, out.size)
        return out

    def vec_dot(self, type_id: int, w: np.ndarray, xq: np.ndarray) -> float:
        """ggml's CPU ``vec_dot`` of weight records w [G, bytes] with activation records xq
        (of the type's vec_dot_type)."""
        t = self.cpu.ggml_get_type_traits_cpu(type_id).contents
        n = w.shape[0] * self._traits(type_id).blck_size
        s = C.c_float()
        _VEC_DOT(t.vec_dot)(n, C.byref(s), 0, np.ascontiguousarray(w).ctypes.data, 0,
                            np.ascontiguousarray(xq).ctypes.data, 0, 1)
        return s.value

    def vec_dot_type(self, type_id: int) -> int:
        return self.cpu.ggml_get_type_traits_cpu(type_id).contents.vec_dot_type

    def quantize_q8_k(self, x: np.ndarray, out: np.ndarray) -> None:
        """ggml's quantize_row_q8_K (its own numerics: iscale = -128 / max)."""
        self._q8_from_float(x.ctypes.data, out.ctypes.data, x.size)

    def vec_dot_q4_k_q8_k(self, w: np.ndarray, xq: np.ndarray) -> float:
        s = C.c_float()
        self._vec_dot(w.shape[0] * 256, C.byref(s), 0, w.ctypes.data, 0, xq.ctypes.data, 0, 1)
        return s.value

    def backend(self, threads: int):
        """One CPU backend per thread count, shared by every graph (as llama.cpp runs one):
        switching between backends costs each its own thread pool and work buffer."""
        if threads not in self._backends:
            b = self.base.ggml_backend_dev_init(self.dev, None)
            self.cpu.ggml_backend_cpu_set_n_threads(b, threads)
            self._backends[threads] = b
        return self._backends[threads]

    def weight_bufts(self, type_id: int) -> list[str]:
        """Buffer types worth measuring for weights of ``type_id``: "CPU" (plain, through the
        backend) and the extra ones that convert this type; [] without a backend registry."""
        if self.dev is None:
            return []
        return ["CPU"] + [b for b in self.extra_bufts if type_id in EXTRA_BUFT_TYPES.get(b, ())]

    def matvec(self, w: np.ndarray, threads: int = 1, batch: int = 0,
               type_id: int = GGML_TYPE_Q4_K, buft: str | None = None):
        """ggml_mul_mat of weights [rows, G, bytes] (of ``type_id``) and an f32 vector
        (batch=0) or a [batch, K] matrix.  ``buft`` names one of ``extra_bufts`` (e.g.
        "CPU_REPACK"): the weights then live in that buffer type (repacked on upload) and the
        graph runs through the CPU backend; "CPU" is the backend's plain buffer type."""
        if buft is None:
            return Matvec(self, w, threads, batch, type_id)
        bt = (self.base.ggml_backend_dev_buffer_type(self.dev) if buft == "CPU"
              else self.extra_bufts[buft])
        return BackendMatvec(self, w, threads, batch, type_id, bt)


class Matvec:
    """A prepared ggml_mul_mat graph: Q4_K weights [rows, cols] times f32 activations."""

    def __init__(self, g: GGML, w: np.ndarray, threads: int, batch: int = 0,
                 type_id: int = GGML_TYPE_Q4_K):
        rows, groups = w.shape[0], w.shape[1]
        cols = groups * g._traits(type_id).blck_size
        n = max(batch, 1)
        self.g, self.threads, self.rows, self.cols = g, threads, rows, cols
        # tensors + graph + the work buffer (activations quantized to Q8_K) + headroom
        size = w.nbytes + n * (cols * 4 + rows * 4) + 2 * n * groups * 292 + (1 << 20) * 32
        self.ctx = g.base.ggml_init(_InitParams(size, None, False))
        wt = g.base.ggml_new_tensor_2d(self.ctx, type_id, cols, rows)
        if batch:
            self.xt = g.base.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, cols, batch)
        else:
            self.xt = g.base.ggml_new_tensor_1d(self.ctx, GGML_TYPE_F32, cols)
        self.yt = g.base.ggml_mul_mat(self.ctx, wt, self.xt)
        self.graph = g.base.ggml_new_graph(self.ctx)
        g.base.ggml_build_forward_expand(self.graph, self.yt)
        C.memmove(g.base.ggml_get_data(wt), w.ctypes.data, w.nbytes)
        xshape = (batch, cols) if batch else (cols,)
        yshape = (batch, rows) if batch else (rows,)
        self.x = np.ctypeslib.as_array(
            C.cast(g.base.ggml_get_data(self.xt), C.POINTER(C.c_float)), shape=xshape)
        self.y = np.ctypeslib.as_array(
            C.cast(g.base.ggml_get_data(self.yt), C.POINTER(C.c_float)), shape=yshape)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.x[:] = x
        self.g.cpu.ggml_graph_compute_with_ctx(self.ctx, self.graph, self.threads)
        return self.y

    def __del__(self):
        try:
            self.g.base.ggml_free(self.ctx)
        except Exception:
            pass


def _madvise_hugepage(addr: int, size: int) -> None:
    """Ask for transparent huge pages on [addr, addr+size) before its first touch, as numpy does
    for its large arrays (so both sides of a comparison stream from the same kind of pages)."""
    try:
        libc = C.CDLL(None, use_errno=True)
        page = 4096
        start = addr // page * page
        libc.madvise(C.c_void_p(start), C.c_size_t(addr + size - start), 14)  # MADV_HUGEPAGE
    except (OSError, AttributeError):
        pass


class BackendMatvec:
    """ggml_mul_mat through the CPU backend with the weights in an extra buffer type (the
    layout llama.cpp uses for CPU weights: CPU_REPACK, AMX).  Same interface as Matvec."""

    def __init__(self, g: GGML, w: np.ndarray, threads: int, batch: int, type_id: int, buft,
                 hugepages: bool = True):
        base = g.base
        rows, groups = w.shape[0], w.shape[1]
        cols = groups * g._traits(type_id).blck_size
        self.g = g
        self.ctx = base.ggml_init(_InitParams(base.ggml_tensor_overhead() * 8
                                              + base.ggml_graph_overhead() + 4096, None, True))
        wt = base.ggml_new_tensor_2d(self.ctx, type_id, cols, rows)
        if batch:
            xt = base.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, cols, batch)
        else:
            xt = base.ggml_new_tensor_1d(self.ctx, GGML_TYPE_F32, cols)
        yt = base.ggml_mul_mat(self.ctx, wt, xt)
        self.graph = base.ggml_new_graph(self.ctx)
        base.ggml_build_forward_expand(self.graph, yt)
        self.wbuf = base.ggml_backend_buft_alloc_buffer(
            buft, base.ggml_backend_buft_get_alloc_size(buft, wt))
        self.xbuf = None
        if not self.wbuf:
            raise MemoryError("ggml could not allocate the weight buffer")
        wbase = base.ggml_backend_buffer_get_base(self.wbuf)
        if hugepages:
            _madvise_hugepage(wbase, w.nbytes)
        base.ggml_backend_tensor_alloc(self.wbuf, wt, wbase)
        base.ggml_backend_tensor_set(wt, np.ascontiguousarray(w).ctypes.data, 0, w.nbytes)
        host = base.ggml_backend_dev_buffer_type(g.dev)
        align = base.ggml_backend_buft_get_alignment(host)
        nx = -(-base.ggml_nbytes(xt) // align) * align
        self.xbuf = base.ggml_backend_buft_alloc_buffer(host, nx + base.ggml_nbytes(yt) + align)
        at = base.ggml_backend_buffer_get_base(self.xbuf)
        base.ggml_backend_tensor_alloc(self.xbuf, xt, at)
        base.ggml_backend_tensor_alloc(self.xbuf, yt, at + nx)
        self.backend = g.backend(threads)
        xshape = (batch, cols) if batch else (cols,)
        yshape = (batch, rows) if batch else (rows,)
        self.x = np.ctypeslib.as_array(
            C.cast(base.ggml_get_data(xt), C.POINTER(C.c_float)), shape=xshape)
        self.y = np.ctypeslib.as_array(
            C.cast(base.ggml_get_data(yt), C.POINTER(C.c_float)), shape=yshape)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.x[:] = x
        self.g.base.ggml_backend_graph_compute(self.backend, self.graph)
        return self.y

    def __del__(self):
        try:
            base = self.g.base
            base.ggml_backend_buffer_free(self.wbuf)
            if self.xbuf:
                base.ggml_backend_buffer_free(self.xbuf)
            base.ggml_free(self.ctx)
        except Exception:
            pass


def load(libdir=None):
    """ggml from ``libdir`` (a folder holding libggml-base.so and libggml-cpu.so, e.g. a native
    build), else from the package libggml-python; None when unavailable."""
    if libdir is not None:
        try:
            return GGML(Path(libdir), f"native build at {libdir}")
        except (OSError, AttributeError):
            return None
    try:
        import libggml
    except ImportError:
        return None
    root = Path(libggml.__file__).resolve().parent
    libdir = next((p for p in (root / "lib64", root / "lib") if p.exists()), None)
    if libdir is None:
        return None
    try:
        from importlib.metadata import version
        ver = "libggml-python " + version("libggml-python")
    except Exception:
        ver = "libggml-python ?"
    try:
        return GGML(libdir, ver)
    except (OSError, AttributeError):  # a wheel built for another platform or ggml version
        return None


def load_dir(libdir) -> GGML:
    """ggml from a folder holding ``libggml-base.so`` and ``libggml-cpu.so`` (e.g. a native
    ``-march=native`` build); raises OSError when they cannot be loaded."""
    libdir = Path(libdir)
    ver = "?"
    for so in sorted(libdir.glob("libggml-base.so.*")):
        ver = so.name[len("libggml-base.so."):]
    return GGML(libdir, ver)


def quantize_row_cpu(g: GGML, type_id: int, x: np.ndarray) -> np.ndarray:
    """ggml's CPU quantizer for ``type_id`` (``ggml_get_type_traits_cpu(type_id)->from_float``:
    ``quantize_row_q8_0`` / ``_q8_1`` / ``_q8_K`` of ggml-cpu/arch/<arch>/quants.c, what
    llama.cpp runs on activations) of f32 ``x`` [G, block]; records [G, bytes], zero-filled
    first (ggml leaves an all-zero Q8_K block's bsums unwritten)."""
    t = g._traits(type_id)
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], t.type_size), np.uint8)
    from_float = g.cpu.ggml_get_type_traits_cpu(type_id).contents.from_float
    _FROM_FLOAT(from_float)(x.ctypes.data, out.ctypes.data, x.size)
    return out
