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

from .._jit import kernel
from .lowp import (_T_E2M1, _T_E2M3, _T_E3M2, _T_E4M3, _T_E5M2, _encode_narrow_f32)

# element kinds (closure constants)
E2M1, E2M3, E3M2, E4M3, E5M2, INT8 = range(6)

# (exponent bits, mantissa bits, bias, largest magnitude code) of the float elements
_ELEMENT = {E2M1: (2, 1, 1, 0x7), E2M3: (2, 3, 1, 0x1F), E3M2: (3, 2, 3, 0x1F),
            E4M3: (4, 3, 7, 0x7E), E5M2: (5, 2, 15, 0x7B), INT8: (0, 0, 0, 0)}
# float32 values of every code (exact), from lowp's tables
_F32 = {E2M1: _T_E2M1.astype(np.float32), E2M3: _T_E2M3.astype(np.float32),
        E3M2: _T_E3M2.astype(np.float32), E4M3: _T_E4M3.astype(np.float32),
        E5M2: _T_E5M2.astype(np.float32),
        INT8: np.arange(-128, 128, dtype=np.float32)[np.arange(256) ^ 0x80]}
_E4M3_F32 = _T_E4M3.astype(np.float32)


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
    """Index of the first non-finite value of a flat float32 array, or -1."""
    xb = x.view(np.uint32)
    for i in range(xb.size):
        if (xb[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
            return i
    return -1


@kernel
def amax_bits(x):
    """Bits of max |x| over a flat float32 array (finite input)."""
    xb = x.view(np.uint32)
    m = np.uint32(0)
    for i in range(xb.size):
        a = np.uint32(xb[i] & np.uint32(0x7FFFFFFF))
        m = a if a > m else m
    return m


_MX_ENCODERS = {}
_MX_DECODERS = {}


def mx_encoder(K, EMAX, B):
    """Compiled MX encoder ``enc(x, codes, scales, b0, b1)`` for element kind K."""
    key = (K, EMAX, B)
    fn = _MX_ENCODERS.get(key)
    if fn is None:
        fn = _MX_ENCODERS[key] = _make_mx_encoder(K, EMAX, B)
    return fn


def _make_mx_encoder(K, EMAX, B):
    EBITS, MBITS, BIAS, MAXMAG = _ELEMENT[K]
    PACK = K == E2M1
    IS_INT = K == INT8

    @kernel
    def enc(x, codes, scales, b0, b1):
        xb = x.view(np.uint32)
        for b in range(b0, b1):
            base = b * B
            amax = np.uint32(0)
            for j in range(B):
                a = np.uint32(xb[base + j] & np.uint32(0x7FFFFFFF))
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
                    q = np.rint(np.float64(x[base + j]) * f)         # P = RNE(v * 2^-X * 64)
                    q = min(max(q, -127.0), 127.0)                   # saturate to +-127
                    codes[base + j] = np.uint8(np.int64(q) & np.int64(0xFF))
            else:
                inv = pow2_f32(-X)                                   # 2^-X
                if PACK:
                    for j in range(0, B, 2):
                        y0 = np.float32(x[base + j] * inv)           # exact where it matters
                        y1 = np.float32(x[base + j + 1] * inv)
                        c0 = _encode_narrow_f32(y0.view(np.uint32), EBITS, MBITS, BIAS, MAXMAG,
                                                MAXMAG, 0, False)    # RNE, saturating
                        c1 = _encode_narrow_f32(y1.view(np.uint32), EBITS, MBITS, BIAS, MAXMAG,
                                                MAXMAG, 0, False)
                        codes[(base + j) >> 1] = np.uint8((c0 << 4) | c1)
                else:
                    for j in range(B):
                        y = np.float32(x[base + j] * inv)
                        codes[base + j] = np.uint8(_encode_narrow_f32(
                            y.view(np.uint32), EBITS, MBITS, BIAS, MAXMAG, MAXMAG, 0, False))

    return enc


def mx_decoder(K, B):
    """Compiled MX decoder ``dec(codes, scales, out, b0, b1)`` to float32."""
    key = (K, B)
    fn = _MX_DECODERS.get(key)
    if fn is None:
        fn = _MX_DECODERS[key] = _make_mx_decoder(K, B)
    return fn


def _make_mx_decoder(K, B):
    TABLE = _F32[K]
    PACK = K == E2M1
    MASK = 0x3F if K in (E2M3, E3M2) else 0xFF
    SHIFT = 6 if K == INT8 else 0

    @kernel
    def dec(codes, scales, out, b0, b1):
        for b in range(b0, b1):
            base = b * B
            sc = np.int64(scales[b])
            if sc == 0xFF:                                           # e8m0 NaN
                for j in range(B):
                    out[base + j] = np.float32(np.nan)
                continue
            s = pow2_f32(sc - np.int64(127 + SHIFT))                 # 2^X (MXINT8: 2^(X-6))
            if PACK:
                for j in range(0, B, 2):
                    byte = np.int64(codes[(base + j) >> 1])
                    out[base + j] = np.float32(TABLE[byte >> 4] * s)
                    out[base + j + 1] = np.float32(TABLE[byte & 0xF] * s)
            else:
                for j in range(B):
                    out[base + j] = np.float32(TABLE[np.int64(codes[base + j]) & MASK] * s)

    return dec


@kernel
def nvfp4_encode(x, ts, codes, scales, b0, b1):
    """NVFP4 blocks [b0, b1) of flat float32 ``x`` with tensor scale ``ts`` (float32 > 0)."""
    xb = x.view(np.uint32)
    ts = np.float32(ts)
    for b in range(b0, b1):
        base = b * 16
        amax = np.uint32(0)
        for j in range(16):
            a = np.uint32(xb[base + j] & np.uint32(0x7FFFFFFF))
            amax = a if a > amax else amax
        s = np.float32(np.uint32(amax).view(np.float32) / np.float32(6.0))     # R32(amax_b / 6)
        s = np.float32(s / ts)                                       # R32(... / ts)
        sc = _encode_narrow_f32(s.view(np.uint32), 4, 3, 7, 0x7E, 0x7E, 0x7F, True)  # ue4m3
        scales[b] = np.uint8(sc)
        d = np.float32(_E4M3_F32[sc] * ts)                           # R32(f32(s_b) * ts)
        for j in range(0, 16, 2):
            v0 = x[base + j]
            v1 = x[base + j + 1]
            if d == np.float32(0.0):                                 # signed zeros
                c0 = np.int32(8) if xb[base + j] >> np.uint32(31) else np.int32(0)
                c1 = np.int32(8) if xb[base + j + 1] >> np.uint32(31) else np.int32(0)
            else:
                y0 = np.float32(v0 / d)                              # R32(v / d)
                y1 = np.float32(v1 / d)
                c0 = _encode_narrow_f32(y0.view(np.uint32), 2, 1, 1, 0x7, 0x7, 0, False)
                c1 = _encode_narrow_f32(y1.view(np.uint32), 2, 1, 1, 0x7, 0x7, 0, False)
            codes[(base + j) >> 1] = np.uint8((c0 << 4) | c1)


_E2M1_F32 = _F32[E2M1]


@kernel
def nvfp4_decode(codes, scales, ts, out, b0, b1):
    """float32 values of NVFP4 blocks [b0, b1): R32(R32(e * s_b) * ts)."""
    ts = np.float32(ts)
    for b in range(b0, b1):
        base = b * 16
        s = _E4M3_F32[np.int64(scales[b])]
        for j in range(0, 16, 2):
            byte = np.int64(codes[(base + j) >> 1])
            out[base + j] = np.float32(np.float32(_E2M1_F32[byte >> 4] * s) * ts)
            out[base + j + 1] = np.float32(np.float32(_E2M1_F32[byte & 0xF] * s) * ts)
