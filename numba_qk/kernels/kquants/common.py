"""Helpers shared by the K-quant kernel modules (``q2_k.py``, ``q3_k.py``, ``q5_k.py``,
``q6_k.py``).  All ``@njit``; callable from user ``@njit`` code.

Record-level building blocks take 2-D record arrays and record indices (``a[row]`` is the
record) and never build sub-array views in the hot loop, like ``kernels/kquants/dot.py``.  Loads go
byte by byte, so read-only, unaligned and strided carriers all work.

Q8_K offsets are read from its schema (``numba_qk.formats.quant.q8_k``), not retyped.

``quantizer_for(fmt, block=, scratch=)`` and ``portable_dot_for(fmt, value=)`` build each
format's ``quantize_<t>`` and ``dot_<t>_q8_k_portable`` from its per-block pieces, the way
``drive.kernels_for`` builds the dots: closures over the int code (so numba's cache keys them
across processes), the pieces picked at typing time from a table.  The encoders' shared steps
(transposes, maxima, the Q4_K/Q5_K scale packing, ...) are ``@inline_kernel`` building blocks
below: each runs once per block, inlined as the code it replaced.
"""

import functools

import numpy as np
from numba.core import types
from numba.extending import overload

from numba_qk._jit import OVERLOAD_OPTIONS, closure_named, inline_kernel, kernel
from numba_qk.formats import quant as _quant
from numba_qk.kernels._bits import f16_to_f32, f32_from_bits, f32_to_f16_bits
from numba_qk.kernels._round import nearest_int

X_DS_AT = _quant.q8_k.field("ds").start      # Q8_K: f32 block scale
X_Q_AT = _quant.q8_k.field("q").start        # Q8_K: int8 quants
X_BSUM_AT = _quant.q8_k.field("bsum").start  # Q8_K: int16 sums of 16 quants
GROUP_MAX_EPS = np.float32(1e-15)              # ggml's GROUP_MAX_EPS: a smaller max |x| is "all zero"


def field_starts(fmt, *names):
    """The byte offsets in a record of ``fmt`` of the fields ``names``, in that order."""
    return tuple(fmt.field(name).start for name in names)


@kernel
def f16_at(a, row, off):
    """Exact f16 -> f32 of bytes ``a[row, off:off+2]`` (little-endian)."""
    return f16_to_f32(np.uint16(np.uint16(a[row, off]) | (np.uint16(a[row, off + 1]) << np.uint16(8))))


@kernel
def f32_at(a, row, off):
    """f32 of bytes ``a[row, off:off+4]`` (little-endian, bits kept)."""
    bits = np.uint32(0)
    for k in range(4):
        bits |= np.uint32(a[row, off + k]) << np.uint32(8 * k)
    return f32_from_bits(bits)


@inline_kernel
def store_f16(out, row, off, x):
    """Write ``fp16(x)`` (round to nearest even, ggml's ``GGML_FP32_TO_FP16``) little-endian at
    ``out[row, off:off+2]``; returns the stored value widened back to f32 (exact)."""
    h = f32_to_f16_bits(np.float32(x))
    out[row, off] = np.uint8(h & np.uint16(0xFF))
    out[row, off + 1] = np.uint8(h >> np.uint16(8))
    return f16_to_f32(h)


@kernel
def x_q(x, bx, i):
    """Q8_K quant ``q[i]`` of record ``x[bx]`` as int32."""
    return np.int32(np.int8(x[bx, X_Q_AT + i]))


@kernel
def x_bsum(x, bx, j):
    """Q8_K stored ``bsum[j]`` of record ``x[bx]`` as int32 (used exactly as stored)."""
    lo = np.int32(x[bx, X_BSUM_AT + 2 * j])
    hi = np.int32(x[bx, X_BSUM_AT + 2 * j + 1])
    return np.int32(np.int16(np.uint16(lo | (hi << np.int32(8)))))


@kernel
def x_ds(x, bx):
    """Q8_K ``ds`` of record ``x[bx]`` (f32, bits kept)."""
    return f32_at(x, bx, X_DS_AT)


@kernel
def first_nonfinite_block(values):
    """The first block (row) of f32 ``values`` holding inf or NaN, or -1."""
    for b in range(values.shape[0]):
        for i in range(values.shape[1]):
            v = np.float32(values[b, i])
            if (v - v) != np.float32(0.0):
                return b
    return -1


@kernel
def k4_scale_min(a, row, at, s):
    """``(sc[s], m[s])`` (int32, 0..63) of the 12-byte 6-bit scale/min packing that Q4_K and
    Q5_K share (ggml's ``get_scale_min_k4``), stored at ``a[row, at:at+12]``, ``0 <= s < 8``::

        s < 4:  sc = a[at+s] & 63,                 m = a[at+4+s] & 63
        s >= 4: sc = (a[at+s+4] & 15) | (a[at+s-4] >> 6) << 4
                m  = (a[at+s+4] >> 4) | (a[at+s]   >> 6) << 4
    """
    return k4_scale_min_inline(a, row, at, s)


@inline_kernel
def k4_scale_min_inline(a, row, at, s):
    """:func:`k4_scale_min` inlined into the caller (the encoders' per-block scale step)."""
    if s < 4:
        sc = a[row, at + s] & np.uint8(63)
        m = a[row, at + s + 4] & np.uint8(63)
    else:
        sc = (a[row, at + s + 4] & np.uint8(15)) | ((a[row, at + s - 4] >> np.uint8(6)) << np.uint8(4))
        m = (a[row, at + s + 4] >> np.uint8(4)) | ((a[row, at + s] >> np.uint8(6)) << np.uint8(4))
    return np.int32(sc), np.int32(m)


@inline_kernel
def k4_pack_scale_min(out, row, at, s, ls, lm):
    """Store 6-bit ``ls``/``lm`` as sub-block ``s`` of the Q4_K/Q5_K packing (the bytes at
    ``out[row, at:at+12]`` must start zeroed), exactly as ggml's quantize_row_q{4,5}_K_ref."""
    if s < 4:
        out[row, at + s] = np.uint8(ls)
        out[row, at + s + 4] = np.uint8(lm)
    else:
        out[row, at + s + 4] = np.uint8((ls & 0xF) | ((lm & 0xF) << 4))
        out[row, at + s - 4] |= np.uint8((ls >> 4) << 6)
        out[row, at + s] |= np.uint8((lm >> 4) << 6)


@inline_kernel
def codes2_sum(byte, x, xr, at, step):
    """``sum_g t_g * int8(x[xr, at + g * step])`` over the four 2-bit codes of ``byte`` (code
    ``g`` in bits ``2g, 2g + 1``, ``t_g = code - 1``), int32: TQ2_0's and Q2_0's record sums."""
    s = ((byte & 3) - 1) * np.int32(np.int8(x[xr, at]))
    s += (((byte >> 2) & 3) - 1) * np.int32(np.int8(x[xr, at + step]))
    s += (((byte >> 4) & 3) - 1) * np.int32(np.int8(x[xr, at + 2 * step]))
    s += (((byte >> 6) & 3) - 1) * np.int32(np.int8(x[xr, at + 3 * step]))
    return s


@inline_kernel
def record_value_d(w, bw, d_at, s, x, bx):
    """``v = R32(ds * R32(f32(d) * f32(S)))`` of a K-quant record ``w[bw]`` whose f16 ``d``
    sits at byte ``d_at`` (Q3_K, Q6_K), with Q8_K record ``x[bx]``."""
    p = np.float32(f16_at(w, bw, d_at) * np.float32(s))   # R32(f32(d) * f32(S))
    return np.float32(x_ds(x, bx) * p)                     # v = R32(ds * p)


@inline_kernel
def record_value_d_dmin(w, bw, d_at, dmin_at, s_b, t_b, x, bx):
    """``v = R32(ds * R32(R32(f32(d) * f32(S)) - R32(f32(dmin) * f32(T))))`` of a K-quant
    record with f16 ``d``/``dmin`` at ``d_at``/``dmin_at`` (Q2_K, Q5_K), with Q8_K ``x[bx]``."""
    p = np.float32(f16_at(w, bw, d_at) * np.float32(s_b))      # R32(f32(d) * f32(S))
    n = np.float32(f16_at(w, bw, dmin_at) * np.float32(t_b))   # R32(f32(dmin) * f32(T))
    diff = np.float32(p - n)                                    # R32(p - n)
    return np.float32(x_ds(x, bx) * diff)                       # v = R32(ds * (p - n))


# ---- encoder building blocks (inlined: each runs once per block) ----------------------------

@inline_kernel
def signed_absmax(v, off, n):
    """``(amax, mx)``: the largest ``|v[off + i]|`` (f32) and the first value reaching it, 0 for
    an all-zero run -- ggml's ``if (ax > amax) { amax = ax; max = x[i]; }``."""
    mx = np.float32(0.0)
    amax = np.float32(0.0)
    for i in range(n):
        xi = np.float32(v[off + i])
        ax = abs(xi)
        if ax > amax:
            amax = ax
            mx = xi
    return amax, mx


@inline_kernel
def max_scale_min(scales, mins, n):
    """``(max_scale, max_min)``: the largest of ``scales[:n]`` and of ``mins[:n]``, at least 0."""
    max_scale = np.float32(0.0)
    max_min = np.float32(0.0)
    for j in range(n):
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    return max_scale, max_min


@inline_kernel
def transpose_in(x, xt, n, nl):
    """``xt[i, j] = x[n*j + i]``: ``nl`` sub-blocks of ``n`` side by side (the lanes' layout)."""
    for j in range(nl):
        for i in range(n):
            xt[i, j] = x[n * j + i]


@inline_kernel
def transpose_out(Lt, L, n, nl):
    """``L[n*j + i] = Lt[i, j]``: the lanes' quants back in element order."""
    for j in range(nl):
        for i in range(n):
            L[n * j + i] = Lt[i, j]


@inline_kernel
def q3_split_hmask(out, b, hm_at, L):
    """Q3_K's high bits: bit ``k`` of byte ``hm_at + l`` is ``L[32k + l] > 3``, which loses 4
    (``L`` 0..7 -> 0..3 for :func:`pack_2bit`)."""
    for l in range(32):  # high bit of element i = 32k + l -> bit k of hmask byte l
        m = np.int32(0)
        for k in range(8):
            h = np.int32(L[32 * k + l] > 3)
            m |= h << k
            L[32 * k + l] -= 4 * h
        out[b, hm_at + l] = np.uint8(m)


@inline_kernel
def q5_pack_quants(out, b, ql_at, qh_at, L):
    """Q5_K's quants ``L`` (0..31): low nibbles of ``L[64p + l]`` / ``L[64p + 32 + l]`` in byte
    ``ql_at + 32p + l``, bit 4 in ``qh`` byte ``l``, bits ``2p`` / ``2p + 1``."""
    for l in range(32):  # bit 4 of L[64p + l] -> qh bit 2p, of L[64p + 32 + l] -> bit 2p + 1
        qh = np.int32(0)
        for p in range(4):
            l1 = L[64 * p + l]
            l2 = L[64 * p + 32 + l]
            qh |= ((l1 >> 4) << (2 * p)) | ((l2 >> 4) << (2 * p + 1))
            out[b, ql_at + 32 * p + l] = np.uint8((l1 & 15) | ((l2 & 15) << 4))
        out[b, qh_at + l] = np.uint8(qh)


@inline_kernel
def pack_2bit(out, b, at, L):
    """Q2_K/Q3_K's 2-bit quants: byte ``at + 32c + l`` of record ``out[b]`` holds
    ``L[128c + 32g + l]`` in bits ``[2g, 2g + 2)`` (values 0..3)."""
    for c in range(2):
        for l in range(32):
            i = 128 * c + l
            out[b, at + 32 * c + l] = np.uint8(L[i] | (L[i + 32] << 2) | (L[i + 64] << 4)
                                               | (L[i + 96] << 6))


@inline_kernel
def av_weights_in(x, xt, wt, n, nl):
    """Q4_K/Q5_K's search weights, transposed: ``xt[i, j] = x_i`` and ``wt[i, j] = av_x +
    |x_i|`` with ``av_x = sqrtf(sum x^2 / n)`` over sub-block ``j`` (ggml's order)."""
    for j in range(nl):
        sum_x2 = np.float32(0.0)
        for l in range(n):
            xv = np.float32(x[n * j + l])
            sum_x2 = np.float32(sum_x2 + np.float32(xv * xv))
        av_x = np.float32(np.sqrt(np.float32(sum_x2 / np.float32(n))))
        for l in range(n):
            xv = np.float32(x[n * j + l])
            xt[l, j] = xv
            wt[l, j] = np.float32(av_x + abs(xv))


@inline_kernel
def k4_encode_scales(out, b, sc_at, d_at, dmin_at, scales, mins, dd):
    """Q4_K/Q5_K's scale step (ggml's ``quantize_row_q{4,5}_K_ref``): the 8 sub-block scales and
    mins to 6 bits against ``max / 63``, packed at ``sc_at``, ``d``/``dmin`` stored as f16;
    ``dd[1, j]``/``dd[0, j]`` get the stored ``d * sc[j]`` / ``dmin * m[j]`` for the requant."""
    max_scale, max_min = max_scale_min(scales, mins, 8)
    inv_scale = np.float32(np.float32(63.0) / max_scale) if max_scale > 0 else np.float32(0.0)
    inv_min = np.float32(np.float32(63.0) / max_min) if max_min > 0 else np.float32(0.0)
    for k in range(12):
        out[b, sc_at + k] = 0
    for j in range(8):
        ls = min(63, nearest_int(np.float32(inv_scale * scales[j])) & 0xFF)  # uint8_t, MIN
        lm = min(63, nearest_int(np.float32(inv_min * mins[j])) & 0xFF)
        k4_pack_scale_min(out, b, sc_at, j, ls, lm)
    d_all = store_f16(out, b, d_at, np.float32(max_scale / np.float32(63.0)))
    dmin_all = store_f16(out, b, dmin_at, np.float32(max_min / np.float32(63.0)))
    for j in range(8):
        sc, m = k4_scale_min_inline(out, b, sc_at, j)
        dd[1, j] = np.float32(d_all * np.float32(sc))     # C: if (!d) continue; (lanes keep L)
        dd[0, j] = np.float32(dmin_all * np.float32(m))


@inline_kernel
def qx_sums(x, off, n, nmax, iscale, L, loff, add, store, qw=None, qwoff=0):
    """One pass of ggml's ``make_qx_quants`` / ``make_q3_quants`` over ``x[off:off+n]``: ``l =
    MAX(-nmax, MIN(nmax-1, nearest_int(iscale*x)))`` (stored as ``l + add`` at ``L[loff + i]``
    when ``store``) and, with ``w = qw[qwoff + i]`` (``x*x`` when ``qw`` is None, ggml's
    ``quant_weights == NULL``), ``(sumlx, suml2) = (sum (w*x)*l, sum (w*l)*l)`` (f32, in
    order)."""
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        xi = np.float32(x[off + i])
        l = nearest_int(np.float32(iscale * xi))
        l = max(-nmax, min(nmax - 1, l))
        if store:
            L[loff + i] = l + add
        if qw is None:   # pruned at compile time: one loop per case
            w = np.float32(xi * xi)
        else:
            w = np.float32(qw[qwoff + i])
        fl = np.float32(l)
        sumlx = np.float32(sumlx + np.float32(np.float32(w * xi) * fl))   # w*x[i]*l
        suml2 = np.float32(suml2 + np.float32(np.float32(w * fl) * fl))   # w*l*l
    return sumlx, suml2


@kernel
def make_qx_quants(x, off, n, nmax, L, loff, qw=None, qwoff=0):
    """ggml's ``make_qx_quants(n, nmax, x + off, L + loff, rmse_type=1, qw + qwoff)`` (weights
    ``x*x`` when ``qw`` is None): writes ``l + nmax`` into ``L[loff:loff+n]`` and returns the
    scale (f32)."""
    amax, mx = signed_absmax(x, off, n)
    if amax < GROUP_MAX_EPS:  # all zero
        for i in range(n):
            L[loff + i] = 0
        return np.float32(0.0)
    fnmax = np.float32(nmax)
    iscale = np.float32(np.float32(-fnmax) / mx)           # -nmax / max
    sumlx, suml2 = qx_sums(x, off, n, nmax, iscale, L, loff, nmax, True, qw, qwoff)
    scale = np.float32(sumlx / suml2) if suml2 != np.float32(0.0) else np.float32(0.0)
    best = np.float32(scale * sumlx)
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = np.float32(np.float32(-np.float32(
            fnmax + np.float32(np.float32(0.1) * np.float32(is_)))) / mx)  # -(nmax + 0.1f*is)/max
        sumlx, suml2 = qx_sums(x, off, n, nmax, iscale, L, loff, nmax, False, qw, qwoff)
        if suml2 > np.float32(0.0) and np.float32(sumlx * sumlx) > np.float32(best * suml2):
            for i in range(n):
                l = nearest_int(np.float32(iscale * np.float32(x[off + i])))
                L[loff + i] = nmax + max(-nmax, min(nmax - 1, l))
            scale = np.float32(sumlx / suml2)
            best = np.float32(scale * sumlx)
    return scale


# ---- one quantize loop and one portable fold, per registered format --------------------------

_QUANTIZE = {}  # code -> (block, scratch)
_VALUE = {}     # code -> value


def _literal(table, code):
    if not isinstance(code, types.IntegerLiteral):
        return None
    return table[code.literal_value]


@functools.lru_cache(maxsize=None)   # one function per format, named by it (closure_named):
def _quantize_loop(block, scratch):  # no two compiled functions share a name
    def quantize_blocks(code, values, out):
        bad = first_nonfinite_block(values)
        if bad >= 0:
            return bad
        work = scratch()
        for b in range(values.shape[0]):
            block(values, b, out, work)
        return -1
    return closure_named(quantize_blocks)


@functools.lru_cache(maxsize=None)
def _fold_loop(value):
    def portable_dot(code, w, x):
        if w.shape[0] == 0:
            return np.float32(0.0)
        acc = value(w, 0, x, 0)
        for b in range(1, w.shape[0]):
            acc = np.float32(acc + value(w, b, x, b))
        return acc
    return closure_named(portable_dot)


# Placeholders resolved by the overloads below (inlined into each entry point: as a call the
# quantize loop measured 2-3 % slower than the hand-written loop it replaced); called as plain
# Python only under NUMBA_DISABLE_JIT=1, where they run the same loops.
def _quantize_blocks(code, values, out):
    return _quantize_loop(*_QUANTIZE[code])(code, values, out)


def _portable_dot(code, w, x):
    return _fold_loop(_VALUE[code])(code, w, x)


@overload(_quantize_blocks, jit_options=OVERLOAD_OPTIONS, inline="always")
def _quantize_blocks_overload(code, values, out):
    impl = _literal(_QUANTIZE, code)
    return None if impl is None else _quantize_loop(*impl)


@overload(_portable_dot, jit_options=OVERLOAD_OPTIONS, inline="always")
def _portable_dot_overload(code, w, x):
    value = _literal(_VALUE, code)
    return None if value is None else _fold_loop(value)


def _bind(table, code, impl):
    if code in table and table[code] != impl:
        raise AssertionError(f"K-quant code {code} bound twice")
    table[code] = impl


def _entry(fn, piece, doc):
    """``kernel(fn)`` documented by ``doc``, made a kernel of ``piece``'s module (the format's):
    its cache key then digests that module's sources (``DependencyCache``), which import this
    one, so an edit of either recompiles it; and the driver (``drive.kernels_for``), given it
    as ``loop_dot``, caches the format's entry points under that module too."""
    fn.__doc__ = doc
    fn.__module__ = getattr(piece, "py_func", piece).__module__
    return kernel(fn)


@kernel
def no_scratch():
    """No scratch: the ``scratch`` of ``quantizer_for`` for blocks that need none."""
    return 0


def quantizer_for(fmt, *, block, scratch):
    """``quantize_<t>(values, out)`` of K-quant ``fmt`` from ``block(values, b, out, work)``
    (one finite block into record ``out[b]``) and ``scratch()`` (the ``work`` it needs): -1, or
    the first block holding a non-finite value (nothing written then); the blocks in order."""
    code = fmt.ggml_type
    _bind(_QUANTIZE, code, (block, scratch))

    def quantize(values, out):
        return _quantize_blocks(code, values, out)
    ref = fmt.name.lower()                       # ggml: quantize_row_q4_K_ref, ..._tq1_0_ref
    if ref.endswith("_k"):
        ref = ref[:-1] + "K"
    return _entry(quantize, block, f"""ggml's ``quantize_row_{ref}_ref`` for f32
    ``[G, {fmt.block_size}]`` into ``out`` ``[G, {fmt.block_bytes}]``.

    Returns -1, or the first block holding a non-finite value (nothing written then).
    """)


def portable_dot_for(fmt, *, value):
    """``dot(w, x)`` of a format through its portable record value ``value(w, bw, x, bx)``: the
    left fold ``((v_0 + v_1) + v_2) + ...``, ``G = 0`` gives ``+0.0``."""
    code = fmt.ggml_type
    _bind(_VALUE, code, value)

    def dot(w, x):
        return _portable_dot(code, w, x)
    return _entry(dot, value, """The dot through the portable record definition (tests compare
    the fast paths with it): left fold of the record values, ``G = 0`` gives ``+0.0``.""")


# ---- decoded fields from a format's accessors -----------------------------------------------

def fields_decoder(scale_min, quant, n_sub, doc):
    """``decode_into(rec, sc, m, q)`` (documented by ``doc``) of a K-quant with ``n_sub``
    sub-blocks: ``(sc[j], m[j]) = scale_min(rec, j)`` and ``q[i] = quant(rec, i)`` for the 256
    quants of one record."""
    def decode_into(rec, sc, m, q):
        for j in range(n_sub):
            a, c = scale_min(rec, j)
            sc[j] = a
            m[j] = c
        for i in range(256):
            q[i] = quant(rec, i)
    return _entry(decode_into, quant, doc)


def records_decoder(decode_into, doc):
    """``decode_records(records, sc, m, q)`` (documented by ``doc``): ``decode_into(records[b],
    sc[b], m[b], q[b])`` for every record of a ``[G, bytes]`` array."""
    def decode_records(records, sc, m, q):
        for b in range(records.shape[0]):
            decode_into(records[b], sc[b], m[b], q[b])
    return _entry(decode_records, decode_into, doc)
