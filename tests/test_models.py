"""Tests for annotated_s4.models: SequenceBlock, StackedModel and LastTokenModel.

Checks that two computations agree in float32 run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU multiplies
float32 matrices in TF32 (see annotated_s4.precision and tests/test_precision.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import CausalSelfAttention, H3Layer, LastTokenModel, SequenceBlock
from annotated_s4 import SSMLayer, StackedModel
from annotated_s4 import train
from annotated_s4.models import eval_mode
from annotated_s4.sample import generate, rnn_log_probs


@jax.default_matmul_precision("float32")
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
    with pytest.raises(ValueError, match="x must have shape"):
        model(jnp.ones((3, 16)))
    with pytest.raises(ValueError, match="classification"):
        model.init_cache(3)


@jax.default_matmul_precision("float32")
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
    np.testing.assert_allclose(rnn_log_probs(model, x), logp, atol=1e-4)
    with pytest.raises(TypeError, match="x must be a int array"):
        model(jnp.ones((2, 12)))


def test_stacked_model_bad_layers():
    with pytest.raises(ValueError, match="n_layers"):
        StackedModel(functools.partial(SSMLayer, N=4, L=12), d_output=5, d_model=8, n_layers=0,
                     rngs=nnx.Rngs(0))


def test_last_token_model_sees_whole_input():
    inner = StackedModel(lambda H, rngs: H3Layer(H, rngs=rngs, head_dim=4), 5, 8, 1,
                         rngs=nnx.Rngs(0), vocab_size=5, classification=False)
    model = LastTokenModel(inner)
    x = jnp.zeros((2, 6), jnp.int32)
    out = model(x)
    assert out.shape == (2, 5)
    assert not jnp.allclose(out, model(x.at[:, -1].set(3)), atol=1e-6)


@jax.default_matmul_precision("float32")
def test_answer_span_model_reads_up_to_each_marker():
    """With answer_len K, answer i is predicted from x_0 .. x_{L-K+i}: it changes with
    the marker before it and not with any later token; evaluate counts n K items."""
    V, L, K = 6, 10, 3
    inner = StackedModel(lambda H, rngs: H3Layer(H, rngs=rngs, head_dim=4), V, 8, 1,
                         rngs=nnx.Rngs(0), vocab_size=V, classification=False)
    model = LastTokenModel(inner, answer_len=K)
    x = jnp.asarray(np.random.default_rng(0).integers(0, V, size=(2, L)), jnp.int32)
    out = model(x)
    assert out.shape == (2, K, V)
    for i in range(K):
        later = model(x.at[:, L - K + i + 1:].set((x[:, L - K + i + 1:] + 1) % V))
        np.testing.assert_allclose(later[:, :i + 1], out[:, :i + 1], atol=1e-6)
        here = model(x.at[:, L - K + i].set((x[:, L - K + i] + 1) % V))
        assert not np.allclose(here[:, i], out[:, i], atol=1e-6)
    y = jnp.asarray([[0, 1, 2], [3, 4, 5]], jnp.int32)
    nll, right = train.item_losses(model, x, y)
    assert nll.shape == right.shape == (2, K)
    scored = train.evaluate(model, np.asarray(x), np.asarray(y), batch_size=2)
    assert scored["loss"] == pytest.approx(float(nll.mean()), rel=1e-6)
    assert scored["accuracy"] == pytest.approx(float(right.mean()), abs=1e-7)
    with pytest.raises(ValueError, match="answer_len"):
        LastTokenModel(inner, answer_len=L + 1)(x)
    with pytest.raises(TypeError, match="answer_len must be an int"):
        LastTokenModel(inner, answer_len=1.5)


def test_hybrid_alternates_and_restarts_per_model():
    make_h3 = lambda H, rngs: H3Layer(H, rngs=rngs, head_dim=4, state_size=4)
    make_attn = lambda H, rngs: CausalSelfAttention(H, rngs=rngs, n_heads=2, max_len=16)
    factory = [make_h3, make_attn]
    kinds = lambda m: [type(b.seq).__name__ for b in m.layers]
    build = lambda: StackedModel(factory, 5, 8, 3, rngs=nnx.Rngs(0), vocab_size=5,
                                 classification=False)
    first, second = build(), build()   # an odd layer count must not shift the cycle
    assert kinds(first) == kinds(second) == ["H3Layer", "CausalSelfAttention", "H3Layer"]
    with pytest.raises(TypeError, match="non-empty list"):
        StackedModel([], 5, 8, 3, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="layer factory"):
        StackedModel([make_h3, 3], 5, 8, 3, rngs=nnx.Rngs(0))


def _dropout_modes(model):
    return [m.deterministic for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Dropout)]


@pytest.mark.parametrize("before", ["train", "eval"])
def test_eval_mode_switches_dropout_off_and_restores_the_mode(before):
    model = StackedModel(functools.partial(SSMLayer, N=4, L=8), 3, 8, 2, rngs=nnx.Rngs(0),
                         dropout=0.5)
    getattr(model, before)()
    modes = _dropout_modes(model)
    assert modes and set(modes) == {before == "eval"}
    with eval_mode(model):
        assert set(_dropout_modes(model)) == {True}
    assert _dropout_modes(model) == modes


def test_evaluation_and_sampling_leave_the_mode_as_they_found_it():
    model = StackedModel(functools.partial(SSMLayer, N=4, L=8), 3, 8, 2, rngs=nnx.Rngs(0),
                         dropout=0.5)
    model.eval()
    train.evaluate(model, np.ones((4, 8, 1), np.float32), np.zeros(4, np.int32))
    assert set(_dropout_modes(model)) == {True}
    gen = StackedModel(functools.partial(SSMLayer, N=4, L=8), 3, 8, 1, rngs=nnx.Rngs(0),
                       dropout=0.5, vocab_size=3, classification=False)
    generate(gen, 4, key=jax.random.key(0), batch_size=2)
    assert set(_dropout_modes(gen)) == {False}
