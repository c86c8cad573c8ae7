"""Conformance over the format registry: every bound format is tested the moment it is bound.

Each test is parametrised over ``numba_qk._registry.BINDINGS`` (or its weight / quantizable
subsets), so a new format runs the oracle, products == dot, error, carrier and capability checks
without a test edit; ``numba_qk.testing.reference.ORACLES`` must name an oracle for every bound
format (a test fails otherwise).  Format-specific quirks stay in the per-format test files.
"""

import numpy as np
import pytest

import numba_qk as qk
from numba_qk import _registry
from numba_qk._registry import BINDINGS, QUANTIZABLE, WEIGHTS, Binding, check_bindings
from numba_qk.testing import reference as oracles

from numba_qk.testing.asserts import assert_same_f32, assert_same_records
from records import random_iq_grid
from subsets import FAMILY_FEW, default_few

ALL = [b.format for b in BINDINGS]
IQ_GRID = (qk.quant.iq2_xxs, qk.quant.iq2_xs, qk.quant.iq3_xxs, qk.quant.iq1_s, qk.quant.iq3_s, qk.quant.iq2_s, qk.quant.iq1_m)
ids = [f.name for f in ALL]


def span(fmt):
    """Activation records per weight record (Q1_0 x Q8_0: 4, NVFP4 and Q2_0: 2, else 1)."""
    return fmt.block_size // qk.activation_format(fmt).block_size


# The slow oracles (written from the specs, no kernel code), one entry point per format.
# quantize_oracle is None for Q4_K and Q2_K..Q6_K: those are checked against ggml's own bytes
# (tests/golden, test_q4_k_encode.py, test_kquants.py).
dot_oracle, dequantize_oracle, quantize_oracle = oracles.dot, oracles.dequantize, oracles.quantize


def test_registry_is_whole_and_ordered():
    assert [b.format for b in BINDINGS] == [qk.quant.q8_k, qk.quant.q4_k, qk.quant.q4_0,
                                             qk.quant.q4_1, qk.quant.q5_0, qk.quant.q5_1,
                                             qk.quant.q8_0, qk.quant.q8_1, qk.quant.q2_k,
                                             qk.quant.q3_k, qk.quant.q5_k, qk.quant.q6_k,
                                             qk.quant.mxfp4, qk.quant.nvfp4, qk.quant.iq4_nl,
                                             qk.quant.iq4_xs, qk.quant.tq1_0, qk.quant.tq2_0,
                                             *IQ_GRID, qk.quant.q1_0, qk.quant.q2_0]
    assert set(ALL) == set(qk.quant)
    assert WEIGHTS == (qk.quant.q4_k, qk.quant.q4_0, qk.quant.q4_1, qk.quant.q5_0,
                       qk.quant.q5_1, qk.quant.q8_0, qk.quant.q2_k, qk.quant.q3_k,
                       qk.quant.q5_k, qk.quant.q6_k, qk.quant.mxfp4, qk.quant.nvfp4,
                       qk.quant.iq4_nl, qk.quant.iq4_xs, qk.quant.tq1_0, qk.quant.tq2_0,
                       *IQ_GRID, qk.quant.q1_0, qk.quant.q2_0)
    # every format is quantizable (IQ2_XXS, IQ2_XS and IQ1_S with an importance matrix only:
    # _registry.REQUIRES_IMATRIX)
    assert QUANTIZABLE == tuple(ALL)
    assert _registry.REQUIRES_IMATRIX == (qk.quant.iq2_xxs, qk.quant.iq2_xs, qk.quant.iq1_s)
    from numba_qk import gguf

    assert gguf.ACCELERATED == WEIGHTS


@pytest.mark.parametrize("fmt", ALL, ids=ids)
def test_every_bound_format_has_an_oracle(fmt):
    assert set(oracles.ORACLES) == {f.name for f in ALL}
    assert (oracles.oracle(fmt).dot is not None) == (fmt in WEIGHTS)
    rec = bytes(fmt.block_bytes)
    assert len(dequantize_oracle(fmt, rec)) == fmt.block_size
    if fmt in WEIGHTS:
        act = qk.activation_format(fmt)
        z = np.zeros((1, fmt.block_bytes), np.uint8)
        assert_same_f32(dot_oracle(fmt, z, np.zeros((span(fmt), act.block_bytes), np.uint8)), 0.0)


# one format per kernel family by default (each family's own tests compare dequantize with ggml
# on any bytes); every format under -m slow (CI time, decision 043)
@pytest.mark.parametrize("fmt", default_few(
    ALL, {f.name for f in ALL} & (FAMILY_FEW | {"Q8_K", "Q8_0", "Q8_1"}),
    name=lambda f: f.name))
def test_dequantize_and_decode_on_any_bytes_match_the_oracle(fmt, rng):
    raw = rng.integers(0, 256, (24, fmt.block_bytes), dtype=np.uint8)
    raw[0] = 0
    raw[1] = 0xFF
    got = qk.dequantize(raw, fmt)
    assert got.shape == (24, fmt.block_size) and got.dtype == np.float32
    for b in range(raw.shape[0]):
        assert_same_f32(got[b], np.array(dequantize_oracle(fmt, raw[b].tobytes()), np.float32),
                        f"{fmt.name} record {b}")
    fields = qk.decode(raw, fmt)
    for name, value in fields._asdict().items():
        if value is not None:
            assert value.shape[0] == 24, name
    assert qk.find_invalid_records(raw, fmt).dtype == np.int64


# the grid encoders compile for tens of seconds each (cold): IQ2_XXS and IQ2_S by default, the
# others under -m slow (tests/iq/test_iq2_encode.py covers them against ggml)
# each encoder compiles its own search: by default one weight format of each kernel family and
# the activation formats (each family's suite checks its encoders' bytes against ggml or its
# golden files), every format under -m slow
@pytest.mark.parametrize("fmt", default_few(
    QUANTIZABLE, {f.name for f in QUANTIZABLE} & (FAMILY_FEW | {"Q8_K", "Q8_0", "Q8_1"}),
    name=lambda f: f.name))
def test_quantize_matches_the_oracle_and_rejects_non_finite(fmt, rng):
    n = fmt.block_size
    # the grid encoders' domain ends where ggml's search aborts, about 1e10 and more (their
    # own tests cover that domain): scales up to 1e8 for them
    top = 8 if _registry.BY_FORMAT[fmt].domain_reason is _registry.grid_reason else 30
    # formats ggml quantizes only with an importance matrix get a uniform one
    kw = {"imatrix": np.ones(n, np.float32)} if fmt in _registry.REQUIRES_IMATRIX else {}
    x = (rng.standard_normal((6, n)) * 10.0 ** rng.uniform(-30, top, (6, 1))).astype(np.float32)
    x[1] = 0.0
    x[2, ::3] = -0.0
    got = qk.quantize(x, format=fmt, **kw)
    assert got.shape == (6, fmt.block_bytes) and got.dtype == np.uint8
    for b in range(6):
        want = quantize_oracle(fmt, x[b])
        if want is not None:
            assert_same_records(got[b:b + 1], np.frombuffer(want, np.uint8)[None], fmt.name)
    assert qk.find_invalid_records(got, fmt).size == 0
    bad = x.copy()
    bad[4, n - 1] = np.nan
    out = np.full((6, fmt.block_bytes), 7, np.uint8)
    with pytest.raises(qk.QuantizationDomainError,
                       match=rf"^block 4: values\[4, {n - 1}\] is nan; quantize needs finite"):
        qk.quantize(bad, format=fmt, out=out, **kw)
    assert (out == 7).all()
    with pytest.raises(ValueError, match=rf"values: expected shape \[G, {n}\]"):
        qk.quantize(np.zeros((2, n + 1), np.float32), format=fmt, **kw)


def _pair(rng, fmt, shape_w, shape_x):
    act = qk.activation_format(fmt)
    if fmt in QUANTIZABLE and fmt not in _registry.REQUIRES_IMATRIX:
        w = qk.quantize(rng.standard_normal((int(np.prod(shape_w)), fmt.block_size))
                        .astype(np.float32), format=fmt).reshape(*shape_w, -1)
    else:   # no encoder: random records with finite scales
        w = random_iq_grid(rng, fmt, int(np.prod(shape_w))).reshape(*shape_w, -1)
    shape_x = (*shape_x[:-1], shape_x[-1] * span(fmt))
    x = qk.quantize(rng.standard_normal((int(np.prod(shape_x)), act.block_size))
                    .astype(np.float32), format=act).reshape(*shape_x, -1)
    return act, w, x


# one format of each kernel family by default (each family's suite checks its formats' dots against
# the oracle or ggml), every format under -m slow
@pytest.mark.parametrize("fmt", default_few(WEIGHTS, FAMILY_FEW, name=lambda f: f.name))
def test_dot_matches_the_oracle(fmt, rng):
    act = qk.activation_format(fmt)
    for g in (1, 3):
        w = rng.integers(0, 256, (g, fmt.block_bytes), dtype=np.uint8)
        x = rng.integers(0, 256, (g * span(fmt), act.block_bytes), dtype=np.uint8)
        assert_same_f32(qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=act),
                        dot_oracle(fmt, w, x), f"{fmt.name} G={g}")


def _dots(rng, fmt):
    rows, g, batch = 17, 2, 9  # 8-row / 8-activation tiles and remainders
    act, w, xq = _pair(rng, fmt, (rows, g), (batch, g))
    want = np.array([[qk.quantized_dot(w[r], xq[a], lhs_format=fmt, rhs_format=act)
                      for r in range(rows)] for a in range(batch)], np.float32)
    return act, w, xq, want


# gemv compiles each format's 8-row tile loop: one format of each kernel family by default (the
# family suites run their own gemv tests), every format under -m slow
@pytest.mark.parametrize("fmt", default_few(WEIGHTS, FAMILY_FEW, name=lambda f: f.name))
def test_gemv_equals_dot(fmt, rng):
    act, w, xq, want = _dots(rng, fmt)
    assert_same_f32(qk.gemv(w, xq[3], lhs_format=fmt, rhs_format=act), want[3])


# gemm compiles each format's 8-activation tile loop (~2 s of CPU a format, cold): one format of
# each kernel family by default, every format under -m slow
@pytest.mark.parametrize("fmt", default_few(WEIGHTS, FAMILY_FEW, name=lambda f: f.name))
def test_gemm_equals_dot(fmt, rng):
    act, w, xq, want = _dots(rng, fmt)
    assert_same_f32(qk.gemm(w, xq, lhs_format=fmt, rhs_format=act), want)


# threads=2 compiles a threaded runner per kernel and matmul its activation path (~5 s of CPU a
# format, cold).  The row split is the same for every format (each row one serial call): by
# default Q4_K (Q8_K activations), Q4_0 (Q8_0), the grid IQ3_S and the FP4 records' MXFP4; every
# format under -m slow
@pytest.mark.parametrize("fmt", default_few(WEIGHTS, {"Q4_K", "Q4_0", "MXFP4", "IQ3_S"},
                                            name=lambda f: f.name))
def test_threads_and_matmul_equal_dot(fmt, rng):
    act, w, xq, want = _dots(rng, fmt)
    assert_same_f32(qk.gemv(w, xq[3], lhs_format=fmt, rhs_format=act, threads=2), want[3])
    assert_same_f32(qk.gemm(w, xq, lhs_format=fmt, rhs_format=act, threads=2), want)
    xf = rng.standard_normal((xq.shape[0], w.shape[1] * fmt.block_size)).astype(np.float32)
    xfq = qk.quantize(xf.reshape(-1, act.block_size), format=act).reshape(
        xq.shape[0], w.shape[1] * span(fmt), -1)
    assert_same_f32(qk.matmul(w, xf, lhs_format=fmt, threads=2),
                    qk.gemm(w, xfq, lhs_format=fmt, rhs_format=act))


@pytest.mark.parametrize("fmt", ALL, ids=ids)
def test_unbound_combinations_are_explicit_errors(fmt):
    """Every combination the registry does not bind raises a TypeError naming the slot."""
    z = np.zeros((1, fmt.block_bytes), np.uint8)
    if fmt not in WEIGHTS:
        with pytest.raises(TypeError, match=r"lhs_format: quantized_dot expects"):
            qk.quantized_dot(z, z, lhs_format=fmt, rhs_format=fmt)
        with pytest.raises(TypeError, match=r"lhs_format: gemv expects"):
            qk.gemv(z[None], z, lhs_format=fmt, rhs_format=fmt)
        with pytest.raises(TypeError, match=r"lhs_format: gemm expects"):
            qk.gemm(z[None], z[None], lhs_format=fmt, rhs_format=fmt)
        with pytest.raises(TypeError, match=r"lhs_format: matmul expects"):
            qk.matmul(z[None], np.zeros(fmt.block_size, np.float32), lhs_format=fmt)
        return
    act = qk.activation_format(fmt)
    for other in ALL:
        if other is not act:
            with pytest.raises(TypeError, match=rf"rhs_format: quantized_dot expects "
                                                rf"{act!r} \({act.name}\) to pair with {fmt.name}"):
                qk.quantized_dot(z, np.zeros((1, other.block_bytes), np.uint8),
                                 lhs_format=fmt, rhs_format=other)


# One weight format per kernel family by default (each carrier compiles its own
# specialisations of every kernel it reaches); the others under -m slow.  The K-quants'
# own carrier test (tests/kquants/test_kquants.py) covers Q2_K..Q6_K in every default run;
# IQ4_NL runs the legacy kernels Q4_0 carries here (its lookup is checked on any bytes by
# tests/conformance/test_fast_paths.py).
CARRIER_DEFAULT = {"Q4_K", "Q4_0", "TQ2_0"}


@pytest.mark.parametrize("fmt", [f if f.name in CARRIER_DEFAULT else pytest.param(
    f, marks=pytest.mark.slow) for f in WEIGHTS], ids=[f.name for f in WEIGHTS])
def test_carriers(fmt, rng):
    """Read-only, unaligned, strided and memoryview records give the same bits."""
    act, w, x = _pair(rng, fmt, (5,), (5,))
    want = qk.quantized_dot(w, x, lhs_format=fmt, rhs_format=act)
    want_deq = qk.dequantize(w, fmt)
    ro = w.copy()
    ro.flags.writeable = False
    buf = bytearray(w.nbytes + 1)
    buf[1:] = w.tobytes()
    unaligned = np.frombuffer(memoryview(buf)[1:], np.uint8).reshape(w.shape)
    wide = np.zeros((5, 2 * fmt.block_bytes), np.uint8)
    wide[:, ::2] = w
    for carrier in (ro, unaligned, wide[:, ::2], memoryview(w)):
        assert_same_f32(qk.quantized_dot(carrier, x, lhs_format=fmt, rhs_format=act), want)
        assert_same_f32(qk.dequantize(carrier, fmt), want_deq)


def test_every_kernel_module_declares_whole_traits():
    """Each kernel module ends with one ``TRAITS = ...`` (every slot spelled out: the
    constructor has no defaults); the registry's table is made of them alone, and each oracle
    slot names the numba_qk.testing.reference module the oracle lives in."""
    import ast
    import importlib
    import inspect

    from numba_qk.kernels.traits import SLOTS, Traits

    assert [t.format for t in _registry.TRAITS] == ALL
    sig = inspect.signature(Traits)
    assert tuple(sig.parameters) == SLOTS
    assert all(p.default is p.empty and p.kind is p.KEYWORD_ONLY for p in sig.parameters.values())
    for mod in _registry.KERNEL_MODULES:
        tree = ast.parse(inspect.getsource(mod))
        assigned = [n for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "TRAITS" for t in n.targets)]
        assert len(assigned) == 1 and tree.body[-1] is assigned[0], mod.__name__
    for t in _registry.TRAITS:
        o = oracles.oracle(t.format)
        assert getattr(o.dequantize, "func", o.dequantize).__module__ == t.oracle, t.format.name
        importlib.import_module(t.oracle)
        b = _registry.binding(t.format)
        assert (b.dequantize, b.quantize, b.dot, b.gemv, b.gemm, b.find_invalid, b.quantizer) == \
            (t.dequantize, t.quantize, t.dot, t.gemv, t.gemm, t.find_invalid, t.quantizer)
        assert type(b.decode(np.zeros((0, t.format.block_bytes), np.uint8))).__name__ == \
            t.decoded.type_name
    q4k = _registry.TRAITS[1]
    slots = {s: getattr(q4k, s) for s in SLOTS}
    with pytest.raises(AssertionError, match="Q4_K: domain None does not go with its quantizer"):
        _registry.check_traits([Traits(**{**slots, "domain": None})])
    with pytest.raises(AssertionError, match="Q4_K: oracle must name a numba_qk.testing"):
        _registry.check_traits([Traits(**{**slots, "oracle": "numba_qk.ops"})])
    with pytest.raises(AssertionError, match="Q4_K.sc is neither filled by decode nor f16"):
        _registry.check_traits([Traits(**{**slots, "decoded": q4k.decoded._replace(
            filled=(("q", "u1"),))})])
    with pytest.raises(TypeError):
        Traits(**{k: v for k, v in slots.items() if k != "oracle"})


def test_half_bound_formats_fail_the_import_check():
    b = _registry.binding
    q8k, q4k = b(qk.quant.q8_k), b(qk.quant.q4_k)
    check_bindings(BINDINGS, tuple(qk.quant))  # the real table is whole
    with pytest.raises(AssertionError, match="Q4_0 is declared but has no kernels bound"):
        check_bindings([x for x in BINDINGS if x.format is not qk.quant.q4_0], tuple(qk.quant))
    with pytest.raises(AssertionError, match="Q4_K is bound twice"):
        check_bindings(BINDINGS + (q4k,), tuple(qk.quant))
    half = Binding(qk.quant.q4_k, dequantize=q4k.dequantize, decode=q4k.decode, dot=q4k.dot)
    with pytest.raises(AssertionError, match="Q4_K is half-bound: dot, gemv and gemm go together"):
        check_bindings([half], (qk.quant.q4_k,))
    no_dot = Binding(qk.quant.q4_k, dequantize=q4k.dequantize, decode=q4k.decode)
    with pytest.raises(AssertionError, match="Q4_K is half-bound: a declared activation pairing"):
        check_bindings([no_dot], (qk.quant.q4_k,))
    no_reason = Binding(qk.quant.q8_k, dequantize=q8k.dequantize, decode=q8k.decode,
                        quantize=q8k.quantize)
    with pytest.raises(AssertionError, match="Q8_K is half-bound: quantize and domain_reason"):
        check_bindings([no_reason], (qk.quant.q8_k,))
    no_act_quantizer = Binding(qk.quant.q8_k, dequantize=q8k.dequantize, decode=q8k.decode)
    with pytest.raises(AssertionError, match="activation Q8_K has no quantizer"):
        check_bindings([q4k, no_act_quantizer], (qk.quant.q4_k, qk.quant.q8_k))
    with pytest.raises(AssertionError, match="F32 is bound but not a declared format"):
        check_bindings([Binding(qk.f32, dequantize=q8k.dequantize, decode=q8k.decode)],
                       tuple(qk.quant))


def test_capabilities():
    caps = qk.capabilities()
    assert list(caps) == list(qk.quant)
    for fmt, c in caps.items():
        assert c == qk.capabilities(fmt) and c.format is fmt
        assert c.dequantize and c.decode and c.quantize == (fmt in QUANTIZABLE)
        assert (c.dot_partner is not None) == (fmt in WEIGHTS) == c.gemv == c.gemm == c.matmul
    q4k = qk.capabilities(qk.quant.q4_k)
    assert q4k.dot_partner is qk.quant.q8_k and q4k.quantizer == "ggml quantize_row_q4_K_ref"
    assert qk.capabilities(qk.quant.q8_k).activation_of == (
        qk.quant.q4_k, qk.quant.q2_k, qk.quant.q3_k, qk.quant.q5_k, qk.quant.q6_k,
        qk.quant.iq4_xs, qk.quant.tq1_0, qk.quant.tq2_0, *IQ_GRID)
    assert qk.capabilities(qk.quant.q6_k).quantizer == "ggml quantize_row_q6_K_ref"
    assert qk.capabilities(qk.quant.q8_1).activation_of == (qk.quant.q4_1, qk.quant.q5_1)
    for scalar in (qk.f32, qk.f16, qk.bf16, qk.i8, qk.i32):
        c = qk.capabilities(scalar)
        assert not (c.quantize or c.dequantize or c.decode) and c.dot_partner is None
        # f16 / bf16 weight matrices: gemv / gemm / matmul (docs/halfmat.md), nothing else
        weight = scalar is qk.f16 or scalar is qk.bf16
        assert (c.gemv, c.gemm, c.matmul) == (weight,) * 3 and c.activation_of == ()
    with pytest.raises(TypeError, match="format: capabilities expects a numba_qk Format or "
                                        "ScalarType, got the string 'q4_k'"):
        qk.capabilities("q4_k")


def test_capabilities_of_the_block_scaled_formats():
    """numba_qk.mx's formats answer too (astype encodes and decodes them; the registry's
    operations take record formats only), and ``scaled=True`` appends them to the listing."""
    from numba_qk._registry import ScaledCapabilities

    for f in qk.mx.FORMATS:
        c = qk.capabilities(f)
        assert isinstance(c, ScaledCapabilities) and c.format is f
        assert c[1:10] == qk.capabilities(qk.f32)[1:]   # no registry operation, as for scalars
        assert c._fields[:10] == qk.Capabilities._fields
        assert c.astype_encode and c.astype_decode
        assert (c.block_size, c.element, c.scale, c.bits_per_element) == (
            f.block_size, f.element, f.scale, f.bits_per_element)
        assert c.tensor_scale is (qk.f32 if f.has_tensor_scale else None)
    assert qk.capabilities(qk.mx.nvfp4)[-5:] == (16, qk.e2m1, qk.e4m3, qk.f32, 4.5)
    assert qk.capabilities(qk.mx.mxint8)[-5:] == (32, qk.i8, qk.e8m0, None, 8.25)
    every = qk.capabilities(scaled=True)
    assert list(every) == [*qk.quant, *qk.mx.FORMATS]
    assert list(every.items())[:len(list(qk.quant))] == list(qk.capabilities().items())
    assert all(every[f] == qk.capabilities(f) for f in qk.mx.FORMATS)
    with pytest.raises(TypeError, match="scaled=True lists every format; it takes no format"):
        qk.capabilities(qk.mx.mxfp4, scaled=True)


def test_readme_capability_table_is_generated_from_the_registry():
    """README's table is ``python tools/capabilities_table.py`` output; regenerate on change."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert _registry.markdown_table() in readme, \
        "README capability table is stale: run python tools/capabilities_table.py --write"
    assert _registry.markdown_scaled_table() in readme, \
        "README block-scaled table is stale: run python tools/capabilities_table.py --write"


def test_declarations_need_no_numba():
    """numba_qk.formats (schemas) imports without numba: declarations apart from kernels."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(qk.__file__).resolve().parent.parent
    code = ("import sys, types; pkg = types.ModuleType('numba_qk'); "  # skip numba_qk/__init__
            "pkg.__path__ = [sys.argv[1] + '/numba_qk']; sys.modules['numba_qk'] = pkg; "
            "import numba_qk.formats as m; "
            "assert 'numba' not in sys.modules, 'numba imported'; print(len(list(m.quant)))")
    r = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(ALL)


def _format_refs(tree):
    """(line, kind) of every ``quant.<format>`` attribute, and every ``is`` test against one."""
    import ast
    import re

    def is_format(node):
        return (isinstance(node, ast.Attribute) and re.fullmatch(r"q\d_[k01]", node.attr)
                and (getattr(node.value, "id", None) == "quant"
                     or getattr(node.value, "attr", None) == "quant"))

    refs = []
    for node in ast.walk(tree):
        if is_format(node):
            refs.append((node.lineno, "reference"))
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot))
                                                 for op in node.ops):
            if any(is_format(c) for c in [node.left, *node.comparators]):
                refs.append((node.lineno, "is-test"))
    return refs


def test_no_format_ladders_outside_the_registry():
    """ops, the thread policy and validation name no individual format, gguf and the CLI
    never branch on one (their demo data may use Q4_K/Q8_0): they ask the registry."""
    import ast
    from pathlib import Path

    pkg = Path(qk.__file__).resolve().parent
    for name in ("ops.py", "_threads.py", "_validate.py"):
        assert _format_refs(ast.parse((pkg / name).read_text())) == [], name
    for name in ("gguf.py", "__main__.py"):
        refs = _format_refs(ast.parse((pkg / name).read_text()))
        assert [r for r in refs if r[1] == "is-test"] == [], name
    assert "ACCELERATED = _registry.WEIGHTS" in (pkg / "gguf.py").read_text()
    # the check itself can fail
    assert sorted(_format_refs(ast.parse("if f is quant.q4_0: pass"))) == [(1, "is-test"), (1, "reference")]


def test_inspect_prints_capabilities(tmp_path, capsys):
    pytest.importorskip("gguf")
    from numba_qk import __main__ as cli
    from numba_qk.gguf import write_demo_model

    path = write_demo_model(tmp_path / "demo.gguf", dim=256)
    assert cli.cmd_inspect(str(path)) == 0
    out = capsys.readouterr().out
    assert "formats (numba_qk.capabilities):" in out
    assert "  Q4_K: quantize, dequantize, decode, dot with Q8_K, gemv/gemm/matmul" in out
    assert ("  IQ2_XXS: quantize (with imatrix), dequantize, decode, dot with Q8_K, "
            "gemv/gemm/matmul") in out
    assert "  F32: no kernels (stored values only)" in out
    assert "  F16: gemv/gemm/matmul as weights" in out and "  BF16: gemv/gemm/matmul as weights" in out
    assert cli._quantizable_weights() == ["q4_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k",
                                          "q3_k", "q5_k", "q6_k", "mxfp4", "nvfp4", "iq4_nl",
                                          "iq4_xs", "tq1_0", "tq2_0", "iq3_xxs", "iq3_s",
                                          "iq2_s", "iq1_m", "q1_0", "q2_0"]
