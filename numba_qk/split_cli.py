"""``python -m numba_qk gguf-split``: llama.cpp's ``llama-gguf-split`` command line.

``gguf-split [--split] [--split-max-tensors N | --split-max-size N(M|G)]
[--no-tensor-first-split] [--dry-run] IN OUT_PREFIX`` writes ``OUT_PREFIX-0000K-of-0000N.gguf``
(by 128 tensors when no limit is given), ``gguf-split --merge [--delete-splits] FIRST_SHARD OUT``
one file: byte-identical to llama-gguf-split's (tests/io/test_llama_tools.py). The CLI layer
only: the work is :func:`numba_qk.gguf.split_file` and :func:`numba_qk.gguf.merge_file`.

Where numba_qk differs: every output is written to a temporary file and renamed (an error or a
signal leaves no partial shard), so ``--delete-splits`` removes the shards only once the merged
file is in place -- llama-gguf-split deletes each shard as it goes and warns that a failure
then loses the model.
"""

from __future__ import annotations

import os
import sys

__all__ = ["add_parser", "run"]

DEFAULT_MAX_TENSORS = 128   # llama-gguf-split's default n_split_tensors


def add_parser(sub):
    from numba_qk.quantize_cli import add_split_limits, add_switches

    p = sub.add_parser(
        "gguf-split", help="split or merge a GGUF model: llama-gguf-split's command line",
        usage="python -m numba_qk gguf-split [--split | --merge] [--split-max-tensors N | "
              "--split-max-size N(M|G)] [--no-tensor-first-split] [--dry-run] "
              "[--delete-splits] IN OUT",
        description="llama-gguf-split's command line, byte-identical files: --split (the "
                    "default) writes OUT-0000K-of-0000N.gguf, --merge joins a split model "
                    "given by its first shard into OUT.")
    op = p.add_mutually_exclusive_group()
    op.add_argument("--split", dest="merge", action="store_false",
                    help="split IN into shards OUT-0000K-of-0000N.gguf (the default)")
    op.add_argument("--merge", dest="merge", action="store_true",
                    help="merge the split model whose first shard is IN into OUT")
    add_split_limits(p.add_mutually_exclusive_group(),
                     f"at most N tensors per shard (default: {DEFAULT_MAX_TENSORS})",
                     "at most N megabytes (M, 10^6 bytes) or gigabytes (G) of tensor data per "
                     "shard")
    add_switches(p, ("--no-tensor-first-split", "the first shard holds the metadata only"),
                 ("--dry-run", "print the split plan (or check the shards of a merge) and write "
                               "nothing"),
                 ("--delete-splits", "merge: delete the shards once the merged file is written"))
    p.add_argument("input", metavar="IN", help="GGUF file to split (a split model by its first "
                                                "shard), or the first shard to merge")
    p.add_argument("output", metavar="OUT", help="prefix of the shards, or the merged file")
    p.set_defaults(merge=False)
    return p


def run(args, parser) -> int:
    from numba_qk import gguf
    from numba_qk.quantize_cli import split_limits

    def say(line):
        print(line, flush=True)

    if args.merge:
        if args.split_max_tensors is not None or args.split_max_size is not None or \
                args.no_tensor_first_split:
            parser.error("--split-max-tensors, --split-max-size and --no-tensor-first-split "
                         "go with --split")
        if os.path.exists(args.output):   # llama-gguf-split refuses too
            raise gguf.GGUFError(f"gguf_merge: output file {args.output} already exists")
        with gguf.open(args.input) as f:
            shards = f.split_paths
        gguf.merge_file(args.input, args.output, dry_run=args.dry_run,
                        progress=lambda line: print(line, file=sys.stderr))
        if args.dry_run:
            say(f"gguf_merge: {len(shards)} shards of {args.input} checked, nothing written")
            return 0
        if args.delete_splits:
            for path in shards:
                os.remove(path)
                print(f"gguf_merge: deleted file {path}", file=sys.stderr)
        print(f"gguf_merge: {args.output} merged from {len(shards)} split", file=sys.stderr)
        return 0
    if args.delete_splits:
        parser.error("--delete-splits goes with --merge")
    tensors, size = split_limits(args, parser)   # at most one of them (exclusive options)
    tensors = None if size is not None else (tensors or DEFAULT_MAX_TENSORS)
    paths = gguf.split_file(args.input, args.output, max_tensors=tensors, max_size=size,
                            no_tensor_first_split=args.no_tensor_first_split,
                            dry_run=args.dry_run,
                            progress=lambda line: say(line) if line.startswith(
                                ("n_split", "split ")) else print(line, file=sys.stderr))
    if not args.dry_run:
        print(f"gguf_split: {len(paths)} gguf split written", file=sys.stderr)
    return 0
