"""Causal softmax attention: the baseline that H3 is measured against.

It follows the same layer contract as the SSM layers (see `models`): CNN mode
computes all positions at once; RNN mode keeps a key-value cache.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import LayerOptions, option, register_layer
from .h3 import H3Options, build_h3
from .layers import Linear

__all__ = ["CausalSelfAttention", "AttentionOptions", "HybridOptions", "cached_attention",
           "causal_attention", "flash_attention", "fused_attention", "FUSED_DTYPES"]


def _rotary(x, positions):
    """Rotary position embedding of x (..., T, heads, d) at integer positions (T,)."""
    d = x.shape[-1]
    half = d // 2
    freqs = 1.0 / (10000.0 ** (jnp.arange(half) / half))
    angle = positions[:, None] * freqs[None, :]                    # (T, half)
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return jnp.concatenate([rotated, x[..., 2 * half:]], axis=-1)


def cached_attention(q, k_cache, v_cache, length, block):
    """Softmax attention of one query per head over the first `length` cached
    positions, visiting only the blocks of `block` positions that hold them.

    q: (batch, heads, d); k_cache, v_cache: (batch, slots, heads, d) with
    slots a multiple of `block`; length: the number of valid positions (an
    int or a traced int, at least 1). The loop runs ceil(length / block)
    times, so a decoding step at position t costs O(t), not O(slots). The
    softmax is accumulated block by block with a running maximum m, sum s and
    weighted sum acc (the online softmax of FlashAttention): a new block's
    maximum m' rescales the old sums by exp(m - m').
    """
    b, slots, h, d = k_cache.shape
    if slots % block:
        raise ValueError(f"the cache's {slots} slots must be a multiple of block = {block}")

    def visit(i, carry):
        m, s, acc = carry
        k = jax.lax.dynamic_slice_in_dim(k_cache, i * block, block, axis=1)
        v = jax.lax.dynamic_slice_in_dim(v_cache, i * block, block, axis=1)
        scores = jnp.einsum("bhd,bkhd->bhk", q, k) / math.sqrt(d)
        scores = jnp.where(i * block + jnp.arange(block) < length, scores, -jnp.inf)
        m_new = jnp.maximum(m, scores.max(-1))        # finite: block 0 holds position 0
        p, rescale = jnp.exp(scores - m_new[..., None]), jnp.exp(m - m_new)
        return (m_new, s * rescale + p.sum(-1),
                acc * rescale[..., None] + jnp.einsum("bhk,bkhd->bhd", p, v))

    init = (jnp.full((b, h), -jnp.inf, q.dtype), jnp.zeros((b, h), q.dtype),
            jnp.zeros((b, h, d), q.dtype))
    _, s, acc = jax.lax.fori_loop(0, (length + block - 1) // block, visit, init)
    return acc / s[..., None]


def causal_attention(q, k, v):
    """softmax(Q K^T / sqrt(d) + causal mask) V, with the L x L scores stored.

    q, k, v: (batch, L, heads, d). The reference the blockwise version is
    checked against: O(L^2) memory per head.
    """
    L, d = q.shape[1], q.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = jnp.where(jnp.tril(jnp.ones((L, L), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)


def _blocks(x, block):
    """(batch, L, heads, d) -> (L / block, batch, heads, block, d)."""
    b, L, h, d = x.shape
    return x.reshape(b, L // block, block, h, d).transpose(1, 0, 3, 2, 4)


def _unblock(x):
    """The inverse of `_blocks`: (n, batch, heads, block, d) -> (batch, L, heads, d)."""
    n, b, h, block, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, n * block, h, d)


def _scores(q_i, k_j, i, j):
    """The scores of query block i against key block j, masked where j = i."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q_i, k_j)
    block = s.shape[-1]
    causal = jnp.tril(jnp.ones((block, block), bool))
    return jnp.where((j < i) | causal, s, -jnp.inf)


def _flash_forward(q, k, v):
    """O and the log-sum-exp of every query's scores, both from blocks (n, b, h, B, d)."""
    def query_block(args):
        i, q_i = args

        def visit(j, carry):                                # key block j <= i
            m, s, acc = carry
            scores = _scores(q_i, k[j], i, j)
            m_new = jnp.maximum(m, scores.max(-1))
            p, rescale = jnp.exp(scores - m_new[..., None]), jnp.exp(m - m_new)
            return (m_new, s * rescale + p.sum(-1),
                    acc * rescale[..., None] + jnp.einsum("bhqk,bhkd->bhqd", p, v[j]))

        init = (jnp.full(q_i.shape[:-1], -jnp.inf, q.dtype),
                jnp.zeros(q_i.shape[:-1], q.dtype), jnp.zeros_like(q_i))
        m, s, acc = jax.lax.fori_loop(0, i + 1, visit, init)
        return acc / s[..., None], m + jnp.log(s)

    return jax.lax.map(query_block, (jnp.arange(q.shape[0]), q))


def _flash_backward(q, k, v, o, lse, do):
    """dQ, dK, dV, recomputing each block's probabilities from the saved lse."""
    n = q.shape[0]
    delta = jnp.sum(do * o, axis=-1)                        # rowsum(dO * O)

    def key_block(j, grads):
        dq, dk, dv = grads

        def visit(i, carry):                                # query block i >= j
            dq, dk_j, dv_j = carry
            p = jnp.exp(_scores(q[i], k[j], i, j) - lse[i][..., None])
            dp = jnp.einsum("bhqd,bhkd->bhqk", do[i], v[j])
            ds = p * (dp - delta[i][..., None])
            dq = dq.at[i].add(jnp.einsum("bhqk,bhkd->bhqd", ds, k[j]))
            return (dq, dk_j + jnp.einsum("bhqk,bhqd->bhkd", ds, q[i]),
                    dv_j + jnp.einsum("bhqk,bhqd->bhkd", p, do[i]))

        dq, dk_j, dv_j = jax.lax.fori_loop(
            j, n, visit, (dq, jnp.zeros_like(k[j]), jnp.zeros_like(v[j])))
        return dq, dk.at[j].set(dk_j), dv.at[j].set(dv_j)

    zeros = jnp.zeros_like(q)
    return jax.lax.fori_loop(0, n, key_block, (zeros, zeros, zeros))


@jax.custom_vjp
def _flash(q, k, v):
    return _flash_forward(q, k, v)[0]


def _flash_fwd(q, k, v):
    o, lse = _flash_forward(q, k, v)
    return o, (q, k, v, o, lse)


def _flash_bwd(residuals, do):
    return _flash_backward(*residuals, do)


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q, k, v, block=512):
    """`causal_attention` computed block by block, never storing the L x L scores.

    FlashAttention's algorithm (Dao et al., 2022): the queries and keys are cut
    into blocks of `block` positions; query block i visits key blocks
    0, ..., i only (the causal mask skips the rest), keeping a running maximum
    m, normaliser s and weighted sum of values (the online softmax). The
    backward pass saves O and lse = m + log s, O(L) numbers per head, and
    recomputes each block's probabilities exp(scores - lse) from them. q, k,
    v: (batch, L, heads, d); L is padded to a whole number of blocks (a padded
    key comes after every real query, so the mask hides it).
    """
    L = q.shape[1]
    block = min(checks.positive_int(block, "block"), L)
    pad = -L % block
    q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    o = _flash(_blocks(q * scale, block), _blocks(k, block), _blocks(v, block))
    return _unblock(o)[:, :L]


# The input precisions of cuDNN's fused attention kernel.
FUSED_DTYPES = (jnp.bfloat16, jnp.float16)


def _needs_gpu(what):
    if jax.default_backend() != "gpu":
        raise ValueError(f"{what} needs an NVIDIA GPU (cuDNN); the backend is "
                         f"{jax.default_backend()}")


def fused_attention(q, k, v, dtype=jnp.bfloat16):
    """`causal_attention` by JAX's fused cuDNN kernel, a vendor's tuned
    FlashAttention, to compare `flash_attention` with (NVIDIA GPUs only).

    `jax.nn.dot_product_attention(..., implementation="cudnn")` takes half
    precision: q, k, v (batch, L, heads, d) are cast to `dtype` (bfloat16 or
    float16) and the result back to q's dtype.
    """
    _needs_gpu("fused_attention")
    if dtype not in FUSED_DTYPES:
        raise ValueError(f"dtype must be bfloat16 or float16 (cuDNN's), got {dtype}")
    o = jax.nn.dot_product_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                     is_causal=True, implementation="cudnn")
    return o.astype(q.dtype)


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention with rotary positions (the baseline).

    ``step`` decodes with a key-value cache of ``max_len`` positions (rounded
    up to whole blocks of ``step_block``): the token at position t attends to
    the t + 1 cached keys block by block (`cached_attention`), so a step costs
    O(t H), growing with t, where H3's state stays the same size. Sequences longer than
    ``max_len`` are refused: ``__call__`` raises ValueError, and so does
    ``step`` when its position is a concrete number; under ``jit`` (position
    traced) a step past the cache returns NaN instead of overwriting a slot.

    CNN mode stores the L x L scores (`causal_attention`) unless
    ``flash_block`` is set: then it runs `flash_attention` with blocks of
    that many positions, O(L) memory, the same result up to rounding; or,
    with ``fused=True`` (an NVIDIA GPU only), `fused_attention` in bfloat16.
    """

    def __init__(self, H, *, rngs: nnx.Rngs, n_heads=4, max_len=2048, step_block=128,
                 flash_block=None, fused=False):
        H, n_heads = checks.positive_int(H, "H"), checks.positive_int(n_heads, "n_heads")
        if fused:
            if flash_block is not None:
                raise ValueError("fused=True and flash_block are two implementations: "
                                 "give one")
            _needs_gpu("CausalSelfAttention(fused=True)")
        self.fused = bool(fused)
        max_len = checks.positive_int(max_len, "max_len")
        if flash_block is not None:
            checks.positive_int(flash_block, "flash_block")
        self.flash_block = flash_block
        self.step_block = min(checks.positive_int(step_block, "step_block"), max_len)
        if H % n_heads:
            raise ValueError(f"n_heads must divide H, got H={H}, n_heads={n_heads}")
        self.H, self.n_heads, self.head_dim, self.max_len = H, n_heads, H // n_heads, max_len
        self.W_QKV = Linear(H, 3 * H, rngs=rngs)
        self.W_O = Linear(H, H, rngs=rngs)
        self.cache = nnx.data(None)

    def _split(self, x):
        q, k, v = jnp.split(self.W_QKV(x), 3, axis=-1)
        shape = (*x.shape[:-1], self.n_heads, self.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.max_length(checks.sequence(u, self.H), self.max_len)
        L = u.shape[1]
        q, k, v = self._split(u)                                    # (b, L, h, d)
        pos = jnp.arange(L)
        q, k = _rotary(q, pos), _rotary(k, pos)
        if self.fused:
            o = fused_attention(q, k, v)
        elif self.flash_block is None:
            o = causal_attention(q, k, v)
        else:
            o = flash_attention(q, k, v, self.flash_block)
        return self.W_O(o.reshape(u.shape))

    def init_cache(self, batch_size):
        """The key-value cache: the keys and values of every position so far,
        stacked (2, batch, slots, heads, d), and the next position."""
        slots = -(-self.max_len // self.step_block) * self.step_block  # whole blocks
        self.cache = nnx.Cache(jnp.zeros((2, batch_size, slots, self.n_heads, self.head_dim)))
        self.position = nnx.Cache(jnp.zeros((), jnp.int32))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        t = self.position[...]
        if not isinstance(t, jax.core.Tracer) and int(t) >= self.max_len:
            raise ValueError(f"the key-value cache is full: step {int(t)} needs "
                             f"max_len > {int(t)}, got max_len = {self.max_len}")
        q, k, v = self._split(u_t[:, None])                         # (b, 1, h, d)
        q, k = _rotary(q, t[None]), _rotary(k, t[None])
        self.cache[...] = jax.lax.dynamic_update_slice_in_dim(
            self.cache[...], jnp.stack([k, v]), t, axis=2)          # write slot t
        self.position[...] = t + 1
        keys, values = self.cache[...]
        o = cached_attention(q[:, 0], keys, values, t + 1, self.step_block)  # positions 0 .. t
        out = self.W_O(o.reshape(u_t.shape))
        # traced past the end: dynamic_update_slice clamped t, so the write
        # above overwrote the last slot; make the result unmistakably wrong
        return jnp.where(t < self.max_len, out, jnp.nan)


@dataclasses.dataclass(frozen=True)
class AttentionOptions(LayerOptions):
    """The options of `CausalSelfAttention` on the command line."""

    n_heads: int = option(4, "attention heads (they divide --d-model)",
                          check=checks.positive_int)


def build_attention(options, L):
    """The `CausalSelfAttention` factory of `options`, its cache L positions long."""
    return functools.partial(CausalSelfAttention, n_heads=options.n_heads, max_len=L)


register_layer("attention", AttentionOptions, build_attention,
               help="causal softmax attention with rotary positions (H3's baseline)")


@dataclasses.dataclass(frozen=True)
class HybridOptions(AttentionOptions, H3Options):
    """The hybrid's options: H3's and attention's."""


register_layer("hybrid", HybridOptions,
               lambda options, L: [build_h3(options, L), build_attention(options, L)],
               help="H3 and attention in alternate blocks (not the H3 paper's hybrid, 2 of 12)")
