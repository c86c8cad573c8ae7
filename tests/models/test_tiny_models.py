"""numba_qk.models on tiny llama-, gemma3-, qwen2- and qwen3-shaped models written here: logits
against an independent float64 numpy forward pass, KV-cache decoding against the batched pass,
and logits against golden ones computed once by llama.cpp from the same bytes
(tools/gen_models_golden.py)."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from numba_qk import _threads, models  # noqa: E402
from numba_qk.kernels import _pool  # noqa: E402
from numba_qk.testing.asserts import assert_same_f32  # noqa: E402

from tiny_models import PROMPT, SHAPES, reference_logits, sha256, write_tiny_model  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
ARCHS = ["llama", "gemma3", "qwen2", "qwen3", "llama_ext"]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    arch = request.param
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / f"{arch}.gguf", arch)
    return arch, path, models.load(path)


def test_logits_match_float64_reference(tiny):
    arch, path, m = tiny
    got = m.logits(PROMPT)
    assert got.dtype == np.float32 and got.shape == (len(PROMPT), m.n_vocab)
    ref = reference_logits(path, arch, PROMPT)
    for t in range(len(PROMPT)):
        # 8-bit activations (Q8_0 per matmul) and the f16 KV cache are the only differences
        assert np.corrcoef(got[t], ref[t])[0, 1] >= 0.9995, t
        assert np.abs(got[t] - ref[t]).max() <= 0.02 * np.abs(ref[t]).max(), t
        assert got[t].argmax() == ref[t].argmax(), t


def test_cached_decoding_equals_the_batched_pass(tiny):
    """Each position's activations are quantized per row and attend only to earlier keys, so
    one token at a time through the KV cache gives the batched logits bit for bit."""
    arch, path, m = tiny
    full = m.logits(PROMPT)
    cache = m.new_cache(len(PROMPT))
    steps = np.concatenate([m.forward([i], cache) for i in PROMPT])
    np.testing.assert_array_equal(steps, full)
    gen = m.generate(PROMPT[:4], 5)
    seq = PROMPT[:4] + gen
    assert gen == [int(r.argmax()) for r in m.logits(seq)[3:-1]]
    assert len(m.generate(PROMPT[:4], 3, temperature=0.8, seed=1)) == 3
    assert m.generate(PROMPT[:4], 3, temperature=0.8, seed=1) == \
        m.generate(PROMPT[:4], 3, temperature=0.8, seed=1)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "q6_k", "iq4_nl"])
def test_decode_blocks_split_over_threads_equal_gemv(fmt, monkeypatch):
    """The runner's decode blocks (x8 / x16 tiles or plain rows; whole tiles split over the
    pool, then the tail rows) equal ``gemv`` bit for bit, with rows that leave a tail."""
    import numba_qk as qk
    from numba_qk.models import _runner
    from numba_qk.models._runner import _decode_block

    monkeypatch.setattr(_runner, "DECODE_MIN_THREADED", 0)   # small matrices split too

    rng = np.random.default_rng(5)
    f = getattr(qk.quant, fmt)
    act = qk.activation_format(f)
    rows, g = 16 * 5 + 11, 2 * (256 // f.block_size)
    w = qk.quantize(rng.standard_normal((rows * g, f.block_size)).astype(np.float32),
                    format=f).reshape(rows, g, f.block_bytes)
    gx = g * f.block_size // act.block_size
    x = qk.quantize(rng.standard_normal((gx, act.block_size)).astype(np.float32), format=act)
    want = qk.gemv(w, x, lhs_format=f, rhs_format=act)
    gemv = getattr(qk.kernels, f"gemv_{fmt}_{act.name.lower()}")
    for threads in (1, 2):
        out = np.full(rows, np.nan, np.float32)
        _decode_block(f, w, gemv, threads)(w, x, out)
        assert_same_f32(out, want, f"{fmt} threads={threads}")
    if not _pool.HAVE_ATOMICS:
        return
    for threads in (2, 3):   # with standing helpers, again and again (who runs what varies)
        helpers = _threads.Helpers(threads - 1)
        block = _decode_block(f, w, gemv, threads, helpers)
        for i in range(50):
            out = np.full(rows, np.nan, np.float32)
            block(w, x, out)
            assert_same_f32(out, want, f"{fmt} threads={threads} with helpers, call {i}")
        helpers.close()


@pytest.mark.parametrize("split_faster", [True, False])
def test_small_decode_products_take_the_thread_count_timed_faster(split_faster, monkeypatch):
    """Under ``DECODE_MIN_THREADED`` weights a one-token product alternates one thread and the
    split while ``_ThreadChoice`` times them, then runs the faster (by ``MARGIN``) for every
    block of that shape; the bits never depend on it."""
    import numba_qk as qk
    from numba_qk.models import _runner

    monkeypatch.setattr(_runner, "_CHOICES", {})
    ran = []
    real = _runner._block_maker

    def counting_maker(fmt, recs, gemv, helpers=None):
        make = real(fmt, recs, gemv, helpers)

        def made(threads):
            block = make(threads)
            return lambda r, x, out: (ran.append(threads), block(r, x, out))
        return made

    monkeypatch.setattr(_runner, "_block_maker", counting_maker)
    now = [0.0]

    def clock():   # the split costs 1 or 3 time units a call, one thread 2
        cost = {2: 1.0 if split_faster else 3.0, 1: 2.0}[ran[-1]] if ran else 0.0
        now[0] += cost if clock.calls % 2 else 0.0
        clock.calls += 1
        return now[0]
    clock.calls = 0
    monkeypatch.setattr(_runner, "_clock", clock)
    rng = np.random.default_rng(6)
    f, act = qk.quant.q4_0, qk.quant.q8_0
    w = qk.quantize(rng.standard_normal((40 * 8, 32)).astype(np.float32), format=f)
    w = w.reshape(40, 8, f.block_bytes)
    x = qk.quantize(rng.standard_normal((8, 32)).astype(np.float32), format=act)
    want = qk.gemv(w, x, lhs_format=f, rhs_format=act)
    blocks = [_runner._decode_block(f, w, qk.kernels.gemv_q4_0_q8_0, 2) for _ in range(2)]
    n = 2 * _runner._ThreadChoice.SAMPLES
    for i in range(n + 4):
        out = np.full(40, np.nan, np.float32)
        blocks[i % 2](w, x, out)
        assert_same_f32(out, want)
    assert ran[:n] == [1, 2] * (n // 2)            # the two alternate while timed
    assert ran[n:] == [2 if split_faster else 1] * 4
    (choice,) = _runner._CHOICES.values()          # one choice for the shape, shared
    assert choice.threaded is split_faster
    ran.clear()
    decided = _runner._decode_block(f, w, qk.kernels.gemv_q4_0_q8_0, 2)
    decided(w, x, out)
    assert ran == [2 if split_faster else 1]      # a block made later takes the decision


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k"])
def test_fused_decode_equals_each_weight(fmt):
    """q/k/v (and gate/up) of one format decoded by one block over their stacked tile copy
    (``_fuse``) equal each weight's own ``gemv`` bit for bit -- row counts that put rows of
    two weights in one tile included -- with one and two threads; a weight of another format
    stays a call of its own."""
    import numba_qk as qk
    from types import SimpleNamespace
    from numba_qk.models._runner import _Fused, _fuse

    rng = np.random.default_rng(6)
    f = getattr(qk.quant, fmt)
    act = qk.activation_format(f)
    g = 2 * (256 // f.block_size)
    gemv = getattr(qk.kernels, f"gemv_{fmt}_{act.name.lower()}")

    def weight(rows, fmt=f):
        recs = qk.quantize(rng.standard_normal((rows * g, fmt.block_size)).astype(np.float32),
                           format=fmt).reshape(rows, g, fmt.block_bytes)
        a = qk.activation_format(fmt)
        return SimpleNamespace(fmt=fmt, act=a, recs=recs, rows=rows, threads=1, block=None,
                               gemv_block=getattr(qk.kernels, f"gemv_{fmt.name.lower()}_"
                                                              f"{a.name.lower()}"),
                               prepare_decode=lambda helpers=None: None)

    ws = [weight(rows) for rows in (16 * 3 + 5, 7, 16 + 9)]
    x = qk.quantize(rng.standard_normal((g * f.block_size // act.block_size, act.block_size))
                    .astype(np.float32), format=act)
    helpers = _threads.Helpers(1) if _pool.HAVE_ATOMICS else None
    for threads, with_helpers in ((1, None), (2, None), (2, helpers)):
        fused = _Fused(ws, threads, with_helpers)
        for _ in range(3 if with_helpers else 1):
            outs = fused.apply_group(x[None])
            for w, got in zip(ws, outs):
                assert got.shape == (1, w.rows)
                assert_same_f32(got[0], qk.gemv(w.recs, x, lhs_format=f, rhs_format=act),
                                f"{fmt} threads={threads} rows={w.rows} {with_helpers}")
    other = weight(8, qk.quant.q8_0)
    calls = _fuse([ws[0], other, ws[1]], 1)
    assert len(calls) == 2 and isinstance(calls[0], _Fused) and calls[1] is other
    assert calls[0].weights == [ws[0], ws[1]] and gemv is ws[0].gemv_block


def test_logits_agree_with_llama_cpp_golden(tiny):
    arch, path, m = tiny
    golden = GOLDEN / f"tiny_{arch}.npz"
    if not golden.exists():
        pytest.skip(f"{golden.name} not generated (tools/gen_models_golden.py)")
    g = np.load(golden)
    assert str(g["sha256"]) == sha256(path), "the tiny model's bytes changed: regenerate"
    got = m.logits([int(i) for i in g["ids"]])
    ref = g["logits"]
    for t in range(len(ref)):
        assert np.corrcoef(got[t], ref[t])[0, 1] >= 0.9995, t
        assert np.abs(got[t] - ref[t]).max() <= 0.02 * np.abs(ref[t]).max(), t
    # at these sizes the activation quantization picks the same codes as llama.cpp's and only the
    # order of float32 sums differs: when the golden file was made every logit agreed to 1 ulp
    # of the largest (max |diff| 9.5e-7 at |logit| <= 13.4); 10x that margin here
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    assert m.generate([int(i) for i in g["ids"]], len(g["greedy"])) == list(g["greedy"])


def test_unsupported_architecture_is_refused(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'mamba' is not supported"):
        models.load(tmp_path / "x.gguf")


@pytest.mark.parametrize("variant,match", [
    (dict(SHAPES["qwen3"], arch="qwen3", biases=True), "tensor 'blk.0.attn_output.bias' and 7 more is not "
                                         "part of the qwen3 graph"),
    (dict(SHAPES["llama_ext"], rope_type="yarn"), "RoPE scaling 'yarn' is not supported"),
    (dict(SHAPES["llama_ext"], rope_factors=(1.0, 2.0)), r"rope_freqs.weight has shape \(2,\), "
                                                          r"expected \(8,\)"),
])
def test_what_the_graph_does_not_take_is_refused(tmp_path, monkeypatch, variant, match):
    """A tensor the architecture's llama.cpp graph does not load (llama.cpp: "wrong number of
    tensors"), a RoPE scaling numba_qk does not implement and misshapen rope factors are
    refused when the model loads, not run without."""
    from numba_qk.gguf import GGUFError

    monkeypatch.setitem(SHAPES, "odd", variant)
    path = write_tiny_model(tmp_path / "odd.gguf", "odd")
    with pytest.raises(GGUFError, match=match):
        models.load(path)


def test_cli_generate(tiny, capsys):
    import json

    from numba_qk.__main__ import main

    arch, path, m = tiny
    ids = ",".join(map(str, PROMPT[:5]))
    assert main(["generate", str(path), "--tokens", ids, "-n", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompt_tokens"] == PROMPT[:5]
    assert r["tokens"] == m.generate(PROMPT[:5], 4)
    assert r["text"] == "".join(f"t{i}" for i in r["tokens"])      # the tiny vocabulary's pieces
    assert main(["generate", str(path), "--tokens", ids, "-n", "4"]) == 0
    assert capsys.readouterr().out.strip() == r["text"]
    assert r["prompt_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    assert main(["generate", str(path), "--tokens", "1,999", "-n", "2"]) == 1
    assert "outside the vocabulary" in capsys.readouterr().err


def test_detokenize_kinds(tiny):
    arch, path, m = tiny
    assert m.detokenize([1, 5, 6, 2]) == "t5t6"                 # control tokens left out
    assert m.detokenize([1, 5], special=True) == "<s>t5"


def test_non_finite_activations_raise(tiny, monkeypatch):
    import numba_qk as qk

    arch, path, m = tiny
    nan = np.full(m.n_embd, np.nan, np.float32)
    monkeypatch.setattr(m.layers[0], "attn_norm", nan)
    for ids in ([5], [5, 6]):            # one token (the decoder) and a batch (ops)
        with pytest.raises(qk.QuantizationDomainError):
            m.logits(ids)


def test_one_token_decoder_equals_the_batched_code(tiny):
    """``forward`` of one token runs ``_Decoder`` (buffers made once); the general code run for
    one token gives the same logits and cache bit for bit (every architecture; the other
    activation numerics and two threads on gemma3)."""
    arch, path, m = tiny
    configs = [("ggml_cpu", 1)] + ([("canonical", 1), ("ggml_cpu", 2)] if arch == "gemma3" else [])
    for numerics, threads in configs:
        a = models.load(path, numerics=numerics, threads=threads)
        b = models.load(path, numerics=numerics, threads=threads)
        b._fast_decode = False
        ca, cb = a.new_cache(len(PROMPT)), b.new_cache(len(PROMPT))
        a.forward(PROMPT[:3], ca)
        b.forward(PROMPT[:3], cb)
        for i in PROMPT[3:]:
            np.testing.assert_array_equal(a.forward([i], ca), b.forward([i], cb))
        assert a._decoder is not None and b._decoder is None
        np.testing.assert_array_equal(ca["k"], cb["k"])
        np.testing.assert_array_equal(ca["v"], cb["v"])


@pytest.mark.skipif(not _pool.HAVE_ATOMICS, reason="no compiled atomics here")
def test_decoding_with_standing_helpers_gives_the_one_thread_bits(tiny, monkeypatch):
    """With threads, each decoded token's products and attention heads (and a small batch's
    products) are split between the caller and the model's standing helpers
    (``_threads.Helpers``): logits and cache equal the one-thread run bit for bit, with 1 and 2
    helpers, every product split."""
    from numba_qk.models import _runner

    arch, path, m = tiny
    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    monkeypatch.setattr(_runner, "DECODE_MIN_THREADED", 0)
    c1 = m.new_cache(len(PROMPT))
    first = m.forward(PROMPT[:3], c1)
    want = [m.forward([i], c1) for i in PROMPT[3:]]
    for threads in (2, 3):
        mt = models.load(path, threads=threads)
        ct = mt.new_cache(len(PROMPT))
        # a batch under PROMPT_SPLIT_MIN tokens: its products split by rows with the helpers
        np.testing.assert_array_equal(mt.forward(PROMPT[:3], ct), first)
        for i, w in zip(PROMPT[3:], want):
            np.testing.assert_array_equal(mt.forward([i], ct), w)
        np.testing.assert_array_equal(ct["k"], c1["k"])
        np.testing.assert_array_equal(ct["v"], c1["v"])
        h = mt._helpers
        assert h.helpers == threads - 1 and mt._attention_kind == 0   # attention split too
        assert all(w.batch_split is not None for w in (mt.layers[0].wq, mt.output))
        # woken (the second of two helpers may find no core free on a 2-core machine)
        assert h.ctl[_pool.AWAKE + 1] > 0, h.ctl[_pool.AWAKE + 1::8].tolist()
        h.close()


def test_calls_from_several_threads_wait_for_each_other(tiny, monkeypatch):
    """A model's calls share its decoder buffers and its helpers' product slot, so calls from
    several Python threads run one at a time (``Model._lock``) and each gets its own result."""
    import threading

    from numba_qk.models import _runner

    arch, path, m = tiny
    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    monkeypatch.setattr(_runner, "DECODE_MIN_THREADED", 0)
    mt = models.load(path, threads=2)
    prompts = [PROMPT[:4], PROMPT[2:7], PROMPT[::-1][:3]]
    want = [m.generate(p, 6) for p in prompts]
    got = [None] * 6

    def run(i):
        got[i] = mt.generate(prompts[i % 3], 6)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert got == want + want


@pytest.mark.parametrize("split_min", [2, 8])
def test_batches_split_by_tokens_give_the_one_pass_bits(tiny, monkeypatch, split_min):
    """With threads, a batch runs as consecutive parts of tokens, one a thread, each part's
    attention after the earlier parts' K/V (``_TokenSplit``): the logits (every position's and
    the last one's) and the cache equal the one-thread pass bit for bit, for 2 and 3 parts (and
    1-token parts), after a first batch too."""
    from numba_qk import _threads
    from numba_qk.models import _runner

    arch, path, m = tiny
    monkeypatch.setattr(_threads, "ADAPTIVE", False)            # the parts even on a busy host
    monkeypatch.setattr(_runner, "PROMPT_SPLIT_MIN", split_min)
    monkeypatch.setattr(_runner, "PROMPT_SPLIT_MIN_HELPED", split_min)
    ids = PROMPT + PROMPT[::-1]
    c1 = m.new_cache(len(ids) + 1)
    want = m.forward(ids[:3], c1)
    want_rest = m.forward(ids[3:], c1)
    for threads in (2, 3):
        mt = models.load(path, threads=threads)
        seen = []
        split_run = _runner._TokenSplit.run
        monkeypatch.setattr(_runner._TokenSplit, "run",
                            lambda self, *a: seen.append(self.parts) or split_run(self, *a))
        ct = mt.new_cache(len(ids) + 1)
        np.testing.assert_array_equal(mt.forward(ids[:3], ct), want)
        np.testing.assert_array_equal(mt.forward(ids[3:], ct), want_rest)
        np.testing.assert_array_equal(ct["k"], c1["k"])
        np.testing.assert_array_equal(ct["v"], c1["v"])
        np.testing.assert_array_equal(mt.forward(ids, mt.new_cache(len(ids)), all_logits=False),
                                      want_rest[-1:])
        assert seen and set(seen) == {threads}, seen          # the split ran, in that many parts
        monkeypatch.setattr(_runner._TokenSplit, "run", split_run)


def test_a_failing_part_of_a_split_batch_raises_its_error(tiny, monkeypatch):
    """An error in any part of a split batch reaches the caller (the other parts stop at their
    next wait), and the model keeps working."""
    from numba_qk import _threads
    from numba_qk.models import _runner

    arch, path, m = tiny
    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    monkeypatch.setattr(_runner, "PROMPT_SPLIT_MIN", 2)
    monkeypatch.setattr(_runner, "PROMPT_SPLIT_MIN_HELPED", 2)
    mt = models.load(path, threads=2)
    real = _runner.K.attention

    def failing(q, kc, vc, n_past, *a):
        if n_past > 0:   # a part after the first (a fresh cache), whichever thread runs it
            raise RuntimeError("part 1 failed")
        return real(q, kc, vc, n_past, *a)

    monkeypatch.setattr(_runner.K, "attention", failing)
    with pytest.raises(RuntimeError, match="part 1 failed"):
        mt.logits(PROMPT)
    monkeypatch.setattr(_runner.K, "attention", real)
    np.testing.assert_array_equal(mt.logits(PROMPT), m.logits(PROMPT))


def test_token_ids_out_of_range_are_refused(tiny):
    arch, path, m = tiny
    for ids in ([m.n_vocab], [-1], [3, m.n_vocab]):
        with pytest.raises(IndexError, match="out of range for a vocabulary"):
            m.logits(ids)
        with pytest.raises(IndexError, match="out of range for a vocabulary"):
            m.generate(ids, 2)


def test_thread_counts_are_checked_and_none_is_every_core(tiny):
    """``load(threads=...)`` takes what the products take: a positive int, or None for every
    core this process may run on (it reached the runner unchecked: None raised a TypeError in
    the first decode, 0 was kept)."""
    from numba_qk._threads import cpu_count

    arch, path, m = tiny
    every = models.load(path, threads=None)
    assert every.threads == cpu_count()
    np.testing.assert_array_equal(every.generate(PROMPT[:4], 3), m.generate(PROMPT[:4], 3))
    for bad, err in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError),
                     ("2", TypeError)):
        with pytest.raises(err, match="^threads: expected a positive int or None"):
            models.load(path, threads=bad)


def test_bad_arguments_get_one_line_errors_before_any_work(tiny, monkeypatch):
    """ids must be int token ids (nothing truncated: a float, a bool, a str is refused), in the
    vocabulary (detokenize too: -1 read the last token's text), at least one, and with
    ``max_new_tokens`` (an int >= 0) within the context length (a huge count tried to allocate
    its KV cache: 10 TiB); ``temperature`` a finite number >= 0 (-1 sampled, NaN failed inside
    numpy).  ``stream`` checks before its first id is asked for; nothing is run on error."""
    arch, path, m = tiny
    ran = []
    monkeypatch.setattr(m, "_forward", lambda *a, **k: ran.append(a))
    n_ctx = m.n_ctx_train
    cases = [
        (lambda: m.generate([1.5, 2], 2), TypeError,
         r"^ids\[0\]: expected an int token id, got float"),
        (lambda: m.generate([1, True], 2), TypeError,
         r"^ids\[1\]: expected an int token id, got bool"),
        (lambda: m.generate("hello", 2), TypeError,
         r"^ids: expected a sequence of int token ids, got str"),
        (lambda: m.logits(np.array([1.0, 2.0])), TypeError, r"^ids\[0\]: .* got float64"),
        (lambda: m.logits([]), ValueError, r"^logits needs at least one token id"),
        (lambda: m.generate([], 2), ValueError, r"^generate needs at least one prompt token"),
        (lambda: m.generate([1], -1), ValueError,
         r"^max_new_tokens: expected an int >= 0, got -1"),
        (lambda: m.generate([1], 2.0), TypeError,
         r"^max_new_tokens: expected an int, got float"),
        (lambda: m.generate([1], 10**12), ValueError,
         rf"^1 prompt tokens \+ {10**12} new tokens = {10**12 + 1} positions, more than the "
         rf"model's context length of {n_ctx}"),
        (lambda: m.logits([1] * (n_ctx + 1)), ValueError, r"more than the model's context length"),
        (lambda: m.generate([1], 2, temperature=-1.0), ValueError,
         r"^temperature: expected a finite number >= 0, got -1.0"),
        (lambda: m.generate([1], 2, temperature=float("nan")), ValueError,
         r"^temperature: .* nan"),
        (lambda: m.generate([1], 2, temperature="0"), TypeError,
         r"^temperature: expected a number"),
        (lambda: m.stream([1], -1), ValueError, r"^max_new_tokens"),
        (lambda: m.generate([m.n_vocab], 2), IndexError, r"out of range for a vocabulary"),
        (lambda: m.detokenize([-1]), IndexError, r"^token id -1 out of range"),
        (lambda: m.detokenize([m.n_vocab]), IndexError, r"out of range for a vocabulary"),
    ]
    for call, err, match in cases:
        with pytest.raises(err, match=match):
            call()
    assert not ran
    assert m.generate(np.array([1, 2]), np.int64(0)) == []
    assert m.detokenize(np.array([], np.int64)) == ""


def test_forward_refuses_a_cache_that_is_not_this_models(tiny):
    """The kernels write the K/V cache without bounds checks, so ``forward`` takes only a cache
    of this model's shapes: another model's cache (it wrote out of bounds and corrupted the
    heap: "corrupted size vs. prev_size", abort), a strided or read-only array, a bad ``n``, a
    missing entry each get a one-line error, and the cache is left as it was."""
    arch, path, m = tiny
    good = m.new_cache(4)
    wrong = m.new_cache(8)          # arrays of another shape than n_ctx says (as another
    wrong["n_ctx"] = 4              # model's cache has)
    strided = m.new_cache(4)
    k = strided["k"]
    strided["k"] = np.zeros((*k.shape[:-1], 2 * k.shape[-1]), np.float16)[..., ::2]
    readonly = m.new_cache(4)
    readonly["v"].flags.writeable = False
    past_end = m.new_cache(4)
    past_end["n"] = 5
    for ids in ([3], [3, 4]):       # the one-token decoder and the batch path
        for cache, err, match in (
                (wrong, ValueError, r"^cache\['[kv]'\]: expected this model's"),
                (strided, ValueError, r"^cache\['k'\]: expected this model's"),
                (readonly, ValueError, r"^cache\['v'\]: expected this model's"),
                (past_end, ValueError, r"^cache: n = 5 and n_ctx = 4"),
                ({"k": good["k"]}, ValueError, r"^cache: no 'v' entry"),
                ([good], TypeError, r"^cache: expected a dict made by Model.new_cache")):
            before = {k: (v.copy() if isinstance(v, np.ndarray) else v)
                      for k, v in (cache.items() if isinstance(cache, dict) else ())}
            with pytest.raises(err, match=match):
                m.forward(ids, cache)
            for k, v in before.items():
                np.testing.assert_array_equal(cache[k], v)
    with pytest.raises(ValueError, match="^forward needs at least one token id"):
        m.forward([], good)
    for bad, err in ((0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="^new_cache: n_ctx must be a positive int"):
            m.new_cache(bad)
    assert m.forward([3], good).shape == (1, m.n_vocab) and good["n"] == 1


def test_warmup_changes_no_later_result(tiny):
    """``Model.warmup`` (run by the CLI before its clock starts) leaves no state behind that a
    later call could see: the same greedy tokens and logits bits as a model never warmed."""
    arch, path, m = tiny
    fresh = models.load(path)
    want_tokens = fresh.generate(PROMPT[:4], 4)
    want_logits = fresh.logits(PROMPT[:6])
    warm = models.load(path)
    warm.warmup()
    assert warm.generate(PROMPT[:4], 4) == want_tokens
    np.testing.assert_array_equal(warm.logits(PROMPT[:6]), want_logits)


def test_activation_numerics_option(tiny):
    """``load(numerics=...)``: "ggml_cpu" (default, llama.cpp's run-time quantizer) and
    "canonical" (numba_qk's default ``quantize``) both hold the reference tolerances; the
    default equals an explicit "ggml_cpu" bit for bit."""
    arch, path, m = tiny
    assert m.numerics == "ggml_cpu"
    np.testing.assert_array_equal(models.load(path, numerics="ggml_cpu").logits(PROMPT[:5]),
                                  m.logits(PROMPT[:5]))
    got = models.load(path, numerics="canonical").logits(PROMPT)
    ref = reference_logits(path, arch, PROMPT)
    for t in range(len(PROMPT)):
        assert np.corrcoef(got[t], ref[t])[0, 1] >= 0.9995, t
    with pytest.raises(ValueError, match="numerics"):
        models.load(path, numerics="fast")
