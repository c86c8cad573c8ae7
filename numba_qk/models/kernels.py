"""The elementwise parts of a transformer forward pass, as ``@njit`` kernels (numba_qk's JIT
policy), each following the arithmetic of llama.cpp's CPU backend (ggml-cpu, scalar paths).

Where ggml's SIMD paths evaluate a function differently from its scalar code (``expf`` by a
polynomial in ``ggml_v_expf`` for SiLU and softmax; reduction order of ``ggml_vec_dot_f16``),
these kernels follow the scalar code: results agree to float32 rounding, not bit for bit.
"""

import functools
import math

import numpy as np

from llvmlite import ir
from numba import carray
from numba.core import cgutils, types
from numba.extending import intrinsic

from .._jit import kernel
from ..kernels._pool import pointer_to, post, work_of
from ..kernels.simd.stream import address_of
from ..kernels import encode_f16, f16_to_f32
from ..kernels.f16 import f32_to_f16_bits_ggml_hw as f16_bits


@intrinsic
def _widen(typingctx, x):
    """float32 of the binary16 held in uint16 ``x`` (exact ``fpext``: what numpy's
    ``astype(np.float32)`` of the f16 KV cache gives)."""
    if x == types.uint16:
        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(x), codegen
    return None


_KEY_LANES = 16   # keys side by side in one vector of scores
_KEY_BLOCKS = 4   # key blocks scored at once (independent accumulators: the adds' latency)


@intrinsic
def _scores64(typingctx, q, kc, kc_at, hd, sc):
    """``sc[16 b + u] = sum_i q[i] * f32(kc[kc_at + (b hd + i) 16 + u])`` for key blocks
    b < 4 and lanes u < 16 (``q``, ``sc`` f32 contiguous, ``kc`` the uint16 bits of f16 keys,
    element offset ``kc_at``): each score an f32 sum of f32 products in the order of ``i`` (one
    ``fmul`` then one ``fadd`` a term, as a scalar loop; the keys, not the terms, are the lanes;
    ``fpext`` widens the keys exactly)."""
    if not (isinstance(q, types.Array) and q.dtype == types.float32
            and isinstance(kc, types.Array) and kc.dtype == types.uint16):
        return None
    sig = types.none(q, kc, types.intp, types.intp, sc)

    def codegen(context, builder, signature, args):
        qa, ka, k_off, n, sa = args
        v16 = ir.VectorType(ir.FloatType(), _KEY_LANES)
        h16 = ir.VectorType(ir.HalfType(), _KEY_LANES)
        qp = context.make_array(signature.args[0])(context, builder, qa).data
        kp = builder.gep(context.make_array(signature.args[1])(context, builder, ka).data,
                         [k_off])
        sp = context.make_array(signature.args[4])(context, builder, sa).data
        accs = [cgutils.alloca_once_value(builder, ir.Constant(v16, None))
                for _ in range(_KEY_BLOCKS)]
        block = builder.mul(n, ir.Constant(n.type, _KEY_LANES))
        with cgutils.for_range(builder, n) as loop:
            i = loop.index
            qi = builder.load(builder.gep(qp, [i]), align=4)
            qv = builder.insert_element(ir.Constant(v16, ir.Undefined), qi,
                                        ir.Constant(ir.IntType(32), 0))
            qv = builder.shuffle_vector(qv, ir.Constant(v16, ir.Undefined),
                                        ir.Constant(ir.VectorType(ir.IntType(32), _KEY_LANES),
                                                    [0] * _KEY_LANES))
            row = builder.mul(i, ir.Constant(i.type, _KEY_LANES))
            for b, acc in enumerate(accs):
                at = builder.add(row, builder.mul(block, ir.Constant(n.type, b)))
                kh = builder.load(builder.bitcast(builder.gep(kp, [at]), h16.as_pointer()),
                                  align=2)
                kv = builder.fpext(kh, v16)
                builder.store(builder.fadd(builder.load(acc), builder.fmul(qv, kv)), acc)
        for b, acc in enumerate(accs):
            dst = builder.bitcast(builder.gep(sp, [ir.Constant(ir.IntType(64), 16 * b)]),
                                  v16.as_pointer())
            builder.store(builder.load(acc), dst, align=4)
        return context.get_dummy_value()

    return sig, codegen


def key_cache_shape(n_ctx, n_head_kv, head_dim):
    """Shape of one layer's K cache (f16): ``[Hkv, NB, head_dim, 16]``, the key at position
    ``p`` in ``[h, p // 16, :, p % 16]`` (16 positions side by side, so that ``attention``
    scores 64 keys at once), NB rounded up to a multiple of 4 blocks."""
    nb = (n_ctx + _KEY_LANES - 1) // _KEY_LANES
    return (n_head_kv, -(-nb // _KEY_BLOCKS) * _KEY_BLOCKS, head_dim, _KEY_LANES)


@kernel
def key_blocks(k):
    """The f16 K cache (``key_cache_shape``, as uint16 bits) holding ``k`` (f32 ``[Hkv, n,
    hd]``, values rounded to f16 by RNE)."""
    Hkv, n, hd = k.shape
    nb = (n + _KEY_LANES - 1) // _KEY_LANES
    nb = (nb + _KEY_BLOCKS - 1) // _KEY_BLOCKS * _KEY_BLOCKS
    kc = np.zeros((Hkv, nb, hd, _KEY_LANES), np.uint16)
    for h in range(Hkv):
        for j in range(n):
            for i in range(hd):
                kc[h, j // _KEY_LANES, i, j % _KEY_LANES] = f16_bits(k[h, j, i])
    return kc


@kernel
def rms_norm(x, w, eps, out):
    """``out[t] = x[t] * 1/sqrtf(mean(x[t]^2) + eps) * w`` for each row of ``x`` f32 ``[T, D]``
    (``w`` f32 ``[D]``), as ggml_compute_forward_rms_norm_f32 then ggml_mul: squares in f32,
    summed in double (ggml_float), ``mean = (float)(sum / D)``, ``scale = 1.0f/sqrtf(mean +
    eps)``, ``y = x * scale`` then ``y * w`` (two f32 roundings)."""
    T, D = x.shape
    for t in range(T):
        s = 0.0
        for i in range(D):
            v = x[t, i] * x[t, i]
            s += np.float64(v)
        mean = np.float32(s / D)
        scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(mean + eps)))
        for i in range(D):
            out[t, i] = np.float32(x[t, i] * scale) * w[i]


@kernel
def rope(x, pos, n_rot, freq_base, neox, factors, freq_scale, mscale):
    """Rotary position embedding in place on ``x`` f32 ``[T, H, head_dim]`` at positions ``pos``
    (int ``[T]``), as ggml_rope_cache_init + rope_yarn + rotate_pairs with ext_factor 0 (no
    YaRN): ``theta_scale = powf(freq_base, -2.0f/n_rot)``; per pair ``i0 = 0, 2, ...`` ``theta``
    starts at ``(float)pos`` and is multiplied by ``theta_scale`` in f32 after each pair; the
    angle is ``freq_scale * (theta / ff)`` in f32 (``ff = factors[i0/2]``, the file's
    ``rope_freqs`` of Llama 3.1+; no division when ``factors`` is empty; ``freq_scale`` = 1 /
    ``rope.scaling.factor``, linear scaling, 1 when none), ``cos = cosf(angle) * mscale``,
    ``sin = sinf(angle) * mscale`` (``mscale``: ``rope.scaling.attn_factor``, 1 when absent:
    multiplying by 1 and by ``freq_scale`` 1 are exact); ``y0 = x0*cos - x1*sin``,
    ``y1 = x0*sin + x1*cos``.  Pairs are ``(i0, i0+1)`` in the normal layout (LLAMA_ROPE_TYPE_NORM,
    llama) and ``(i0/2, i0/2 + n_rot/2)`` in the NeoX layout (gemma3, qwen2, qwen3); dims past
    ``n_rot`` are left as they are."""
    _rope_apply(x, rope_table(pos, n_rot, freq_base, factors, freq_scale, mscale), neox)


@kernel
def rope_table(pos, n_rot, freq_base, factors, freq_scale, mscale):
    """``cs`` f32 ``[T, n_rot]``: ``cos`` and ``sin`` of pair ``i0`` at position ``pos[t]`` in
    ``cs[t, i0]`` and ``cs[t, i0 + 1]`` (``rope``'s angles; one table serves Q and K)."""
    T = pos.shape[0]
    theta_scale = np.float32(math.pow(np.float32(freq_base), np.float32(-2.0) / np.float32(n_rot)))
    cs = np.empty((T, n_rot), np.float32)
    for t in range(T):
        theta = np.float32(pos[t])
        for i0 in range(0, n_rot, 2):
            extrap = np.float32(theta / factors[i0 // 2]) if factors.size else theta
            angle = np.float32(freq_scale * extrap)
            cs[t, i0] = np.float32(np.float32(math.cos(angle)) * mscale)
            cs[t, i0 + 1] = np.float32(np.float32(math.sin(angle)) * mscale)
            theta = np.float32(theta * theta_scale)
    return cs


@kernel
def _rope_apply(x, cs, neox):
    """Rotate the pairs of ``x`` f32 ``[T, H, head_dim]`` in place by the table ``cs``
    (``rope_table``)."""
    T, H, hd = x.shape
    n_rot = cs.shape[1]
    for t in range(T):
        for h in range(H):
            for i0 in range(0, n_rot, 2):
                if neox:
                    a = i0 // 2
                    b = a + n_rot // 2
                else:
                    a = i0
                    b = i0 + 1
                c = cs[t, i0]
                s = cs[t, i0 + 1]
                x0 = x[t, h, a]
                x1 = x[t, h, b]
                x[t, h, a] = np.float32(x0 * c) - np.float32(x1 * s)
                x[t, h, b] = np.float32(x0 * s) + np.float32(x1 * c)


@kernel
def attention(q, kc, vc, n_past, scale, window, out):
    """Causal multi-head attention with grouped K/V heads over an f16 KV cache, as llama.cpp's
    CPU graph without flash attention.  ``q`` f32 ``[T, Hq, hd]`` holds Q rounded to f16 (as
    ``ggml_mul_mat`` converts it to K's vec_dot_type); ``kc`` (``key_cache_shape``) and ``vc``
    (``[Hkv, n_ctx, hd]``) are one layer's cache (uint16 bits of f16 values, widened exactly
    where read) holding positions ``0 .. n_past + T - 1``; query ``t`` sits at position
    ``n_past + t``.  Query head ``h`` reads K/V head ``h // (Hq // Hkv)`` (GQA, as ggml_mul_mat
    broadcasts).  Scores: f16·f16 products (exact in f32) summed in f32 in the order of the
    dimensions (ggml's scalar ``ggml_vec_dot_f16`` order; 64 keys are scored at once, each in
    a vector lane of its own), then ``ggml_soft_max_ext``: ``s*scale``, masked to keys
    ``j <= pos`` (and ``pos - j < window`` when ``window > 0``: LLAMA_SWA_TYPE_STANDARD),
    ``expf(s - max)`` summed in double, multiplied by ``(float)(1/sum)``.  The probabilities
    are rounded to f16 (ggml_mul_mat of the f16 V converts them) and ``sum_j p_j v_j`` is
    summed in f32 -> ``out`` f32 ``[T, Hq, hd]``.  ggml's SIMD dot products sum in another
    order: equal to float32 rounding, not bit for bit."""
    attention_heads(q, kc, vc, n_past, scale, window, out, 0, q.shape[1])


@kernel
def attention_heads(q, kc, vc, n_past, scale, window, out, h0, h1):
    """``attention`` of query heads ``h0 .. h1 - 1`` only (each head's output depends on that
    head alone: split over threads, the same bits)."""
    attention_part(q, kc, vc, n_past, scale, window, out, h0, h1, 0, q.shape[0])


@kernel
def attention_part(q, kc, vc, n_past, scale, window, out, h0, h1, t0, t1):
    """``attention`` of query heads ``h0 .. h1 - 1`` for the new tokens ``t0 .. t1 - 1`` only
    (each token's and head's output depends on them alone: the same bits however split)."""
    T, Hq, hd = q.shape
    Hkv = kc.shape[0]
    group = Hq // Hkv
    n_kv = n_past + T
    sc = np.empty(n_kv, np.float32)
    got = np.empty(_KEY_LANES * _KEY_BLOCKS, np.float32)
    qrow = np.empty(hd, np.float32)
    acc_v = np.empty(hd, np.float32)
    per = _KEY_LANES * _KEY_BLOCKS
    for t in range(t0, t1):
        pos = n_past + t
        j0 = 0
        if window > 0 and pos - window + 1 > 0:
            j0 = pos - window + 1
        for h in range(h0, h1):
            kh = h // group
            for i in range(hd):
                qrow[i] = q[t, h, i]
            j = j0 // per * per                     # 64 keys a pass, from the group of j0
            while j <= pos:
                _scores64(qrow, kc, (kh * kc.shape[1] + j // _KEY_LANES) * hd * _KEY_LANES,
                          hd, got)
                for u in range(max(j, j0), min(j + per, pos + 1)):
                    sc[u] = np.float32(got[u - j] * scale)
                j += per
            mx = -np.inf
            for j in range(j0, pos + 1):
                if sc[j] > mx:
                    mx = sc[j]
            total = 0.0
            for j in range(j0, pos + 1):
                e = np.float32(math.exp(np.float32(sc[j] - mx)))
                sc[j] = e
                total += np.float64(e)
            inv = np.float32(1.0 / total)
            for i in range(hd):
                acc_v[i] = np.float32(0.0)
            for j in range(j0, pos + 1):
                p = f16_to_f32(f16_bits(np.float32(sc[j] * inv)))
                for i in range(hd):
                    acc_v[i] += p * _widen(vc[kh, j, i])
            for i in range(hd):
                out[t, h, i] = acc_v[i]


@kernel
def swiglu(g, u, out):
    """``out = silu(g) * u`` (f32, any shape flattened): ggml_silu_f32 ``x / (1.0f +
    expf(-x))`` then the product, as ggml_swiglu (LLM_FFN_SILU, LLM_FFN_PAR: llama)."""
    gf = g.ravel()
    uf = u.ravel()
    of = out.ravel()
    for i in range(gf.size):
        x = gf[i]
        s = np.float32(x / np.float32(np.float32(1.0) + np.float32(math.exp(-x))))
        of[i] = s * uf[i]


@kernel
def gelu_f16_table():
    """ggml's GELU table (``ggml_table_gelu_f16``, used since GGML_GELU_FP16 is defined in
    ggml-cpu): for every f16 code, ``fp16(0.5f*x*(1.0f + tanhf(sqrt(2/pi)*x*(1.0f +
    0.044715f*x*x))))`` of its value ``x``."""
    tab = np.empty(65536, np.float32)
    c = np.float32(0.79788456080286535587989211986876)
    a = np.float32(0.044715)
    for code in range(65536):
        x = f16_to_f32(np.uint16(code))
        inner = np.float32(c * x) * np.float32(np.float32(1.0) + np.float32(np.float32(a * x) * x))
        th = np.float32(math.tanh(inner))
        y = np.float32(np.float32(0.5) * x) * np.float32(np.float32(1.0) + th)
        tab[code] = f16_to_f32(encode_f16(y))
    return tab


@kernel
def geglu(g, u, table, out):
    """``out = gelu(g) * u`` as ggml_geglu with GGML_GELU_FP16 (gemma3's LLM_FFN_GELU,
    LLM_FFN_PAR): ``gelu(x) = 0`` for ``x <= -10``, ``x`` for ``x >= 10``, else the table value of
    ``fp16(x)`` (``table`` from ``gelu_f16_table``)."""
    gf = g.ravel()
    uf = u.ravel()
    of = out.ravel()
    for i in range(gf.size):
        x = gf[i]
        if x <= np.float32(-10.0):
            y = np.float32(0.0)
        elif x >= np.float32(10.0):
            y = x
        else:
            y = table[f16_bits(x)]
        of[i] = y * uf[i]


@kernel
def attention_prepare(q, k, v, q_norm, k_norm, eps, pos, n_rot, freq_base, neox, rope_factors,
                      freq_scale, mscale, q_scale, kc, vc, n_past):
    """What one layer's attention does to ``T`` new tokens before it reads the cache, the steps
    of llama.cpp's graph in order: ``q``/``k`` (f32 ``[T, H, hd]`` / ``[T, Hkv, hd]``,
    C-contiguous, changed in place) RMS-normalised per head by ``q_norm``/``k_norm`` (gemma3,
    qwen3; skipped when they are empty), ``rope`` at positions ``pos`` (with ``rope_factors``,
    ``freq_scale``, ``mscale``), Q times ``q_scale`` in f32 (gemma3; skipped when 0) and rounded
    to f16 (as ``attention`` takes it); K and ``v`` rounded to f16 (RNE) into the cache layer
    ``kc``/``vc`` (uint16 views of the float16 cache: ``key_cache_shape`` / ``[Hkv, n_ctx,
    hd]``) at positions ``n_past .. n_past + T - 1``.  Each token's results depend on that
    token alone."""
    cs = rope_table(pos, n_rot, freq_base, rope_factors, freq_scale, mscale)
    attention_prepare_rotated(q, k, v, q_norm, k_norm, eps, cs, neox, q_scale, kc, vc, n_past)


@kernel
def attention_prepare_rotated(q, k, v, q_norm, k_norm, eps, cs, neox, q_scale, kc, vc, n_past):
    """``attention_prepare`` with its RoPE angles given: ``cs`` the ``rope_table`` of the
    tokens' positions (the same for every layer of one RoPE base: a batch's runner makes it
    once per forward, not once per layer; 32 tokens of 64 rotated dimensions are 2048 cos/sin
    calls, most of the step's time)."""
    T, H, hd = q.shape
    Hkv = k.shape[1]
    if q_norm.size:
        q2 = q.reshape((T * H, hd))
        rms_norm(q2, q_norm, eps, q2)
        k2 = k.reshape((T * Hkv, hd))
        rms_norm(k2, k_norm, eps, k2)
    _rope_apply(q, cs, neox)
    _rope_apply(k, cs, neox)
    for t in range(T):
        for h in range(Hkv):
            for i in range(hd):
                kc[h, (n_past + t) // _KEY_LANES, i, (n_past + t) % _KEY_LANES] = \
                    f16_bits(k[t, h, i])
                vc[h, n_past + t, i] = f16_bits(v[t, h, i])
        for h in range(H):
            for i in range(hd):
                y = q[t, h, i]
                if q_scale != 0:
                    y = np.float32(y * q_scale)
                q[t, h, i] = f16_to_f32(f16_bits(y))


@kernel
def attention_step(q, k, v, q_norm, k_norm, eps, pos, n_rot, freq_base, neox, rope_factors,
                   freq_scale, mscale, q_scale, kc, vc, n_past, kq_scale, window, out):
    """One layer's attention for ``T`` new tokens in one call: ``attention_prepare`` (norms,
    RoPE, the K/V cache written at ``n_past ..``), then ``attention`` of the prepared Q over the
    cached positions into ``out`` f32 ``[T, H, hd]``."""
    attention_prepare(q, k, v, q_norm, k_norm, eps, pos, n_rot, freq_base, neox, rope_factors,
                      freq_scale, mscale, q_scale, kc, vc, n_past)
    attention(q, kc, vc, n_past, kq_scale, window, out)


# One token's attention split by query heads between the caller and the model's standing
# helpers (``_threads.Helpers``): the caller describes the arrays in ``args`` (int64: addresses
# and shapes, the f32 scale in a slot of its own) and posts it as the product's activations;
# a helper rebuilds the arrays from it (``attention_job``) and runs the heads it claims.
(_A_Q, _A_T, _A_HQ, _A_HD, _A_KC, _A_HKV, _A_NB, _A_VC, _A_NCTX, _A_OUT, _A_NPAST, _A_SCALE,
 _A_WINDOW, _A_PARTS) = range(14)
ATTENTION_ARGS = 16
#: a batch's attention splits its new tokens in up to this many parts a head (a part's cost grows
#: with its tokens' positions; the last parts are claimed first)
ATTENTION_TOKEN_PARTS = 4


@kernel
def _f32_at(args, i):
    """Slot ``i`` of the int64 ``args`` as a one-element f32 array (the value's bits in the
    slot's first 4 bytes)."""
    return carray(pointer_to(address_of(args) + np.int64(8) * np.int64(i), np.float32), (1,))


@kernel
def attention_job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
    """The helpers' job for ``attention_split``: chunk ``r0`` of the attention that the ``args``
    at ``x_at`` describe, one head's part of the new tokens."""
    a = carray(pointer_to(x_at, np.int64), (ATTENTION_ARGS,))
    T, Hq, hd, Hkv = a[_A_T], a[_A_HQ], a[_A_HD], a[_A_HKV]
    q = carray(pointer_to(a[_A_Q], np.float32), (T, Hq, hd))
    kc = carray(pointer_to(a[_A_KC], np.uint16), (Hkv, a[_A_NB], hd, _KEY_LANES))
    vc = carray(pointer_to(a[_A_VC], np.uint16), (Hkv, a[_A_NCTX], hd))
    out = carray(pointer_to(a[_A_OUT], np.float32), (T, Hq, hd))
    scale = _f32_at(a, _A_SCALE)[0]
    parts = a[_A_PARTS]
    head, part = r0 % Hq, parts - 1 - r0 // Hq     # the latest tokens (the longest rows) first
    attention_part(q, kc, vc, a[_A_NPAST], scale, a[_A_WINDOW], out, head, head + 1,
                   part * T // parts, (part + 1) * T // parts)


# the caller's share of a posted product: the same job the helpers run (kernels/_pool.work_of)
_attention_work = work_of(attention_job)


@kernel
def attention_chunks(T, Hq):
    """The chunks of ``attention_split`` for ``T`` new tokens and ``Hq`` query heads: a head
    and a part of the tokens each."""
    return Hq * min(T, ATTENTION_TOKEN_PARTS)


@kernel
def attention_split(ctl, kind, args, q, kc, vc, n_past, scale, window, out, wait_iters):
    """``attention(q, kc, vc, n_past, scale, window, out)`` (all C-contiguous) in chunks of one
    query head and a part of the new tokens (``ATTENTION_TOKEN_PARTS`` at most; one token: a
    head a chunk) claimed one at a time by the caller and the helpers whose ``serve`` runs
    ``attention_job`` as job ``kind``; returns 1 once every chunk is done, 0 if a helper still
    holds one after ``wait_iters`` polls (``_pool.wait_count(ctl, _pool.DONE, chunks, ...)``,
    ``chunks = attention_chunks(T, Hq)``)."""
    T, Hq, hd = q.shape
    args[_A_Q] = address_of(q)
    args[_A_T] = T
    args[_A_HQ] = Hq
    args[_A_HD] = hd
    args[_A_KC] = address_of(kc)
    args[_A_HKV] = kc.shape[0]
    args[_A_NB] = kc.shape[1]
    args[_A_VC] = address_of(vc)
    args[_A_NCTX] = vc.shape[1]
    args[_A_OUT] = address_of(out)
    args[_A_NPAST] = n_past
    args[_A_WINDOW] = window
    _f32_at(args, _A_SCALE)[0] = np.float32(scale)
    n = attention_chunks(T, Hq)
    args[_A_PARTS] = n // Hq
    a_at = address_of(args)
    seq = post(ctl, kind, 0, n, 0, 0, a_at, 0, 0, 0, 0, 0, n, 1, 1)
    return _attention_work(ctl, seq, 0, n, 0, 0, a_at, 0, 0, 0, 0, 0, n, 1, 1, wait_iters)


@kernel
def glu_job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
    """The helpers' job for ``glu_split``: token rows ``[r0, r1)`` of ``out = glu(gate) * up``
    (f32 ``[d0, d1]`` at ``w_at`` (gate), ``x_at`` (up), ``out_at``); ``d2`` the address of
    the GELU table (``geglu``), 0 for ``swiglu``."""
    gate = carray(pointer_to(w_at, np.float32), (d0, d1))
    up = carray(pointer_to(x_at, np.float32), (d0, d1))
    out = carray(pointer_to(out_at, np.float32), (d0, d1))
    if d2:
        geglu(gate[r0:r1], up[r0:r1], carray(pointer_to(d2, np.float32), (65536,)), out[r0:r1])
    else:
        swiglu(gate[r0:r1], up[r0:r1], out[r0:r1])


_glu_work = work_of(glu_job)


@kernel
def glu_split(ctl, kind, gate, up, table, out, chunk, wait_iters):
    """``geglu(gate, up, table, out)`` (``table`` empty: ``swiglu(gate, up, out)``) of f32
    ``[T, F]`` C-contiguous arrays, its token rows in chunks of ``chunk`` claimed by the caller
    and the helpers whose ``serve`` runs ``glu_job`` as job ``kind`` (each element depends on
    its own inputs alone: the same bits); returns as ``attention_split`` does."""
    T, F = gate.shape
    n = (T + chunk - 1) // chunk
    tab = address_of(table) if table.size else np.int64(0)
    g_at, u_at, o_at = address_of(gate), address_of(up), address_of(out)
    seq = post(ctl, kind, g_at, T, F, tab, u_at, 0, 0, 0, o_at, 0, n, chunk, 1)
    return _glu_work(ctl, seq, g_at, T, F, tab, u_at, 0, 0, 0, o_at, 0, n, chunk, 1, wait_iters)


@functools.lru_cache(maxsize=None)
def quantize_rows_job(fn, block, nbytes):
    """The helpers' job quantizing token rows ``[r0, r1)`` with the activation quantizer ``fn``
    (``(x f32 [n], records [n // block, nbytes]) -> -1 | first bad block``): f32 ``[d0, d1]``
    at ``x_at`` into the records ``[d0 * d1 // block, nbytes]`` at ``out_at``; the chunk's
    first bad block (counted over all rows), or -1, into the int64 ``[d2]`` at ``w_at``, slot
    ``r0 // per`` (``per``: the chunk's rows).  Each block is its own tokens' alone: the
    records are those of one call over every row."""
    def quantize_job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
        x = carray(pointer_to(x_at, np.float32), (d0 * d1,))
        xq = carray(pointer_to(out_at, np.uint8), (d0 * d1 // block, nbytes))
        res = carray(pointer_to(w_at, np.int64), (d2,))
        lo, hi = r0 * d1 // block, r1 * d1 // block
        bad = fn(x[r0 * d1:r1 * d1], xq[lo:hi])
        res[r0 // per] = lo + bad if bad >= 0 else np.int64(-1)
    return kernel(quantize_job)


(_R_X, _R_O, _R_H, _R_T, _R_D, _R_POST, _R_POST_N, _R_NORM, _R_NORM_N, _R_EPS) = range(10)
RESIDUAL_ARGS = 16


@kernel
def residual_job(w_at, d0, d1, d2, x_at, t, g, b, out_at, n, r0, r1, per):
    """The helpers' job for ``residual_split``: token rows ``[r0, r1)`` of the
    ``residual_norm`` that the ``args`` at ``x_at`` describe."""
    a = carray(pointer_to(x_at, np.int64), (RESIDUAL_ARGS,))
    T, D = a[_R_T], a[_R_D]
    x = carray(pointer_to(a[_R_X], np.float32), (T, D))
    o = carray(pointer_to(a[_R_O], np.float32), (T, D))
    h = carray(pointer_to(a[_R_H], np.float32), (T, D))
    post = carray(pointer_to(a[_R_POST], np.float32), (a[_R_POST_N],))
    norm = carray(pointer_to(a[_R_NORM], np.float32), (a[_R_NORM_N],))
    eps = _f32_at(a, _R_EPS)[0]
    residual_norm(x[r0:r1], o[r0:r1], post, eps, norm, h[r0:r1])


_residual_work = work_of(residual_job)


@kernel
def residual_split(ctl, kind, args, x, o, post_w, eps, norm_w, h, chunk, wait_iters):
    """``residual_norm(x, o, post_w, eps, norm_w, h)`` (``[T, D]`` C-contiguous; each token's
    row depends on that row alone) with its token rows in chunks of ``chunk`` claimed by the
    caller and the helpers whose ``serve`` runs ``residual_job`` as job ``kind``."""
    T, D = x.shape
    args[_R_X] = address_of(x)
    args[_R_O] = address_of(o)
    args[_R_H] = address_of(h)
    args[_R_T] = T
    args[_R_D] = D
    args[_R_POST] = address_of(post_w)
    args[_R_POST_N] = post_w.size
    args[_R_NORM] = address_of(norm_w)
    args[_R_NORM_N] = norm_w.size
    _f32_at(args, _R_EPS)[0] = eps
    n = (T + chunk - 1) // chunk
    a_at = address_of(args)
    seq = post(ctl, kind, 0, T, D, 0, a_at, 0, 0, 0, 0, 0, n, chunk, 1)
    return _residual_work(ctl, seq, 0, T, D, 0, a_at, 0, 0, 0, 0, 0, n, chunk, 1, wait_iters)


@kernel
def residual_norm(x, o, post_w, eps, norm_w, h):
    """The residual step between two blocks: ``o`` RMS-normalised by ``post_w`` (gemma3's
    post-attention / post-FFN norm; skipped when empty, ``o`` changed in place), ``x += o`` in
    f32 (in place), then ``h = rms_norm(x, norm_w)`` (the next block's input norm; skipped when
    ``norm_w`` is empty)."""
    T, D = x.shape
    if post_w.size:
        rms_norm(o, post_w, eps, o)
    for t in range(T):
        for i in range(D):
            x[t, i] = x[t, i] + o[t, i]
    if norm_w.size:
        rms_norm(x, norm_w, eps, h)
