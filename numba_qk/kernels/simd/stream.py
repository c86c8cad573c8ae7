"""Non-temporal (streaming) stores for the large one-pass conversions (LLVM IR intrinsics).

A cast of 16 M elements writes 32-64 MB that nothing reads back soon.  An ordinary store first
reads each destination cache line from memory ("read for ownership") and later writes it back,
so the destination crosses the memory bus twice; a non-temporal store (x86 ``vmovntdq``) writes
whole 64-byte lines straight to memory.  The conversion kernels compute codes exactly as before
into a small L1-resident scratch row and :func:`stream_bytes` copies that row to the
destination (casts with a vector kernel store whole lines straight from registers instead,
``lowp._encode_run_nt`` / ``_decode_run_nt8/16``): every line that lies wholly inside the destination goes out with one aligned
64-byte non-temporal store, the partial lines at either end by ordinary byte stores.  The bits
written are the scratch row's bits, so streaming cannot change a result -- only its speed.

Non-temporal stores are weakly ordered: a kernel that streamed ends with :func:`store_fence`
(``sfence``) before it returns, so any thread that later synchronises with the caller (a join,
a lock) sees the data.  They pay off only when the destination is much larger than the caches;
callers stream only above ``STREAM_MIN_BYTES`` of output (``_convert``, ``scaled``): 16 MiB
on Intel CPUs and "never" elsewhere (measured; ``NUMBA_QK_STREAM_MIN_BYTES`` overrides).

``HAVE_STREAM`` is False (ordinary stores everywhere) off x86-64, under ``NUMBA_DISABLE_JIT``
and with ``NUMBA_QK_PORTABLE=1`` or ``NUMBA_QK_NO_STREAM=1``.
"""

from __future__ import annotations

import os
import platform

import numpy as np
from llvmlite import ir
from numba import config
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk._jit import kernel

_i8, _i32, _i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_X86 = platform.machine().lower() in ("x86_64", "amd64")

HAVE_STREAM = (_X86 and not config.DISABLE_JIT
               and os.environ.get("NUMBA_QK_PORTABLE", "") in ("", "0")
               and os.environ.get("NUMBA_QK_NO_STREAM", "") in ("", "0"))



def _vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _env_bytes(name):
    """A byte count from the environment (None when unset; a bad value is an error that names
    the variable, not a silent default)."""
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r}: expected a whole number of bytes") from None


def _default_min_bytes() -> int:
    """Stream only outputs of at least this many bytes (several times a core's L2; below it
    the destination may well still be in cache when the caller reads it).  Measured per CPU
    family (docs/decisions/016-*.md): on Intel (Emerald Rapids) the non-temporal path saved
    the read-for-ownership traffic and won; on AMD Zen 4 the plain stores won for every
    widening cast and MX decode (bf16 -> f32 3.0 vs 4.0 ms, MX decode 4.8 vs 7.6 ms), so off
    Intel nothing streams unless ``NUMBA_QK_STREAM_MIN_BYTES`` asks for it."""
    env = _env_bytes("NUMBA_QK_STREAM_MIN_BYTES")
    if env is not None:
        return env
    return 16 << 20 if _vendor() == "GenuineIntel" else 1 << 62


# numba_qk._convert and numba_qk.scaled read it at every call, so tests may lower it.
STREAM_MIN_BYTES = _default_min_bytes()


def _default_reg_min_bytes() -> int:
    """Casts that have a vector kernel (f32 -> bf16/f16, bf16/f16/fp8/fp6 -> f32) write whole
    64-byte lines with non-temporal stores straight from registers (no L1 scratch pass) from
    this many output bytes on.  Measured per CPU family: on AMD Zen 4, 16 M values f32 -> bf16
    2.7 vs 3.3 ms plain, bf16 -> f32 2.9 vs 3.2; on Intel the widening casts stream at
    ``STREAM_MIN_BYTES`` (then also from registers where they can) and narrowing ones were not
    faster streamed, so this is off there.  ``NUMBA_QK_REG_STREAM_MIN_BYTES`` overrides."""
    env = _env_bytes("NUMBA_QK_REG_STREAM_MIN_BYTES")
    if env is not None:
        return env
    return 1 << 62 if _vendor() == "GenuineIntel" else 16 << 20


REG_STREAM_MIN_BYTES = _default_reg_min_bytes()

LINE = 64


@intrinsic
def address_of(typingctx, arr):
    """The data pointer of ``arr`` as an int64 (for alignment arithmetic only)."""
    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(a.data, _i64)

    return types.int64(arr), codegen


@intrinsic
def stream_line(typingctx, dst, doff, src, soff):
    """Copy the 64 bytes at byte ``soff`` of uint8 array ``src`` to byte ``doff`` of uint8 array
    ``dst`` with one non-temporal store; ``dst``'s address plus ``doff`` must be a multiple of
    64 (the caller checks it)."""
    sig = types.none(dst, types.intp, src, types.intp)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(_i8, LINE)
        d = context.make_array(signature.args[0])(context, builder, args[0]).data
        s = context.make_array(signature.args[2])(context, builder, args[2]).data
        v = builder.load(builder.bitcast(builder.gep(s, [args[3]]), vt.as_pointer()), align=1)
        st = builder.store(v, builder.bitcast(builder.gep(d, [args[1]]), vt.as_pointer()),
                           align=LINE)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_i32, 1)]))
        return context.get_dummy_value()

    return sig, codegen


def x86_hint(name):
    """Intrinsic ``f()``: one call of the void x86 intrinsic ``llvm.x86.<name>`` (a fence or a
    hint); nothing on other targets."""
    @intrinsic
    def hint(typingctx):
        def codegen(context, builder, signature, args):
            if _X86:
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), []), f"llvm.x86.{name}")
                builder.call(fn, [])
            return context.get_dummy_value()

        return types.none(), codegen

    return hint


# ``sfence`` (x86): order this thread's earlier non-temporal stores before later stores.
store_fence = x86_hint("sse.sfence")


@kernel
def stream_bytes(dst, doff, src, n):
    """``dst[doff:doff + n] = src[:n]`` (uint8 arrays, ``dst`` C-contiguous): whole aligned
    64-byte lines by non-temporal stores, the partial lines at the ends byte by byte."""
    a = address_of(dst) + np.int64(doff)
    head = min(np.int64((-a) & np.int64(LINE - 1)), np.int64(n))
    for i in range(head):
        dst[doff + i] = src[i]
    full = head + (np.int64(n) - head) // np.int64(LINE) * np.int64(LINE)
    for o in range(head, full, LINE):
        stream_line(dst, doff + o, src, o)
    for i in range(full, n):
        dst[doff + i] = src[i]


@kernel
def line_head(dst, itemsize):
    """Elements of ``dst`` (1-d, C-contiguous) before its first 64-byte-aligned element; -1 when
    its address is not a multiple of ``itemsize`` (no element is ever aligned: do not stream)."""
    a = address_of(dst)
    if a % np.int64(itemsize) != 0:
        return np.int64(-1)
    return np.int64(((-a) & np.int64(LINE - 1)) // np.int64(itemsize))
