"""Causal softmax attention: the baseline that H3 is measured against (chapter 7).

It follows the same layer contract as the SSM layers (see `models`): CNN mode
computes all positions at once; RNN mode keeps a key-value cache.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks

__all__ = ["CausalSelfAttention", "cached_attention"]


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


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention with rotary positions (the baseline).

    ``step`` decodes with a key-value cache of ``max_len`` positions (rounded
    up to whole blocks of ``step_block``): the token at position t attends to
    the t + 1 cached keys block by block (`cached_attention`), so a step costs
    O(t H), growing with t, where H3's state stays the same size. Sequences longer than
    ``max_len`` are refused: ``__call__`` raises ValueError, and so does
    ``step`` when its position is a concrete number; under ``jit`` (position
    traced) a step past the cache returns NaN instead of overwriting a slot.
    """

    def __init__(self, H, *, rngs: nnx.Rngs, n_heads=4, max_len=2048, step_block=128):
        H, n_heads = checks.positive_int(H, "H"), checks.positive_int(n_heads, "n_heads")
        max_len = checks.positive_int(max_len, "max_len")
        self.step_block = min(checks.positive_int(step_block, "step_block"), max_len)
        if H % n_heads:
            raise ValueError(f"n_heads must divide H, got H={H}, n_heads={n_heads}")
        self.H, self.n_heads, self.head_dim, self.max_len = H, n_heads, H // n_heads, max_len
        self.W_QKV = nnx.Linear(H, 3 * H, rngs=rngs)
        self.W_O = nnx.Linear(H, H, rngs=rngs)
        self.cache = nnx.data(None)

    def _split(self, x):
        q, k, v = jnp.split(self.W_QKV(x), 3, axis=-1)
        shape = (*x.shape[:-1], self.n_heads, self.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def __call__(self, u):
        checks.sequence(u, self.H)
        L = u.shape[1]
        if L > self.max_len:
            raise ValueError(f"u has length {L}, more than max_len = {self.max_len}")
        q, k, v = self._split(u)                                    # (b, L, h, d)
        pos = jnp.arange(L)
        q, k = _rotary(q, pos), _rotary(k, pos)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        mask = jnp.tril(jnp.ones((L, L), bool))
        scores = jnp.where(mask, scores, -jnp.inf)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return self.W_O(o.reshape(u.shape))

    def init_cache(self, batch_size):
        slots = -(-self.max_len // self.step_block) * self.step_block  # whole blocks
        shape = (batch_size, slots, self.n_heads, self.head_dim)
        self.k_cache = nnx.Cache(jnp.zeros(shape))
        self.v_cache = nnx.Cache(jnp.zeros(shape))
        self.cache = nnx.Cache(jnp.zeros((), jnp.int32))             # next position

    def step(self, u_t):
        checks.step_input(u_t, self.H, self.cache)
        t = self.cache[...]
        if not isinstance(t, jax.core.Tracer) and int(t) >= self.max_len:
            raise ValueError(f"the key-value cache is full: step {int(t)} needs "
                             f"max_len > {int(t)}, got max_len = {self.max_len}")
        q, k, v = self._split(u_t[:, None])                         # (b, 1, h, d)
        q, k = _rotary(q, t[None]), _rotary(k, t[None])
        self.k_cache[...] = jax.lax.dynamic_update_slice_in_dim(self.k_cache[...], k, t, axis=1)
        self.v_cache[...] = jax.lax.dynamic_update_slice_in_dim(self.v_cache[...], v, t, axis=1)
        self.cache[...] = t + 1
        o = cached_attention(q[:, 0], self.k_cache[...], self.v_cache[...], t + 1,
                             self.step_block)                      # positions 0 .. t
        out = self.W_O(o.reshape(u_t.shape))
        # traced past the end: dynamic_update_slice clamped t, so the write
        # above overwrote the last slot; make the result unmistakably wrong
        return jnp.where(t < self.max_len, out, jnp.nan)
