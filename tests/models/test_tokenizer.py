"""Model.tokenize / detokenize on tiny models with small but realistic vocabularies
(tiny_vocab.py: byte-level BPE under five pre-tokenizer types, SentencePiece with and without
the space prefix), against golden ids and pieces computed once by llama.cpp from the same bytes
(tools/gen_models_golden.py, golden/tokenizer_tiny.json): every string of tiny_vocab.CORPUS,
with and without BOS, with and without special-token parsing."""

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from numba_qk import models  # noqa: E402

from tiny_models import sha256, write_tiny_model  # noqa: E402
from tiny_vocab import VARIANTS  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_tiny.json").read_text())


def check_against_llama_cpp(m, golden):
    """Every case's ids (4 flag combinations) and detokenized text; returns (agree, total)."""
    agree = total = 0
    bad = []
    for case in golden["cases"]:
        raw = bytes.fromhex(case["raw"])
        for key, want in case["ids"].items():
            got = m.tokenize(raw, add_bos=key[0] == "1", special=key[1] == "1")
            total += 1
            agree += got == want
            if got != want:
                bad.append((raw, key, got, want))
        for sp, text in case["text"].items():
            ids = case["ids"][f"0{sp}"]
            want = bytes.fromhex(text).decode("utf-8", "replace")
            total += 1
            agree += m.detokenize(ids, special=sp == "1") == want
            if m.detokenize(ids, special=sp == "1") != want:
                bad.append((raw, f"detokenize special={sp}", ids, want))
    assert not bad, f"{len(bad)} of {total} differ from llama.cpp, first: {bad[:3]}"
    return agree, total


def pieces_sha256(m, special):
    h = hashlib.sha256()
    for i in range(len(m.vocab.tokens)):
        p = m.vocab.piece(i, special)
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_tokenize_agrees_with_llama_cpp(name, tmp_path):
    path = write_tiny_model(tmp_path / f"{name}.gguf", "llama", vocab=VARIANTS[name]())
    golden = GOLDEN[name]
    assert golden["sha256"] == sha256(path), "the tiny vocabulary's bytes changed: regenerate"
    m = models.load(path)
    check_against_llama_cpp(m, golden)
    for sp in ("0", "1"):
        assert pieces_sha256(m, sp == "1") == golden["pieces_sha256"][sp]


def test_tokenize_api(tmp_path):
    m = models.load(write_tiny_model(tmp_path / "spm.gguf", "llama", vocab=VARIANTS["spm"]()))
    ids = m.tokenize("Hello world")
    assert ids[0] == 1 and m.tokenize("Hello world", add_bos=False) == ids[1:]
    assert m.tokenize("Hello world".encode()) == ids                     # bytes as str
    assert m.detokenize(ids) == " Hello world"        # token_to_piece keeps the space prefix
    ctrl = m.vocab.tokens.index("<ctrl>")
    assert ctrl in m.tokenize("a<ctrl>b", special=True)
    assert ctrl not in m.tokenize("a<ctrl>b")                           # text unless special
    assert m.vocab.tokens.index("<ud>") in m.tokenize("a<ud>b")         # user-defined: always
    assert m.tokenize("", add_bos=False) == []
    bpe = models.load(write_tiny_model(tmp_path / "bpe.gguf", "llama",
                                       vocab=VARIANTS["bpe_smollm"]()))
    with pytest.raises(ValueError, match="U\\+1FFFFF"):       # llama.cpp aborts on these
        bpe.tokenize(b"\xf7\xbf\xbf\xbf")


def test_cli_generate_from_prompt_text(tmp_path, capsys):
    from numba_qk.__main__ import main

    path = write_tiny_model(tmp_path / "spm.gguf", "llama", vocab=VARIANTS["spm"]())
    m = models.load(path)
    prompt = "Hello<ctrl> world"
    assert main(["generate", str(path), prompt, "-n", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompt_tokens"] == m.tokenize(prompt, special=True)   # as llama.cpp's programs
    assert m.vocab.tokens.index("<ctrl>") in r["prompt_tokens"]
    assert r["tokens"] == m.generate(r["prompt_tokens"], 3)
    assert r["text"] == m.detokenize(r["tokens"])
    with pytest.raises(SystemExit):                            # neither PROMPT nor --tokens
        main(["generate", str(path), "-n", "2"])
    assert "PROMPT or --tokens" in capsys.readouterr().err


def test_qwen_vocabulary(tmp_path):
    """A qwen3 (and qwen2) model with a Qwen-style vocabulary (``gpt2`` model, ``qwen2``
    pre-tokenizer, no ``add_bos_token`` key: no BOS): ids equal llama.cpp's golden ones for that
    vocabulary (made on a llama-architecture file; llama.cpp's vocabulary does not depend on the
    architecture), and text runs through the model end to end."""
    for arch in ("qwen3", "qwen2"):
        m = models.load(write_tiny_model(tmp_path / f"{arch}.gguf", arch,
                                         vocab=VARIANTS["bpe_qwen2"]()))
        assert not m.vocab.add_bos
        ids = m.tokenize("Hello world")
        assert ids == m.tokenize("Hello world", add_bos=False) and m.detokenize(ids) == \
            "Hello world"
        assert len(m.generate(ids, 2)) == 2
        check_against_llama_cpp(m, GOLDEN["bpe_qwen2"])
