"""The Unicode pieces of llama.cpp's tokenizers (src/unicode.cpp), in plain Python.

* :func:`cpts_from_utf8` decodes bytes the way ``unicode_cpts_from_utf8`` does (no overlong or
  surrogate checks; each byte that does not start a well-formed sequence becomes U+FFFD).
* :func:`flags` gives a code point's category flags as ``unicode_cpt_flags``: the general
  category's first letter (``\\p{L}``, ``\\p{N}``, ...), UNDEFINED for unassigned code points, and
  WHITESPACE for llama.cpp's 24 white-space code points (no U+3000).  Categories come from
  :mod:`unicodedata`; llama.cpp's tables are Unicode 15.1, so the code points assigned in Unicode
  15.0/15.1 are listed here for Pythons whose tables are older (3.11 has 14.0).  Code points
  assigned after 15.1 are unassigned for llama.cpp and may differ on a newer Python.
* :func:`regex_split` is ``unicode_regex_split``: the hand-written GPT-2 and Llama-3 splitters
  for those two expressions, every other expression run over llama.cpp's "collapsed" text (each
  non-ASCII code point replaced by one byte naming its category) with Python's :mod:`re`, as
  llama.cpp runs ``std::regex`` over it.
"""

from __future__ import annotations

import re
import unicodedata

UNDEFINED = 0x0001
NUMBER = 0x0002
LETTER = 0x0004
SEPARATOR = 0x0008
ACCENT_MARK = 0x0010
PUNCTUATION = 0x0020
SYMBOL = 0x0040
CONTROL = 0x0080
WHITESPACE = 0x0100

_CATEGORY = {"C": CONTROL, "L": LETTER, "N": NUMBER, "Z": SEPARATOR, "M": ACCENT_MARK,
             "P": PUNCTUATION, "S": SYMBOL}
_WHITESPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                         *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F])
# (first, end, flag): code points assigned in Unicode 15.0 and 15.1 (unassigned in 14.0)
_UNICODE_15 = (
    (0xCF3, 0xCF4, 16), (0xECE, 0xECF, 16), (0x2FFC, 0x3000, 64), (0x31EF, 0x31F0, 64),
    (0x10EFD, 0x10F00, 16), (0x1123F, 0x11241, 4), (0x11241, 0x11242, 16),
    (0x11B00, 0x11B0A, 32), (0x11F00, 0x11F02, 16), (0x11F02, 0x11F03, 4),
    (0x11F03, 0x11F04, 16), (0x11F04, 0x11F11, 4), (0x11F12, 0x11F34, 4),
    (0x11F34, 0x11F3B, 16), (0x11F3E, 0x11F43, 16), (0x11F43, 0x11F50, 32),
    (0x11F50, 0x11F5A, 2), (0x1342F, 0x13430, 4), (0x13439, 0x13440, 128),
    (0x13440, 0x13441, 16), (0x13441, 0x13447, 4), (0x13447, 0x13456, 16),
    (0x1B132, 0x1B133, 4), (0x1B155, 0x1B156, 4), (0x1D2C0, 0x1D2D4, 2),
    (0x1DF25, 0x1DF2B, 4), (0x1E030, 0x1E06E, 4), (0x1E08F, 0x1E090, 16),
    (0x1E4D0, 0x1E4EC, 4), (0x1E4EC, 0x1E4F0, 16), (0x1E4F0, 0x1E4FA, 2),
    (0x1F6DC, 0x1F6DD, 64), (0x1F774, 0x1F777, 64), (0x1F77B, 0x1F780, 64),
    (0x1F7D9, 0x1F7DA, 64), (0x1FA75, 0x1FA78, 64), (0x1FA87, 0x1FA89, 64),
    (0x1FAAD, 0x1FAB0, 64), (0x1FABB, 0x1FABE, 64), (0x1FABF, 0x1FAC0, 64),
    (0x1FACE, 0x1FAD0, 64), (0x1FADA, 0x1FADC, 64), (0x1FAE8, 0x1FAE9, 64),
    (0x1FAF7, 0x1FAF9, 64), (0x2B739, 0x2B73A, 4), (0x2EBF0, 0x2EE5E, 4),
    (0x31350, 0x323B0, 4),
)

_flags_cache: dict = {}


def flags(cp: int) -> int:
    """llama.cpp's ``unicode_cpt_flags_from_cpt(cp).as_uint()`` (case and NFD bits left out)."""
    got = _flags_cache.get(cp)
    if got is not None:
        return got
    if cp >= 0x110000:
        f = UNDEFINED
    else:
        cat = unicodedata.category(chr(cp))
        if cat == "Cn":
            f = UNDEFINED
            for lo, hi, fl in _UNICODE_15:
                if lo <= cp < hi:
                    f = fl
                    break
        else:
            f = _CATEGORY[cat[0]]
        if cp in _WHITESPACE:
            f |= WHITESPACE
    _flags_cache[cp] = f
    return f


def cpts_from_utf8(data: bytes) -> str:
    """``unicode_cpts_from_utf8`` as a str (one character per code point)."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        pass
    out = []
    n = len(data)
    i = 0
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(b)
            i += 1
            continue
        need = 0 if not b & 0x40 else 1 if not b & 0x20 else 2 if not b & 0x10 else \
            3 if not b & 0x08 else 0
        if need and i + need < n + 0 and all((data[i + k] & 0xC0) == 0x80
                                               for k in range(1, need + 1)):
            cp = b & (0x1F, 0x0F, 0x07)[need - 1]
            for k in range(1, need + 1):
                cp = (cp << 6) | (data[i + k] & 0x3F)
            if cp > 0x10FFFF:   # unicode_cpt_to_utf8 throws "invalid codepoint" on these
                raise ValueError(f"invalid code point U+{cp:X} in the text (byte {i})")
            out.append(cp)
            i += need + 1
        else:
            out.append(0xFFFD)
            i += 1
    return "".join(map(chr, out))


# ------------------------------------------------------------------------------ splitters

GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
LLAMA3_REGEXES = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
)


def _contraction(s, pos, end, fold):
    """Length of 's|'t|'re|'ve|'m|'ll|'d at ``pos`` (0 if none); ``fold``: ASCII case-folded."""
    if s[pos] != "'" or pos + 1 >= end:
        return 0
    c1 = s[pos + 1].lower() if fold and s[pos + 1] < "\x80" else s[pos + 1]
    if c1 in "stmd":
        return 2
    if pos + 2 < end:
        c2 = s[pos + 2].lower() if fold and s[pos + 2] < "\x80" else s[pos + 2]
        if c1 + c2 in ("re", "ve", "ll"):
            return 3
    return 0


def _symbols(f, pos):
    """End of the run of [^\\s\\p{L}\\p{N}] (defined code points) from ``pos``."""
    while True:
        g = f(pos)
        if g & (WHITESPACE | LETTER | NUMBER) or not g:
            return pos
        pos += 1


def _spaces(s, f, pos, end, newlines):
    """The white-space alternatives: (\\s*[\\r\\n]+ when ``newlines``,) \\s+(?!\\S), \\s+,
    or one code point when none matches."""
    n = 0
    last_rn = 0
    while f(pos + n) & WHITESPACE:
        if newlines and s[pos + n] in "\r\n":
            last_rn = pos + n + 1
        n += 1
    if last_rn > 0:
        return last_rn
    if n > 1 and pos + n < end:
        return pos + n - 1
    return pos + (n or 1)


def _gpt2_word(s, fl, f, pos, end):
    """End of the word at ``pos`` under unicode_regex_split_custom_gpt2."""
    n = _contraction(s, pos, end, False)
    if n:
        return pos + n
    c = s[pos]
    f2 = f(pos + 1) if c == " " else fl[pos]
    for cls in (LETTER, NUMBER):
        if f2 & cls:
            pos += c == " "
            while f(pos) & cls:
                pos += 1
            return pos
    if not f2 & (WHITESPACE | LETTER | NUMBER) and f2:
        return _symbols(f, pos + (c == " "))
    return _spaces(s, f, pos, end, False)


def _llama3_word(s, fl, f, pos, end):
    """End of the word at ``pos`` under unicode_regex_split_custom_llama3."""
    n = _contraction(s, pos, end, True)
    if n:
        return pos + n
    c = s[pos]
    fc = fl[pos]
    if not (c == "\r" or c == "\n" or fc & NUMBER) and (fc & LETTER or f(pos + 1) & LETTER):
        pos += 1
        while f(pos) & LETTER:
            pos += 1
        return pos
    if fc & NUMBER:                      # \p{N}{1,3}: the rest of a longer run comes next
        ini = pos
        while f(pos) & NUMBER and pos - ini < 3:
            pos += 1
        return pos
    f2 = f(pos + 1) if c == " " else fc
    if not f2 & (WHITESPACE | LETTER | NUMBER) and fc:
        pos = _symbols(f, pos + (c == " "))
        while pos < end and s[pos] in "\r\n":
            pos += 1
        return pos
    return _spaces(s, f, pos, end, True)


def _split_custom(s, fl, offsets, word):
    out = []
    start = 0
    for off in offsets:
        end = start + off
        pos = start
        start = end

        def f(p):
            return fl[p] if p < end else 0

        while pos < end:
            nxt = word(s, fl, f, pos, end)
            out.append(nxt - pos)
            pos = nxt
    return out


# the byte each category collapses to, and the ASCII members llama.cpp adds to a \p{..} class
_UCAT = {"\\p{N}": NUMBER, "\\p{L}": LETTER, "\\p{P}": PUNCTUATION, "\\p{M}": ACCENT_MARK,
         "\\p{S}": SYMBOL, "\\p{Lu}": LETTER, "\\p{Ll}": LETTER, "\\p{Lt}": LETTER,
         "\\p{Lm}": LETTER, "\\p{Lo}": LETTER}
_UCAT_BYTE = {NUMBER: "\xD1", LETTER: "\xD2", PUNCTUATION: "\xD3", ACCENT_MARK: "\xD4",
              SYMBOL: "\xD5"}
_UCAT_ASCII = {NUMBER: "0-9", LETTER: "A-Za-z",
               PUNCTUATION: "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}", ACCENT_MARK: "",
               SYMBOL: "\\$\\+<->^`\\|"}
_ASCII_SPACE = "\\t\\n\\x0b\\x0c\\r "      # std::regex's \s on char: isspace in the C locale


def _collapse_regex(expr):
    """llama.cpp's collapsed form of ``expr`` (each \\p{..} by its byte and ASCII members), then
    rewritten for Python's re: \\s and \\S name only ASCII white space, as std::regex's do."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and ch == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            pat = expr[i:close + 1] if close != -1 and close <= i + 10 else None
            if pat in _UCAT:
                cat = _UCAT[pat]
                body = _UCAT_BYTE[cat] + _UCAT_ASCII[cat]
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
        if expr.startswith("\\s", i):
            out.append(_ASCII_SPACE if inside else "[" + _ASCII_SPACE + "]")
            i += 2
            continue
        if expr.startswith("\\S", i) and not inside:
            out.append("[^" + _ASCII_SPACE + "]")
            i += 2
            continue
        if expr.startswith("\\", i):
            out.append(expr[i:i + 2])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


_compiled: dict = {}


def _split_regex(text, offsets, expr):
    pat = _compiled.get(expr)
    if pat is None:
        pat = _compiled[expr] = re.compile(_collapse_regex(expr))
    out = []
    start = 0
    for off in offsets:
        end = start + off
        prev = start
        for m in pat.finditer(text, start, end):
            if m.start() > prev:
                out.append(m.start() - prev)
            if m.end() > m.start():
                out.append(m.end() - m.start())
            prev = m.end()
        if prev < end:
            out.append(end - prev)
        start = end
    return out


def _collapsed_text(s, fl):
    out = []
    for c, f in zip(s, fl):
        if c < "\x80":
            out.append(c)
        elif f & WHITESPACE:
            out.append("\x0b")
        else:
            out.append(_UCAT_BYTE.get(f & 0xFF, "\xD0"))
    return "".join(out)


def regex_split(s: str, exprs) -> list:
    """``unicode_regex_split``: the words of ``s`` (code points, as a str) under the expressions
    applied one after another, each to the pieces the one before made."""
    fl = [flags(ord(c)) for c in s]
    offsets = [len(s)]
    collapsed = plain = None
    for expr in exprs:
        if expr == GPT2_REGEX:
            offsets = _split_custom(s, fl, offsets, _gpt2_word)
        elif expr in LLAMA3_REGEXES:
            offsets = _split_custom(s, fl, offsets, _llama3_word)
        elif any(k in expr for k in _UCAT):
            if collapsed is None:
                collapsed = _collapsed_text(s, fl)
            offsets = _split_regex(collapsed, offsets, expr)
        else:   # std::wregex over the code points, non-ASCII white space as \x0b
            if plain is None:
                plain = "".join("\x0b" if c >= "\x80" and f & WHITESPACE else c
                                for c, f in zip(s, fl))
            offsets = _split_regex(plain, offsets, expr)
        if not offsets:
            return []
    words = []
    start = 0
    for off in offsets:
        words.append(s[start:start + off])
        start += off
    return words
