"""Small but realistic tokenizer vocabularies for the tiny models (tiny_models.write_tiny_model's
``vocab=``), built deterministically from TRAIN, and the corpus of hard strings their token ids
are checked on against llama.cpp (golden/tokenizer.json, made by tools/gen_models_golden.py).

* BPE (``gpt2``): control and user-defined specials, the 256 byte-level characters, ~260 merges
  learned here from TRAIN (one whose result is left out of the vocabulary, so llama.cpp's
  per-byte fallback runs), for several ``tokenizer.ggml.pre`` types.
* SentencePiece (``llama``): unknown/control/user-defined/unused specials, the 256 ``<0xXX>``
  byte tokens, single characters and frequent substrings of TRAIN with scores (some tied), with
  and without ``add_space_prefix``.
"""

import re
from collections import Counter

from numba_qk.models._vocab import gpt2_byte_to_unicode

TRAIN = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away! "
    "Hello world, hello there. It's a test: we're testing the tokenizer and they've said "
    "it'll work, I'm sure. Numbers: 123 456 7890 2024 3.14 and 1,000,000. "
    "def hello(x):\n    return x + 1\n\nif x == 2:\n\tprint('hi')\n"
    "Café, naïve, résumé. 日本語 テキスト 中文 你好 世界. Привет мир. "
    "<html><body>text</body></html> https://example.com/a?b=c "
    "the the the and and of of to to in in is is that that with with for for"
)

CORPUS = [
    "", " ", "  ", "\n", "\n\n\n", " \n ", "\t", "\r\n", "Hello world", " Hello world",
    "hello   world  ", "  leading", "The quick brown fox jumps over the lazy dog.",
    "It's I'M they've WE'RE it'll you'd", "123 4567 89012 3.14 1,000", "a1b22c333",
    "٣٤ ½ Ⅻ ²", "日本語のテキスト", "你好，世界！", "Привет мир", "Café naïve résumé",
    "emoji 😀 👍🏽 👨‍👩‍👧", "zero\u200bwidth nbsp\u00a0x ideo\u3000y em\u2003z",
    "def hello(x):\n    return x + 1\n", "\tindented\n\t\tmore", "<html><body>t</body></html>",
    "https://example.com/a?b=c&d=e", "$100 + 20% = ???", "....!!!", "'''quoted'''",
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>", "x<tool>y <tool>", "<s>a</s>",
    "<ctrl> <ud>z<ud>", "<unused0>", "\n\nafter", "▁escaped▁", "xyz xy zz", "\x00\x1f\x7f",
    "a" * 40, "the the the", "𝕳𝖊 \U0001FAE8", "\u0301\u0301", "ÿþ",
]
# not valid UTF-8 (tokenized as bytes)
CORPUS_BYTES = [b"\xff\xfe bad", b"cut\xe2\x82", b"\xc0\x80 overlong", b"\xed\xa0\x80 surr",
                b"caf\xc3"]

BPE_SPECIALS = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool>", 4)]
SPM_SPECIALS = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("<ctrl>", 3), ("<ud>", 4),
                ("\n\n", 4), ("<unused0>", 5)]


def bpe_vocab(pre="smollm", n_merges=260):
    """tokens, token types, merges (GPT-2 byte-level BPE learned from TRAIN)."""
    b2u = gpt2_byte_to_unicode()
    words = Counter("".join(b2u[b] for b in w.encode("utf-8"))
                    for w in re.findall(r" ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+", TRAIN))
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, seq in seqs.items():
            for a, b in zip(seq, seq[1:]):
                pairs[(a, b)] += words[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    # digits merged across a space and a pair whose result has no token
    merges += [("Ġ", "1"), ("1", "2"), ("x", "y")]
    tokens = [t for t, _ in BPE_SPECIALS] + [b2u[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen and a + b != "xy":
            tokens.append(a + b)
            seen.add(a + b)
    types = [t for _, t in BPE_SPECIALS] + [1] * (len(tokens) - len(BPE_SPECIALS))
    return dict(model="gpt2", pre=pre, tokens=tokens, types=types,
                merges=[f"{a} {b}" for a, b in merges], bos=0, eos=0)


def spm_vocab(add_space_prefix=None, n_pieces=300):
    """tokens, token types, scores (SentencePiece-style, from TRAIN's frequent substrings)."""
    text = "\u2581" + TRAIN.replace(" ", "\u2581")
    chars = sorted(set(text))
    grams = Counter()
    for n in range(2, 7):
        for i in range(len(text) - n + 1):
            g = text[i:i + n]
            if "\n" not in g:
                grams[g] += 1
    best = sorted((g for g, c in grams.items() if c >= 2), key=lambda g: (-grams[g] * len(g), g))
    pieces = []
    seen = set(chars) | {t for t, _ in SPM_SPECIALS}
    for g in best:
        if g not in seen:
            pieces.append(g)
            seen.add(g)
        if len(pieces) == n_pieces:
            break
    tokens = [t for t, _ in SPM_SPECIALS] + [f"<0x{b:02X}>" for b in range(256)]
    types = [t for _, t in SPM_SPECIALS] + [6] * 256
    scores = [0.0] * len(tokens)
    for c in chars:
        if c not in {t for t, _ in SPM_SPECIALS}:
            tokens.append(c)
            types.append(1)
            scores.append(-1000.0)
    for rank, g in enumerate(pieces):
        tokens.append(g)
        types.append(1)
        scores.append(-float(rank // 3))      # ties in threes: the leftmost pair merges first
    v = dict(model="llama", pre="default", tokens=tokens, types=types, scores=scores, bos=1,
             eos=2)
    if add_space_prefix is not None:
        v["add_space_prefix"] = add_space_prefix
    return v


VARIANTS = {
    "bpe_smollm": lambda: bpe_vocab("smollm"),
    "bpe_gpt2": lambda: bpe_vocab("gpt-2"),
    "bpe_default": lambda: bpe_vocab("default"),
    "bpe_llama3": lambda: bpe_vocab("llama-bpe"),
    "bpe_qwen2": lambda: bpe_vocab("qwen2"),
    "spm": lambda: spm_vocab(None),
    "spm_no_prefix": lambda: spm_vocab(False),
}

# the opt-in real-model check (tests/models/test_real_models.py): CORPUS and more
REAL_CORPUS = CORPUS + [
    "   ", "\n\n", "\n ", " \t\n \t", "Hello World!", "Hello\tworld\n", "trailing spaces   ",
    "multiple\n\n\nnewlines\n", "I'm sure you've got it, don't you? We'll see. HERE'S IT'S",
    "1", "12", "123", "1234", "12345678901234567890", "3.14159 2,000,000 1e-9 0x1F",
    "The year 2024 had 366 days.", "٣٤٥ ४५६ ½ ² Ⅻ", "日本語のテキストです。",
    "中文分词测试，你好世界！", "한국어 텍스트", "Привет, мир!", "Ελληνικά κείμενα",
    "עברית مرحبا بالعالم", "ไทย ภาษา", "Tiếng Việt có dấu", "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "❤️ ✨ ☕", "naïve café résumé Ångström", "e\u0301 combining", "zero\u200bwidth\u200djoiner",
    "nbsp\u00a0here", "ideo\u3000space", "en\u2003em\u2009thin", "line\u2028sep", "\u0085nel",
    "soft\u00adhyphen", "\ufeffbom", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n", "<eos>",
    "<pad><unk><mask>", "text<|im_start|>", "<|im_start", "<<|im_end|>>",
    "if (a && b) { c[i] = d->e; }", "<html><body class=\"x\">&amp;</body></html>",
    "$100 + €200 = £300; 50% off!!! ???", "---===***~~~", "\"quoted\"",
    "snake_case_name CamelCaseName kebab-case-name", "ALLCAPS lowercase MiXeD",
    "tab\tseparated\tvalues\t", "    four spaces", "\t\ttabs", "a  b   c    d     e",
    "\u0000\u001f\u001c", "𝕳𝖊𝖑𝖑𝖔 𝟙𝟚𝟛", "\U0001F9E0\U0001FAE8", "\U00031350", "ﬁ ligature ﬀ",
    "Ｆｕｌｌｗｉｄｔｈ １２３", "¡Hola! ¿Qué tal?", "Ω≈ç√∫˜µ≤≥÷", " " * 40 + "x", "\n" * 20,
    "ab" * 50, "▁", "▁▁ ▁", "<start_of_image>", "<unused12>x", "<|fim_prefix|>a<fim_suffix>",
]
# (not b"\xf5\x80\x80\x80": a code point above U+10FFFF aborts llama.cpp's BPE tokenizer, an
# uncaught std::invalid_argument; numba_qk raises ValueError)
REAL_CORPUS_BYTES = CORPUS_BYTES + [b"\x80\x80", b"\xf0\x9f\x98", b"a\xe2b"]
