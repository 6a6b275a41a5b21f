"""Part I layers: SSMLayer (CNN and RNN modes), SequenceBlock, StackedModel."""

import functools

import annotated_s4  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import K_conv, SequenceBlock, SSMLayer, StackedModel, causal_convolution
from annotated_s4.layers import log_step_initializer


def test_log_step_initializer_range():
    x = log_step_initializer(jax.random.PRNGKey(0), (1000,), 0.001, 0.1)
    assert float(x.min()) >= np.log(0.001) and float(x.max()) <= np.log(0.1)
    assert float(x.max()) - float(x.min()) > 0.9 * (np.log(0.1) - np.log(0.001))


def test_batched_convolution_matches_single():
    u = jax.random.normal(jax.random.PRNGKey(0), (3, 20, 4))
    K = jax.random.normal(jax.random.PRNGKey(1), (4, 20))
    y = causal_convolution(u, K, axis=1)
    for b in range(3):
        for h in range(4):
            np.testing.assert_allclose(y[b, :, h], causal_convolution(u[b, :, h], K[h]), atol=1e-4)
    with pytest.raises(ValueError, match="K"):
        causal_convolution(u, K[:, :10], axis=1)
    with pytest.raises(ValueError, match="axis"):
        causal_convolution(u[0, :, 0], K, axis=1)


def test_ssm_layer_kernel_is_K_conv():
    layer = SSMLayer(H=3, N=5, L=16, rngs=nnx.Rngs(0))
    Ab, Bb, Cb = layer.discrete()
    K = layer.kernel()
    assert K.shape == (3, 16)
    for h in range(3):
        np.testing.assert_allclose(K[h], K_conv(Ab[h], Bb[h], Cb[h], 16), rtol=1e-5, atol=1e-6)


def test_ssm_layer_cnn_equals_rnn():
    layer = SSMLayer(H=4, N=8, L=32, rngs=nnx.Rngs(1))
    u = jax.random.normal(jax.random.PRNGKey(2), (2, 32, 4))
    y = layer(u)
    layer.init_cache(2)
    y_rnn = jnp.stack([layer.step(u[:, k]) for k in range(32)], axis=1)
    np.testing.assert_allclose(y, y_rnn, atol=1e-4)


def test_ssm_layer_errors():
    layer = SSMLayer(H=4, N=8, L=32, rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match="batch, L, 4"):
        layer(jnp.ones((2, 32, 5)))
    with pytest.raises(ValueError, match="init_cache"):
        layer.step(jnp.ones((2, 4)))
    layer.init_cache(2)
    with pytest.raises(ValueError, match="u_t"):
        layer.step(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="positive"):
        SSMLayer(H=0, N=8, L=32, rngs=nnx.Rngs(1))


def test_sequence_block_residual_and_step():
    block = SequenceBlock(functools.partial(SSMLayer, N=4, L=16), 8, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8))
    y = block(x)
    assert y.shape == x.shape
    block.init_cache(2)
    y_rnn = jnp.stack([block.step(x[:, k]) for k in range(16)], axis=1)
    np.testing.assert_allclose(y, y_rnn, atol=1e-4)


def test_stacked_classifier_shapes_and_causality():
    model = StackedModel(functools.partial(SSMLayer, N=4, L=16), d_output=10, d_model=8,
                         n_layers=2, rngs=nnx.Rngs(0))
    logp = model(jnp.ones((3, 16, 1)))
    assert logp.shape == (3, 10)
    np.testing.assert_allclose(jnp.exp(logp).sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="d_input"):
        model(jnp.ones((3, 16)))
    with pytest.raises(ValueError, match="classification"):
        model.init_cache(3)


def test_stacked_generator_is_causal_and_rnn_matches():
    model = StackedModel(functools.partial(SSMLayer, N=4, L=12), d_output=5, d_model=8, n_layers=2,
                         rngs=nnx.Rngs(0), vocab_size=5, classification=False)
    model.eval()
    x = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 5)
    logp = model(x)
    assert logp.shape == (2, 12, 5)
    # Output k must not depend on input k or later (it predicts input k).
    x2 = x.at[:, 6:].set((x[:, 6:] + 1) % 5)
    np.testing.assert_allclose(model(x2)[:, :7], logp[:, :7], atol=1e-5)
    assert not np.allclose(model(x2)[:, 7:], logp[:, 7:], atol=1e-3)
    # RNN mode, fed the previous token, reproduces the parallel log-probabilities.
    model.init_cache(2)
    prev = jnp.full((2,), model.start_token)
    steps = []
    for k in range(12):
        steps.append(model.step(prev))
        prev = x[:, k]
    np.testing.assert_allclose(jnp.stack(steps, 1), logp, atol=1e-4)
    with pytest.raises(TypeError, match="integer tokens"):
        model(jnp.ones((2, 12)))


def test_stacked_model_bad_layers():
    with pytest.raises(ValueError, match="n_layers"):
        StackedModel(functools.partial(SSMLayer, N=4, L=12), d_output=5, d_model=8, n_layers=0,
                     rngs=nnx.Rngs(0))


def test_ssm_layer_init_is_per_channel():
    """lecun_normal per channel: the H axis is not in the fan-in, std(A) ~ 1/sqrt(N)."""
    H, N = 64, 16
    layer = SSMLayer(H, N, 8, rngs=nnx.Rngs(0))
    A, B, C = layer.A[...], layer.B[...], layer.C[...]
    assert A.shape == (H, N, N) and B.shape == (H, N, 1) and C.shape == (H, 1, N)
    assert abs(float(A.std()) * N**0.5 - 1.0) < 0.05
    assert abs(float(B.std()) * N**0.5 - 1.0) < 0.1
    assert abs(float(C.std()) - 1.0) < 0.1
    assert abs(float(A.mean())) < 0.01
