"""``python -m numba_qk quantize``: llama-quantize's command line beside numba_qk's own.

Two forms, told apart as llama-quantize tells its own arguments apart:

* llama-quantize's: ``quantize [FLAGS] IN [OUT] TYPE [NTHREADS]`` -- TYPE a preset name in any
  case (``q4_k_m``), an alias (``Q4_K``) or llama.cpp's numeric file type (``15``); when the
  argument after IN is a TYPE, OUT is llama-quantize's default ``<IN's directory>/ggml-model-
  <TYPE>.gguf``. The same flags as llama-quantize, with its parsing (``--tensor-type`` names
  lower-cased and split at the first ``=``, ``--override-kv KEY=TYPE:VALUE`` …).
* numba_qk's: ``quantize [IN [OUT]] --to PRESET`` or ``--type FORMAT`` (one format for every
  F32/F16/BF16 2-D tensor), and ``quantize [IN [OUT]]`` alone (``--type q4_k``).

The output is byte-identical to llama.cpp's for the same arguments (see docs/llama-quantize.md
for what was compared). The CLI layer only: the work is :func:`numba_qk.gguf.quantize_file`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

__all__ = ["add_parser", "run", "preset_listing", "human_size", "split_max_size", "add_switches",
           "add_split_limits", "split_limits"]

_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")


def preset_listing() -> str:
    """llama-quantize's "allowed quantization types" table, from numba_qk.presets.PRESETS."""
    from numba_qk.presets import PRESETS

    lines = ["allowed quantization types (llama-quantize's table; TYPE is the name in any case "
             "or the number):", ""]
    for p in PRESETS:
        head = f"  {p.ftype:2d}  or  " if p.name != "COPY" else " " * 10
        lines.append(f"{head}{p.name:<7s} : {p.description}")
    return "\n".join(lines)


def add_parser(sub, type_choices):
    """The ``quantize`` subcommand's parser (returned, for the shared ``--demo-dim``)."""
    p = sub.add_parser(
        "quantize", help="quantize a GGUF file: llama-quantize's presets and flags",
        usage="python -m numba_qk quantize [FLAGS] IN [OUT] TYPE [NTHREADS]\n"
              "       python -m numba_qk quantize [FLAGS] [IN [OUT]] [--to PRESET | --type "
              "FORMAT]",
        description="llama-quantize's command line (byte-identical output for the presets and "
                    "flags numba_qk can encode) or numba_qk's --to/--type form.",
        epilog=preset_listing(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("args", nargs="*", metavar="IN [OUT] TYPE [NTHREADS]",
                   help="input GGUF (a split model by its first shard; default: the embedded "
                        "demo model), output (default: llama-quantize's ggml-model-TYPE.gguf "
                        "beside the input; with --to/--type: IN-<type>.gguf), preset, threads "
                        "(accepted; numba_qk encodes on one)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--to", metavar="PRESET",
                        help="numba_qk's form of TYPE: a llama-quantize preset with llama.cpp's "
                             "per-tensor rules (q4_k_m, q5_k_m, q8_0, …; aliases too)")
    target.add_argument("--type", choices=type_choices,
                        help="one format for every F32/F16/BF16 2-D tensor with whole-block "
                             "rows (the default, q4_k, when no preset is given)")
    add_switches(p, ("--allow-requantize", "allow requantizing tensors that are already "
                                           "quantized (dequantized to f32 as ggml does, then "
                                           "encoded)"),
                 ("--leave-output-tensor", "leave output.weight un(re)quantized"),
                 ("--pure", "no mixture rules: every tensor gets the preset's default type"))
    p.add_argument("--imatrix", metavar="FILE",
                   help="importance matrix (llama-imatrix's GGUF file or the legacy .dat)")
    p.add_argument("--include-weights", metavar="NAME", action="append", default=[],
                   help="use the importance matrix only for entries whose name contains NAME")
    p.add_argument("--exclude-weights", metavar="NAME", action="append", default=[],
                   help="do not use the importance matrix for entries whose name contains NAME")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="the type of output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE",
                   help="the type of the token embeddings")
    p.add_argument("--tensor-type", metavar="NAME=TYPE", action="append", default=[],
                   help="tensors whose name matches NAME (a regex, lower-cased) get TYPE "
                        "(repeatable; the first match wins)")
    p.add_argument("--tensor-type-file", metavar="FILE", action="append", default=[],
                   help="NAME=TYPE entries separated by spaces or newlines")
    p.add_argument("--prune-layers", metavar="L0,L1,...",
                   help="drop these layers (the later ones are renumbered)")
    add_switches(p, ("--keep-split", "write one file per input shard (OUT-0000K-of-0000N.gguf)"))
    add_split_limits(p, "write the output as gguf-split --split does: shards of N tensors "
                        "(OUT without .gguf is the prefix)",
                     "the same, shards of at most N megabytes/gigabytes of tensor data")
    p.add_argument("--override-kv", metavar="KEY=TYPE:VALUE", action="append", default=[],
                   help="set a metadata key in the output; TYPE int, float, bool or str")
    add_switches(p, ("--dry-run", "print the plan and the sizes; write nothing"))
    p.add_argument("--max-buffer-size", metavar="MiB", type=int,
                   help="accepted for llama-quantize compatibility (numba_qk streams in small "
                        "chunks anyway)")
    return p


def add_switches(p, *switches) -> None:
    """``store_true`` options of parser (or group) ``p``, in order: ``(flag, help)`` pairs."""
    for flag, text in switches:
        p.add_argument(flag, action="store_true", help=text)


def add_split_limits(p, tensors_help: str, size_help: str) -> None:
    """gguf-split's shard limits, ``--split-max-tensors N`` and ``--split-max-size N(M|G)``
    (read by ``split_limits``), as options of parser (or group) ``p``."""
    p.add_argument("--split-max-tensors", metavar="N", type=int, help=tensors_help)
    p.add_argument("--split-max-size", metavar="N(M|G)", help=size_help)


def split_limits(args, parser):
    """``(max_tensors, max_bytes)`` of ``add_split_limits``' options, None where not given; a
    usage error for a tensor count under 1 or a malformed size."""
    size = split_max_size(args.split_max_size, parser) if args.split_max_size else None
    if args.split_max_tensors is not None and args.split_max_tensors < 1:
        parser.error("--split-max-tensors must be positive")
    return args.split_max_tensors, size


def _stoi(text: str):
    m = _STOI.match(text)
    if m is None:
        return None
    v = int(m.group(1))
    return v if -2**31 <= v < 2**31 else None


def split_max_size(text: str, parser) -> int:
    """Bytes of ``--split-max-size N(M|G)`` as llama.cpp's tools read it (``N`` a positive
    integer, M = 10**6 and G = 10**9 bytes); a usage error otherwise."""
    unit = text[-1]
    n = _stoi(text)
    if unit not in "MG":
        parser.error(f"--split-max-size: supported units are M (megabytes) or G "
                     f"(gigabytes), but got: {unit}")
    if n is None or n <= 0:
        parser.error("--split-max-size: size must be a positive value")
    return n * (1000**2 if unit == "M" else 1000**3)


def _ggml_type(text: str, parser, flag: str) -> str:
    from numba_qk.presets import GGML_TYPES

    if text.upper() not in GGML_TYPES:
        parser.error(f"{flag}: invalid ggml_type {text!r}")
    return text.upper()


def _tensor_type(text: str, parser, flag: str = "--tensor-type"):
    """llama-quantize's parse_tensor_type: NAME before the first '=', lower-cased."""
    name, sep, typ = text.partition("=")
    if not sep:
        parser.error(f"{flag}: malformed tensor type {text!r}")
    if not name:
        parser.error(f"{flag}: missing tensor name in {text!r}")
    if not typ:
        parser.error(f"{flag}: missing quantization type in {text!r}")
    return (name.lower(), _ggml_type(typ, parser, flag))


def _prune(text: str, parser):
    ids = []
    for part in text.split(","):
        v = _stoi(part)
        if v is None or v < 0:
            parser.error(f"--prune-layers: invalid layer id {part!r}")
        ids.append(v)
    return sorted(set(ids))


def human_size(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ``3.2 MiB`` …"""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run(args, parser, default_model) -> int:
    """Interpret the quantize subcommand's arguments and run it (``default_model()`` gives the
    embedded demo model's path)."""
    from numba_qk import gguf, presets

    pos = list(args.args)
    t_start = time.perf_counter()
    preset = args.to
    fmt_name = args.type
    src = dst = None
    llama_form = False
    if preset is not None or fmt_name is not None or len(pos) < 2:
        if len(pos) > 2:
            parser.error("with --to/--type: at most IN and OUT")
        src = pos[0] if pos else None
        dst = pos[1] if len(pos) > 1 else None
    else:
        llama_form = True
        src = pos[0]
        p = presets.parse_ftype(pos[1])
        rest = pos[2:]
        if p is None:
            dst = pos[1]
            if not rest:
                # numba_qk's older form IN OUT (one format, q4_k): kept
                llama_form = False
                p = None
            else:
                p = presets.parse_ftype(rest[0])
                if p is None:
                    parser.error(f"invalid ftype {rest[0]!r}")
                rest = rest[1:]
        if llama_form:
            preset = p.name
            if rest:
                if _stoi(rest[0]) is None:
                    parser.error(f"invalid nthread {rest[0]!r}")
                rest = rest[1:]
            if rest:
                parser.error(f"unexpected arguments after NTHREADS: {' '.join(rest)}")
            if dst is None and not args.dry_run:
                cut = max(src.rfind("/"), src.rfind("\\"))
                dst = src[:cut + 1] + "ggml-model-" + preset + ("" if args.keep_split
                                                                 else ".gguf")

    preset_only = {
        "--pure": args.pure, "--leave-output-tensor": args.leave_output_tensor,
        "--output-tensor-type": args.output_tensor_type,
        "--token-embedding-type": args.token_embedding_type, "--tensor-type": args.tensor_type,
        "--tensor-type-file": args.tensor_type_file, "--allow-requantize":
        args.allow_requantize, "--imatrix": args.imatrix, "--prune-layers": args.prune_layers,
        "--keep-split": args.keep_split, "--override-kv": args.override_kv,
        "--dry-run": args.dry_run, "--include-weights": args.include_weights,
        "--exclude-weights": args.exclude_weights,
        "--split-max-tensors": args.split_max_tensors, "--split-max-size": args.split_max_size}
    used = [k for k, v in preset_only.items() if v]
    if used and preset is None:
        parser.error(f"{', '.join(used)} go with --to PRESET (or llama-quantize's TYPE "
                     f"argument)")
    if args.include_weights and args.exclude_weights:
        parser.error("--include-weights and --exclude-weights cannot be used together")
    split_tensors, split_size = split_limits(args, parser)
    splitting = split_size is not None or split_tensors is not None
    if splitting and args.keep_split:
        parser.error("--keep-split and --split-max-* cannot be used together")
    if args.max_buffer_size is not None and args.max_buffer_size <= 0:
        parser.error(f"invalid --max-buffer-size {args.max_buffer_size}")

    if src is None:
        src = default_model()
    label = (preset or fmt_name or "q4_k").lower()
    if dst is None and not args.dry_run:
        dst = os.path.splitext(src)[0] + f"-{label}.gguf"
        if not pos:
            dst = os.path.join(os.getcwd(), f"numba_qk-demo-{label}.gguf")
    if args.keep_split and dst is not None and ".gguf" in dst:
        dst = dst[:-5]   # llama-quantize cuts the last 5 characters (wherever ".gguf" is)
    if splitting and dst is not None and dst.endswith(".gguf"):
        dst = dst[:-5]   # the prefix of OUT-0000K-of-0000N.gguf

    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if preset is None:
        import numba_qk as qk

        fmt = getattr(qk.quant, fmt_name or "q4_k")
        results = gguf.quantize_file(src, dst, to=fmt, progress=progress)
        _report(dst, results, f"to {fmt.name}", True, t_start)
        return 0

    p = presets.find_preset(preset)
    tensor_types = [_tensor_type(t, parser) for t in args.tensor_type]
    for path in args.tensor_type_file:
        try:
            with open(path, encoding="utf-8") as fh:
                words = fh.read().split()
        except OSError as e:
            parser.error(f"--tensor-type-file: failed to open file {path!r}: {e.strerror}")
        tensor_types += [_tensor_type(w, parser, "--tensor-type-file") for w in words]
    options = dict(
        pure=args.pure, leave_output_tensor=args.leave_output_tensor,
        output_tensor_type=(_ggml_type(args.output_tensor_type, parser, "--output-tensor-type")
                            if args.output_tensor_type else None),
        token_embedding_type=(_ggml_type(args.token_embedding_type, parser,
                                         "--token-embedding-type")
                              if args.token_embedding_type else None),
        tensor_types=tensor_types, allow_requantize=args.allow_requantize)
    kv = [gguf.parse_kv_override(o) for o in args.override_kv]
    imatrix = None
    if args.imatrix:
        imatrix = gguf.read_imatrix(args.imatrix, include=args.include_weights,
                                    exclude=args.exclude_weights)
        if imatrix.datasets:
            print("load_imatrix: imatrix datasets=[" + ", ".join(f"'{d}'" for d in
                                                                 imatrix.datasets) + "]")
        print(f"load_imatrix: loaded {len(imatrix.weights)} importance matrix entries from "
              f"{args.imatrix} computed on {imatrix.chunk_count} chunks")
        if not imatrix.weights:
            imatrix = None
    elif args.include_weights or args.exclude_weights:
        print("note: --include-weights/--exclude-weights select importance-matrix entries; "
              "without --imatrix they have no effect (as in llama-quantize)")
    prune = _prune(args.prune_layers, parser) if args.prune_layers else ()
    what = "as" if not args.dry_run else "calculating quantization size as"
    print(f"quantize: {src} -> {dst if dst else '(nothing written)'} {what} {p.name}"
          + (" (llama-quantize's argument form)" if llama_form else ""))
    try:
        for note in gguf.plan_file(src, p.name, dry_run=True, **options).notes:
            print(f"  note: {note}")
    except Exception:  # the notes are advice; quantize_file reports the real error below
        pass
    t0 = time.perf_counter()
    results = gguf.quantize_file(src, dst, preset=p.name, progress=progress,
                                 dry_run=args.dry_run, kv_overrides=kv, prune_layers=prune,
                                 keep_split=args.keep_split, imatrix=imatrix,
                                 split_max_tensors=split_tensors,
                                 split_max_size=split_size, **options)
    t1 = time.perf_counter()
    counts: dict = {}
    for r in results:
        counts[r.type_after] = counts.get(r.type_after, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    print(f"preset {p.name}: {len(results)} tensors ({mix})")
    if args.dry_run:
        n_el = sum(_nelements(r.shape) for r in results) or 1
        before = sum(r.bytes_before for r in results)
        after = sum(r.bytes_after for r in results)
        print(f"model size  = {before / 2**20:8.2f} MiB ({before * 8 / n_el:.2f} BPW)")
        print(f"quant size  = {after / 2**20:8.2f} MiB ({after * 8 / n_el:.2f} BPW)")
        print(f"dry run: nothing written; planned in {t1 - t_start:.2f} s")
        return 0
    _report(dst, results, f"by llama.cpp's preset {p.name}", False, t_start,
            split=args.keep_split or splitting)
    print(f"quantize time = {(t1 - t0) * 1e3:8.2f} ms")
    print(f"   total time = {(time.perf_counter() - t_start) * 1e3:8.2f} ms")
    return 0


def _nelements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _report(dst, results, what, single_format, t_start, split=False) -> None:
    conv = [r for r in results if r.type_after != r.type_before]
    kept = [r for r in results if r.type_after == r.type_before]
    before = sum(r.bytes_before for r in results)
    after = sum(r.bytes_after for r in results)
    where = f"{dst}-*-of-*.gguf" if split else str(dst)
    print(f"wrote {where}: {len(conv)} tensors converted {what}, {len(kept)} kept as they "
          f"were; {human_size(before)} -> {human_size(after)} in {time.perf_counter() - t_start:.2f} s")
    for r in conv:
        print(f"  {r.name}: {r.type_before} -> {r.type_after}"
              + (f", relative RMS error {r.rms_error:.4f}" if r.rms_error is not None else ""))
    for r in kept:
        print(f"  {r.name}: kept ({r.type_before}"
              + (", not 2-D with whole-block rows" if single_format
                 and r.type_before in ("F32", "F16", "BF16") else "") + ")")
