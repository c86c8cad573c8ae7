"""The forward pass of the ``llama``, ``gemma3``, ``qwen2`` and ``qwen3`` GGUF architectures
(llama.cpp's src/models/llama.cpp, gemma3.cpp, qwen2.cpp and qwen3.cpp graphs), with an f16 KV
cache and batched prompts."""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _registry, _threads
from .. import gguf as _gguf
from .. import kernels as _blocks
from .._validate import check_threads
from ..errors import QuantizationDomainError
from ..formats import activation_format, quant
from ..kernels import _pool
from ..kernels.legacy import layout as _LL
from ..kernels.legacy import x8 as _x8
from ..kernels.kquants import q4_k_x16 as _x16
from ..kernels.iq import iq4 as _iq4
from ..ops import gemm, gemv, get_rows
from . import kernels as K
from ._vocab import Vocab

ARCHITECTURES = ("llama", "gemma3", "qwen2", "qwen3")
# LLAMA_ROPE_TYPE_NEOX (llama-model.cpp llama_model_rope_type); the others are NORM
_NEOX = ("gemma3", "qwen2", "qwen3")


# weight formats decoded through x8 tiles: format -> (x8 code, gemv(tiles, tail, x, out), gemv
# of whole tiles (tiles, x, out)) (Q8_0's were slower than its plain records streamed from DRAM:
# kernels/legacy/x8.py)
_X8_DECODE = {**{_LL.FORMATS[c]: (c, _x8.GEMV_X8[c], _x8.GEMV_X8_TILES[c])
                 for c in (_LL.Q4_0, _LL.Q4_1, _LL.Q5_0)},
              quant.iq4_nl: (_x8.X8_IQ4_NL, _iq4.gemv_x8_iq4_nl_q8_0,
                             _iq4.gemv_x8_tiles_iq4_nl_q8_0)}


def _tiles_decode(fmt) -> bool:
    """Whether ``_decode_block`` decodes ``fmt`` through a tile copy (x8 / x16)."""
    return ((_x8.HAVE_X8 and fmt in _X8_DECODE)
            or (_x16.HAVE_X16 and fmt is quant.q4_k))


#: A one-token product over this many weights or more splits its rows over ``threads``; a
#: smaller one runs split or on one thread as ``_ThreadChoice`` finds faster in the running
#: model.  A hand-off to the pool costs ~10-20 us, which is about what a second core saves on
#: a matrix of 1 M weights, and which side wins depends on the machine: on Zen 5 (one core
#: reads 35-40 GB/s) two threads made SmolLM2's 576 x 1536 products slower (its decoding
#: 0.85x, docs/decisions/041), on an Intel Xeon (a core reads ~10 GB/s) faster (decode 1.1 ->
#: 1.3x, decision 049).  The vocabulary matrices (28-168 M weights) always split.
DECODE_MIN_THREADED = 2 << 20


class _ThreadChoice:
    """One-thread or split for the one-token products of one shape (format, rows, records per
    row, thread count), shared by every block of that shape in the process: the first
    ``2 * SAMPLES`` calls alternate the two and are timed where they run, between the model's
    other steps (a product timed alone misjudges the split: back to back, each call waits for
    the helper's bookkeeping of the one before), then the one with the lower median runs;
    splitting must win by ``MARGIN`` (one thread leaves the other core to other work).  Either
    way every output row is the same serial dot, so the choice changes no bit."""

    SAMPLES = 8
    MARGIN = 0.95

    __slots__ = ("one", "split", "threaded")

    def __init__(self):
        self.one, self.split = [], []
        self.threaded = None      # undecided

    def add(self, split: bool, seconds: float):
        (self.split if split else self.one).append(seconds)
        if len(self.one) >= self.SAMPLES and len(self.split) >= self.SAMPLES:
            self.threaded = (sorted(self.split)[len(self.split) // 2]
                             < self.MARGIN * sorted(self.one)[len(self.one) // 2])


# (format, rows, records per row, threads) -> its _ThreadChoice, for the life of the process
_CHOICES: dict = {}
_clock = time.perf_counter   # a name of its own, so that a test can give the choice a clock


def _chosen(one, split, choice):
    """The block running ``one`` or ``split`` as ``choice`` (a ``_ThreadChoice``) decides."""
    def block(recs, x, out):
        threaded = choice.threaded
        if threaded is None:
            use = len(choice.split) < len(choice.one)
            t0 = _clock()
            (split if use else one)(recs, x, out)
            choice.add(use, _clock() - t0)
        elif threaded:
            split(recs, x, out)
        else:
            one(recs, x, out)
    return block


def _decode_block(fmt, recs, gemv, threads, helpers=None):
    """``block(recs, x, out)``: one token's ``out = W x`` for weight records ``recs`` of
    ``fmt`` (``gemv`` is the format's @njit building block; None: no block, the public gemv
    then).  Decoding streams every weight once per token: a copy in row-interleaved tiles (the
    kernels' x8 / x16 layouts: one 512-bit load feeds 8 or 16 rows) gives the same bits ~1.5-2x
    faster; batches keep the memory-mapped records (the VNNI gemm).  With ``threads`` > 1 the
    tiles (or rows) are split between the caller and the model's standing ``helpers``
    (``_threads.Helpers``: they wait for the next product in compiled code) or, without them,
    the thread pool (``_threads.run_rows``); matrices under ``DECODE_MIN_THREADED`` weights
    split only where ``_ThreadChoice`` finds that faster.  Every output row is still one serial
    call on the same records, so the bits do not depend on the thread count."""
    if gemv is None:
        return None
    make = _block_maker(fmt, recs, gemv, helpers)
    if threads == 1 or recs.shape[0] * recs.shape[1] * fmt.block_size >= DECODE_MIN_THREADED:
        return make(threads)
    choice = _CHOICES.setdefault((fmt, recs.shape[0], recs.shape[1], threads), _ThreadChoice())
    if choice.threaded is not None:
        return make(threads if choice.threaded else 1)
    return _chosen(make(1), make(threads), choice)


def _block_maker(fmt, recs, gemv, helpers=None):
    """``make(threads) -> block(recs, x, out)`` over one tile copy of ``recs`` (made here)."""
    if _x8.HAVE_X8 and fmt in _X8_DECODE:
        code, tiles_gemv, tiles_only = _X8_DECODE[fmt]
        tiles, tail = _x8.repack_x8(code, recs)
        return lambda threads: _tiled(tiles, tail, tiles_gemv, tiles_only, 8, threads, helpers)
    if _x16.HAVE_X16 and fmt is quant.q4_k:
        tiles, tail = _x16.repack_x16(recs)
        return lambda threads: _tiled(tiles, tail, _x16.gemv_x16, _x16.gemv_x16_tiles, 16,
                                      threads, helpers)

    def make(threads):
        if threads == 1:
            return gemv
        split = _helped(helpers, gemv, recs, 1, 8)
        if split is not None:
            def block(recs, x, out):
                if _threads.effective_threads(threads, 2) > 1:
                    split(x, out)
                else:
                    gemv(recs, x, out)
            return block

        def block(recs, x, out):
            _threads.run_rows(gemv, recs, x, out, _threads.effective_threads(threads, 2))
        return block
    return make


def _helped(helpers, fn, w, per, tile):
    """``helpers.product(...)`` where the model has standing helpers and ``w`` suits them."""
    if helpers is None or not w.flags.c_contiguous:
        return None
    return helpers.product(fn, w, per, tile)


def _tiled(tiles, tail, gemv, gemv_tiles, per, threads, helpers=None):
    """The decode block over ``per``-row tiles: ``gemv(tiles, tail, x, out)`` on one thread;
    with threads, whole tiles split between the caller and the helpers (``gemv_tiles``; without
    helpers by ``run_rows``), then the tail rows."""
    if threads == 1:
        return lambda recs, x, out: gemv(tiles, tail, x, out)
    n = per * tiles.shape[0]
    none = tiles[:0]
    split = _helped(helpers, gemv_tiles, tiles, per, 1)

    def block(recs, x, out):
        used = _threads.effective_threads(threads, 2)
        if used == 1:
            gemv(tiles, tail, x, out)
            return
        if split is not None:
            split(x, out[:n])
        else:
            _threads.run_rows(gemv_tiles, tiles, x, out[:n], used, tile=1, per=per)
        if tail.shape[0]:
            gemv(none, tail, x, out[n:])
    return block


class _Weight:
    """A 2-D weight: numba_qk records over the memory map (or an F32/F16 matrix)."""

    def __init__(self, f, name, threads):
        info = f.tensor(name)
        self.name = name
        self.rows = info.shape[0]
        self.threads = threads
        if info.accelerated:
            self.fmt = info.format
            self.act = activation_format(info.format)
            self.recs = f.records(name)
            self.mat = None
            # one token: the @njit building block itself (same bits as ops.gemv, without the
            # public layer's checks, which cost ~10 us a call); with threads, its rows split by
            # the compiled row runner (_threads.run_rows: each row still one serial call).
            # Made by prepare_decode, unless the weight is decoded in a _Fused group.
            self.gemv_block = getattr(
                _blocks, f"gemv_{self.fmt.name.lower()}_{self.act.name.lower()}", None)
            self.block = None
            self.gemm_block = _registry.BY_FORMAT[self.fmt].gemm
            self.batch_split = None    # made by prepare_batch
        elif info.type_name in ("F32", "F16"):
            self.fmt = self.act = None
            self.recs = None
            self.mat = np.asarray(f.raw(name), dtype=np.float32)
            self.gemv_block = self.block = self.gemm_block = self.batch_split = None
        else:
            raise _gguf.GGUFError(f"tensor {name!r} is {info.type_name}: not supported by "
                                  f"numba_qk.models")

    def prepare_decode(self, helpers=None):
        """Make the one-token block (a tile copy for the formats decoded through tiles), split
        with the model's standing ``helpers`` where it has them."""
        if self.recs is not None and self.block is None:
            self.block = _decode_block(self.fmt, self.recs, self.gemv_block, self.threads,
                                       helpers)

    def apply(self, xq, x, threads=None):
        """``x @ W.T`` for ``x`` f32 ``[T, K]`` whose activation records are ``xq``; the
        product on ``threads`` threads (default: the weight's own count, one token through its
        decode block)."""
        if self.mat is not None:   # one token at a time: the same bits whatever the batch
            return np.stack([self.mat @ xt for xt in x]) if len(x) else x @ self.mat.T
        if threads is None:
            if xq.shape[0] == 1 and self.block is not None:
                out = np.empty((1, self.rows), np.float32)
                self.block(self.recs, xq[0], out[0])
                return out
            threads = self.threads
        if xq.shape[0] == 1:
            return gemv(self.recs, xq[0], lhs_format=self.fmt, rhs_format=self.act,
                        threads=threads)[None, :]
        if threads == 1 and self.gemm_block is not None:
            # the format's serial gemm itself (ops.gemm's kernel, without its checks)
            out = np.empty((xq.shape[0], self.rows), np.float32)
            self.gemm_block(self.recs, np.ascontiguousarray(xq), out)
            return out
        if (threads > 1 and self.batch_split is not None
                and _threads.effective_threads(threads, 2) > 1):
            out = np.empty((xq.shape[0], self.rows), np.float32)
            self.batch_split(np.ascontiguousarray(xq), out.reshape(-1))
            return out
        return gemm(self.recs, xq, lhs_format=self.fmt, rhs_format=self.act, threads=threads)

    def prepare_batch(self, helpers):
        """With the model's standing ``helpers``: batches split by rows with them (the
        format's serial gemm on each chunk, as ``ops.gemm`` with threads runs it)."""
        if helpers is not None and self.recs is not None and self.recs.flags.c_contiguous:
            self.batch_split = helpers.batch_product(self.gemm_block, [self.recs])


class _BatchGroup:
    """Weights of one format that read the same activations (q/k/v, gate/up), multiplied for a
    batch in one product split with the model's standing helpers (``Helpers.batch_product``:
    by claimed bands of rows for the panel gemms), their rows stacked: one hand-off and one
    wait instead of one per weight, and the small k/v matrices no longer split alone
    (SmolLM2's 192 x 576: 41 us on one thread, 27 split).  Each part of a weight's rows is the
    format's own gemm step on those rows, as for a single weight: the same bits."""

    def __init__(self, weights, helpers):
        self.weights = weights
        self.act = weights[0].act
        self.rows = sum(w.rows for w in weights)
        self.threads = weights[0].threads
        self.split = helpers.batch_product(weights[0].gemm_block, [w.recs for w in weights])

    def apply_group(self, xq):
        """The outputs ``[T, rows]`` of each weight for the activation records ``xq``."""
        if self.split is None or _threads.effective_threads(self.threads, 2) == 1:
            return [w.apply(xq, None, 1) for w in self.weights]
        T = xq.shape[0]
        out = np.empty(T * self.rows, np.float32)
        self.split(np.ascontiguousarray(xq), out)
        outs, at = [], 0
        for w in self.weights:
            outs.append(out[at:at + T * w.rows].reshape(T, w.rows))
            at += T * w.rows
        return outs


def _batch_calls(weights, helpers):
    """``weights`` in a batch's calls, with the model's standing ``helpers``: the weights of one
    format (memory-mapped records, the same records per row) two or more become one
    ``_BatchGroup`` (in the order of its first weight), the rest stay single.  None without
    helpers (every weight its own product)."""
    if helpers is None:
        return None
    calls, groups = [], {}
    for w in weights:
        if w.recs is None or not w.recs.flags.c_contiguous:
            calls.append(w)
            continue
        same = [v for v in weights if v.fmt is w.fmt and v.recs is not None
                and v.recs.flags.c_contiguous and v.recs.shape[1:] == w.recs.shape[1:]]
        if len(same) > 1:
            if w.fmt not in groups:
                groups[w.fmt] = _BatchGroup(same, helpers)
                calls.append(groups[w.fmt])
            continue
        calls.append(w)
    return calls


class _Fused:
    """Weights of one format that read the same activations (q/k/v, gate/up), decoded for one
    token by one block over their rows stacked in one tile copy: one call (one hand-off to the
    thread pool) instead of one per weight.  Every output row is still its own serial dot over
    the same records, so the bits are those of the separate weights'.  Only formats decoded
    through tiles (a copy made anyway); others stay separate weights."""

    def __init__(self, weights, threads, helpers=None):
        w0 = weights[0]
        self.weights = weights
        self.act = w0.act
        ends = np.cumsum([w.rows for w in weights]).tolist()
        self.rows = ends[-1]
        self.spans = list(zip([0] + ends[:-1], ends))
        stacked = np.concatenate([np.asarray(w.recs) for w in weights])
        # with tiles the block reads only its tile copy (_fuse groups only those formats)
        self.recs = stacked[:0] if _tiles_decode(w0.fmt) else stacked
        self.block = _decode_block(w0.fmt, stacked, w0.gemv_block, threads, helpers)

    def apply_group(self, xq):
        """The outputs ``[1, rows]`` of each weight for one token's activation records."""
        out = np.empty((1, self.rows), np.float32)
        self.block(self.recs, xq[0], out[0])
        return [out[:, a:b] for a, b in self.spans]


def _fuse(weights, threads, helpers=None):
    """``weights`` in decode calls: each format decoded through tiles with two or more weights
    becomes one ``_Fused`` group (in the order of its first weight), the rest stay single;
    every single weight gets its own block.  Returns the list of calls."""
    calls, groups = [], {}
    for w in weights:
        if w.recs is not None and w.gemv_block is not None and _tiles_decode(w.fmt):
            same = [v for v in weights if v.fmt is w.fmt and v.recs is not None]
            if len(same) > 1:
                if w.fmt not in groups:
                    groups[w.fmt] = _Fused(same, threads, helpers)
                    calls.append(groups[w.fmt])
                continue
        w.prepare_decode(helpers)
        calls.append(w)
    return calls


NUMERICS = ("ggml_cpu", "canonical")


@functools.lru_cache(maxsize=None)
def _act_quantizer(act, numerics):
    """``quantize(x32, xq) -> bad`` for one token: the @njit building block that quantizes f32
    ``x32`` ``[n]`` (contiguous) into activation records ``xq`` ``[n // block, bytes]`` of
    ``act`` with ``numerics`` (same bits as ``ops.quantize``); ``bad`` >= 0 names a block
    holding a NaN or inf."""
    name = act.name.lower()
    if numerics == "ggml_cpu":
        return getattr(_blocks, f"quantize_{name}_ggml_cpu")
    if act.block_size == 256:
        q8_k = _blocks.quantize_q8_k
        return lambda x32, xq: q8_k(x32.reshape(-1, 256), xq)
    return getattr(_blocks, f"quantize_{name}")


def _check_quantized(bad, per_row=None):
    """The error for ``bad`` >= 0, the first bad block of activation records quantized as one
    array of rows of ``per_row`` blocks (None: one row)."""
    if bad >= 0:
        row, block = divmod(int(bad), per_row) if per_row else (0, int(bad))
        raise QuantizationDomainError(block, "the model's activations cannot be quantized "
                                      "(a NaN or inf)", row=row)


def _quantized(x, weights, numerics="canonical", calls=None, threads=None, split=None):
    """``x @ W.T`` for each weight W of ``weights``: activation records of ``x`` f32 ``[T, K]``
    for each activation format the weights need, one quantization shared by every weight of
    that format (llama.cpp quantizes per matmul), with ``ops.quantize``'s ``numerics`` (by
    token rows with the helpers where ``split`` -- ``Model._split_quantize`` -- takes it); the
    products through ``calls`` where given (one token: the decode calls, ``_fuse``; a batch:
    ``_batch_calls``), else on ``threads`` threads where given (``_Weight.apply``)."""
    cache = {}
    for w in weights:
        if w.act is not None and w.act not in cache:
            T, n = x.shape
            b = w.act.block_size
            # the @njit building block (same bits as ops.quantize), every token's blocks in
            # one call (a block never spans two tokens: n is a multiple of b)
            xq = np.empty((T, n // b, w.act.block_bytes), np.uint8)
            x32 = np.ascontiguousarray(x, dtype=np.float32)
            bad = None if split is None else split(w.act, x32, xq)
            if bad is None:
                bad = _act_quantizer(w.act, numerics)(x32.reshape(-1), xq.reshape(T * (n // b), -1))
            _check_quantized(bad, n // b)
            cache[w.act] = xq
    if calls is None or threads is not None:
        return [w.apply(cache.get(w.act), x, threads) for w in weights]
    got = {}
    for c in calls:
        if isinstance(c, (_Fused, _BatchGroup)):
            got.update(zip(map(id, c.weights), c.apply_group(cache[c.act])))
        else:
            got[id(c)] = c.apply(cache.get(c.act), x)
    return [got[id(w)] for w in weights]


class _Matmuls:
    """One token's ``x @ W.T`` for the weights that read the same activations (q/k/v, gate/up,
    or one weight), with every buffer made once: the input ``x`` f32 ``[1, K]``, the activation
    records of each format the weights need (quantized once, shared), and the outputs (one
    ``[1, rows]`` row per weight, views of one buffer for a ``_Fused`` group).  ``run()`` does
    what ``_quantized(x, weights, numerics, calls)`` does for one token, with the same kernels
    (so the same bits), without its per-call allocations and lookups."""

    def __init__(self, x, weights, calls, numerics):
        self.x = x
        acts = {}
        for w in weights:
            if w.act is not None and w.act not in acts:
                xq = np.empty((1, x.shape[1] // w.act.block_size, w.act.block_bytes), np.uint8)
                acts[w.act] = (_act_quantizer(w.act, numerics), xq)
        self.quantizers = [(fn, xq[0]) for fn, xq in acts.values()]
        outs = {}
        self.steps = []   # (block, records, activation records, out row) per decode call
        for c in calls:
            out = np.empty((1, c.rows), np.float32)
            if isinstance(c, _Fused):
                outs.update((id(w), out[:, a:b]) for w, (a, b) in zip(c.weights, c.spans))
                self.steps.append((c.block, c.recs, acts[c.act][1][0], out[0]))
            elif c.block is not None:
                outs[id(c)] = out
                self.steps.append((c.block, c.recs, acts[c.act][1][0], out[0]))
            else:   # an F32/F16 matrix, or a format without a building block: its own apply
                outs[id(c)] = out
                self.steps.append((None, c, acts[c.act][1] if c.act else None, out))
        self.results = [outs[id(w)] for w in weights]

    def run(self):
        """The outputs (``[1, rows]`` each, in the order of ``weights``) for the current ``x``;
        they are overwritten by the next ``run``."""
        x32 = self.x[0]
        for fn, xq in self.quantizers:
            _check_quantized(fn(x32, xq))
        for block, recs, xq, out in self.steps:
            if block is not None:
                block(recs, xq, out)
            else:
                out[...] = recs.apply(xq, self.x)
        return self.results


_NONE = np.empty(0, np.float32)   # an absent norm weight (the fused kernels skip the step)


@dataclass
class _Layer:
    attn_norm: np.ndarray
    wq: _Weight
    wk: _Weight
    wv: _Weight
    wo: _Weight
    ffn_norm: np.ndarray
    gate: _Weight
    up: _Weight
    down: _Weight
    # q/k/v biases (F32 ``[rows]``, added after the matmul as build_qkv does: qwen2); None
    # where the file has none
    bq: np.ndarray = None
    bk: np.ndarray = None
    bv: np.ndarray = None
    # the llama graph's optional attention-output and FFN biases (build_attn / build_ffn add
    # them after their matmul, in f32); None where the file has none
    bo: np.ndarray = None
    b_gate: np.ndarray = None
    b_up: np.ndarray = None
    b_down: np.ndarray = None
    # gemma3's norms (and qwen3's q/k norms); empty (_NONE) where the architecture has none
    q_norm: np.ndarray = field(default_factory=lambda: _NONE)
    k_norm: np.ndarray = field(default_factory=lambda: _NONE)
    post_attn_norm: np.ndarray = field(default_factory=lambda: _NONE)
    post_ffn_norm: np.ndarray = field(default_factory=lambda: _NONE)
    window: int = 0
    freq_base: float = 10000.0
    # one token's decode calls (_fuse) of q/k/v and of gate/up
    qkv_calls: list = None
    glu_calls: list = None
    # a batch's calls (_batch_calls: with standing helpers) of q/k/v and of gate/up
    qkv_batch: list = None
    glu_batch: list = None


class _Decoder:
    """``Model.forward`` for one token (decoding), every buffer made once per model: the same
    kernels in the same order (so the same bits as the batched path's one-token case, which
    ``tests/models`` checks), without numpy allocations or dictionary lookups per matmul."""

    def __init__(self, m):
        self.m = m
        T, D, H, Hkv, hd = 1, m.n_embd, m.n_head, m.n_head_kv, m.head_dim
        nm = m.numerics
        self.x = np.empty((T, D), np.float32)
        self.h = np.empty((T, D), np.float32)
        self.attn = np.empty((T, H, hd), np.float32)
        self.pos = np.zeros(T, np.int64)
        self.attn_args = np.zeros(K.ATTENTION_ARGS, np.int64)   # K.attention_split's
        attn2 = self.attn.reshape(T, H * hd)
        self.layers = []
        for L in m.layers:
            qkv = _Matmuls(self.h, (L.wq, L.wk, L.wv), L.qkv_calls, nm)
            q, k, v = qkv.results
            o = _Matmuls(attn2, (L.wo,), (L.wo,), nm)
            glu = _Matmuls(self.h, (L.gate, L.up), L.glu_calls, nm)
            a = np.empty_like(glu.results[0])
            down = _Matmuls(a, (L.down,), (L.down,), nm)
            self.layers.append((L, qkv, (q, k, v), q.reshape(T, H, hd), k.reshape(T, Hkv, hd),
                                v.reshape(T, Hkv, hd), o, glu, a, down))
        e = m.tok_embd
        self.dequantize_row = (None if e.mat is not None else
                               getattr(_blocks, f"dequantize_{e.fmt.name.lower()}", None))
        out = m.output
        self.out_quantize = (_act_quantizer(out.act, nm),
                             np.empty((1, D // out.act.block_size, out.act.block_bytes),
                                      np.uint8)) if out.act is not None else None

    def embed(self, tok):
        """The embedding row of token ``tok`` into ``self.x`` (``Model.embed``'s bits)."""
        m = self.m
        if self.dequantize_row is None:
            self.x[...] = m.embed([tok])
            return
        m.check_ids(tok, tok)
        self.dequantize_row(m.tok_embd.recs[tok], self.x[0])
        if m.embd_scale is not None:
            np.multiply(self.x, m.embd_scale, out=self.x)

    def step(self, tok, cache):
        """Logits f32 ``[1, n_vocab]`` (a new array) of token ``tok`` at position
        ``cache['n']``; its K/V appended to the cache."""
        m = self.m
        n_past = cache["n"]
        if n_past + 1 > cache["n_ctx"]:
            raise ValueError(f"context full: {n_past} + 1 > {cache['n_ctx']}")
        self.embed(tok)
        self.pos[0] = n_past
        x, h, attn, eps, none = self.x, self.h, self.attn, m.eps, m._none
        q_scale = m.q_scale if m.q_scale is not None else np.float32(0.0)
        kcs, vcs = cache["k"].view(np.uint16), cache["v"].view(np.uint16)
        K.rms_norm(x, m.layers[0].attn_norm, eps, h)
        last = len(self.layers) - 1
        helpers = m._helpers
        split_heads = m._attention_kind is not None
        for il, (L, qkv, qkv_out, q3, k3, v3, o, glu, a, down) in enumerate(self.layers):
            qkv.run()
            for y, b in zip(qkv_out, (L.bq, L.bk, L.bv)):
                if b is not None:   # ggml_add in f32
                    y += b
            if split_heads and _threads.effective_threads(m.threads, 2) > 1:
                K.attention_prepare(q3, k3, v3, L.q_norm, L.k_norm, eps, self.pos, m.n_rot,
                                    L.freq_base, m.neox, m.rope_factors, m.freq_scale,
                                    m.rope_mscale, q_scale, kcs[il], vcs[il], n_past)
                helpers.run(K.attention_split, m.n_head, m._attention_kind, self.attn_args, q3,
                            kcs[il], vcs[il], n_past, m.kq_scale, L.window, attn)
            else:
                K.attention_step(q3, k3, v3, L.q_norm, L.k_norm, eps, self.pos, m.n_rot,
                                 L.freq_base, m.neox, m.rope_factors, m.freq_scale,
                                 m.rope_mscale, q_scale, kcs[il], vcs[il], n_past, m.kq_scale,
                                 L.window, attn)
            (oy,) = o.run()
            if L.bo is not None:
                oy += L.bo
            K.residual_norm(x, oy, L.post_attn_norm, eps, L.ffn_norm, h)
            g, u = glu.run()
            if L.b_up is not None:
                u += L.b_up
            if L.b_gate is not None:
                g += L.b_gate
            if m._gelu is not None:
                K.geglu(g, u, m._gelu, a)
            else:
                K.swiglu(g, u, a)
            (d,) = down.run()
            if L.b_down is not None:
                d += L.b_down
            K.residual_norm(x, d, L.post_ffn_norm, eps,
                            m.layers[il + 1].attn_norm if il < last else none, h)
        cache["n"] = n_past + 1
        K.rms_norm(x, m.output_norm, eps, h)
        out = m.output
        if self.out_quantize is not None and out.block is not None:
            fn, xq = self.out_quantize
            _check_quantized(fn(h[0], xq[0]))
            logits = np.empty((1, out.rows), np.float32)
            out.block(out.recs, xq[0], logits[0])
        else:
            (logits,) = _quantized(h, (out,), m.numerics)
        return m._finish_logits(logits)


#: Without standing helpers, a batch of at least this many tokens is split over the threads by
#: tokens (``_TokenSplit``), each part at least half this many tokens; smaller batches split
#: each product's rows (with helpers: ``PROMPT_SPLIT_MIN_HELPED``).  Two threads against one
#: (Zen 5, decision 047): prompts of 64-256 tokens 1.4-1.7x by tokens, 0.9-1.3x by rows.  32
#: tokens (Intel Xeon, decision 050): 1.40-1.42x by tokens, 1.06-1.27x by rows, once the last
#: token's vocabulary product runs on every thread after the parts (it ran on the last part's
#: one thread: Gemma-3's 168 M-weight matrix made the split lose there).
PROMPT_SPLIT_MIN = 32
#: The same with standing helpers (decisions 051, 052); None: never -- a batch splits its
#: products (the panel gemms' by claimed bands of weight rows), attention (heads and token
#: parts), GLU and residual rows and activation quantization with them whatever its length.
#: Two threads against one (medians of alternating runs, Intel Xeon), so / by tokens: 32 tokens
#: SmolLM2 1.67x / 1.49x; 128 tokens SmolLM2 1.68x / 1.61x, Gemma-3 1.71x / 1.67x; 256 tokens
#: 1.71x / 1.60x, 1.67x / 1.73x; 512 tokens 1.79x / 1.56x, 1.59x / 1.56x; 1024 tokens SmolLM2
#: 1.86x / 1.51x (the token split's later part holds the longer attention rows).
PROMPT_SPLIT_MIN_HELPED = None


class _Abandoned(Exception):
    """A part of a split batch stopped because another part failed."""


class _TokenSplit:
    """One batch of tokens run as ``parts`` consecutive parts, one a thread (the caller runs the
    first), each through every layer on its own.  Every step of a layer but attention reads
    only its own token, so a part needs nothing from the others except, for its attention,
    the K/V of the earlier positions: part ``p`` waits, at each layer, until parts ``0 .. p-1``
    have written theirs (``prepared``); no part waits for a later one.  Each token's results are
    those of the one-pass batch (each product element is one serial dot whatever the batch;
    decision 047), so the logits do not depend on the thread count.  When a part fails, the
    others stop at their next wait and the first error is raised."""

    def __init__(self, model, parts):
        self.model = model
        self.parts = parts
        self.ready = [[threading.Event() for _ in model.layers] for _ in range(parts)]
        self.failed = False

    def prepared(self, part, il):
        """Part ``part`` has written its K/V of layer ``il``; wait for the earlier parts'."""
        self.ready[part][il].set()
        for p in range(part):
            self.ready[p][il].wait()
        if self.failed:
            raise _Abandoned()

    def run(self, ids, n_past, all_logits, cache):
        T = len(ids)
        bounds = [T * p // self.parts for p in range(self.parts + 1)]
        results = [None] * self.parts
        errors = []

        def part(p):
            a, b = bounds[p], bounds[p + 1]
            try:
                results[p] = self.model._forward_tokens(ids[a:b], n_past + a, all_logits, cache,
                                                        split=self, part=p)
            except BaseException as e:   # noqa: B036 - handed to the caller below
                self.failed = True
                for evs in self.ready:
                    for ev in evs:
                        ev.set()
                errors.append(e)

        # on numba_qk's pool (the caller included; numba_qk starts threads in _threads only):
        # the parts are claimed in order, so a part waits only for parts already running or
        # done, and a worker that never comes leaves the caller to run every part in turn
        _threads.run([(part, (p,)) for p in range(self.parts)], self.parts)
        real = [e for e in errors if not isinstance(e, _Abandoned)]
        if real:
            raise real[0]
        if errors:   # pragma: no cover - a part is abandoned only after another failed
            raise errors[0]
        if all_logits:
            return np.concatenate(results)
        # the last token's output product (the vocabulary matrix, the largest of the model)
        # with the model's threads, not the last part's one: through the pool, whose worker
        # has just finished its part and still spins (the model's helpers sleep by now)
        m = self.model
        (logits,) = _quantized(results[-1], (m.output,), m.numerics, None, m.threads)
        return logits


class Model:
    """A loaded GGUF model: ``logits(ids)`` and ``generate(ids, n)``."""

    def __init__(self, path, threads=1, numerics="ggml_cpu"):
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, not {numerics!r}")
        threads = check_threads(threads)   # None: every core this process may run on
        self.numerics = numerics
        f = _gguf.open(path)
        self.file = f
        md = f.metadata
        arch = md.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise _gguf.GGUFError(f"{path}: architecture {arch!r} is not supported by "
                                  f"numba_qk.models (supported: {', '.join(ARCHITECTURES)})")
        self.arch = arch
        self.threads = threads
        # with threads, one token's products are split with standing helper threads that wait
        # for the next product in compiled code (decision 051); without atomics (numba's JIT
        # disabled), through the pool
        helpers = (_threads.Helpers(threads - 1) if threads > 1 and _pool.HAVE_ATOMICS
                   else None)
        self._helpers = helpers
        self._lock = threading.RLock()   # _forward: one call at a time
        # a decoded token's attention split by heads with them (registered first: a group runs
        # at most _pool.KINDS kernels, the products take the rest)
        self._attention_kind = helpers.kind_of(K.attention_job) if helpers else None
        # and a batch's GLU, residual steps and activation quantization by token rows
        self._glu_kind = helpers.kind_of(K.glu_job) if helpers else None
        self._residual_kind = helpers.kind_of(K.residual_job) if helpers else None
        self._residual_args = np.zeros(K.RESIDUAL_ARGS, np.int64)
        self._quant_kinds = {}     # activation format -> (kind, compiled caller)
        self._attn_args = np.zeros(K.ATTENTION_ARGS, np.int64)   # a batch's attention_split

        def kv(key, default=None):
            return md.get(f"{arch}.{key}", default)

        self.n_layer = int(kv("block_count"))
        self.n_embd = int(kv("embedding_length"))
        self.n_head = int(kv("attention.head_count"))
        self.n_head_kv = int(kv("attention.head_count_kv", self.n_head))
        self.head_dim = int(kv("attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(kv("rope.dimension_count", self.head_dim))
        self.eps = np.float32(kv("attention.layer_norm_rms_epsilon"))
        self.n_ctx_train = int(kv("context_length", 2048))
        freq_base = float(kv("rope.freq_base", 10000.0))
        # RoPE scaling as llama.cpp reads it (llama-model.cpp load_hparams, llama-context.cpp):
        # type "linear" unless the file says otherwise; freq_scale = 1/rope.scaling.factor (or the
        # older rope.scale_linear; 0 or absent: 1), 1 for type "none"; the attention factor
        # multiplies cos and sin.  YaRN and LongRoPE are not implemented: refused.
        scaling = kv("rope.scaling.type", "linear")
        if scaling not in ("none", "linear"):
            raise _gguf.GGUFError(f"{path}: RoPE scaling {scaling!r} is not supported by "
                                  f"numba_qk.models (supported: none, linear)")
        factor = kv("rope.scaling.factor")
        factor = np.float32(kv("rope.scale_linear", 0.0) if factor is None else factor)
        self.freq_scale = (np.float32(1.0) if factor == 0 or scaling == "none"
                           else np.float32(np.float32(1.0) / factor))
        self.rope_mscale = np.float32(kv("rope.scaling.attn_factor", 1.0))
        self.neox = arch in _NEOX
        self.softcap = None
        swa_layers = set()
        freq_base_swa = freq_base
        if arch == "gemma3":
            # src/models/gemma3.cpp: Q scaled in f32 by f_attention_scale (1.0f/sqrtf(head_dim))
            # before attention (kq_scale 1); embeddings scaled by sqrtf(n_embd); with a sliding
            # window, layers il % n_pattern < n_pattern - 1 slide (set_swa_pattern, n_pattern 6
            # unless attention.sliding_window_pattern says otherwise, an array naming each layer)
            # with rope base rope.freq_base_swa (default 10000, llama-hparams.h); an optional final
            # logit soft-capping.
            self.q_scale = np.float32(np.float32(1.0) / np.float32(math.sqrt(self.head_dim)))
            self.kq_scale = np.float32(1.0)
            self.embd_scale = np.float32(math.sqrt(self.n_embd))
            n_swa = int(kv("attention.sliding_window", 0))
            if n_swa > 0:
                pattern = kv("attention.sliding_window_pattern", 6)
                if isinstance(pattern, list):
                    swa_layers = {i for i, p in enumerate(pattern) if p}
                else:
                    n = int(pattern)
                    swa_layers = {i for i in range(self.n_layer) if n == 0 or i % n < n - 1}
                freq_base_swa = float(kv("rope.freq_base_swa", 10000.0))
            cap = float(kv("final_logit_softcapping", 0.0) or 0.0)
            self.softcap = np.float32(cap) if cap else None
        else:
            # src/models/llama.cpp, qwen2.cpp, qwen3.cpp: kq_scale = 1.0f/sqrtf(n_embd_head)
            # inside the softmax
            self.q_scale = None
            self.kq_scale = np.float32(np.float32(1.0) / np.float32(math.sqrt(self.head_dim)))
            self.embd_scale = None
            n_swa = 0

        names = {t.name for t in f.tensors}
        used = set()

        def vec(name):
            used.add(name)
            return np.asarray(f.raw(name), dtype=np.float32)

        def w(name):
            used.add(name)
            return _Weight(f, name, threads)

        def bias(name):   # create_tensor's optional (TENSOR_NOT_REQUIRED) biases
            return vec(name) if name in names else None

        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            layer = _Layer(vec(p + "attn_norm.weight"), w(p + "attn_q.weight"),
                           w(p + "attn_k.weight"), w(p + "attn_v.weight"),
                           w(p + "attn_output.weight"), vec(p + "ffn_norm.weight"),
                           w(p + "ffn_gate.weight"), w(p + "ffn_up.weight"),
                           w(p + "ffn_down.weight"), freq_base=freq_base,
                           bq=bias(p + "attn_q.bias"), bk=bias(p + "attn_k.bias"),
                           bv=bias(p + "attn_v.bias"))
            if arch == "llama":   # models/llama.cpp's optional attention-output and MLP biases
                layer.bo = bias(p + "attn_output.bias")
                layer.b_gate = bias(p + "ffn_gate.bias")
                layer.b_up = bias(p + "ffn_up.bias")
                layer.b_down = bias(p + "ffn_down.bias")
            if arch in ("gemma3", "qwen3"):   # RMS norms of Q and K per head, before RoPE
                layer.q_norm = vec(p + "attn_q_norm.weight")
                layer.k_norm = vec(p + "attn_k_norm.weight")
            if arch == "gemma3":
                layer.post_attn_norm = vec(p + "post_attention_norm.weight")
                layer.post_ffn_norm = vec(p + "post_ffw_norm.weight")
                if i in swa_layers:
                    layer.window = n_swa
                    layer.freq_base = freq_base_swa
            layer.qkv_calls = _fuse([layer.wq, layer.wk, layer.wv], threads, helpers)
            layer.glu_calls = _fuse([layer.gate, layer.up], threads, helpers)
            layer.qkv_batch = _batch_calls([layer.wq, layer.wk, layer.wv], helpers)
            layer.glu_batch = _batch_calls([layer.gate, layer.up], helpers)
            layer.wo.prepare_decode(helpers)
            layer.down.prepare_decode(helpers)
            self.layers.append(layer)
        self.output_norm = vec("output_norm.weight")
        embd = f.tensor("token_embd.weight")
        self.n_vocab = embd.shape[0]
        self.tok_embd = w("token_embd.weight")
        self.output = w("output.weight") if "output.weight" in names else self.tok_embd
        self.output.prepare_decode(helpers)
        batch_weights = [w for L in self.layers for w in (L.wq, L.wk, L.wv, L.wo, L.gate, L.up,
                                                          L.down)] + [self.output]
        for act in dict.fromkeys(w.act for w in batch_weights if w.act is not None):
            fn = _act_quantizer(act, numerics)
            if helpers is not None and hasattr(fn, "py_func"):   # a kernel (not Q8_K's lambda)
                job = K.quantize_rows_job(fn, act.block_size, act.block_bytes)
                kind = helpers.kind_of(job)
                if kind is not None:
                    self._quant_kinds[act] = (kind, _pool.arrays_caller_of(job))
        for w in batch_weights:
            w.prepare_batch(helpers)
        # qwen2.cpp's optional output.bias, added to the logits
        self.output_b = vec("output.bias") if arch == "qwen2" and "output.bias" in names else None
        # Llama 3.1+'s per-pair RoPE frequency factors (models/llama.cpp's rope_freqs, shared by
        # every layer)
        self.rope_factors = (vec("rope_freqs.weight") if arch == "llama" and
                             "rope_freqs.weight" in names else _NONE)
        if self.rope_factors.size and self.rope_factors.shape != (self.n_rot // 2,):
            raise _gguf.GGUFError(f"{path}: rope_freqs.weight has shape "
                                  f"{self.rope_factors.shape}, expected ({self.n_rot // 2},)")
        # llama.cpp refuses a file whose tensors its graph does not all take ("wrong number of
        # tensors"); so does numba_qk rather than run without one of them
        unused = sorted(names - used)
        if unused:
            more = f" and {len(unused) - 1} more" if len(unused) > 1 else ""
            raise _gguf.GGUFError(f"{path}: tensor {unused[0]!r}{more} is not part of the {arch} "
                                  f"graph numba_qk.models runs")
        self._gelu = K.gelu_f16_table() if arch == "gemma3" else None
        self._none = _NONE
        # one token goes through _Decoder (made on first use); False: through the batched
        # code below as well (the tests compare the two)
        self._fast_decode = True
        self._decoder = None
        self.vocab = Vocab(md)

    def tokenize(self, text, add_bos=True, special=False) -> list:
        """Token ids of ``text`` (str, or UTF-8 bytes) from the file's own vocabulary, equal to
        llama.cpp's ``llama_tokenize(text, add_special=add_bos, parse_special=special)`` (BPE
        and SentencePiece vocabularies).  ``add_bos`` adds BOS/EOS only where the file asks for
        them (``tokenizer.ggml.add_bos_token``); special tokens written in the text
        (``"<|im_start|>"``) are parsed as such only with ``special=True`` (llama-cpp-python's
        ``Llama.tokenize`` default; llama.cpp's own programs pass true for prompts, as the
        ``generate`` command does), user-defined tokens always."""
        return self.vocab.tokenize(text, add_bos, special)

    def detokenize(self, ids, special=False) -> str:
        """Text of token ids from the file's vocabulary: llama.cpp's ``llama_token_to_piece``
        of each id, concatenated and decoded as UTF-8 (control tokens left out unless
        ``special``)."""
        ids = _token_ids(ids)
        if ids:
            self.check_ids(min(ids), max(ids))
        return self.vocab.detokenize(ids, special)

    # -- pieces -------------------------------------------------------------------------------
    def embed(self, ids) -> np.ndarray:
        """f32 ``[T, n_embd]``: the embedding rows of ``ids`` (only those records are read)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size:
            self.check_ids(int(ids.min()), int(ids.max()))
        e = self.tok_embd
        if e.mat is not None:
            x = e.mat[ids].astype(np.float32)
        else:
            x = get_rows(e.recs, ids, e.fmt)
        if self.embd_scale is not None:
            x = x * self.embd_scale
        return x

    def check_ids(self, lo, hi):
        """IndexError unless token ids ``lo`` .. ``hi`` are in the vocabulary."""
        if lo < 0 or hi >= self.n_vocab:
            bad = lo if lo < 0 else hi
            raise IndexError(f"token id {bad} out of range for a vocabulary of {self.n_vocab}")

    def _norm(self, x, w):
        out = np.empty_like(x)
        K.rms_norm(x, w, self.eps, out)
        return out

    def new_cache(self, n_ctx):
        """An empty f16 KV cache for ``n_ctx`` positions (a positive int): ``{"k", "v": the
        arrays, "n": positions filled, "n_ctx"}``, for ``forward``."""
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)):
            raise TypeError(f"new_cache: n_ctx must be a positive int, got "
                            f"{type(n_ctx).__name__}")
        if n_ctx < 1:
            raise ValueError(f"new_cache: n_ctx must be a positive int, got {n_ctx}")
        kshape, vshape = self._cache_shapes(int(n_ctx))
        return {"k": np.zeros(kshape, np.float16), "v": np.zeros(vshape, np.float16),
                "n": 0, "n_ctx": int(n_ctx)}

    def _cache_shapes(self, n_ctx):
        return ((self.n_layer, *K.key_cache_shape(n_ctx, self.n_head_kv, self.head_dim)),
                (self.n_layer, self.n_head_kv, n_ctx, self.head_dim))

    def _check_cache(self, cache):
        """A one-line error unless ``cache`` is a cache of this model's shapes (``new_cache``):
        the kernels write into its arrays without bounds checks."""
        if not isinstance(cache, dict):
            raise TypeError(f"cache: expected a dict made by Model.new_cache, got "
                            f"{type(cache).__name__}")
        missing = [key for key in ("k", "v", "n", "n_ctx") if key not in cache]
        if missing:
            raise ValueError(f"cache: no {missing[0]!r} entry (make caches with "
                             f"Model.new_cache)")
        n, n_ctx = cache["n"], cache["n_ctx"]
        if not (all(isinstance(c, (int, np.integer)) and not isinstance(c, bool)
                    for c in (n, n_ctx)) and 0 <= n <= n_ctx):
            raise ValueError(f"cache: n = {n!r} and n_ctx = {n_ctx!r}: expected ints with "
                             f"0 <= n <= n_ctx")
        for key, shape in zip(("k", "v"), self._cache_shapes(int(n_ctx))):
            a = cache[key]
            if not (type(a) is np.ndarray and a.dtype == np.float16 and a.shape == shape
                    and a.flags.c_contiguous and a.flags.writeable):
                got = (f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray)
                       else type(a).__name__)
                raise ValueError(f"cache[{key!r}]: expected this model's writeable, "
                                 f"C-contiguous float16 array of shape {shape} for n_ctx = "
                                 f"{n_ctx}, got {got}")

    def forward(self, ids, cache, all_logits=True) -> np.ndarray:
        """Run ``ids`` at positions ``cache['n'] ...`` (one batch), append their K/V to the cache,
        return logits f32 ``[T, n_vocab]`` (or ``[1, n_vocab]`` for the last token only).

        With ``threads`` > 1, a batch splits its products, attention, GLU and residual rows and
        activation quantization with the model's standing helpers; without them (no compiled
        atomics) a batch of at least ``PROMPT_SPLIT_MIN`` tokens is split into consecutive
        parts, one a thread, each run through every layer with one-thread products
        (``_TokenSplit``), a smaller one splits its products' rows through the pool."""
        ids = _token_ids(ids)
        if not ids:
            raise ValueError("forward needs at least one token id")
        self._check_cache(cache)
        return self._forward(ids, cache, all_logits)

    def _forward(self, ids, cache, all_logits):
        """``forward`` for the model's own calls: ``ids`` a non-empty list of ints (their range
        is still checked) and ``cache`` one that ``new_cache`` made.  One call at a time: the
        decoder's buffers and the helpers' product slot are the model's (calls from several
        threads wait for each other)."""
        with self._lock:
            return self._forward_locked(ids, cache, all_logits)

    def _forward_locked(self, ids, cache, all_logits):
        T = len(ids)
        if T == 1 and self._fast_decode:
            if self._decoder is None:
                self._decoder = _Decoder(self)
            return self._decoder.step(int(ids[0]), cache)
        n_past = cache["n"]
        if n_past + T > cache["n_ctx"]:
            raise ValueError(f"context full: {n_past} + {T} > {cache['n_ctx']}")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size:
            self.check_ids(int(ids.min()), int(ids.max()))
        parts = 1
        split_min = PROMPT_SPLIT_MIN if self._helpers is None else PROMPT_SPLIT_MIN_HELPED
        if self.threads > 1 and split_min is not None and T >= split_min:
            parts = _threads.effective_threads(self.threads, T // (split_min // 2))
        if parts == 1:
            logits = self._forward_tokens(ids, n_past, all_logits, cache)
        else:
            logits = _TokenSplit(self, parts).run(ids, n_past, all_logits, cache)
        cache["n"] = n_past + T
        return self._finish_logits(logits)

    def _split_quantize(self, act, x, xq):
        """Activation records ``xq`` ``[T, n // b, bytes]`` of f32 ``x`` ``[T, n]`` by token
        rows with the helpers; the first bad block (over all rows) or -1; None where the
        helpers have no job for ``act``."""
        entry = self._quant_kinds.get(act)
        if entry is None:
            return None
        kind, run = entry
        T, n = x.shape
        chunk = -(-T // (2 * self.threads))
        chunks = -(-T // chunk)
        res = np.empty(chunks, np.int64)
        self._helpers.run(run, chunks, kind, res, x, xq, T, n, chunks, chunks, chunk, chunk)
        bad = res[res >= 0]
        return int(bad[0]) if bad.size else -1

    def _forward_tokens(self, ids, n_past, all_logits, cache, split=None, part=0):
        """Logits of tokens ``ids`` at positions ``n_past ...`` (their K/V written to the
        cache): every position's, or with ``all_logits`` False the last one's (``None`` for a
        part of a split batch other than the last).  ``split`` (a ``_TokenSplit``) runs this
        as part ``part`` of a batch: one-thread products, and each layer's attention only once
        the earlier parts' K/V of that layer are in the cache; with ``all_logits`` False the
        last part returns its last token's normed hidden state ``[1, n_embd]`` instead, for
        ``_TokenSplit.run`` to multiply by the output matrix on every thread."""
        T = len(ids)
        pos = np.arange(n_past, n_past + T, dtype=np.int64)
        hd, H, Hkv = self.head_dim, self.n_head, self.n_head_kv
        x = np.ascontiguousarray(self.embed(ids), dtype=np.float32)
        nm, eps, none = self.numerics, self.eps, self._none
        threads = None if split is None else 1
        q_scale = self.q_scale if self.q_scale is not None else np.float32(0.0)
        kcs, vcs = cache["k"].view(np.uint16), cache["v"].view(np.uint16)
        attn = np.empty((T, H, hd), np.float32)
        h = np.empty_like(x)
        K.rms_norm(x, self.layers[0].attn_norm, eps, h)
        last = len(self.layers) - 1
        # one pass on several threads: attention heads and GLU rows split with the helpers too
        helped = (split is None and self._attention_kind is not None and T > 1
                  and _threads.effective_threads(self.threads, 2) > 1)
        helpers, table = self._helpers, (self._gelu if self._gelu is not None else _NONE)
        glu_chunk = -(-T // (2 * self.threads))
        quant = self._split_quantize if helped else None
        resid = helped and self._residual_kind is not None
        tables = {}   # RoPE base -> rope_table of pos
        for il, L in enumerate(self.layers):
            q, k, v = _quantized(h, (L.wq, L.wk, L.wv), nm,
                                 L.qkv_calls if T == 1 else L.qkv_batch, threads, quant)
            for y, b in ((q, L.bq), (k, L.bk), (v, L.bv)):
                if b is not None:   # ggml_add in f32
                    y += b
            q3 = q.reshape(T, H, hd)
            cs = tables.get(L.freq_base)
            if cs is None:   # the RoPE angles of these positions: once per base, not per layer
                cs = tables[L.freq_base] = K.rope_table(
                    pos, self.n_rot, L.freq_base, self.rope_factors, self.freq_scale,
                    self.rope_mscale)
            K.attention_prepare_rotated(q3, k.reshape(T, Hkv, hd), v.reshape(T, Hkv, hd),
                                        L.q_norm, L.k_norm, eps, cs, self.neox, q_scale,
                                        kcs[il], vcs[il], n_past)
            if split is not None:
                split.prepared(part, il)
            if helped:
                helpers.run(K.attention_split, K.attention_chunks(T, H), self._attention_kind,
                            self._attn_args, q3, kcs[il], vcs[il], n_past, self.kq_scale,
                            L.window, attn)
            else:
                K.attention(q3, kcs[il], vcs[il], n_past, self.kq_scale, L.window, attn)
            (o,) = _quantized(attn.reshape(T, H * hd), (L.wo,), nm, None, threads, quant)
            if L.bo is not None:
                o += L.bo
            if resid:
                helpers.run(K.residual_split, -(-T // glu_chunk), self._residual_kind,
                            self._residual_args, x, o, L.post_attn_norm, eps, L.ffn_norm, h,
                            glu_chunk)
            else:
                K.residual_norm(x, o, L.post_attn_norm, eps, L.ffn_norm, h)
            g, u = _quantized(h, (L.gate, L.up), nm, L.glu_calls if T == 1 else L.glu_batch,
                              threads, quant)
            if L.b_up is not None:
                u += L.b_up
            if L.b_gate is not None:
                g += L.b_gate
            a = np.empty_like(g)
            if helped and self._glu_kind is not None:
                helpers.run(K.glu_split, -(-T // glu_chunk), self._glu_kind, g, u, table, a,
                            glu_chunk)
            elif self._gelu is not None:
                K.geglu(g, u, self._gelu, a)
            else:
                K.swiglu(g, u, a)
            (d,) = _quantized(a, (L.down,), nm, None, threads, quant)
            if L.b_down is not None:
                d += L.b_down
            nxt = self.layers[il + 1].attn_norm if il < last else none
            if resid:
                helpers.run(K.residual_split, -(-T // glu_chunk), self._residual_kind,
                            self._residual_args, x, d, L.post_ffn_norm, eps, nxt, h, glu_chunk)
            else:
                K.residual_norm(x, d, L.post_ffn_norm, eps, nxt, h)
        if not all_logits:
            if split is not None and part != split.parts - 1:
                return None
            x = x[-1:]
        h = self._norm(np.ascontiguousarray(x), self.output_norm)
        if split is not None and not all_logits:
            return h   # one token's output product: after the parts, on every thread
        (logits,) = _quantized(h, (self.output,), nm, None, threads)
        return logits

    def _finish_logits(self, logits):
        """qwen2's output bias, gemma's final soft-capping."""
        if self.output_b is not None:
            logits += self.output_b
        if self.softcap is not None:   # ggml_scale(1/c), ggml_tanh, ggml_scale(c)
            inv = np.float32(np.float32(1.0) / self.softcap)
            logits = np.tanh(logits * inv) * self.softcap
        return logits

    # -- API ------------------------------------------------------------------------------------
    def warmup(self):
        """Run a two-token batch and one decoded token (token id 0) on throwaway caches, as
        llama.cpp's programs warm up before they time anything: the compiled kernels are loaded
        from numba's cache and the decode tile copies made here, not in the first timed call.
        Changes no later result."""
        self._forward([0, 0], self.new_cache(3), all_logits=False)
        self._forward([0], self.new_cache(1), all_logits=False)

    def logits(self, ids) -> np.ndarray:
        """float32 ``[len(ids), n_vocab]``: the logits at every position of ``ids`` (int token
        ids, at least one, at most the model's context length), run as one batch in a fresh
        context."""
        ids = _token_ids(ids)
        if not ids:
            raise ValueError("logits needs at least one token id")
        self._check_context(len(ids), 0)
        return self._forward(ids, self.new_cache(len(ids)), all_logits=True)

    def _check_context(self, n_prompt, n_new):
        """ValueError unless ``n_prompt + n_new`` positions fit the model's context length."""
        if n_prompt + n_new > self.n_ctx_train:
            raise ValueError(f"{n_prompt} prompt tokens + {n_new} new tokens = "
                             f"{n_prompt + n_new} positions, more than the model's context "
                             f"length of {self.n_ctx_train}")

    def generate(self, ids, max_new_tokens, temperature=0.0, seed=None) -> list:
        """The new token ids after prompt ``ids`` (one batch, then one token at a time with the
        KV cache): greedy (argmax, lowest id on ties) at ``temperature == 0``, otherwise sampled
        from ``softmax(logits / temperature)`` with ``numpy.random.default_rng(seed)``."""
        return list(self.stream(ids, max_new_tokens, temperature, seed))

    def stream(self, ids, max_new_tokens, temperature=0.0, seed=None):
        """``generate`` one token at a time: yields each new id as soon as it is chosen.  The
        arguments are checked here, before the first id is asked for: ``ids`` int token ids (at
        least one), ``max_new_tokens`` an int >= 0, the two together within the model's
        context length, ``temperature`` a finite number >= 0."""
        ids = _token_ids(ids)
        if not ids:
            raise ValueError("generate needs at least one prompt token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens,
                                                               (int, np.integer)):
            raise TypeError(f"max_new_tokens: expected an int, got "
                            f"{type(max_new_tokens).__name__}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens}")
        if isinstance(temperature, bool) or not isinstance(temperature,
                                                           (int, float, np.number)):
            raise TypeError(f"temperature: expected a number, got {type(temperature).__name__}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature: expected a finite number >= 0, got {temperature}")
        self._check_context(len(ids), int(max_new_tokens))
        self.check_ids(min(ids), max(ids))
        rng = np.random.default_rng(seed)
        return self._stream(ids, int(max_new_tokens), float(temperature), rng)

    def _stream(self, ids, max_new_tokens, temperature, rng):
        cache = self.new_cache(len(ids) + max_new_tokens)
        if max_new_tokens == 0:
            return
        logits = self._forward(ids, cache, all_logits=False)[-1]
        for n in range(max_new_tokens):
            if temperature == 0:
                nxt = int(np.argmax(logits))
            else:
                z = logits.astype(np.float64) / temperature
                p = np.exp(z - z.max())
                nxt = int(rng.choice(len(p), p=p / p.sum()))
            yield nxt
            if n + 1 < max_new_tokens:
                logits = self._forward([nxt], cache, all_logits=False)[-1]


def _token_ids(ids) -> list:
    """``ids`` (a sequence or 1-D array of int token ids) as a list of Python ints; a
    TypeError names the first element that is not an int (a float, a bool, a str: nothing is
    truncated or converted)."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"ids: expected a sequence of int token ids, got "
                        f"{type(ids).__name__} (Model.tokenize makes ids of text)")
    out = []
    for i, t in enumerate(ids):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"ids[{i}]: expected an int token id, got {type(t).__name__}")
        out.append(int(t))
    return out


def load(path, threads=1, numerics="ggml_cpu") -> Model:
    """Open a GGUF model of architecture ``llama``, ``gemma3``, ``qwen2`` or ``qwen3`` (weights
    memory-mapped), run on up to ``threads`` threads (a positive int; ``None``: every core this
    process may run on).

    ``numerics`` names the activation quantizer (``numba_qk.quantize``'s argument):
    ``"ggml_cpu"`` (default) quantizes activations as llama.cpp does at run time (ggml's x86 CPU
    ``quantize_row_q8_0/q8_1/q8_K``), so logits and greedy tokens follow llama.cpp's most
    closely; ``"canonical"`` uses numba_qk's default ``quantize`` (ggml's ``_ref`` numerics for
    Q8_0/Q8_1, spec 000 for Q8_K)."""
    return Model(path, threads=threads, numerics=numerics)
