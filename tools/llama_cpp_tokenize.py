"""llama.cpp's token ids for a list of texts, and its pieces of every token, run in the
interpreter that has llama-cpp-python (e.g. /work/.native-ggml/bin/python):

    python tools/llama_cpp_tokenize.py MODEL TEXTS.json OUT.json

TEXTS.json is a list of hex-encoded byte strings.  OUT.json gets, per text, ``ids`` for the four
``(add_special, parse_special)`` combinations ("00", "01", "10", "11") and ``text`` per special
flag: the concatenated ``llama_token_to_piece`` of the ``parse_special`` ids (hex); and
``pieces_sha256`` per special flag: sha256 over every token's piece, each prefixed by its
length as 4 little-endian bytes.  Needs only llama_cpp.
"""

import ctypes
import hashlib
import json
import sys


def main():
    import llama_cpp

    path, texts, out = sys.argv[1:4]
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    buf = ctypes.create_string_buffer(1 << 16)

    def piece(i, special):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
        return buf.raw[:n]

    rows = []
    for h in json.load(open(texts)):
        raw = bytes.fromhex(h)
        row = {"raw": h, "ids": {}, "text": {}}
        for add in (0, 1):
            for sp in (0, 1):
                row["ids"][f"{add}{sp}"] = llm.tokenize(raw, add_bos=bool(add), special=bool(sp))
        for sp in (0, 1):
            row["text"][str(sp)] = b"".join(piece(i, bool(sp))
                                            for i in row["ids"][f"0{sp}"]).hex()
        rows.append(row)
    sha = {}
    for sp in (0, 1):
        h = hashlib.sha256()
        for i in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            p = piece(i, bool(sp))
            h.update(len(p).to_bytes(4, "little") + p)
        sha[str(sp)] = h.hexdigest()
    json.dump({"cases": rows, "pieces_sha256": sha}, open(out, "w"))


if __name__ == "__main__":
    main()
