"""Encode/decode kernels for the block-scaled formats (OCP MX v1.0, NVFP4; DESIGN.md §9).

The kernels see flat, C-contiguous storage: ``x`` float32 values (blocks are consecutive runs of
``B`` values -- any tensor whose last axis is a whole number of blocks is such a run), ``codes``
the element storage (one uint8 per element, or two e2m1 nibbles per byte with element 0 in the
HIGH nibble), ``scales`` one uint8 per block.  They process blocks ``[b0, b1)`` so callers can
split work over threads; validation (shapes, non-finite input) is the caller's.

MX encode, per block (one line per spec step)::

    amax = max |v| as float32 bits (|v| ordered like its bits)
    X    = floor(log2(amax)) - emax    from the exponent field (subnormals: highest set bit)
    X    = clamp(X, -127, 127)         a zero block gives X = -127: scale code 0x00
    P_i  = RNE(v_i * 2^-X)             the product is exact in float32 wherever it can be
                                       nonzero in the element type, and the element rounding
                                       is lowp's single-RNE encoder with overflow saturating
    MXINT8: P_i = rint(f64(v_i) * 2^(6 - X)) saturated to +-127 (the product is exact in f64)

Why the float32 product is exact: |v_i * 2^-X| < 2^(emax+1) never overflows, and it loses bits
only when the result is below 2^-126, far below half the element type's smallest subnormal
(2^-17 at most), where every rounding gives a (signed) zero.

NVFP4 encode: ``s = R32(R32(amax / 6) / ts)``; scale code = e4m3(s) saturating (ue4m3);
``d = R32(f32(scale) * ts)``; ``P_i = e2m1(R32(v_i / d))`` (signed zeros where ``d`` is 0).

Decode: MX ``R32(value(P_i) * 2^X)`` (exact except overflow to inf; 2^X is a float32 for every
X in [-127, 127]; MXINT8 multiplies by ``2^(X-6)``, also a float32); scale code 0xFF gives NaN.
NVFP4 ``R32(R32(value(P_i) * f32(scale)) * ts)``.
"""

import numpy as np

from numba_qk._jit import kernel
from numba_qk.kernels.simd import stream as _stream
from numba_qk.kernels.lowp import codecs as _lowp
from numba_qk.kernels.lowp.codecs import T_E2M1, T_E2M3, T_E3M2, T_E4M3, T_E5M2, encode_narrow_f32

# element kinds (closure constants)
E2M1, E2M3, E3M2, E4M3, E5M2, INT8 = range(6)

# (exponent bits, mantissa bits, bias, largest magnitude code) of the float elements
_ELEMENT = {E2M1: (2, 1, 1, 0x7), E2M3: (2, 3, 1, 0x1F), E3M2: (3, 2, 3, 0x1F),
            E4M3: (4, 3, 7, 0x7E), E5M2: (5, 2, 15, 0x7B), INT8: (0, 0, 0, 0)}
# float32 values of every code (exact), from lowp's tables.  numba freezes these arrays into
# the compiled code; _jit.DependencyCache keys the cache on lowp.py's source too, so a table
# change recompiles these kernels.
_F32 = {E2M1: T_E2M1.astype(np.float32), E2M3: T_E2M3.astype(np.float32),
        E3M2: T_E3M2.astype(np.float32), E4M3: T_E4M3.astype(np.float32),
        E5M2: T_E5M2.astype(np.float32),
        INT8: np.arange(-128, 128, dtype=np.float32)[np.arange(256) ^ 0x80]}
_E4M3_F32 = T_E4M3.astype(np.float32)
_LOWP_KIND = {E4M3: _lowp.K_E4M3, E5M2: _lowp.K_E5M2, E2M3: _lowp.K_E2M3, E3M2: _lowp.K_E3M2}
_STREAM_VALUES = 4096   # float32 values decoded into L1 before they are streamed out


@kernel
def pow2_f32(k):
    """2^k as a float32, for k in [-149, 127] (subnormal below -126)."""
    k = np.int64(k)
    if k >= -126:
        return np.uint32((k + np.int64(127)) << np.int64(23)).view(np.float32)
    return np.uint32(np.int64(1) << (k + np.int64(149))).view(np.float32)


@kernel
def floor_log2_bits(a):
    """floor(log2(x)) of a positive finite float32 given as its bits ``a`` (no log2f)."""
    es = np.int64(a >> np.uint32(23))
    if es != 0:
        return es - np.int64(127)
    # subnormal: m * 2^-149 with m < 2^23; the f64 conversion of m is exact, read its exponent
    m = np.float64(a & np.uint32(0x7FFFFF))
    return ((m.view(np.int64) >> np.int64(52)) - np.int64(1023)) - np.int64(149)


@kernel
def first_nonfinite(x):
    """Index of the first non-finite value of a flat float32 array, or -1 (chunks are tested
    with a vectorizable OR first; only a chunk that holds one is scanned for its index)."""
    xb = x.view(np.uint32)
    n = xb.size
    for c0 in range(0, n, 4096):
        c1 = min(c0 + 4096, n)
        hit = np.uint32(0)
        for i in range(c0, c1):
            e = xb[np.uint64(i)] & np.uint32(0x7F800000)
            hit |= np.uint32(e == np.uint32(0x7F800000))
        if hit:
            for i in range(c0, c1):
                if (xb[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
                    return i
    return -1


@kernel
def amax_bits(x):
    """Bits of max |x| over a flat float32 array: at least 0x7F800000 exactly when ``x`` holds
    an inf or a NaN (their magnitude bits are the largest)."""
    xb = x.view(np.uint32)
    m = np.uint32(0)
    for i in range(xb.size):
        a = np.uint32(xb[i] & np.uint32(0x7FFFFFFF))
        m = a if a > m else m
    return m


@kernel
def _stream_chunk(out, w0, buf, n, last):
    """Write the decoded values ``buf[:n]`` to ``out[w0:w0 + n]`` by non-temporal stores, except
    (unless ``last``) the values after the last 64-byte line boundary of ``out``: those move to
    the front of ``buf`` and go out with the next chunk, so no cache line is written partly by
    one chunk and partly by the next.  Returns how many values were kept back."""
    a = _stream.address_of(out) + w0 * 4
    wn = n if last else max((((a + n * 4) & np.int64(-64)) - a) // 4, np.int64(0))
    _stream.stream_bytes(out.view(np.uint8), w0 * 4, buf.view(np.uint8), wn * 4)
    for i in range(n - wn):
        buf[i] = buf[wn + i]
    return n - wn


_MX_ENCODERS = {}
_MX_DECODERS = {}


def mx_encoder(K, EMAX, B):
    """Compiled MX encoder ``enc(x, codes, scales, b0, b1)`` for element kind K."""
    return _lowp.memoized(_MX_ENCODERS, (K, EMAX, B), _make_mx_encoder)


def _make_mx_encoder(K, EMAX, B):
    EBITS, MBITS, BIAS, MAXMAG = _ELEMENT[K]
    PACK = K == E2M1
    IS_INT = K == INT8

    # Indices are unsigned (``u0 + j``): with a signed ``base + j`` numba tests every index for
    # wraparound and the loops stay scalar (slices would cost a reference count per block).
    @kernel
    def enc(x, codes, scales, b0, b1):
        xb = x.view(np.uint32)
        tmp = np.empty(B, np.int32)                                  # one block's codes
        for b in range(b0, b1):
            base = b * B
            u0 = np.uint64(base)
            amax = np.uint32(0)
            for j in range(B):
                a = np.uint32(xb[u0 + np.uint64(j)] & np.uint32(0x7FFFFFFF))
                amax = a if a > amax else amax
            if amax == np.uint32(0):
                X = np.int64(-127)                                   # zero block: code 0x00
            else:
                X = min(max(floor_log2_bits(amax) - np.int64(EMAX), np.int64(-127)),
                        np.int64(127))                               # X = floor(log2 amax) - emax
            scales[b] = np.uint8(X + np.int64(127))
            if IS_INT:
                # 2^(6 - X) as a float64 (exponent field 1023 + 6 - X, always normal)
                f = np.int64((np.int64(1023 + 6) - X) << np.int64(52)).view(np.float64)
                for j in range(B):
                    q = np.rint(np.float64(x[u0 + np.uint64(j)]) * f)  # P = RNE(v * 2^-X * 64)
                    q = min(max(q, -127.0), 127.0)                   # saturate to +-127
                    codes[u0 + np.uint64(j)] = np.uint8(np.int64(q) & np.int64(0xFF))
                continue
            inv = pow2_f32(-X)                                       # 2^-X
            for j in range(B):
                y = np.float32(x[u0 + np.uint64(j)] * inv)           # exact where it matters
                tmp[j] = encode_narrow_f32(y.view(np.uint32), EBITS, MBITS, BIAS, MAXMAG,
                                            MAXMAG, 0, False)        # RNE, saturating
            if PACK:                                                 # element 0: high nibble
                h0 = np.uint64(base >> 1)
                for j in range(B // 2):
                    codes[h0 + np.uint64(j)] = np.uint8((tmp[2 * j] << 4) | tmp[2 * j + 1])
            else:
                for j in range(B):
                    codes[u0 + np.uint64(j)] = np.uint8(tmp[j])

    return enc


def mx_decoder(K, B):
    """Compiled MX decoder ``dec(codes, scales, out, b0, b1)`` to float32."""
    return _lowp.memoized(_MX_DECODERS, (K, B), _make_mx_decoder)


def _make_mx_decoder(K, B):
    TABLE = _F32[K]
    PACK = K == E2M1
    IS_INT = K == INT8
    MASK = 0x3F if K in (E2M3, E3M2) else 0xFF
    SHIFT = 6 if K == INT8 else 0
    CHB = _STREAM_VALUES // B                                        # blocks per streamed chunk
    # fp8/fp6 element values by lowp's register-table lookup (AVX-512) instead of a gather
    LK = _LOWP_KIND.get(K, -1)
    PERM = LK in _lowp._PERM_KINDS

    @kernel
    def dec(codes, scales, out, b0, b1, stream):
        # ``stream``: decode CHB blocks at a time into an L1 row and copy it out with
        # non-temporal stores (kernels/simd/stream.py; the same values, fewer memory transfers)
        buf = np.empty(CHB * B + 16 if stream else 0, np.float32)
        tmp = np.empty(CHB * B if PERM else 0, np.uint32)            # a chunk's element bits
        tv = tmp.view(np.float32)
        pending = np.int64(0)                                        # see _stream_chunk
        for c0 in range(b0, b1, CHB):
            c1 = min(c0 + CHB, b1)
            dst = buf if stream else out
            off = c0 * B - pending if stream else 0                  # out index of dst[0]
            if PERM:
                _lowp._decode_run(LK, codes[c0 * B:c1 * B], tmp[:(c1 - c0) * B])
            for b in range(c0, c1):
                base = b * B
                # unsigned indices: numba then skips its wraparound test and the loops
                # vectorize (slices would cost a reference count per block)
                d0 = np.uint64(base - off)
                sc = np.int64(scales[b])
                if sc == 0xFF:                                       # e8m0 NaN
                    for j in range(B):
                        dst[d0 + np.uint64(j)] = np.float32(np.nan)
                    continue
                s = pow2_f32(sc - np.int64(127 + SHIFT))             # 2^X (MXINT8: 2^(X-6))
                if PACK:
                    c0b = np.uint64(base >> 1)
                    for j in range(B // 2):
                        byte = np.int64(codes[c0b + np.uint64(j)])
                        dst[d0 + np.uint64(2 * j)] = np.float32(TABLE[byte >> 4] * s)
                        dst[d0 + np.uint64(2 * j + 1)] = np.float32(TABLE[byte & 0xF] * s)
                elif IS_INT:                                         # value(P) = int8 code
                    for j in range(B):
                        q = np.int8(codes[np.uint64(base) + np.uint64(j)])
                        dst[d0 + np.uint64(j)] = np.float32(np.float32(q) * s)
                elif PERM:
                    t0 = np.uint64((b - c0) * B)
                    for j in range(B):
                        dst[d0 + np.uint64(j)] = np.float32(tv[t0 + np.uint64(j)] * s)
                else:
                    for j in range(B):
                        code = np.int64(codes[np.uint64(base) + np.uint64(j)]) & MASK
                        dst[d0 + np.uint64(j)] = np.float32(TABLE[code] * s)
            if stream:
                pending = _stream_chunk(out, off, buf, pending + (c1 - c0) * B, c1 == b1)
        if stream:
            _stream.store_fence()

    return dec


@kernel
def nvfp4_encode(x, ts, codes, scales, b0, b1):
    """NVFP4 blocks [b0, b1) of flat float32 ``x`` with tensor scale ``ts`` (float32 > 0)."""
    xb = x.view(np.uint32)
    ts = np.float32(ts)
    tmp = np.empty(16, np.int32)                                     # one block's codes
    for b in range(b0, b1):
        u0 = np.uint64(b * 16)                                       # unsigned: see mx_encoder
        amax = np.uint32(0)
        for j in range(16):
            a = np.uint32(xb[u0 + np.uint64(j)] & np.uint32(0x7FFFFFFF))
            amax = a if a > amax else amax
        s = np.float32(np.uint32(amax).view(np.float32) / np.float32(6.0))     # R32(amax_b / 6)
        s = np.float32(s / ts)                                       # R32(... / ts)
        sc = encode_narrow_f32(s.view(np.uint32), 4, 3, 7, 0x7E, 0x7E, 0x7F, True)  # ue4m3
        scales[b] = np.uint8(sc)
        d = np.float32(_E4M3_F32[sc] * ts)                           # R32(f32(s_b) * ts)
        if d == np.float32(0.0):                                     # signed zeros
            for j in range(16):
                tmp[j] = np.int32(8) if xb[u0 + np.uint64(j)] >> np.uint32(31) else np.int32(0)
        else:
            for j in range(16):
                y = np.float32(x[u0 + np.uint64(j)] / d)             # R32(v / d)
                tmp[j] = encode_narrow_f32(y.view(np.uint32), 2, 1, 1, 0x7, 0x7, 0, False)
        h0 = np.uint64(b * 8)
        for j in range(8):
            codes[h0 + np.uint64(j)] = np.uint8((tmp[2 * j] << 4) | tmp[2 * j + 1])


_E2M1_F32 = _F32[E2M1]


@kernel
def nvfp4_decode(codes, scales, ts, out, b0, b1, stream):
    """float32 values of NVFP4 blocks [b0, b1): R32(R32(e * s_b) * ts); ``stream`` as in
    :func:`mx_decoder` (unsigned indices for the same reason)."""
    ts = np.float32(ts)
    CHB = _STREAM_VALUES // 16
    buf = np.empty(CHB * 16 + 16 if stream else 0, np.float32)
    pending = np.int64(0)
    for c0 in range(b0, b1, CHB):
        c1 = min(c0 + CHB, b1)
        dst = buf if stream else out
        off = c0 * 16 - pending if stream else 0
        for b in range(c0, c1):
            d0 = np.uint64(b * 16 - off)
            cb = np.uint64(b * 8)
            s = _E4M3_F32[np.int64(scales[b])]
            for j in range(8):
                byte = np.int64(codes[cb + np.uint64(j)])
                dst[d0 + np.uint64(2 * j)] = np.float32(np.float32(_E2M1_F32[byte >> 4] * s) * ts)
                dst[d0 + np.uint64(2 * j + 1)] = np.float32(
                    np.float32(_E2M1_F32[byte & 0xF] * s) * ts)
        if stream:
            pending = _stream_chunk(out, off, buf, pending + (c1 - c0) * 16, c1 == b1)
    if stream:
        _stream.store_fence()
