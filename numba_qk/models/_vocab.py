"""Token ids -> text from a GGUF file's own vocabulary (``tokenizer.ggml.*``), as llama.cpp's
``llama_detokenize`` with ``special=False``: control tokens (type 3) give nothing; ``gpt2``
(byte-level BPE) pieces map back through GPT-2's byte-to-unicode table; ``llama``
(SentencePiece) pieces turn ``▁`` into a space and ``<0xXX>`` byte pieces into that byte."""

from __future__ import annotations

import codecs


def _gpt2_unicode_to_byte() -> dict:
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


CONTROL = 3
BYTE = 6
# llama-vocab.cpp marks tokens with these texts end-of-generation and forces them to CONTROL
# (a partial list: the ones these models' vocabularies hold)
EOG_TEXTS = {"</s>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|eom_id|>", "<EOT>"}


class Vocab:
    def __init__(self, metadata: dict):
        self.kind = metadata.get("tokenizer.ggml.model")
        self.tokens = metadata.get("tokenizer.ggml.tokens") or []
        self.types = metadata.get("tokenizer.ggml.token_type") or [1] * len(self.tokens)
        self._u2b = _gpt2_unicode_to_byte() if self.kind == "gpt2" else None
        self._cache = {}

    def piece(self, i: int, special: bool = False) -> bytes:
        """The bytes token ``i`` stands for (control tokens: empty unless ``special``)."""
        key = (i, special)
        got = self._cache.get(key)
        if got is not None:
            return got
        text = self.tokens[i]
        t = self.types[i] if i < len(self.types) else 1
        if text in EOG_TEXTS:
            t = CONTROL
        if t == CONTROL and not special:
            out = b""
        elif self._u2b is not None and self.types[i] != CONTROL and text not in EOG_TEXTS:
            out = bytes(self._u2b.get(ch, 0x3F) for ch in text)
        elif t == BYTE and text.startswith("<0x") and text.endswith(">"):
            out = bytes([int(text[3:-1], 16)])
        else:
            out = text.replace("\u2581", " ").encode("utf-8")
        self._cache[key] = out
        return out

    def detokenize(self, ids, special: bool = False) -> str:
        return b"".join(self.piece(int(i), special) for i in ids).decode("utf-8", "replace")

    def decoder(self, special: bool = False):
        """A function ``id -> text`` for streaming (holds back incomplete UTF-8 sequences)."""
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        return lambda i: dec.decode(self.piece(int(i), special))
