"""The embedded demo model (``numba_qk.models.demo``; ``generate`` without a MODEL): a runnable
llama whose logits follow the independent float64 forward pass, whose vocabulary round-trips
text, and which the CLI runs."""

import json

import numpy as np
import pytest

pytest.importorskip("gguf")

from numba_qk import models  # noqa: E402
from numba_qk.__main__ import main  # noqa: E402
from numba_qk.models import demo  # noqa: E402

from tiny_models import reference_logits  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = demo.write_demo_model(tmp_path_factory.mktemp("demo") / "demo.gguf")
    return path, models.load(path)


def test_same_bytes_every_time(model, tmp_path):
    path, _ = model
    assert demo.write_demo_model(tmp_path / "again.gguf").read_bytes() == path.read_bytes()


def test_logits_follow_the_float64_reference(model):
    path, m = model
    ids = m.tokenize(demo.DEMO_PROMPT)
    got = m.logits(ids)
    ref = reference_logits(path, "llama", ids, shape=demo.SHAPE)
    for t in range(len(ids)):
        # 8-bit activations and the f16 KV cache are the only differences
        assert np.corrcoef(got[t], ref[t])[0, 1] >= 0.999, t


def test_vocabulary_round_trips_text(model):
    _, m = model
    for text in ("The quick brown fox", "hello there\n", "Café 日本 😀", ""):
        ids = m.tokenize(text, add_bos=False)
        assert m.detokenize(ids) == text
    assert m.tokenize(" the", add_bos=False) == [m.vocab.tokens.index("\u0120the")]   # merged


def test_cli_generate_without_a_model(capsys):
    assert main(["generate", "-n", "3", "--json"]) == 0
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert len(got["tokens"]) == 3 and got["prompt_tokens"][0] == 0   # BOS <|endoftext|>
    assert "embedded demo model" in out.err
    assert main(["generate", "--tokens", "5,6", "-n", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == [5, 6]


def test_two_threads_give_the_same_bits(model):
    """Threaded decoding splits the x16 tiles (Q4_K) and the plain rows (Q6_K, Q8_0) over the
    pool: every output row is one serial call either way, so the tokens' logits are equal."""
    path, m1 = model
    m2 = models.load(path, threads=2)
    ids = m1.tokenize(demo.DEMO_PROMPT)[:6]
    c1, c2 = m1.new_cache(len(ids)), m2.new_cache(len(ids))
    for i in ids:
        np.testing.assert_array_equal(m2.forward([i], c2), m1.forward([i], c1))
    np.testing.assert_array_equal(m2.logits(ids), m1.logits(ids))
