"""Text <-> token ids from a GGUF file's own vocabulary (``tokenizer.ggml.*``), as llama.cpp's
src/llama-vocab.cpp does it (the llama.cpp built for the tests, llama-cpp-python 0.3.36, is the
reference; tests/models compare ids on both real models).

* ``tokenize`` is ``llama_tokenize(text, add_special, parse_special)``: special tokens are cut
  out of the text first (``tokenizer_st_partition``: control, unknown and user-defined tokens,
  longest text first; with ``special=False`` only user-defined ones), then each piece of text
  goes through the file's tokenizer:

  - ``gpt2`` (byte-level BPE, ``llm_tokenizer_bpe``): the pre-tokenizer expressions of
    ``tokenizer.ggml.pre`` split the text into words (:mod:`._unicode`), each word's UTF-8 bytes
    are mapped through GPT-2's byte-to-unicode table and merged pair by pair, lowest merge rank
    first (leftmost on ties); a piece with no token falls back to its single-byte tokens.
  - ``llama`` (SentencePiece, ``llm_tokenizer_spm``): spaces become ``▁`` (and one is put in
    front of text that starts the prompt or follows a special token when
    ``tokenizer.ggml.add_space_prefix`` is true, its default), the UTF-8 characters are merged
    two at a time, highest score first (leftmost on ties), and characters no token covers become
    ``<0xXX>`` byte tokens.

  BOS (and EOS) are added as llama.cpp adds them with ``add_special``: only when the file says
  so (``tokenizer.ggml.add_bos_token``, default true for SentencePiece, false for most BPE
  pre-tokenizers).
* ``piece``/``detokenize`` are ``llama_token_to_piece`` per token (``lstrip`` 0), concatenated:
  control and unknown tokens give nothing unless ``special``; user-defined ones (and control ones
  with ``special``) their text as it is; normal BPE tokens go back through the byte table,
  normal SentencePiece tokens turn ``▁`` into a space; byte tokens give their byte.

Not modelled: the per-model LSTRIP/RSTRIP token attributes (phi-3, jina, modern-bert names),
the pre-tokenizers not listed in ``PRE_TOKENIZERS``, and the WPM/UGM/RWKV tokenizers.  Special
tokens of equal length are tried in id order (llama.cpp's order among them is std::sort's).
"""

from __future__ import annotations

import codecs
import heapq

from . import _unicode as U

# llama_token_type (GGUF tokenizer.ggml.token_type) and llama_token_attr
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = range(7)
A_UNDEFINED, A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER_DEFINED, A_BYTE = \
    0, 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5
_ATTR = {UNDEFINED: A_UNDEFINED, NORMAL: A_NORMAL, UNKNOWN: A_UNKNOWN, CONTROL: A_CONTROL,
         USER_DEFINED: A_USER_DEFINED, UNUSED: A_UNUSED, BYTE: A_BYTE}

# llama-vocab.cpp marks tokens with these texts end-of-generation and forces them to CONTROL
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}
# ... and the first token found with one of these texts (per kind) when the file names none
_FIM_TEXTS = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
     "<|code_prefix|>", "<|prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
     "<|code_suffix|>", "<|suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
     "<|code_middle|>", "<|middle|>"),
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
_FIM_KEYS = ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")

_GPT2 = U.GPT2_REGEX
_LLAMA3 = U.LLAMA3_REGEXES[1]
# tokenizer.ggml.pre -> (llm_tokenizer_bpe's expressions, ignore_merges, add_bos default)
_PRE_GROUPS = (
    (("default",), ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"), False,
     False),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     (_LLAMA3,), True, True),
    (("dbrx", "smaug-bpe"), (_LLAMA3,), False, False),
    (("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
     ("\\p{N}", _GPT2), False, False),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "mpt",
      "olmo", "jais", "exaone4", "roberta-bpe", "jina-v1-en", "jina-v2-code"), (_GPT2,), False,
     False),
    (("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"),
     ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",), False, False),
    (("falcon",), ("[\\p{P}\\$\\+<=>\\^~\\|`]+",
                   "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                   "[0-9][0-9][0-9]"), False, False),
)
PRE_TOKENIZERS = {name: (exprs, ignore, bos) for names, exprs, ignore, bos in _PRE_GROUPS
                  for name in names}


def gpt2_byte_to_unicode() -> dict:
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_B2U = gpt2_byte_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_LATIN1_TO_GPT2 = str.maketrans({chr(b): c for b, c in _B2U.items()})


def _merge_pairs(heap, size, add, stale):
    """The merge loop both tokenizers share (llm_tokenizer_spm/bpe_session): symbols
    ``0 .. len(size) - 1`` in a linked list, ``add(left, right)`` pushes a candidate pair onto
    ``heap`` (best first), popped pairs whose symbols are gone or ``stale(entry)`` are skipped,
    the others merge right into left and offer the new neighbours.  Returns ``next`` links."""
    m = len(size)
    nxt = list(range(1, m)) + [-1]
    prv = list(range(-1, m - 1))
    for i in range(1, m):
        add(i - 1, i)
    while heap:
        e = heapq.heappop(heap)
        left, right = e[1], e[2]
        if size[left] == 0 or size[right] == 0 or stale(e):
            continue
        size[left] += size[right]
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        if prv[left] != -1:
            add(prv[left], left)
        if nxt[left] != -1:
            add(left, nxt[left])
    return nxt


class Vocab:
    def __init__(self, metadata: dict):
        md = metadata
        self.kind = md.get("tokenizer.ggml.model")
        self.pre = md.get("tokenizer.ggml.pre") or "default"
        tokens = md.get("tokenizer.ggml.tokens") or []
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        types = md.get("tokenizer.ggml.token_type")
        self.types = list(types) if types is not None else [NORMAL] * len(self.tokens)
        self.scores = md.get("tokenizer.ggml.scores")
        self._md = md
        spm = self.kind == "llama"
        bpe_pre = PRE_TOKENIZERS.get(self.pre) if self.kind == "gpt2" else None
        self.add_space_prefix = bool(md.get("tokenizer.ggml.add_space_prefix", spm))
        default_bos = spm or bool(bpe_pre and bpe_pre[2])
        self.add_bos = bool(md.get("tokenizer.ggml.add_bos_token", default_bos))
        self.add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        self.bos_id = md.get("tokenizer.ggml.bos_token_id", 1 if spm else 11)
        self.eos_id = md.get("tokenizer.ggml.eos_token_id", 2 if spm else 11)
        self.attrs = self._attributes()
        self._cache = {}
        self._ready = False

    # -- attributes (llama_vocab::impl::load) ------------------------------------------------
    def _attributes(self):
        attrs = [_ATTR.get(t, A_UNDEFINED) for t in self.types]
        attrs += [A_NORMAL] * (len(self.tokens) - len(attrs))
        md = self._md
        ids = {}
        for i, t in enumerate(self.tokens):
            ids.setdefault(t, i)
        for key, texts in zip(_FIM_KEYS, _FIM_TEXTS):
            if f"tokenizer.ggml.{key}_token_id" in md:
                continue
            found = [ids[t] for t in texts if t in ids]
            if found:
                attrs[min(found)] |= A_CONTROL
        for t in EOG_TEXTS:
            if t in ids:
                attrs[ids[t]] |= A_CONTROL
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if t in ids:
                attrs[ids[t]] = A_USER_DEFINED
        if all(t in ids for t in ("<|return|>", "<|call|>", "<|end|>")) or \
                all(t in ids for t in ("<|calls|>", "<|flush|>", "<|end|>")):
            attrs[ids["<|end|>"]] = A_USER_DEFINED
        if "<|tool_response>" in ids and "</s>" in ids:
            attrs[ids["</s>"]] = A_NORMAL
        return attrs

    # -- ids -> text (llama_token_to_piece) ---------------------------------------------------
    def piece(self, i: int, special: bool = False) -> bytes:
        """The bytes token ``i`` stands for, as ``llama_token_to_piece(i, lstrip=0, special)``."""
        key = (i, special)
        got = self._cache.get(key)
        if got is not None:
            return got
        a = self.attrs[i]
        text = self.tokens[i]
        if a & (A_UNKNOWN | A_CONTROL) and not special:
            out = b""
        elif a & (A_UNKNOWN | A_CONTROL | A_USER_DEFINED):
            out = text.encode("utf-8")
        elif a & A_NORMAL:
            if self.kind == "gpt2":
                out = bytearray()
                for ch in text:
                    b = _U2B.get(ch)
                    if b is None:   # llama_decode_text's marker for a character off the table
                        out += (b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() +
                                text.encode("utf-8") + b"]")
                    else:
                        out.append(b)
                out = bytes(out)
            else:
                out = text.replace("\u2581", " ").encode("utf-8")
        elif a & A_BYTE:
            out = bytes([int(text[3:5], 16)])
        else:
            out = b""
        self._cache[key] = out
        return out

    def detokenize(self, ids, special: bool = False) -> str:
        return b"".join(self.piece(int(i), special) for i in ids).decode("utf-8", "replace")

    def decoder(self, special: bool = False):
        """A function ``id -> text`` for streaming (holds back incomplete UTF-8 sequences)."""
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        return lambda i: dec.decode(self.piece(int(i), special))

    # -- text -> ids (llama_tokenize) ---------------------------------------------------------
    def _prepare(self):
        if self._ready:
            return
        if self.kind not in ("gpt2", "llama"):
            raise ValueError(f"tokenizer.ggml.model {self.kind!r}: numba_qk.models tokenizes "
                             f"'gpt2' (BPE) and 'llama' (SentencePiece) vocabularies")
        if self.kind == "gpt2":
            if self.pre not in PRE_TOKENIZERS:
                raise ValueError(
                    f"tokenizer.ggml.pre {self.pre!r} is not supported by numba_qk.models "
                    f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
            self._exprs, self._ignore_merges, _ = PRE_TOKENIZERS[self.pre]
            self._tok = {}
            for i, t in enumerate(self.tokens):
                self._tok.setdefault(t, i)
            ranks = {}
            for r, m in enumerate(self._md.get("tokenizer.ggml.merges") or []):
                p = m.find(" ", 1)
                pair = (m[:p], m[p + 1:]) if p != -1 else ("", "")
                ranks.setdefault(pair, r)
            self._ranks = ranks
            self._words = {}
        else:
            self._tok = {}
            for i, t in enumerate(self.tokens):
                self._tok.setdefault(t.encode("utf-8"), i)
            sc = self.scores
            self._score = [float(s) for s in sc] if sc is not None else [0.0] * len(self.tokens)
        by_len = sorted((i for i, a in enumerate(self.attrs)
                         if a & (A_CONTROL | A_USER_DEFINED | A_UNKNOWN)),
                        key=lambda i: -len(self.tokens[i].encode("utf-8")))
        self._specials = [(i, self.tokens[i].encode("utf-8"), self.attrs[i]) for i in by_len]
        self._ready = True

    def tokenize(self, text, add_bos: bool = True, special: bool = False) -> list:
        """Token ids of ``text`` (str or UTF-8 bytes) as ``llama_tokenize(text, add_special=
        add_bos, parse_special=special)``: BOS (and EOS) only where the file asks for them;
        control tokens written in the text are recognised only with ``special`` (user-defined
        ones always)."""
        self._prepare()
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        frags = self._partition(raw, special) if raw else []
        out = []
        if self.kind == "llama":
            if add_bos and self.add_bos:
                out.append(self.bos_id)
            prev_special = True
            for fr in frags:
                if isinstance(fr, int):
                    out.append(fr)
                    prev_special = True
                    continue
                t = raw[fr[0]:fr[1]]
                if self.add_space_prefix and prev_special:
                    t = b" " + t
                self._spm(t.replace(b" ", "\u2581".encode()), out)
                prev_special = False
        else:
            if add_bos and self.add_bos:
                out.append(self.bos_id)
            for fr in frags:
                if isinstance(fr, int):
                    out.append(fr)
                else:
                    self._bpe(raw[fr[0]:fr[1]], out)
        if add_bos and self.add_eos:
            out.append(self.eos_id)
        return out

    def _partition(self, raw: bytes, special: bool):
        """tokenizer_st_partition: a list of token ids and (start, end) spans of plain text."""
        frags = [(0, len(raw))]
        for tid, text, attr in self._specials:
            if not special and attr & (A_CONTROL | A_UNKNOWN):
                continue
            if text not in raw:
                continue
            new = []
            for fr in frags:
                if isinstance(fr, int):
                    new.append(fr)
                    continue
                lo, hi = fr
                while True:
                    at = raw.find(text, lo, hi)
                    if at < 0:
                        if lo < hi:
                            new.append((lo, hi))
                        break
                    if at > lo:
                        new.append((lo, at))
                    new.append(tid)
                    lo = at + len(text)
            frags = new
        return frags

    # BPE ---------------------------------------------------------------------------------------
    def _bpe(self, raw: bytes, out: list):
        words = U.regex_split(U.cpts_from_utf8(raw), self._exprs)
        cache = self._words
        for w in words:
            got = cache.get(w)
            if got is None:
                enc = w.encode("utf-8", "surrogatepass").decode("latin-1") \
                    .translate(_LATIN1_TO_GPT2)
                got = self._bpe_word(enc)
                if len(cache) < 100_000:
                    cache[w] = got
            out.extend(got)

    def _bpe_word(self, word: str) -> list:
        tok = self._tok
        if not word:
            return []
        if self._ignore_merges and word in tok:
            return [tok[word]]
        ranks = self._ranks
        n = len(word)
        start = list(range(n))
        size = [1] * n
        heap = []

        def add(left, right):
            a = word[start[left]:start[left] + size[left]]
            b = word[start[right]:start[right] + size[right]]
            r = ranks.get((a, b))
            if r is not None:
                heapq.heappush(heap, (r, left, right, a + b))

        def stale(e):   # llama.cpp re-reads both texts
            _, left, right, text = e
            return word[start[left]:start[left] + size[left]] + \
                word[start[right]:start[right] + size[right]] != text

        nxt = _merge_pairs(heap, size, add, stale)
        ids = []
        i = 0
        while i != -1:
            if size[i]:
                s = word[start[i]:start[i] + size[i]]
                t = tok.get(s)
                if t is not None:
                    ids.append(t)
                else:   # one token per byte of the piece's UTF-8 text, where there is one
                    for b in s.encode("utf-8"):
                        t = tok.get(chr(b)) if b < 0x80 else None
                        if t is not None:
                            ids.append(t)
            i = nxt[i]
        return ids

    # SentencePiece -----------------------------------------------------------------------------
    def _spm(self, text: bytes, out: list):
        tok = self._tok
        score = self._score
        n_vocab = len(self.tokens)
        n = len(text)
        if n == 0:
            return
        start, size = [], []
        off = 0
        while off < n:
            ln = min((1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[text[off] >> 4], n - off)
            start.append(off)
            size.append(ln)
            off += ln
        heap = []
        rev = {}

        def add(left, right):
            s = text[start[left]:start[left] + size[left] + size[right]]
            t = tok.get(s)
            if t is None or t >= n_vocab:
                return
            heapq.heappush(heap, (-score[t], left, right, len(s)))
            rev[s] = (left, right)

        nxt = _merge_pairs(heap, size, add, lambda e: size[e[1]] + size[e[2]] != e[3])

        def resegment(i):
            s = text[start[i]:start[i] + size[i]]
            t = tok.get(s)
            if t is not None:
                out.append(t)
                return
            p = rev.get(s)
            if p is None:
                for b in s:
                    out.append(self._byte_token(b))
                return
            resegment(p[0])
            resegment(p[1])

        i = 0
        while i != -1:
            resegment(i)
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        t = self._tok.get(f"<0x{b:02X}>".encode())
        if t is None:
            t = self._tok.get(bytes([b]))
        if t is None:
            raise KeyError(f"the vocabulary has no token for byte 0x{b:02X}")
        return t
