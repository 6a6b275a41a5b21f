"""Tests for annotated_s4.attention: causal, cached and flash attention, and the layer.

Checks that two computations agree in float32 run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU multiplies
float32 matrices in TF32 (see annotated_s4.precision and tests/test_precision.py).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4.attention import CausalSelfAttention, cached_attention


def _u(shape, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def _dense(q, k, v, length):
    scores = jnp.einsum("bhd,bkhd->bhk", q, k[:, :length]) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhk,bkhd->bhd", jax.nn.softmax(scores, -1), v[:, :length])


@pytest.mark.parametrize("length", [1, 5, 8, 9, 31, 32])
@jax.default_matmul_precision("float32")   # a float32 claim
def test_cached_attention_is_softmax_attention_over_the_prefix(length):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (2, 3, 4))
    k = 3 * jax.random.normal(keys[1], (2, 32, 3, 4))
    v = jax.random.normal(keys[2], (2, 32, 3, 4))
    got = cached_attention(q, k, v, length, 8)
    assert jnp.allclose(got, _dense(q, k, v, length), atol=1e-5)
    traced = jax.jit(cached_attention, static_argnums=4)(q, k, v, jnp.int32(length), 8)
    assert jnp.allclose(traced, got, atol=1e-6)


@jax.default_matmul_precision("float32")   # a float32 claim
def test_cached_attention_reads_only_the_blocks_it_needs():
    """Blocks past the current one are never visited: NaN there changes nothing."""
    q = jnp.ones((1, 2, 4))
    k = jax.random.normal(jax.random.PRNGKey(1), (1, 64, 2, 4))
    v = jax.random.normal(jax.random.PRNGKey(2), (1, 64, 2, 4))
    length = 20                                   # blocks 0..2 of 8 are visited
    poisoned = (k.at[:, 24:].set(jnp.nan), v.at[:, 24:].set(jnp.nan))
    got = jax.jit(cached_attention, static_argnums=4)(q, *poisoned, jnp.int32(length), 8)
    assert jnp.isfinite(got).all()
    assert jnp.allclose(got, _dense(q, k, v, length), atol=1e-5)


@pytest.mark.parametrize("step_block", [1, 4, 5, 64])
@jax.default_matmul_precision("float32")
def test_step_equals_parallel_mode_for_any_block(step_block):
    layer = CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, max_len=12,
                                step_block=step_block)
    u = jax.random.normal(jax.random.PRNGKey(3), (2, 12, 8))
    layer.init_cache(2)
    steps = jnp.stack([layer.step(u[:, t]) for t in range(12)], 1)
    assert jnp.allclose(steps, layer(u), atol=1e-4)


def test_cached_attention_checks_block():
    with pytest.raises(ValueError, match="multiple of block"):
        cached_attention(jnp.ones((1, 1, 2)), jnp.ones((1, 10, 1, 2)), jnp.ones((1, 10, 1, 2)), 3, 4)
    with pytest.raises(ValueError, match="step_block"):
        CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, step_block=0)


def test_attention_refuses_sequences_longer_than_max_len():
    layer = CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, max_len=4)
    with pytest.raises(ValueError, match="more than the layer's max_len = 4"):
        layer(_u((1, 5, 8)))
    assert layer(_u((1, 4, 8))).shape == (1, 4, 8)
    # RNN mode, eager: the fifth step raises instead of overwriting slot 3
    layer.init_cache(1)
    for t in range(4):
        layer.step(_u((1, 8), seed=t))
    with pytest.raises(ValueError, match="cache is full"):
        layer.step(_u((1, 8)))


def test_attention_step_past_max_len_under_jit_is_nan():
    layer = CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, max_len=3)
    step = nnx.jit(lambda layer, u: layer.step(u))
    layer.init_cache(2)
    outs = [step(layer, _u((2, 8), seed=t)) for t in range(4)]
    assert all(jnp.isfinite(o).all() for o in outs[:3])
    assert jnp.isnan(outs[3]).all()


# --- The memory-efficient (FlashAttention) form ---------------------------------

from annotated_s4.attention import (causal_attention, flash_attention,  # noqa: E402
                                    fused_attention)


@pytest.mark.parametrize("L, block", [(1, 4), (7, 4), (16, 4), (37, 8), (64, 64), (64, 512)])
def test_flash_attention_equals_attention_with_its_gradients(L, block):
    """Values and all three gradients agree with the stored-scores attention
    to float64 rounding, for L a multiple of the block and not (padding)."""
    from jax import enable_x64

    with enable_x64():
        keys = jax.random.split(jax.random.PRNGKey(L), 4)
        q, k, v, g = (jax.random.normal(key, (2, L, 3, 5), jnp.float64) for key in keys)
        q = 3 * q                                  # peaked softmax: the running max matters
        flash = lambda q, k, v: flash_attention(q, k, v, block)  # noqa: E731
        assert jnp.abs(flash(q, k, v) - causal_attention(q, k, v)).max() < 1e-10

        def grads(fn):  # one compiled program (eagerly, each operation is compiled apart)
            return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * g), argnums=(0, 1, 2)))(q, k, v)

        for got, want in zip(grads(flash), grads(causal_attention)):
            assert jnp.abs(got - want).max() < 1e-10


def test_flash_attention_memory_grows_linearly():
    """XLA's own accounting of the compiled forward+backward: the stored
    scores make attention's temporaries grow 4x when L doubles, the blocks
    keep the flash form's growth near 2x."""
    def temp_bytes(fn, L):
        q = jnp.ones((1, L, 2, 16))
        grad = jax.jit(jax.grad(lambda q, k, v: fn(q, k, v).sum(), argnums=(0, 1, 2)))
        return grad.lower(q, q, q).compile().memory_analysis().temp_size_in_bytes

    flash = lambda q, k, v: flash_attention(q, k, v, 128)  # noqa: E731
    assert temp_bytes(causal_attention, 2048) > 3.5 * temp_bytes(causal_attention, 1024)
    assert temp_bytes(flash, 2048) < 2.5 * temp_bytes(flash, 1024)
    assert temp_bytes(flash, 2048) < temp_bytes(causal_attention, 2048) / 4


@jax.default_matmul_precision("float32")
def test_layer_with_flash_blocks_equals_the_plain_layer():
    plain = CausalSelfAttention(16, rngs=nnx.Rngs(0), n_heads=2, max_len=40)
    flash = CausalSelfAttention(16, rngs=nnx.Rngs(0), n_heads=2, max_len=40, flash_block=8)
    u = jax.random.normal(jax.random.PRNGKey(5), (2, 37, 16))
    assert jnp.allclose(flash(u), plain(u), atol=1e-5)


def test_flash_block_is_checked():
    with pytest.raises(ValueError, match="flash_block"):
        CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=2, flash_block=0)
    with pytest.raises(TypeError, match="block"):
        flash_attention(jnp.ones((1, 4, 1, 2)), jnp.ones((1, 4, 1, 2)), jnp.ones((1, 4, 1, 2)), 2.5)


ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.skipif(ON_GPU, reason="on a GPU the fused kernel runs (the next test)")
def test_fused_attention_is_refused_without_a_gpu():
    x = jnp.ones((1, 8, 2, 8))
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        fused_attention(x, x, x)
    with pytest.raises(ValueError, match="fused=True"):
        CausalSelfAttention(16, rngs=nnx.Rngs(0), n_heads=2, fused=True)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN's fused attention needs an NVIDIA GPU")
def test_fused_attention_equals_attention_to_bfloat16_precision():
    """The fused kernel computes causal attention from bfloat16 inputs (an
    8-bit mantissa: relative rounding 2^-8 of each input and of the output,
    about 1e-2 of the output in all), so it agrees with the float32 form to
    within 3e-2 of the output's scale; its gradient flows."""
    q, k, v = (_u((2, 256, 2, 64), seed) for seed in range(3))
    with jax.default_matmul_precision("float32"):
        want = causal_attention(q, k, v)
    got = fused_attention(q, k, v)
    assert got.dtype == q.dtype
    assert float(jnp.abs(got - want).max()) < 3e-2 * float(jnp.abs(want).max())
    g = jax.grad(lambda q: fused_attention(q, k, v).sum())(q)
    assert bool(jnp.all(jnp.isfinite(g)))
    with pytest.raises(ValueError, match="dtype"):
        fused_attention(q, k, v, dtype=jnp.float32)
    with pytest.raises(ValueError, match="flash_block"):
        CausalSelfAttention(16, rngs=nnx.Rngs(0), n_heads=2, fused=True, flash_block=8)
