"""Q4_K x Q8_K GEMM tile on AMX-INT8 (Intel Sapphire Rapids and later), LLVM IR via numba.

Only *exact integer* work runs on the tile unit; the float steps of every record stay one IEEE
instruction each, lane-wise (lane = one activation), in spec order, and each (row, activation)
pair is folded in record order, so the outputs are the portable loops' bits.

One call handles a block of 16 weight rows x 16 activations and one record index ``b``:

    S = sum_e (q_e * sc_{e//32}) * x_e       the scale is folded into the weight byte first:
        A'_e = q_e * sc <= 15 * 63 = 945 is split into L_e = A'_e & 0xFF and H_e = A'_e >> 8
        (both u8), so S = C_L + 256 * C_H with C_L = L . x, C_H = H . x   (tdpbusd, u8 x s8)
    T = sum_j m_{j//2} * bsum_j               bsum (int16, any value) is split into its two
        bytes: lo (u8) and hi (s8), bsum = lo + 256 * hi, so T = T_lo + 256 * T_hi
        with T_lo = m . lo (tdpbuud, u8 x u8) and T_hi = m . hi (tdpbusd, u8 x s8)

Bounds: |C_L| <= 256*255*128, |C_H| <= 256*3*128, |S| <= 30,965,760 (spec), T_lo <= 16*63*255,
|T_hi| <= 16*63*128, |T| <= 33,030,144 (spec): every value and every partial sum is exact in
int32, whatever the bytes (tdpbusd accumulates without saturation).  The four int32 16 x 16
result tiles go to a 4 KB scratch buffer and the epilogue runs, per weight row m,
    p = R32(d_m * f32(S)), n = R32(dmin_m * f32(T)), v = R32(ds * R32(p - n)), acc = R32(acc + v)
on 16 activation lanes.

Layouts (all offsets in bytes):

* decoded weights, one block of DEC_BYTES per (group of 16 rows, record b):
  [0, 4096) L, row m at 256 m, element order; [4096, 8192) H likewise;
  [8192, 8448) min pattern, row m at 8192 + 16 m: m_0, m_0, m_1, m_1, .., m_7, m_7 (u8);
  [8448, 8512) d of row m at 8448 + 4 m (f32, exact widening); [8512, 8576) dmin likewise.
* activations, one block of ACT_BYTES per (group of 16 activations, record b), in the tile
  unit's "VNNI" B layout (row k4 holds, for each activation n, 4 consecutive K bytes at 4 n):
  [0, 4096) quants, element e of activation n at 64 (e >> 2) + 4 n + (e & 3);
  [4096, 4352) low bytes of bsum_j at 4096 + 64 (j >> 2) + 4 n + (j & 3); [4352, 4608) high
  bytes likewise; [4608, 4672) ds of activation n at 4608 + 4 n (f32 bits).

Tile registers (configured once per gemm call by ``amx_begin``): tmm0..3 = C_L, C_H, T_lo, T_hi
(16 x 64 B), tmm4 = weight tile (16 x 64 B), tmm5 = bsum bytes (4 x 64 B), tmm6 = activation
tile (16 x 64 B), tmm7 = min patterns (16 x 16 B).

Linux gives a process the AMX tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``), made once at import here; ``HAVE_AMX`` is False when the compilation
target lacks AMX-INT8, the request fails, or ``NUMBA_QK_NO_AMX=1``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from numba_qk.formats import quant
from numba_qk.kernels.simd.base import HAVE_AVX512, FEATURES, float_array_ptr, i8, i16, i32, i64, load, byte_ptr, splat_lanes, vec, fold_into, fold_signature
from numba_qk.kernels.simd.q4_k import unpack_scales

__all__ = ["HAVE_AMX", "AMX_ROWS", "AMX_ACTS", "AMX_DEC_BYTES", "AMX_ACT_BYTES", "AMX_CONFIG",
           "amx_begin", "amx_end", "q4_k_decode_amx", "accumulate_amx"]

_K_D_AT = quant.q4_k.field("d").start
_K_QS_AT = quant.q4_k.field("q").start
assert quant.q4_k.field("dmin").start == _K_D_AT + 2

AMX_ROWS = 16
AMX_ACTS = 16
DEC_L_AT, DEC_H_AT, DEC_M_AT, DEC_D_AT, DEC_DMIN_AT = 0, 4096, 8192, 8448, 8512
AMX_DEC_BYTES = 8576
ACT_Q_AT, ACT_BLO_AT, ACT_BHI_AT, ACT_DS_AT = 0, 4096, 4352, 4608
AMX_ACT_BYTES = 4672


def _request_tile_state() -> bool:
    """Ask Linux for the AMX tile data state (x86-64 ``arch_prctl`` 0x1023, feature 18)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0
    except Exception:  # pragma: no cover - no libc / seccomp
        return False


HAVE_AMX = (HAVE_AVX512 and {"amx-tile", "amx-int8"} <= FEATURES
            and os.environ.get("NUMBA_QK_NO_AMX", "") in ("", "0") and _request_tile_state())


def _config() -> np.ndarray:
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1                                    # palette 1
    colsb = cfg[16:32].view(np.uint16)
    rows = cfg[48:56]
    for t, (r, c) in enumerate([(16, 64)] * 5 + [(4, 64), (16, 64), (16, 16)]):
        rows[t], colsb[t] = r, c
    return cfg


AMX_CONFIG = _config()
_C_L, _C_H, _T_LO, _T_HI, _A, _BS, _B, _M = range(8)


def _amx(builder, name, *args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [a.type for a in args]), "llvm.x86." + name)
    builder.call(fn, list(args))


def _tile(k):
    return ir.Constant(i8, k)


@intrinsic
def amx_begin(typingctx, cfg):
    """Load the tile configuration ``cfg`` (64 bytes, ``AMX_CONFIG``) for this thread."""
    if not isinstance(cfg, types.Array):
        return None
    sig = types.none(cfg)

    def codegen(context, builder, signature, args):
        _amx(builder, "ldtilecfg", byte_ptr(context, builder, signature.args[0], args[0],
                                        ir.Constant(i64, 0)))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def amx_end(typingctx):
    """Release the tile state (``tilerelease``)."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        _amx(builder, "tilerelease")
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def q4_k_decode_amx(typingctx, w, w_off, dec, blk_off, m):
    """Decode the Q4_K record at byte ``w_off`` of ``w`` as row ``m`` (0..15) of the decoded
    block at byte ``blk_off`` of ``dec`` (layout in the module docstring)."""
    if not (isinstance(w, types.Array) and isinstance(dec, types.Array)):
        return None
    sig = types.none(w, types.intp, dec, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        w_arr, w_off_v, d_arr, blk_v, m_v = args
        wb = byte_ptr(context, builder, signature.args[0], w_arr, w_off_v)

        def at(base, stride):
            off = builder.add(blk_v, builder.add(ir.Constant(i64, base),
                                                 builder.mul(m_v, ir.Constant(i64, stride))))
            return byte_ptr(context, builder, signature.args[2], d_arr, off)

        def store(ptr, offset, v):
            p = builder.gep(ptr, [ir.Constant(i64, offset)])
            builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=1)

        lp, hp = at(DEC_L_AT, 256), at(DEC_H_AT, 256)
        sc16, m16 = unpack_scales(builder, wb)
        low4 = ir.Constant(vec(i8, 64), [0x0F] * 64)
        four = ir.Constant(vec(i8, 64), [4] * 64)
        eight = ir.Constant(vec(i16, 64), [8] * 64)
        for h in range(2):
            qs = load(builder, wb, _K_QS_AT + 64 * h, vec(i8, 64))
            lo = builder.and_(qs, low4)
            hi = builder.lshr(qs, four)
            for c in range(2):   # chunk j = 2h + c: elements 64j.. (low nibbles), 64j+32.. (high)
                j = 2 * h + c
                order = [32 * c + k for k in range(32)] + [64 + 32 * c + k for k in range(32)]
                q = builder.zext(builder.shuffle_vector(lo, hi, ir.Constant(vec(i32, 64), order)),
                                 vec(i16, 64))
                prod = builder.mul(q, splat_lanes(builder, sc16, [2 * j] * 32 + [2 * j + 1] * 32))
                store(lp, 64 * j, builder.trunc(prod, vec(i8, 64)))
                store(hp, 64 * j, builder.trunc(builder.lshr(prod, eight), vec(i8, 64)))
        mpat = splat_lanes(builder, m16, [k // 2 for k in range(16)])
        store(at(DEC_M_AT, 16), 0, builder.trunc(mpat, vec(i8, 16)))
        dd = builder.fpext(load(builder, wb, _K_D_AT, vec(ir.HalfType(), 2)),
                           vec(ir.FloatType(), 2))
        store(at(DEC_D_AT, 4), 0, builder.extract_element(dd, ir.Constant(i32, 0)))
        store(at(DEC_DMIN_AT, 4), 0, builder.extract_element(dd, ir.Constant(i32, 1)))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def accumulate_amx(typingctx, dec, dec_off, t, t_off, scr, scr_off, acc, acc_at, first):
    """Fold the record values of the decoded block at byte ``dec_off`` of ``dec`` (16 rows)
    against the activation block at byte ``t_off`` of ``t`` (16 activations) into
    ``acc.flat[acc_at + 16 m + n]`` (row m, activation n; acc = v if ``first`` else
    R32(acc + v)).  ``scr`` at ``scr_off``: 4096 bytes of scratch (64-byte aligned is best).
    The tile configuration must be loaded (``amx_begin``)."""
    sig = fold_signature(acc, dec, t, scr)
    if sig is None:
        return None

    def codegen(context, builder, signature, args):
        d_arr, d_off, t_arr, t_off_v, s_arr, s_off, acc_arr, acc_at_v, first_v = args
        db = byte_ptr(context, builder, signature.args[0], d_arr, d_off)
        tb = byte_ptr(context, builder, signature.args[2], t_arr, t_off_v)
        sb = byte_ptr(context, builder, signature.args[4], s_arr, s_off)

        def gep(base, off):
            return builder.gep(base, [ir.Constant(i64, off)])

        def stride(n):
            return ir.Constant(i64, n)

        for c in (_C_L, _C_H, _T_LO, _T_HI):
            _amx(builder, "tilezero", _tile(c))
        for kc in range(4):   # K = 64 elements per step
            _amx(builder, "tileloadd64", _tile(_B), gep(tb, ACT_Q_AT + 1024 * kc), stride(64))
            _amx(builder, "tileloadd64", _tile(_A), gep(db, DEC_L_AT + 64 * kc), stride(256))
            _amx(builder, "tdpbusd", _tile(_C_L), _tile(_A), _tile(_B))
            _amx(builder, "tileloadd64", _tile(_A), gep(db, DEC_H_AT + 64 * kc), stride(256))
            _amx(builder, "tdpbusd", _tile(_C_H), _tile(_A), _tile(_B))
        _amx(builder, "tileloadd64", _tile(_M), gep(db, DEC_M_AT), stride(16))
        _amx(builder, "tileloadd64", _tile(_BS), gep(tb, ACT_BLO_AT), stride(64))
        _amx(builder, "tdpbuud", _tile(_T_LO), _tile(_M), _tile(_BS))
        _amx(builder, "tileloadd64", _tile(_BS), gep(tb, ACT_BHI_AT), stride(64))
        _amx(builder, "tdpbusd", _tile(_T_HI), _tile(_M), _tile(_BS))
        for k, c in enumerate((_C_L, _C_H, _T_LO, _T_HI)):
            _amx(builder, "tilestored64", _tile(c), gep(sb, 1024 * k), stride(64))

        f32 = ir.FloatType()
        v16 = vec(i32, 16)
        sh8 = ir.Constant(v16, [8] * 16)
        ds = load(builder, tb, ACT_DS_AT, vec(f32, 16))
        acc_base = float_array_ptr(context, builder, signature.args[6], acc_arr)
        for m in range(16):
            cl, ch, tl, th = (load(builder, sb, 1024 * k + 64 * m, v16) for k in range(4))
            s = builder.add(cl, builder.shl(ch, sh8))       # exact (see bounds above)
            tt = builder.add(tl, builder.shl(th, sh8))
            d = splat_lanes(builder, load(builder, db, DEC_D_AT + 4 * m, vec(f32, 1)), [0] * 16)
            dmin = splat_lanes(builder, load(builder, db, DEC_DMIN_AT + 4 * m, vec(f32, 1)),
                                [0] * 16)
            p = builder.fmul(d, builder.sitofp(s, vec(f32, 16)))       # R32(d * f32(S))
            n = builder.fmul(dmin, builder.sitofp(tt, vec(f32, 16)))   # R32(dmin * f32(T))
            v = builder.fmul(ds, builder.fsub(p, n))                    # R32(ds * R32(p - n))
            ptr = builder.gep(acc_base, [builder.add(acc_at_v, ir.Constant(i64, 16 * m))])
            fold_into(builder, ptr, v, first_v)
        return context.get_dummy_value()
    return sig, codegen
