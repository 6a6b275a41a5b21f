"""Tests for annotated_s4.h3: shift SSM, H3 (Algorithm 1), state passing, RNN mode.

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

from annotated_s4 import CausalSelfAttention, StackedModel, causal_convolution
from annotated_s4.h3 import H3Layer, ShiftSSM, causal_conv, shift_kernel, shift_matrix
from annotated_s4 import h3


def _u(shape, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def test_shift_kernel_is_C_A_power_B():
    N, L = 5, 9
    C = jnp.arange(1.0, N + 1)
    A, B = shift_matrix(N), jnp.eye(N)[:, 0]
    direct = jnp.array([C @ jnp.linalg.matrix_power(A, l) @ B for l in range(L)])
    assert jnp.allclose(shift_kernel(C, L), direct)
    assert jnp.allclose(direct[N:], 0.0)


def test_shift_ssm_shifts():
    layer = ShiftSSM(3, 4, rngs=nnx.Rngs(0))
    layer.C[...] = jnp.zeros((3, 4)).at[:, 2].set(1.0)  # C = e_2: delay by 2
    u = _u((2, 10, 3))
    y = layer(u)
    assert jnp.allclose(y[:, 2:], u[:, :-2], atol=1e-5)
    assert jnp.allclose(y[:, :2], 0.0, atol=1e-5)


def _algorithm1_loop(layer, u):
    """Algorithm 1 step by step with explicit sums over time (numpy, float64)."""
    p = lambda lin: (np.asarray(lin.kernel[...], np.float64), np.asarray(lin.bias[...], np.float64))
    u = np.asarray(u, np.float64)
    b, L, H = u.shape
    (WQ, bQ), (WK, bK), (WV, bV), (WO, bO) = map(p, (layer.W_Q, layer.W_K, layer.W_V, layer.W_O))
    Q, K, V = u @ WQ + bQ, u @ WK + bK, u @ WV + bV
    C = np.asarray(layer.shift.C[...], np.float64)
    Ks = np.zeros_like(K)
    for t in range(L):
        for j in range(min(C.shape[1], t + 1)):
            Ks[:, t] += C[:, j] * K[:, t - j]
    Lambda, _, Cd, step = (np.asarray(a) for a in layer.diag.ssm_params())   # B = 1
    Lambda, Cd = Lambda.astype(np.complex128), Cd.astype(np.complex128)
    Lb = np.exp(step.astype(np.float64)[:, None] * Lambda)
    Bb = (Lb - 1) / Lambda
    D = np.asarray(layer.diag.D[...], np.float64)
    nh, dh = layer.n_heads, layer.head_dim
    out = np.zeros((b, L, H))
    for h in range(nh):
        sl = slice(h * dh, (h + 1) * dh)
        kv = Ks[:, :, sl, None] * V[:, :, None, sl]               # (b, L, dh, dh)
        Kd = (2 * (Cd[h] * Bb[h])[None, :] * Lb[h][None, :] ** np.arange(L)[:, None]).sum(1).real
        for t in range(L):
            mem = D[h] * kv[:, t] + sum(Kd[s] * kv[:, t - s] for s in range(t + 1))
            out[:, t, sl] = np.einsum("bi,bij->bj", Q[:, t, sl], mem)
    return out @ WO + bO


@pytest.mark.parametrize("head_dim", [1, 4])
@jax.default_matmul_precision("float32")
def test_h3_matches_algorithm1_loop(head_dim):
    layer = H3Layer(8, rngs=nnx.Rngs(1), head_dim=head_dim, state_size=6, shift_size=3)
    u = _u((2, 12, 8), seed=2)
    assert np.allclose(layer(u), _algorithm1_loop(layer, u), atol=1e-4)


@jax.default_matmul_precision("float32")
def test_state_passing_equals_full_convolution():
    layer = H3Layer(8, rngs=nnx.Rngs(3), head_dim=2, state_size=8, shift_size=4)
    u = _u((2, 48, 8), seed=4)
    full = layer(u)
    for chunk in (48, 16, 12, 1):
        assert jnp.allclose(layer.chunked(u, chunk), full, atol=1e-4), chunk


def _run_rnn(layer, u):
    layer.init_cache(u.shape[0])
    return jnp.stack([layer.step(u[:, t]) for t in range(u.shape[1])], axis=1)


@jax.default_matmul_precision("float32")   # a float32 claim
def test_shift_ssm_rnn_mode_equals_cnn_mode():
    # H3Layer and its diagonal SSM are checked with every layer in test_layers
    layer = ShiftSSM(8, 3, rngs=nnx.Rngs(7))
    u = _u((3, 16, 8), seed=9)
    assert jnp.allclose(_run_rnn(layer, u), layer(u), atol=1e-4)


fft_conv = functools.partial(causal_convolution, nofft=False)
toeplitz_conv = functools.partial(causal_convolution, nofft=True)


@pytest.mark.parametrize("conv", [fft_conv, toeplitz_conv, causal_conv])
@jax.default_matmul_precision("float32")
def test_convolutions_share_kernel(conv):
    u = _u((2, 10, 3, 4))
    K = _u((3, 1, 10), seed=1)
    y = conv(u, K, axis=1)
    direct = jnp.stack([sum(K[:, :, s] * u[:, t - s] for s in range(t + 1)) for t in range(10)], 1)
    assert jnp.allclose(y, direct, atol=1e-4)
    with pytest.raises(ValueError, match="length L"):
        conv(u, K[..., :9], axis=1)


def test_causal_conv_switches_to_fft_for_long_sequences(monkeypatch):
    used = []
    monkeypatch.setattr(h3, "causal_convolution", lambda u, K, axis, nofft:
                        used.append("direct" if nofft else "fft") or u)
    for L in (h3.DIRECT_CONV_MAX_LEN, h3.DIRECT_CONV_MAX_LEN + 1):
        h3.causal_conv(jnp.zeros((1, L, 2)), jnp.zeros((2, L)), axis=1)
    assert used == ["direct", "fft"]


@pytest.mark.parametrize("L", [3, 4, 12])  # shorter than, equal to, longer than N
def test_shift_ssm_is_the_convolution_with_its_kernel(L):
    layer = ShiftSSM(5, 4, rngs=nnx.Rngs(0))
    u = _u((2, L, 5))
    expected = causal_convolution(u, layer.kernel(L), axis=1)
    assert jnp.allclose(layer(u), expected, atol=1e-5)


@jax.default_matmul_precision("float32")
def test_stacked_generation_equals_parallel():
    model = StackedModel(lambda H, rngs: H3Layer(H, rngs=rngs, head_dim=4, state_size=8),
                         7, 16, 2, rngs=nnx.Rngs(0), vocab_size=7, classification=False)
    model.eval()
    x = jnp.array(np.random.default_rng(0).integers(0, 7, (2, 9)), jnp.int32)
    logp = model(x)
    model.init_cache(2)
    prev = jnp.full((2,), model.start_token, jnp.int32)
    for t in range(9):
        assert jnp.allclose(model.step(prev), logp[:, t], atol=1e-4)
        prev = x[:, t]


def test_bad_arguments_raise():
    layer = H3Layer(8, rngs=nnx.Rngs(0), head_dim=4)
    with pytest.raises(ValueError, match="u must have shape"):
        layer(jnp.zeros((2, 5, 6)))
    with pytest.raises(ValueError, match="u must have shape"):
        layer(jnp.zeros((5, 8)))
    with pytest.raises(ValueError, match="head_dim must divide H"):
        H3Layer(8, rngs=nnx.Rngs(0), head_dim=3)
    with pytest.raises(ValueError, match="n_heads must divide H"):
        CausalSelfAttention(8, rngs=nnx.Rngs(0), n_heads=3)
    with pytest.raises(ValueError, match="init_cache"):
        layer.step(jnp.zeros((2, 8)))
    layer.init_cache(2)
    with pytest.raises(ValueError, match="u_t must have shape"):
        layer.step(jnp.zeros((2, 7)))
    with pytest.raises(ValueError, match="chunk_size must divide"):
        layer.chunked(jnp.zeros((1, 10, 8)), 3)
    with pytest.raises(ValueError, match="L must be a positive int"):
        shift_kernel(jnp.ones(3), 0)
    with pytest.raises(ValueError, match="H must be a positive int"):
        H3Layer(0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="K must have length"):
        fft_conv(jnp.zeros((1, 5, 2)), jnp.zeros((2, 4)), axis=1)


def test_sizes_accept_numpy_integers():
    assert jnp.allclose(shift_matrix(np.int64(4)), shift_matrix(4))
    assert shift_kernel(jnp.ones(3), np.int32(6)).shape == (6,)
    layer = H3Layer(np.int64(8), rngs=nnx.Rngs(0), head_dim=np.int64(4),
                    state_size=np.int64(6), shift_size=np.int64(3))
    assert layer(_u((1, 5, 8))).shape == (1, 5, 8)
    with pytest.raises(TypeError, match="N must be an int"):
        shift_matrix(4.0)
    with pytest.raises(TypeError, match="L must be an int"):
        shift_kernel(jnp.ones(3), True)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"state_size": 0}, ValueError, "state_size must be a positive int"),
    ({"shift_size": 0}, ValueError, "shift_size must be a positive int"),
    ({"state_size": 4.5}, TypeError, "state_size must be an int"),
    ({"state_size": 5}, ValueError, "state_size must be even"),
    ({"shift_size": "4"}, TypeError, "shift_size must be an int"),
])
def test_h3_checks_its_sizes(kwargs, error, match):
    with pytest.raises(error, match=match):
        H3Layer(8, rngs=nnx.Rngs(0), head_dim=4, **kwargs)


@jax.default_matmul_precision("float32")
def test_chunked_checks_chunk_size():
    layer = H3Layer(8, rngs=nnx.Rngs(0), head_dim=4, state_size=4)
    u = _u((1, 12, 8))
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        layer.chunked(u, 4.0)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        layer.chunked(u, 0)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        layer.chunked(u, -4)
    assert jnp.allclose(layer.chunked(u, np.int64(4)), layer(u), atol=1e-4)


def test_chunk_checks_cache():
    layer = H3Layer(8, rngs=nnx.Rngs(0), head_dim=4, state_size=4, shift_size=3)
    u = _u((2, 6, 8))
    k_prev, x_prev = layer.empty_cache(2)
    with pytest.raises(ValueError, match="cache must have shapes"):
        layer.chunk(u, (k_prev, x_prev[..., :1]))
    with pytest.raises(ValueError, match="cache must have shapes"):
        layer.chunk(u, layer.empty_cache(3))            # batch 3 for a batch-2 chunk
    with pytest.raises(TypeError, match="cache must be a pair"):
        layer.chunk(u, x_prev)


def test_chunk_survives_underflowing_decay():
    # a fast-decaying mode: Lambda_bar^T underflows to 0 in float32 within a
    # chunk; the carried state must stay finite (it once was 0/0 = NaN)
    layer = H3Layer(8, rngs=nnx.Rngs(1), head_dim=4, state_size=4)
    layer.diag.Lambda_log_neg_re[...] = jnp.full_like(layer.diag.Lambda_log_neg_re[...],
                                                      jnp.log(200.0))
    layer.diag.log_dt[...] = jnp.zeros_like(layer.diag.log_dt[...])   # dt 1
    u = _u((1, 32, 8), seed=3)
    y, (k_new, x_new) = layer.chunk(u, layer.empty_cache(1))
    assert jnp.isfinite(y).all() and jnp.isfinite(x_new).all()
    assert jnp.allclose(layer.chunked(u, 8), layer(u), atol=1e-4)


# --- The block FFT (float64) ---------------------------------------------------


@pytest.mark.parametrize("N,n1", [(1, 1), (8, 2), (64, 8), (96, 12), (1024, 32), (4096, 64), (60, 60)])
def test_block_fft_equals_fft_float64(N, n1):
    from jax import enable_x64

    with enable_x64():
        rng = np.random.default_rng(N)
        x = jnp.asarray(rng.normal(size=(3, N)) + 1j * rng.normal(size=(3, N)))
        ref = jnp.fft.fft(x)
        got = h3.block_fft(x, n1)
        assert got.dtype == jnp.complex128
        assert float(jnp.abs(got - ref).max() / jnp.abs(ref).max()) < 1e-12
        real = jnp.asarray(rng.normal(size=(N,)))
        assert float(jnp.abs(h3.block_fft(real, n1) - jnp.fft.fft(real)).max()
                     / jnp.abs(jnp.fft.fft(real)).max()) < 1e-12


def test_dft_matrix_is_the_fft_of_the_identity():
    assert jnp.allclose(h3.dft_matrix(12), jnp.fft.fft(jnp.eye(12), axis=0), atol=1e-5)


def test_block_fft_checks_its_arguments():
    with pytest.raises(ValueError, match="n1 must divide"):
        h3.block_fft(jnp.ones(10), 3)
    with pytest.raises(TypeError, match="n1"):
        h3.block_fft(jnp.ones(10), 2.0)
