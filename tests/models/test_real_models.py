"""The two real GGUF models of issue 23 (opt-in: ``-m models``).  Files are read from
``$NUMBA_QK_MODELS`` or ``~/.cache/numba_qk-models``; a missing file skips its tests.  Agreement
with llama.cpp is checked against ``golden/real_<model>.npz`` (tools/models_agreement.py):
llama.cpp's top-1 per position, its top-2 gap and its own batched-vs-stepwise noise, its logits
at a sample of the vocabulary, and its greedy tokens."""

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.models

FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
GOLDEN = Path(__file__).parent / "golden"


def model_path(key):
    root = Path(os.environ.get("NUMBA_QK_MODELS", Path.home() / ".cache" / "numba_qk-models"))
    p = root / FILES[key]
    if not p.exists():
        pytest.skip(f"{p} not found (set NUMBA_QK_MODELS)")
    return p


@pytest.fixture(scope="module", params=sorted(FILES))
def real(request):
    from numba_qk import models

    return request.param, models.load(model_path(request.param))


def test_greedy_generation_is_consistent_with_batched_logits(real):
    key, m = real
    prompt = [int(i) for i in np.load(GOLDEN / f"real_{key}.npz")["ids"][:8]] \
        if (GOLDEN / f"real_{key}.npz").exists() else [1, 2, 3, 4]
    gen = m.generate(prompt, 6)
    logits = m.logits(prompt + gen)
    assert np.isfinite(logits).all()
    assert gen == [int(r.argmax()) for r in logits[len(prompt) - 1:-1]]


def test_agreement_with_llama_cpp(real):
    key, m = real
    golden = GOLDEN / f"real_{key}.npz"
    if not golden.exists():
        pytest.skip(f"{golden.name} not generated (tools/models_agreement.py)")
    g = np.load(golden)
    ids = [int(i) for i in g["ids"]]
    got = m.logits(ids)
    clear = (g["gap"] >= 0.5) & (g["gap"] >= 2 * g["noise"])
    assert (got.argmax(1)[clear] == g["top1"][clear]).all()
    # llama.cpp's logits at a fixed random sample of 2048 vocabulary ids: correlation per
    # position (issue 23's targets on the full vector: median >= 0.999, minimum >= 0.99; the
    # sample's median gets a little slack)
    corr = [np.corrcoef(got[t][g["sample_ids"]], g["sample"][t])[0, 1] for t in range(len(ids))]
    assert min(corr) >= 0.99
    assert np.median(corr) >= 0.998
    # the file's vocabulary gives llama.cpp's text for llama.cpp's greedy tokens
    assert m.detokenize(g["greedy"]) == str(g["greedy_text"])
    gen = m.generate(ids, len(g["greedy"]))
    first_unclear = int(g["greedy_clear"])
    assert gen[:first_unclear] == list(g["greedy"][:first_unclear])


def test_tokenizer_agrees_with_llama_cpp(real):
    """Token ids of tiny_vocab.REAL_CORPUS (hard strings: CJK, emoji, digit and white-space
    runs, contractions, special-token text, invalid UTF-8) with and without BOS and special-token
    parsing, the detokenized text, and every token's piece, against llama.cpp's
    (golden/tokenizer_real.json, tools/gen_models_golden.py --real)."""
    import json

    from test_tokenizer import check_against_llama_cpp, pieces_sha256

    key, m = real
    golden = GOLDEN / "tokenizer_real.json"
    if not golden.exists():
        pytest.skip(f"{golden.name} not generated (tools/gen_models_golden.py --real)")
    g = json.loads(golden.read_text())[key]
    agree, total = check_against_llama_cpp(m, g)
    print(f"{key}: {agree}/{total} tokenize/detokenize results equal llama.cpp's")
    for sp in ("0", "1"):
        assert pieces_sha256(m, sp == "1") == g["pieces_sha256"][sp]


@pytest.mark.parametrize("n", [32, 100, 160])
def test_two_threads_give_the_one_thread_bits(real, n, monkeypatch):
    """With two threads a prompt runs on the model's standing helpers (32 and 100 tokens: the
    products split by claimed bands of weight rows or by row chunks, attention by heads and
    token parts; 160: by tokens): every logit and the cache equal the one-thread run bit for
    bit."""
    from numba_qk import _threads, models

    monkeypatch.setattr(_threads, "ADAPTIVE", False)
    key, m = real
    m2 = models.load(model_path(key), threads=2)
    ids = [int(i) for i in np.random.default_rng(n).integers(10, m.n_vocab - 10, n)]
    c1, c2 = m.new_cache(n + 1), m2.new_cache(n + 1)
    np.testing.assert_array_equal(m.forward(ids, c1), m2.forward(ids, c2))
    np.testing.assert_array_equal(m.forward([ids[0]], c1), m2.forward([ids[0]], c2))
    np.testing.assert_array_equal(c1["k"], c2["k"])
    np.testing.assert_array_equal(c1["v"], c2["v"])
