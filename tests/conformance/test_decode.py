"""Decoders: exhaustive where the space is small, dequantize evaluation order, validation call."""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk.testing.reference import core as ref
from numba_qk.kernels import f16_to_f32, q4_k_quant, q4_k_scale_min, round_half_even, saturate_i8
from numba_qk.kernels._bits import f16_bits_to_f32_bits

from numba_qk.testing.asserts import assert_same_f32
from records import pack_q4_k, pack_q8_k, random_q4_k, random_q8_k

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def test_f16_decoder_all_65536_patterns():
    from numba import njit

    @njit(cache=False)
    def widen_all(out):
        for h in range(65536):
            out[h] = f16_bits_to_f32_bits(np.uint16(h))

    got = np.empty(65536, np.uint32)
    widen_all(got)
    # numpy's float16 -> float32 cast is exact and keeps NaN payloads: identical bits
    want = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"pattern 0x{bad[0]:04x}: got 0x{got[bad[0]]:08x} want 0x{want[bad[0]]:08x}"
    # and the reference's hand decoder agrees on every value
    for h in range(0, 65536, 7):
        assert_same_f32(f16_to_f32(np.uint16(h)), ref.f16_value(h), f"f16 0x{h:04x}")


def test_scale_decoder_all_byte_values():
    # sc[s] and m[s] each depend on two bytes; run every value through every position
    for v in range(256):
        for u in (0, 0x3F, 0x40, 0x80, 0xC0, 0xFF, v ^ 0x5A):
            a = np.full(144, u, np.uint8)
            a[4:16] = (np.arange(12) * 37 + v) % 256
            a[4 + v % 12] = v
            dec = ref.decode_q4_k(a.tobytes())
            for s in range(8):
                assert tuple(q4_k_scale_min(a, s)) == (dec["sc"][s], dec["m"][s])


def test_nibble_decoder_all_byte_values():
    a = np.zeros(144, np.uint8)
    for v in range(256):
        a[16:144] = v
        dec = ref.decode_q4_k(a.tobytes())
        for i in range(0, 256, 5):
            assert q4_k_quant(a, i) == dec["q"][i] == ((v & 15) if i % 64 < 32 else (v >> 4))


def test_decode_matches_reference(rng):
    w = random_q4_k(rng, 20)
    w[3, 0:2] = [0x00, 0x7C]  # inf
    f = qk.decode(w, Q4)
    assert f.d.dtype == np.float16 and f.sc.shape == (20, 8) and f.q.shape == (20, 256)
    for b in range(20):
        dec = ref.decode_q4_k(w[b].tobytes())
        assert_same_f32(np.float32(f.d[b]), dec["d"])
        assert_same_f32(np.float32(f.dmin[b]), dec["dmin"])
        assert f.sc[b].tolist() == dec["sc"] and f.m[b].tolist() == dec["m"]
        assert f.q[b].tolist() == dec["q"]
    x = rng.integers(0, 256, (20, 292), dtype=np.uint8)
    f = qk.decode(x, Q8)
    assert f.ds.dtype == np.float32 and f.q.dtype == np.int8 and f.bsum.dtype == np.int16
    for b in range(20):
        dec = ref.decode_q8_k(x[b].tobytes())
        assert_same_f32(f.ds[b], dec["ds"])
        assert f.q[b].tolist() == dec["q"] and f.bsum[b].tolist() == dec["bsum"]


def test_pack_helpers_round_trip(rng):
    sc = rng.integers(0, 64, 8).tolist()
    m = rng.integers(0, 64, 8).tolist()
    q = rng.integers(0, 16, 256).tolist()
    dec = ref.decode_q4_k(pack_q4_k(0x1234, 0x4321, sc, m, q).tobytes())
    assert (dec["sc"], dec["m"], dec["q"]) == (sc, m, q)


def test_dequantize_q4_k_evaluation_order(rng):
    w = random_q4_k(rng, 16)
    got = qk.dequantize(w, Q4)
    assert got.shape == (16, 256) and got.dtype == np.float32
    for b in range(16):
        dec = ref.decode_q4_k(w[b].tobytes())
        for i in range(256):
            s = i // 32
            d_s = np.float32(dec["d"] * np.float32(dec["sc"][s]))
            m_s = np.float32(dec["dmin"] * np.float32(dec["m"][s]))
            want = np.float32(np.float32(d_s * np.float32(dec["q"][i])) - m_s)
            assert_same_f32(got[b, i], want, f"record {b} element {i}")


def test_dequantize_q4_k_matches_gguf_py(rng):
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    w = random_q4_k(rng, 32)
    want = gguf_quants.dequantize(w.reshape(-1), GGMLQuantizationType.Q4_K).reshape(32, 256)
    assert_same_f32(qk.dequantize(w, Q4), want)


def test_dequantize_q8_k(rng):
    x = random_q8_k(rng, 8)
    got = qk.dequantize(x, Q8)
    f = qk.decode(x, Q8)
    assert_same_f32(got, (f.ds[:, None] * f.q.astype(np.float32)).astype(np.float32))
    out = np.empty((8, 256), np.float32)
    assert qk.dequantize(x, Q8, out=out) is out


def test_find_invalid_records(rng):
    x = random_q8_k(rng, 10)
    assert qk.find_invalid_records(x, Q8).tolist() == []
    x[3, 260] ^= 1          # bsum[0] off by one
    x[7, 4 + 255] ^= 0x80   # q[255] changed: bsum[15] no longer matches
    bad = qk.find_invalid_records(x, Q8)
    assert bad.dtype == np.int64 and bad.tolist() == [3, 7]
    assert qk.find_invalid_records(random_q4_k(rng, 3), Q4).tolist() == []
    assert qk.find_invalid_records(np.empty((0, 292), np.uint8), Q8).tolist() == []


def test_rounding_helpers():
    for x, want in [(0.5, 0.0), (1.5, 2.0), (2.5, 2.0), (-0.5, -0.0), (-1.5, -2.0),
                    (0.49999997, 0.0), (126.5, 126.0), (127.5, 128.0), (-128.5, -128.0)]:
        assert_same_f32(round_half_even(np.float32(x)), np.float32(want), str(x))
    for r, want in [(127.0, 127), (128.0, 127), (1e30, 127), (-128.0, -128), (-129.0, -128),
                    (-3e38, -128), (0.0, 0), (-0.0, 0), (-5.0, -5)]:
        assert saturate_i8(np.float32(r)) == want


def test_every_decoded_fields_type_is_exported():
    """``decode``'s result type for every record format is a public name of ``numba_qk``
    (users check ``isinstance(fields, qk.IQGridFields)``)."""
    for fmt in qk.quant:
        got = qk.decode(np.zeros((1, fmt.block_bytes), np.uint8), fmt)
        name = type(got).__name__
        assert name in qk.__all__ and getattr(qk, name) is type(got), (fmt.name, name)
