"""The closed typed schemas: layout, metadata questions, closedness."""

import copy
import pickle

import pytest

import numba_qk as qk
from numba_qk.formats import Field, Format, ScalarType

Q4, Q8 = qk.quant.q4_k, qk.quant.q8_k


def test_layout_matches_spec():
    assert (Q4.name, Q4.block_size, Q4.block_bytes) == ("Q4_K", 256, 144)
    assert (Q8.name, Q8.block_size, Q8.block_bytes) == ("Q8_K", 256, 292)
    spans = {f.name: (f.span, f.element, f.count, f.bits, f.signed) for f in Q4.fields}
    assert spans == {
        "d": ((0, 2), "f16", 1, 16, True), "dmin": ((2, 4), "f16", 1, 16, True),
        "sc": ((4, 16), "u6", 8, 6, False), "m": ((4, 16), "u6", 8, 6, False),
        "q": ((16, 144), "u4", 256, 4, False)}
    spans = {f.name: (f.span, f.element, f.count, f.bits, f.signed) for f in Q8.fields}
    assert spans == {
        "ds": ((0, 4), "f32", 1, 32, True), "q": ((4, 260), "i8", 256, 8, True),
        "bsum": ((260, 292), "i16", 16, 16, True)}
    assert [f.name for f in Q4.fields] == ["d", "dmin", "sc", "m", "q"]
    assert Q4.field("sc").nbytes == 12
    with pytest.raises(KeyError, match="no field 'x'"):
        Q4.field("x")


def test_metadata_questions():
    assert Q4.bits_per_element == 4.5 and Q8.bits_per_element == 9.125
    assert Q4.elements_per_record == 256 and Q4.record_bytes == 144
    for fmt in (Q4, Q8):
        assert fmt.is_quantized and not fmt.is_float
        assert fmt.storage_bytes(0) == 0
        assert fmt.storage_bytes(256) == fmt.block_bytes
        assert fmt.storage_bytes(4096 * 256) == 4096 * fmt.block_bytes
        assert fmt.storage_bytes(255) is None and fmt.storage_bytes(257) is None
    f32 = qk.f32
    assert (f32.name, f32.block_size, f32.block_bytes) == ("F32", 1, 4)
    assert f32.is_float and not f32.is_quantized
    assert f32.storage_bytes(3) == 12 and f32.storage_bytes(0) == 0
    assert f32.numpy_dtype.str == "<f4"


@pytest.mark.parametrize("fmt", [qk.quant.q4_k, qk.quant.q8_k, qk.f32])
def test_storage_bytes_rejects_bad_counts(fmt):
    with pytest.raises(ValueError, match=">= 0"):
        fmt.storage_bytes(-256)
    for bad in (2.0, "256", None, True):
        with pytest.raises(TypeError, match="integer element count"):
            fmt.storage_bytes(bad)


def test_closed_and_frozen():
    with pytest.raises(TypeError, match="closed"):
        type("Mine", (Format,), {})
    with pytest.raises(TypeError, match="closed"):
        type("Mine", (ScalarType,), {})
    with pytest.raises(TypeError, match="closed"):
        type("Mine", (Field,), {})
    with pytest.raises(TypeError, match="created by numba_qk only"):
        Format(None, "X", "x", 256, 144, [], "", 99)
    with pytest.raises(TypeError):
        ScalarType(None, "X", "x", 4, "<f4", True, 99)
    with pytest.raises(AttributeError, match="immutable"):
        Q4.block_bytes = 145
    with pytest.raises(AttributeError, match="immutable"):
        Q4.fields[0].start = 1
    with pytest.raises(AttributeError):
        qk.quant.q5_k = Q4
    with pytest.raises(AttributeError):
        del qk.f32.name


def test_singletons_survive_copy_and_pickle():
    for fmt in (Q4, Q8, qk.f32, qk.quant.q2_k, qk.quant.q3_k, qk.quant.q5_k, qk.quant.q6_k):
        assert pickle.loads(pickle.dumps(fmt)) is fmt
        assert copy.copy(fmt) is fmt and copy.deepcopy(fmt) is fmt


def test_namespace():
    assert list(qk.quant)[:2] == [Q4, Q8] and len(list(qk.quant)) == 27
    assert [f.name for f in qk.quant][-13:] == ["MXFP4", "NVFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS",
                                                "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ3_S", "IQ2_S",
                                                "IQ1_M", "Q1_0", "Q2_0"]
    assert [f.name for f in qk.quant][2:6] == ["Q2_K", "Q3_K", "Q5_K", "Q6_K"]
    assert Q4 in qk.quant and qk.f32 not in qk.quant and "q4_k" not in qk.quant
    assert repr(Q4) == "numba_qk.quant.q4_k" and str(Q8) == "Q8_K"


def test_tiling_check_catches_bad_layouts():
    from numba_qk import formats as F

    with pytest.raises(AssertionError, match="not covered"):
        Format(F.TOKEN, "Bad", "bad", 32, 6,
               [F.F("a", 0, 2, "f16", 1, 16, True), F.F("b", 3, 6, "u8", 3, 8, False)], "", 99)
    with pytest.raises(AssertionError, match="holds 40 bits"):
        Format(F.TOKEN, "Bad", "bad", 32, 6,
               [F.F("a", 0, 2, "f16", 1, 16, True), F.F("b", 2, 6, "u8", 5, 8, False)], "", 99)
    with pytest.raises(AssertionError, match="fields end at byte 5"):
        Format(F.TOKEN, "Bad", "bad", 32, 6,
               [F.F("a", 0, 2, "f16", 1, 16, True), F.F("b", 2, 5, "u8", 3, 8, False)], "", 99)


LEGACY = {  # ggml's block structs: name, bytes, fields (name, span)
    "q4_0": ("Q4_0", 18, [("d", (0, 2)), ("qs", (2, 18))]),
    "q4_1": ("Q4_1", 20, [("d", (0, 2)), ("m", (2, 4)), ("qs", (4, 20))]),
    "q5_0": ("Q5_0", 22, [("d", (0, 2)), ("qh", (2, 6)), ("qs", (6, 22))]),
    "q5_1": ("Q5_1", 24, [("d", (0, 2)), ("m", (2, 4)), ("qh", (4, 8)), ("qs", (8, 24))]),
    "q8_0": ("Q8_0", 34, [("d", (0, 2)), ("qs", (2, 34))]),
    "q8_1": ("Q8_1", 36, [("d", (0, 2)), ("s", (2, 4)), ("qs", (4, 36))]),
}


@pytest.mark.parametrize("attr", sorted(LEGACY))
def test_legacy_block_formats(attr):
    name, nbytes, fields = LEGACY[attr]
    fmt = getattr(qk.quant, attr)
    assert (fmt.name, fmt.block_size, fmt.block_bytes) == (name, 32, nbytes)
    assert [(f.name, f.span) for f in fmt.fields] == fields
    assert fmt.is_quantized and not fmt.is_float
    assert fmt.storage_bytes(0) == 0 and fmt.storage_bytes(64) == 2 * nbytes
    assert fmt.storage_bytes(31) is None and fmt.storage_bytes(33) is None
    assert fmt.bits_per_element == nbytes * 8 / 32


def test_scalar_types_answer_spec_001():
    table = {qk.f32: ("F32", 4, True, 0), qk.f16: ("F16", 2, True, 1),
             qk.bf16: ("BF16", 2, True, 30), qk.i8: ("I8", 1, False, 24),
             qk.i32: ("I32", 4, False, 26)}
    for t, (name, nbytes, is_float, ggml_id) in table.items():
        assert (t.name, t.block_size, t.block_bytes, t.is_float, t.ggml_type) == \
            (name, 1, nbytes, is_float, ggml_id)
        assert not t.is_quantized
        assert t.storage_bytes(7) == 7 * nbytes and t.storage_bytes(0) == 0
    assert qk.bf16.numpy_dtype is None and qk.i32.numpy_dtype.str == "<i4"


def test_ggml_type_ids_round_trip():
    ids = {0: qk.f32, 1: qk.f16, 2: qk.quant.q4_0, 3: qk.quant.q4_1, 6: qk.quant.q5_0,
           7: qk.quant.q5_1, 8: qk.quant.q8_0, 9: qk.quant.q8_1, 12: Q4, 15: Q8, 24: qk.i8,
           26: qk.i32, 30: qk.bf16, 16: qk.quant.iq2_xxs, 29: qk.quant.iq1_m,
           41: qk.quant.q1_0, 42: qk.quant.q2_0}
    for tid, fmt in ids.items():
        assert qk.from_ggml_type(tid) is fmt and fmt.ggml_type == tid
    with pytest.raises(KeyError, match="GGML type id 28 is not modelled"):
        qk.from_ggml_type(28)  # F64 (unmodelled)
    with pytest.raises(TypeError):
        qk.from_ggml_type("Q4_0")


def test_one_ggml_type_table():
    """Every declared format and scalar type carries ggml's id and block size from the one
    table (numba_qk.formats.ggml_types), which presets, gguf and the ggml bridge read too; it
    agrees with gguf-py's enum where both name a type."""
    from numba_qk import gguf, presets
    from numba_qk import formats as F
    from numba_qk.formats.ggml_types import BLOCK_SIZE, GGML_TYPE_NAMES, GGML_TYPES, GGMLType
    from numba_qk.testing import ggml as bridge

    for t in (*qk.quant, qk.f32, qk.f16, qk.bf16, qk.i8, qk.i32):
        assert GGML_TYPES[t.name] == t.ggml_type and getattr(GGMLType, t.name) == t.ggml_type
        assert BLOCK_SIZE[t.ggml_type] == (t.block_size if t.is_quantized else 1), t.name
    assert presets.GGML_TYPES is GGML_TYPES and presets.GGML_TYPE_NAMES is GGML_TYPE_NAMES
    assert presets.BLOCK_SIZE is BLOCK_SIZE and gguf.GGML_TYPE_NAMES is GGML_TYPE_NAMES
    assert (bridge.GGML_TYPE_F32, bridge.GGML_TYPE_Q4_K, bridge.GGML_TYPE_Q8_K) == (0, 12, 15)
    assert bridge.EXTRA_BUFT_TYPES == {"CPU_REPACK": {2, 12, 20}, "AMX": {2, 3, 8, 12, 13, 14, 23}}
    assert all(type(v) is int for v in GGML_TYPES.values()) and list(GGML_TYPES.values()) == \
        sorted(GGML_TYPES.values())
    assert {GGML_TYPE_NAMES[v]: v for v in GGML_TYPE_NAMES.keys()} == GGML_TYPES
    with pytest.raises(AssertionError, match="ggml_type 99 is not ggml's id 2"):
        Format(F.TOKEN, "Q4_0", "bad", 32, 18, qk.quant.q4_0.fields, "", 99)
    with pytest.raises(AssertionError, match="block size 64 is not ggml's 32"):
        Format(F.TOKEN, "Q4_0", "bad", 64, 18, qk.quant.q4_0.fields, "", 2)
    gq = pytest.importorskip("gguf")
    for t in gq.GGMLQuantizationType:
        if t.name in GGML_TYPES:
            assert GGML_TYPES[t.name] == int(t), t.name


def test_activation_pairing():
    pairs = {Q4: Q8, qk.quant.q4_0: qk.quant.q8_0, qk.quant.q5_0: qk.quant.q8_0,
             qk.quant.q8_0: qk.quant.q8_0, qk.quant.q4_1: qk.quant.q8_1,
             qk.quant.q5_1: qk.quant.q8_1}
    for w, x in pairs.items():
        assert qk.activation_format(w) is x
    for bad in (Q8, qk.quant.q8_1, qk.f32, "q4_0"):
        with pytest.raises(TypeError, match="has no quantized dot"):
            qk.activation_format(bad)
