"""The lowp conversion kernels' fast paths give the portable loops' bits.

* explicit-vector f32 -> bf16/f16 encoders (``kernels/lowp._encode_run``);
* AVX-512 register-table decode of fp8/fp6 codes (``kernels/lowp._decode_run``);
* explicit-vector f16 -> f32 widening (``kernels/lowp._f16_decode_run``, every code, NaN
  payloads and signalling NaNs kept bit for bit);
* non-temporal streaming of large outputs (``kernels/simd/stream.py``), whatever the destination's
  alignment, the row lengths and the source strides, and through ``astype`` (threads too).

The reference is the same converter compiled with the fast paths switched off (the portable
loops, themselves checked against ml_dtypes and the Fraction oracle in test_lowp_codecs.py).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _convert
from numba_qk.kernels.simd import stream as _stream
from numba_qk.kernels.lowp import codecs as L
from numba_qk.kernels._bits import f16_bits_to_f32_bits

T = L._T_E8M0
DECODE_KINDS = {"e4m3": L.K_E4M3, "e5m2": L.K_E5M2, "e2m3": L.K_E2M3, "e3m2": L.K_E3M2}
TABLES = {L.K_E4M3: L._B_E4M3, L.K_E5M2: L._B_E5M2, L.K_E2M3: L._B_E2M3, L.K_E3M2: L._B_E3M2}
_PORTABLE = {}


def portable(S, D):
    """The converter S -> D compiled with the vector paths off."""
    return portable_packed(S, D, 1, 1)


def portable_packed(S, D, SPB, DPB):
    """The converter S -> D (SPB / DPB codes per storage unit) with the vector paths off."""
    if (S, D, SPB, DPB) not in _PORTABLE:
        saved = L._PERM_KINDS, L._VEC_ENC
        L._PERM_KINDS, L._VEC_ENC = (), False
        try:
            _PORTABLE[S, D, SPB, DPB] = L._make_converter(S, D, SPB, DPB)
        finally:
            L._PERM_KINDS, L._VEC_ENC = saved
    return _PORTABLE[S, D, SPB, DPB]


def run(conv, src, dst_dtype, stream=False, pad=0):
    """Convert 1-d ``src`` into a fresh buffer starting ``pad`` elements into a larger one (so
    the destination's alignment varies); check the padding stays untouched."""
    buf = np.full(src.size + pad + 5, 0xA5, dst_dtype)
    dst = buf[pad:pad + src.size]
    conv(src.reshape(1, 1, -1), dst, T, 0, stream)
    assert (buf[:pad] == 0xA5).all() and (buf[pad + src.size:] == 0xA5).all()
    return dst.copy()


def f32_patterns():
    """Every high half of a float32 with low halves at and around the bf16 and f16 rounding
    boundaries (ties, +-1 ulp): every exponent, sign, subnormal, inf and NaN class."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001,
                     0xFFFF], np.uint32)
    return (hi[:, None] | lows[None, :]).reshape(-1)


@pytest.mark.parametrize("name", ["bf16", "f16"])
def test_vector_encode_equals_portable(name):
    D = L.K_BF16 if name == "bf16" else L.K_F16
    x = f32_patterns()
    fast, slow = L.converter(L.K_F32, D, 1, 1), portable(L.K_F32, D)
    ref = run(slow, x, np.uint16)
    assert (run(fast, x, np.uint16) == ref).all()
    if _stream.HAVE_STREAM:                                   # non-temporal lines from registers
        for pad in (0, 1, 31, 33):
            assert (run(fast, x, np.uint16, stream=True, pad=pad) == ref).all(), pad
    for n in list(range(0, 40)) + [1000, 4099]:             # tails of every length
        part = x[12345:12345 + n]
        assert (run(fast, part, np.uint16, pad=n % 3) == ref[12345:12345 + n]).all()
    wide = np.repeat(x[:200_000], 2)                          # strided rows: the gather path
    got = np.empty(100_000, np.uint16)
    fast(wide.reshape(1, 1, -1)[:, :, ::4], got, T, 0, False)
    assert (got == ref[:200_000:2]).all()


@pytest.mark.parametrize("name", list(DECODE_KINDS))
def test_vector_decode_every_code(name):
    S = DECODE_KINDS[name]
    if S not in L._PERM_KINDS:
        pytest.skip("the register-table decode is compiled only with AVX-512")
    codes = np.tile(np.arange(256, dtype=np.uint8), 9)
    mask = 0x3F if TABLES[S].size == 64 else 0xFF
    expect = TABLES[S][codes & mask]
    fast, slow = L.converter(S, L.K_F32, 1, 1), portable(S, L.K_F32)
    assert (run(fast, codes, np.uint32) == expect).all()
    assert (run(slow, codes, np.uint32) == expect).all()
    for start in range(0, 20):                                # every phase, every tail
        for n in (0, 1, 15, 16, 17, 33, 100):
            part = codes[start:start + n]
            assert (run(fast, part, np.uint32, pad=start % 3) == expect[start:start + n]).all()


def _njit_perm_runs():
    """Test-local njit loops over the AVX-512 register-table decoders of e4m3 / e5m2 (the
    converter uses them only on CPUs without F16C, so call them directly)."""
    from numba import njit

    @njit(cache=False)
    def e4m3(src, dst):
        for k in range(0, src.shape[0], 16):
            L._perm_e4m3(src, k, dst, k, 0)

    @njit(cache=False)
    def e5m2(src, dst):
        for k in range(0, src.shape[0], 16):
            L._perm_e5m2(src, k, dst, k, 0)

    return {L.K_E4M3: e4m3, L.K_E5M2: e5m2}


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_vector_decoders_keep_nan_sign(name):
    """Both 16-lane fp8 decoders -- F16C ``vcvtph2ps`` and the AVX-512 register table -- give
    every code's table bits, a negative NaN code the negative quiet NaN (issue 21 B)."""
    S = DECODE_KINDS[name]
    codes = np.tile(np.arange(256, dtype=np.uint8), 2)
    expect = TABLES[S][codes]
    nan = np.isin(codes & 0x7F, [0x7F] if name == "e4m3" else [0x7D, 0x7E, 0x7F])
    assert (expect[nan] == (np.uint32(0x7FC00000) | ((codes[nan].astype(np.uint32) & 0x80) << 24))
            ).all()
    assert (run(portable(S, L.K_F32), codes, np.uint32) == expect).all()
    if S in L._PERM_KINDS:                       # the converter's vector run (F16C or table)
        assert (run(L.converter(S, L.K_F32, 1, 1), codes, np.uint32) == expect).all()
    if L._simd.HAVE_AVX512:
        got = np.zeros(codes.size, np.uint32)
        _njit_perm_runs()[S](codes, got)
        assert (got == expect).all()


_ORACLE = {}


def f16_oracle(codes):
    """float32 bits of f16 codes by the readable integer rule (``_bits.f16_bits_to_f32_bits``,
    interpreted): NaN payloads shifted up, signalling NaNs left signalling."""
    if "f16" not in _ORACLE:
        _ORACLE["f16"] = np.array([int(f16_bits_to_f32_bits.py_func(c)) for c in range(1 << 16)],
                                  np.uint32)
    return _ORACLE["f16"][codes]


def test_vector_f16_decode_every_code():
    codes = np.arange(1 << 16, dtype=np.uint16)
    expect = f16_oracle(codes)
    assert expect[0x7C01] == 0x7F802000 and expect[0xFE00] == 0xFFC00000   # sNaN stays sNaN
    fast, slow = L.converter(L.K_F16, L.K_F32, 1, 1), portable(L.K_F16, L.K_F32)
    assert (run(slow, codes, np.uint32) == expect).all()
    assert (run(fast, codes, np.uint32) == expect).all()
    if _stream.HAVE_STREAM:
        assert (run(fast, codes, np.uint32, stream=True, pad=3) == expect).all()
    nans = codes[(codes & 0x7FFF) > 0x7C00]                   # every NaN code, shuffled
    nans = np.random.default_rng(5).permutation(nans)
    assert (run(fast, nans, np.uint32, pad=1) == f16_oracle(nans)).all()
    for start in range(0, 20):                                # every phase, every tail
        for n in (0, 1, 15, 16, 17, 33, 63, 64, 65, 100):
            part = codes[0x7BF0 + 97 * start:][:n]
            assert (run(fast, part, np.uint32, pad=start % 3) == f16_oracle(part)).all()
    # a byte-misaligned, read-only source; strided rows (the scratch gather path), 3-d
    raw = np.zeros(2 * codes.size + 1, np.uint8)
    odd = raw[1:].view(np.uint16)
    odd[:] = codes
    odd.flags.writeable = False
    assert (run(fast, odd, np.uint32) == expect).all()
    grid = np.repeat(codes, 2).reshape(4, 2, 16384)[:, :, ::2]
    got = np.empty(grid.size, np.uint32)
    fast(grid, got, T, 0, False)
    assert (got == expect).all()
    if _stream.HAVE_STREAM:
        got[:] = 0
        fast(grid, got, T, 0, True)
        assert (got == expect).all()


def test_astype_f16_to_f32_keeps_nan_bits():
    codes = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty((256, 256), np.float32)
    r = qk.astype(codes.view(np.float16).reshape(256, 256)[:, ::-1], qk.f32, out=out, threads=2)
    assert r is out
    assert (out.view(np.uint32) == f16_oracle(codes.reshape(256, 256)[:, ::-1])).all()


F16_SCRIPT = r"""
import sys, numpy as np, numba_qk as qk
from numba_qk.kernels.lowp import codecs as L
codes = np.arange(1 << 16, dtype=np.uint16)
a = qk.astype(codes.view(np.float16), qk.f32).view(np.uint32)
b = qk.astype(codes.view(np.float16)[::-1], qk.f32).view(np.uint32)[::-1]
c = qk.astype(qk.astype(codes.view(np.float16), qk.f32), qk.f16).view(np.uint16)
np.savez(sys.argv[1], a=a, b=b, c=c, vec=np.array([L._VEC_ENC, L._HW_F16]))
"""


@pytest.mark.parametrize("env", [
    pytest.param({"NUMBA_QK_PORTABLE": "1"}, marks=pytest.mark.slow),
    pytest.param({"NUMBA_CPU_NAME": "haswell"}, marks=pytest.mark.slow)],
    ids=["portable", "haswell"])
def test_f16_casts_under_other_targets(tmp_path, env):
    """The f16 casts compiled with the vector paths off (NUMBA_QK_PORTABLE=1) and for a CPU
    without AVX-512 (the 16-lane vectors split into 256-bit halves) give the same bits.  Both are
    slow-marked (a cold compile of 11-15 s each; the portable cast loops are also run
    interpreted against the compiled ones by test_lowp_parity)."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("x86-64 targets only")
    path = tmp_path / "r.npz"
    e = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore", **env)
    subprocess.run([sys.executable, "-c", F16_SCRIPT, str(path)], check=True, env=e, timeout=600)
    r = np.load(path)
    codes = np.arange(1 << 16, dtype=np.uint16)
    expect = f16_oracle(codes)
    assert (r["a"] == expect).all() and (r["b"] == expect).all()
    back = qk.astype(expect.view(np.float32), qk.f16).view(np.uint16)
    assert (r["c"] == back).all()
    if "NUMBA_QK_PORTABLE" in env:
        assert not r["vec"][0]


CASES = [(L.K_BF16, L.K_F32, np.uint16, np.uint32), (L.K_F16, L.K_F32, np.uint16, np.uint32),
         (L.K_E4M3, L.K_F32, np.uint8, np.uint32), (L.K_E2M3, L.K_F32, np.uint8, np.uint32),
         (L.K_F32, L.K_BF16, np.uint32, np.uint16), (L.K_F32, L.K_E5M2, np.uint32, np.uint8),
         (L.K_F32, L.K_F16, np.uint32, np.uint16)]


@pytest.mark.parametrize("S,D,sdt,ddt", CASES,
                         ids=["bf16-f32", "f16-f32", "e4m3-f32", "e2m3-f32", "f32-bf16", "f32-e5m2",
                              "f32-f16"])
def test_streamed_equals_unstreamed(S, D, sdt, ddt):
    if not _stream.HAVE_STREAM:
        pytest.skip("non-temporal stores are used only on x86-64 with the JIT")
    rng = np.random.default_rng(S * 16 + D)
    n = 3 * 2 * 6000 + 37
    src = rng.integers(0, np.iinfo(sdt).max, n, dtype=np.uint64).astype(sdt)
    conv = L.converter(S, D, 1, 1)
    ref = run(conv, src, ddt)
    for pad in range(0, 70, 7):                               # destination alignments
        assert (run(conv, src, ddt, stream=True, pad=pad) == ref).all(), pad
    short = src[:L._SBLOCK - 3]                               # too short to stream: plain path
    assert (run(conv, short, ddt, stream=True, pad=1) == ref[:short.size]).all()
    # a 3-d source with strided rows (gather path) and several rows, streamed
    grid = np.repeat(src[:3 * 2 * 6000], 2).reshape(3, 2, 12000)[:, :, ::2]
    out_s = np.empty(grid.size, ddt)
    out_p = np.empty(grid.size, ddt)
    conv(grid, out_s, T, 0, True)
    conv(grid, out_p, T, 0, False)
    assert (out_s == out_p).all() and (out_p == ref[:grid.size]).all()


def stream_flags(monkeypatch):
    """A list that receives the ``stream`` flag of every converter call ``numba_qk.astype``
    makes from now on (the converter factory wrapped by a spy)."""
    calls = []
    real = L.converter

    def spy(*key):
        fn = real(*key)

        def wrapped(*args):
            calls.append(args[-1])
            return fn(*args)
        return wrapped

    monkeypatch.setattr(L, "converter", spy)
    return calls


def test_astype_streams_large_widening_casts(monkeypatch):
    calls = stream_flags(monkeypatch)
    x = (np.random.default_rng(3).standard_normal((3, 5, 7000)) * 50).astype(np.float32)
    cases = [(qk.e4m3, x), (qk.bf16, x), (qk.f16, x[:, ::-1, ::3]), (qk.e3m2, x[1:, :, 1:])]
    expect = [qk.astype(qk.astype(v, t), qk.f32) for t, v in cases]
    monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 0)
    for (t, v), e in zip(cases, expect):
        codes = qk.astype(v, t)
        for threads in (1, 2, 3):
            calls.clear()
            out = np.full(v.shape, 7.0, np.float32)
            assert qk.astype(codes, qk.f32, out=out, threads=threads) is out
            assert (out.view(np.uint32) == e.view(np.uint32)).all()
            assert calls and all(calls) == _stream.HAVE_STREAM
        calls.clear()
        qk.astype(v, t)             # narrowing: not at this size (REG_STREAM_MIN_BYTES)
        assert calls and not any(calls)


def _codes(r):
    return np.asarray(r.codes() if isinstance(r, qk.Tensor) else r.view(f"u{r.dtype.itemsize}"))


def test_astype_streams_narrowing_f32_to_bf16_f16_from_registers(monkeypatch):
    """Narrowing f32 -> bf16 / f16 streams (non-temporal stores from registers) at or above
    ``REG_STREAM_MIN_BYTES`` where the kernels can, with the same bits at every thread
    count and alignment; other narrowing casts never stream."""
    calls = stream_flags(monkeypatch)
    x = (np.random.default_rng(4).standard_normal((3, 5, 9000)) * 50).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    cases = [(qk.bf16, x), (qk.f16, x), (qk.bf16, x[:, ::-1, 1:]), (qk.e4m3, x)]
    expect = [qk.astype(v, t) for t, v in cases]                # plain stores
    monkeypatch.setattr(_stream, "REG_STREAM_MIN_BYTES", 0)
    for (t, v), e in zip(cases, expect):
        for threads in (1, 2, 3):
            for pad in (0, 1, 3):                               # output alignments
                calls.clear()
                sd = np.uint8 if t is qk.e4m3 else np.uint16
                store = np.empty(v.size + pad, sd)[pad:].reshape(v.shape)
                out = store.view(np.float16) if t is qk.f16 else qk.Tensor(store, dtype=t)
                assert qk.astype(v, t, out=out, threads=threads) is out
                assert (_codes(out) == _codes(e)).all()
                vec = t is qk.bf16 or (t is qk.f16 and L._HW_F16)
                assert calls and all(calls) == (_stream.HAVE_STREAM and L._VEC_ENC and vec)


def test_astype_streams_widening_casts_from_registers(monkeypatch):
    """bf16 / f16 / fp8 / fp6 -> f32 stream from registers at REG_STREAM_MIN_BYTES (the L1
    scratch path's STREAM_MIN_BYTES out of the way): same bits at every alignment and thread
    count, every code included."""
    calls = stream_flags(monkeypatch)
    x = (np.random.default_rng(5).standard_normal((2, 3, 9000)) * 50).astype(np.float32)
    x.reshape(-1)[:256] = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
    srcs = [qk.astype(x, t) for t in (qk.bf16, qk.f16, qk.e4m3, qk.e5m2, qk.e2m3, qk.e3m2)]
    srcs.append(qk.Tensor(np.tile(np.arange(1 << 16, dtype=np.uint16), 1), dtype=qk.bf16))
    expect = [qk.astype(c, qk.f32) for c in srcs]              # plain stores
    monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 1 << 62)
    monkeypatch.setattr(_stream, "REG_STREAM_MIN_BYTES", 0)
    for c, e in zip(srcs, expect):
        for threads in (1, 3):
            for pad in (0, 1, 5):
                calls.clear()
                out = np.empty(e.size + pad, np.float32)[pad:].reshape(e.shape)
                assert qk.astype(c, qk.f32, out=out, threads=threads) is out
                assert (out.view(np.uint32) == e.view(np.uint32)).all()
                kind = _convert.source(c).kind
                assert calls and all(calls) == (_stream.HAVE_STREAM
                                                and L.register_stream(kind, L.K_F32))


@pytest.mark.parametrize("name", ["i4", "u4", "e2m1"])
def test_packed_nibble_decode_every_code(name):
    """int4 / uint4 / e2m1 -> f32 by one vpermd per 16 codes (``lowp._nibble_run``, AVX-512):
    every byte (two codes, high nibble first) at every phase and tail length equals the scalar
    rule, and the expected values (ints exactly; e2m1 by its table)."""
    S = {"i4": L.K_I4, "u4": L.K_U4, "e2m1": L.K_E2M1}[name]
    if S not in L._NIBBLE_KINDS:
        pytest.skip("the vpermd nibble decode is compiled only with AVX-512")
    nib = np.arange(16)
    value = {"i4": ((nib ^ 8) - 8).astype(np.float32), "u4": nib.astype(np.float32),
             "e2m1": L._B_E2M1[:16].view(np.float32)}[name]
    fast, slow = L.converter(S, L.K_F32, 2, 1), portable_packed(S, L.K_F32, 2, 1)
    codes = np.tile(np.arange(256, dtype=np.uint8), 3)
    expect = np.stack([value[codes >> 4], value[codes & 15]], axis=1).reshape(-1).view(np.uint32)
    for start in range(0, 20):
        for n in (0, 1, 15, 16, 17, 33, 100):
            part = codes[start:start + n]
            want = expect[2 * start:2 * (start + n)]
            for conv in (fast, slow):
                dst = np.full(2 * n + 3, 0xA5A5A5A5, np.uint32)
                conv(part.reshape(1, 1, -1), dst[1:2 * n + 1], T, 0, False)
                assert (dst[1:2 * n + 1] == want).all() and dst[0] == dst[-1] == 0xA5A5A5A5
