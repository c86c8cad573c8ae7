"""numba_qk.gguf.accelerate_gguf_py: gguf-py's quantize/dequantize routed through numba_qk give
gguf-py's exact bytes and values, type by type, with and without acceleration; idempotent;
restore_gguf_py undoes it; unrouted types, lazy inputs and non-finite values stay gguf-py's."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import numba_qk as qk  # noqa: E402
from numba_qk import gguf as qg  # noqa: E402

from numba_qk.testing.asserts import assert_same_f32  # noqa: E402

T = gguf.GGMLQuantizationType
ROUTED = [f.name for f in qg.GGUF_PY_ROUTED]
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


@pytest.fixture
def original():
    qg.restore_gguf_py()
    yield gguf.quants.quantize, gguf.quants.dequantize
    qg.restore_gguf_py()


def _values(rng, n, block):
    x = (rng.standard_normal((n, block)) * 10.0 ** rng.uniform(-30, 30, (n, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0                        # all -0.0: gguf-py's d sign differs from ggml's (see gguf.py)
    x[2, 0] = -0.0
    x[2, 1:] = 0.0
    x[3] = np.arange(block)            # ties
    x[4] = np.abs(x[4])                # all positive
    x[5] = np.float32(1e-45) * np.arange(block)  # subnormals
    x[6] = np.float32(3.4e38)
    x[7, ::2] = -x[7, ::2]
    return x


def test_routes_cover_what_the_registry_binds():
    assert ROUTED == ["Q4_K", *LEGACY, "Q2_K", "Q3_K", "Q5_K", "Q6_K", "MXFP4", "NVFP4", "IQ4_NL",
                      "IQ4_XS",
                      "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S",
                      "IQ1_M"]
    assert "Q8_1" not in ROUTED and "Q8_K" not in ROUTED
    assert gguf.GGML_QUANT_SIZES[T.Q8_1] == (32, 40)  # gguf-py's Q8_1 size is not ggml's 36 B
    assert qk.quant.q8_1.block_bytes == 36


@pytest.mark.parametrize("name", ROUTED)
def test_dequantize_is_gguf_py_bit_for_bit(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    raw = rng.integers(0, 256, (3, 5, 2 * fmt.block_bytes), dtype=np.uint8)  # 3-D, 2 per row
    raw[0, 0] = 0
    raw[0, 1] = 0xFF                   # NaN/inf scales
    with np.errstate(all="ignore"):
        want = original[1](raw, T[name])
    assert qg.accelerate_gguf_py() == qg.GGUF_PY_ROUTED
    assert gguf.quants.dequantize is not original[1] and gguf.dequantize is gguf.quants.dequantize
    got = gguf.quants.dequantize(raw, T[name])
    assert got.shape == want.shape == (3, 5, 2 * fmt.block_size) and got.dtype == np.float32
    assert_same_f32(got, want, name)
    ro = raw.copy()
    ro.flags.writeable = False
    assert_same_f32(gguf.dequantize(ro, T[name]), want, name)
    qg.restore_gguf_py()
    assert gguf.quants.dequantize is original[1] and gguf.dequantize is original[1]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_quantize_is_gguf_py_bit_for_bit(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    x = _values(rng, 64, fmt.block_size).reshape(8, 8 * fmt.block_size)
    with np.errstate(all="ignore"):
        want = original[0](x, T[name])
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T[name])
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero((got != want).reshape(64, -1).any(axis=1))
    assert bad.size == 0, f"{name}: blocks {bad} differ from gguf-py"
    # float64 / float16 inputs: converted to float32 as gguf-py does
    np.testing.assert_array_equal(gguf.quants.quantize(x.astype(np.float64), T[name]), want)


def test_mxfp4_quantize_is_gguf_py_bit_for_bit(rng, original):
    """gguf-py's MXFP4 encoder (numpy log2, argmin) gives ggml's bytes; so does the routed one."""
    fmt = qk.quant.mxfp4
    x = _values(rng, 64, 32)
    x[8:40, 0] = (np.ldexp(np.float32(1), rng.integers(-140, 127, 32)).astype(np.float32)
                  .view(np.uint32) - rng.integers(0, 3, 32).astype(np.uint32)).view(np.float32)
    x = x.reshape(8, 8 * 32)
    with np.errstate(all="ignore"):
        want = original[0](x, T.MXFP4)
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T.MXFP4)
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero((got != want).reshape(64, -1).any(axis=1))
    assert bad.size == 0, f"MXFP4: blocks {bad} differ from gguf-py"


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "NVFP4"])
def test_kquant_quantize_is_numba_qk_where_gguf_py_cannot(name, rng, original):
    fmt = getattr(qk.quant, name.lower())
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    with pytest.raises(NotImplementedError):
        original[0](x, T[name])
    qg.accelerate_gguf_py()
    got = gguf.quants.quantize(x, T[name])
    assert got.shape == (2, 3, 512 // fmt.block_size * fmt.block_bytes)
    np.testing.assert_array_equal(got.reshape(-1, fmt.block_bytes),
                                  qk.quantize(x.reshape(-1, fmt.block_size), format=fmt))
    # and gguf-py's own decoder reads it back as numba_qk does
    assert_same_f32(original[1](got, T[name]), qk.dequantize(got.reshape(-1, fmt.block_bytes),
                                                             fmt).reshape(2, 3, 512))


def test_unrouted_inputs_go_to_gguf_py(rng, original):
    qg.accelerate_gguf_py()
    x = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(gguf.quants.quantize(x, T.F16), original[0](x, T.F16))
    np.testing.assert_array_equal(gguf.quants.dequantize(x.view(np.uint8), T.F32), x)
    x[1, 5] = np.nan                                 # numba_qk rejects: gguf-py's bytes kept
    with np.errstate(all="ignore"):
        want = original[0](x, T.Q8_0)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(gguf.quants.quantize(x, T.Q8_0), want)
    with pytest.raises(gguf.quants.QuantError):      # gguf-py's own error for a bad row size
        gguf.quants.quantize(np.zeros((2, 33), np.float32), T.Q8_0)
    with pytest.raises(ValueError, match="not a multiple of Q4_K type size"):
        gguf.quants.dequantize(np.zeros((2, 145), np.uint8), T.Q4_K)
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(np.zeros((1, 40), np.uint8), T.Q8_1)


def test_accelerate_is_idempotent_and_restore_undoes_it(original):
    q, dq = original
    qg.restore_gguf_py()                             # no-op when not accelerated
    assert gguf.quants.quantize is q
    qg.accelerate_gguf_py()
    routed = gguf.quants.dequantize
    qg.accelerate_gguf_py()
    assert gguf.quants.dequantize is routed and routed.__wrapped__ is dq
    qg.restore_gguf_py()
    assert (gguf.quants.quantize, gguf.quants.dequantize, gguf.quantize, gguf.dequantize) == (
        q, dq, q, dq)


# ----------------------------------------------------------------------------- real loaders' inputs

def _write_reader_file(path, rng, names):
    """A GGUF file written by gguf-py with one random-bytes tensor per routed type (finite
    scales are not needed: both sides give the same NaN/inf bits), read back by GGUFReader."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name in names:
        fmt = getattr(qk.quant, name.lower())
        raw = rng.integers(0, 256, (3, 2 * fmt.block_bytes), dtype=np.uint8)
        w.add_tensor(f"t.{name}", raw, raw_dtype=T[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(str(path))


def test_dequantize_routes_gguf_reader_memmaps(tmp_path, rng, original, monkeypatch):
    """transformers' load_gguf_checkpoint calls gguf.dequantize(tensor.data, tensor.tensor_type)
    on GGUFReader's np.memmap rows: those must be accelerated (issue 21, item 1), with
    gguf-py's values."""
    reader = _write_reader_file(tmp_path / "m.gguf", rng, ROUTED)
    want = {}
    with np.errstate(all="ignore"):
        for t in reader.tensors:
            assert isinstance(t.data, np.memmap)   # what GGUFReader hands out
            want[t.name] = original[1](t.data, t.tensor_type)
    calls = []
    real = qg._dequantize
    monkeypatch.setattr(qg, "_dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    qg.accelerate_gguf_py()
    for t in reader.tensors:
        got = gguf.dequantize(t.data, t.tensor_type)
        assert type(got) is np.ndarray and got.dtype == np.float32
        assert_same_f32(got, want[t.name], t.name)
    assert len(calls) == len(ROUTED), "GGUFReader memmaps were not routed through numba_qk"
    # an int8 view is what gguf-py also reads as bytes
    t0 = reader.tensors[0]
    assert_same_f32(gguf.dequantize(np.asarray(t0.data).view(np.int8), t0.tensor_type),
                    want[t0.name], t0.name)


def _outcome(fn, *args):
    """What ``fn(*args)`` gives: ("raised", type, message) or ("value", float32 bits)."""
    try:
        with np.errstate(all="ignore"):
            got = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the point is to compare what each raises
        return "raised", type(exc), str(exc)
    return "value", np.asarray(got, np.float32).shape, np.asarray(got, np.float32).tobytes()


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "MXFP4"])
def test_dequantize_keeps_gguf_py_outcome_for_inputs_it_reads_otherwise(name, rng, original):
    """Strided byte rows and wider dtypes (a uint16 / float32 view of the records) are not
    routed: gguf-py raises for them (or, for MXFP4's strided rows, reads them its own way),
    and so must the routed function."""
    fmt = getattr(qk.quant, name.lower())
    raw = rng.integers(0, 256, (4, 4 * fmt.block_bytes), dtype=np.uint8)
    cases = {"strided rows": raw[:, ::2], "uint16 view": raw.view(np.uint16)}
    if raw.shape[1] % 4 == 0:
        cases["float32 view"] = raw.view(np.float32)
    want = {k: _outcome(original[1], v, T[name]) for k, v in cases.items()}
    assert want["uint16 view"][0] == "raised"
    qg.accelerate_gguf_py()
    for k, v in cases.items():
        assert _outcome(gguf.dequantize, v, T[name]) == want[k], k


def test_quantize_routes_ndarray_subclasses(tmp_path, rng, original, monkeypatch):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    path = tmp_path / "x.f32"
    x.tofile(path)
    mm = np.memmap(path, np.float32, "r", shape=x.shape)
    want = original[0](x, T.Q8_0)
    calls = []
    real = qg._quantize
    monkeypatch.setattr(qg, "_quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    qg.accelerate_gguf_py()
    got = gguf.quantize(mm, T.Q8_0)
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, want)
    assert calls == [1]


def test_concurrent_accelerate_and_restore_leave_gguf_py_consistent(original):
    """Four threads calling accelerate_gguf_py at once must store gguf-py's own functions as the
    originals (a race stored another thread's wrapper, so restore left gguf-py patched)."""
    import sys
    import threading

    q, dq = original
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible: the race shows up
    try:
        _accelerate_restore_rounds(q, dq, threading)
    finally:
        sys.setswitchinterval(interval)


def _accelerate_restore_rounds(q, dq, threading):
    for _ in range(200):
        start = threading.Barrier(4)

        def go():
            start.wait()
            qg.accelerate_gguf_py()

        threads = [threading.Thread(target=go) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert gguf.quants.dequantize.__wrapped__ is dq and gguf.quants.quantize.__wrapped__ is q
        qg.restore_gguf_py()
        assert (gguf.quants.quantize, gguf.quants.dequantize, gguf.quantize, gguf.dequantize) == (
            q, dq, q, dq)
