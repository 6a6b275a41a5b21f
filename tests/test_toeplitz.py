"""Tests for annotated_s4.toeplitz (ETSC, gradient baseline), annotated_s4.decoders
and the long-convolution layers of annotated_s4.longconv.

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

from annotated_s4 import S4DLayer, StackedModel, ToeplitzLayer
from annotated_s4.s4 import kernel_diagonal
from annotated_s4.decoders import CacheDecoder, FFTDecoder, SSMDecoder
from annotated_s4.longconv import (ETSCLayer, SGConvLayer, TNNLayer, converted_model,
                                   truncated_model)
from annotated_s4.toeplitz import decaying_kernel as kernel
from annotated_s4.toeplitz import (decay_powers, etsc, etsc_kernel, fit_toeplitz_gradient,
                                   ssm_to_toeplitz, ssm_to_toeplitz_naive, toeplitz_matvec)


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def test_round_trip_float32_n8192():
    t = kernel(8192)
    lambd, b = etsc(t)
    assert lambd.shape == (8192,) and b.shape == (8192,)
    assert rel(ssm_to_toeplitz(lambd, b, 8192), t) <= 1e-5


def test_round_trip_float64_n8192():
    with jax.enable_x64(True):
        t = kernel(8192, dtype=jnp.float64)
        lambd, b = etsc(t)
        assert b.dtype == jnp.complex128
        assert rel(ssm_to_toeplitz(lambd, b, 8192), t) <= 1e-12


@jax.default_matmul_precision("float32")
def test_round_trip_channels_and_inclusion_equation():
    t = kernel(300, d=5)
    lambd, b = etsc(t)
    assert b.shape == (300, 5)
    t_pred = ssm_to_toeplitz(lambd, b, 302)  # i = n gives -sum t, then period n+1
    assert rel(t_pred[:300], t) <= 1e-5
    np.testing.assert_allclose(t_pred[300], -t.sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t_pred[301], t[0], rtol=1e-4, atol=1e-5)
    # the literal Vandermonde evaluation agrees at small n
    assert rel(ssm_to_toeplitz_naive(lambd, b, 300), t) <= 1e-4


@jax.default_matmul_precision("float32")   # to 1e-4: a float32 claim
def test_general_lambda_path_and_real_diagonal_ssm_recovered():
    """A kernel that came from a real diagonal SSM (S4D-style) is recovered by
    ETSC, and the general (non-grid) evaluation reproduces that SSM's kernel."""
    N, L = 16, 512
    Lambda = -0.1 + 1j * jnp.pi * jnp.arange(N)
    B = jnp.ones(N, jnp.complex64)
    C = jax.random.normal(jax.random.PRNGKey(3), (N, 2)) @ jnp.array([1, 1j])
    dt = 0.01
    K = kernel_diagonal(Lambda, B, C, dt, L)
    lambd, b = etsc(K)
    assert rel(ssm_to_toeplitz(lambd, b, L), K) <= 1e-5
    # general path: the SSM's own (lambda, b) in discrete form
    lam_bar = jnp.exp(Lambda * dt)
    b_bar = C * (lam_bar - 1) / Lambda * B
    assert rel(ssm_to_toeplitz(lam_bar, b_bar, L), K) <= 1e-4


@jax.default_matmul_precision("float32")   # a float32 claim
def test_decoders_agree_with_toeplitz_matvec():
    n, d = 256, 3
    t = kernel(n, d, seed=1)
    x = jax.random.normal(jax.random.PRNGKey(2), (n, d))
    y = toeplitz_matvec(t, x)
    lambd, b = etsc(t)
    outs = {
        "fft": jax.jit(FFTDecoder(t).decode)(x),
        "cache": jax.jit(CacheDecoder(t).decode)(x),
        "ssm": jax.jit(SSMDecoder(lambd, b).decode)(x),
        "ssm_plain": jax.jit(SSMDecoder(lambd, b, exact_phase=False).decode)(x),
    }
    for name, out in outs.items():
        assert out.shape == (n, d)
        assert rel(out, y) <= 1e-5, name
    # the dense definition, to check toeplitz_matvec itself
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]      # T[i, j] = t[i - j], i >= j
    T = np.where(lag >= 0, np.asarray(t[:, 0])[np.maximum(lag, 0)], 0.0)
    assert rel(T @ x[:, 0], y[:, 0]) <= 1e-5


def test_exact_phase_state_drifts_less_than_plain_float32_recurrence():
    n = 2048
    t = kernel(n, 1, seed=4)
    x = jax.random.normal(jax.random.PRNGKey(5), (n, 1))
    y = toeplitz_matvec(t, x)
    lambd, b = etsc(t)
    err_exact = rel(jax.jit(SSMDecoder(lambd, b).decode)(x), y)
    err_plain = rel(jax.jit(SSMDecoder(lambd, b, exact_phase=False).decode)(x), y)
    assert err_exact <= 1e-5  # float32 rounding of a running sum, not of powers
    assert err_exact < err_plain / 10


def test_gradient_baseline_reduces_loss_but_stays_inexact():
    t = kernel(64)
    lambd, b, losses = fit_toeplitz_gradient(t, 64, steps=200, lr=1e-2)
    assert losses.shape == (200,)
    assert float(losses[-1]) < float(losses[0])
    assert float(losses[-1]) < 0.5 * float(losses[0])  # it does optimise
    err = rel(ssm_to_toeplitz(lambd, b, 64), t)
    etsc_err = rel(ssm_to_toeplitz(*etsc(t), 64), t)
    # the loss is the squared relative error, so the two must agree
    np.testing.assert_allclose(err ** 2, float(_final_loss(t, lambd, b)), rtol=1e-2)
    assert np.isfinite(err) and err > 100 * etsc_err  # far from ETSC's ~1e-7


def _final_loss(t, lambd, b):
    pred = ssm_to_toeplitz(lambd, b, t.shape[0])
    return jnp.sum((t - pred) ** 2) / jnp.sum(t ** 2)


@pytest.mark.parametrize("bad", [jnp.zeros((0,)), jnp.array([1.0, jnp.nan]),
                                 jnp.zeros((2, 2, 2)), jnp.array(1.0)])
def test_bad_kernel_raises(bad):
    with pytest.raises(ValueError):
        etsc(bad)


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        etsc(jnp.arange(4))
    lambd, b = etsc(kernel(8))
    with pytest.raises(ValueError):
        ssm_to_toeplitz(lambd, b[:3], 8)
    with pytest.raises(ValueError):
        ssm_to_toeplitz(lambd, b, 0)
    with pytest.raises(ValueError):
        fit_toeplitz_gradient(kernel(8), 0)
    with pytest.raises(ValueError):
        SSMDecoder(lambd * jnp.exp(0.3j), b)  # exact phase needs an ETSC grid
    with pytest.raises(ValueError):
        FFTDecoder(kernel(8, 2)).decode(jnp.ones((8, 3)))
    with pytest.raises(ValueError, match="n must be a positive int"):
        ssm_to_toeplitz_naive(lambd, b, 0)
    with pytest.raises(TypeError, match="n must be an int"):
        ssm_to_toeplitz_naive(lambd, b, 2.5)
    for lr in (0, -1e-2, float("nan")):
        with pytest.raises(ValueError, match="lr"):
            fit_toeplitz_gradient(kernel(8), 8, steps=2, lr=lr)
    with pytest.raises(TypeError, match="h must be an int"):
        fit_toeplitz_gradient(kernel(8), 2.0)
    with pytest.raises(ValueError, match="steps must"):
        fit_toeplitz_gradient(kernel(8), 8, steps=0)


@pytest.mark.parametrize("make", [FFTDecoder, CacheDecoder, lambda t: SSMDecoder(*etsc(t))],
                         ids=["fft", "cache", "ssm"])
def test_decoders_reject_inputs_longer_than_the_kernel(make):
    """Past lag n each decoder would be silently wrong (FFT drops the writes,
    Cache sees zero taps, SSM repeats its kernel): it must raise instead."""
    dec = make(kernel(16, 2))
    assert dec.decode(jnp.ones((16, 2))).shape == (16, 2)
    with pytest.raises(ValueError, match="time steps"):
        dec.decode(jnp.ones((17, 2)))
    with pytest.raises(ValueError, match="x_t must have shape"):
        dec.step(dec.empty_cache(), jnp.ones((3,)))
    with pytest.raises(ValueError, match="x_t must have shape"):
        dec.step(dec.empty_cache(), jnp.ones((1, 2)))


def test_checked_entry_points_work_under_jit():
    t = kernel(64, 2)
    lambd, b = etsc(t)
    out = jax.jit(lambda l, bb: ssm_to_toeplitz(l, bb, 64))(lambd, b)
    assert rel(out, t) <= 1e-4  # general exp(i log lambd) path under jit
    x = jax.random.normal(jax.random.PRNGKey(0), (64, 2))
    y = jax.jit(lambda l, bb, x: SSMDecoder(l, bb, exact_phase=False).decode(x))(lambd, b, x)
    assert rel(y, toeplitz_matvec(t, x)) <= 1e-4
    y = jax.jit(lambda bb, x: SSMDecoder.from_etsc(bb).decode(x))(b, x)
    assert rel(y, toeplitz_matvec(t, x)) <= 1e-5


def test_etsc_kernel_matches_checked_entry_point():
    t = kernel(100, 2)
    lambd, b = etsc(t)
    np.testing.assert_allclose(etsc_kernel(b, 250), ssm_to_toeplitz(lambd, b, 250), atol=1e-6)


@jax.default_matmul_precision("float32")
def test_toeplitz_layer_modes_and_conversion():
    model = StackedModel(functools.partial(ToeplitzLayer, L=16), d_output=7, d_model=6,
                         n_layers=2, rngs=nnx.Rngs(0), vocab_size=7, classification=False)
    x = jax.random.randint(jax.random.PRNGKey(0), (2, 20), 0, 7)
    logp = model(x)

    def rnn(model):
        model.init_cache(2)
        prev, out = jnp.full((2,), model.start_token), []
        for i in range(x.shape[1]):
            out.append(model.step(prev))
            prev = x[:, i]
        return jnp.stack(out, 1)

    np.testing.assert_allclose(rnn(model), logp, atol=1e-4)
    original = model.layers[0].seq
    converted = converted_model(model, 24)
    for block in converted.layers:
        assert isinstance(block.seq, ETSCLayer) and block.seq.b.shape == (24, 6)
    assert isinstance(model.layers[0].seq, ToeplitzLayer)  # the original is left as it was
    np.testing.assert_allclose(model(x), logp, atol=1e-6)
    np.testing.assert_allclose(converted(x), logp, atol=1e-4)
    np.testing.assert_allclose(rnn(converted), logp, atol=1e-4)
    with pytest.raises(ValueError, match="kernel length 16"):
        original.to_ssm(8)
    with pytest.raises(ValueError):
        ToeplitzLayer(4, 0, rngs=nnx.Rngs(0))
    s4d = StackedModel(functools.partial(S4DLayer, N=4, L=16), d_output=7, d_model=6,
                       n_layers=1, rngs=nnx.Rngs(0), vocab_size=7, classification=False)
    with pytest.raises(TypeError, match="to_ssm"):
        converted_model(s4d, 24)                # S4D is already an SSM: no to_ssm
    with pytest.raises(TypeError, match="StackedModel"):
        converted_model(original, 24)


@jax.default_matmul_precision("float32")
def test_truncated_model_forgets_beyond_its_lags():
    model = StackedModel(functools.partial(TNNLayer, L=32), d_output=7, d_model=6,
                         n_layers=2, rngs=nnx.Rngs(0), vocab_size=7, classification=False)
    x = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 0, 7)
    cut = truncated_model(model, 8)
    for block, kept in zip(cut.layers, model.layers):
        assert isinstance(block.seq, ToeplitzLayer)
        np.testing.assert_array_equal(block.seq.kernel(8), kept.seq.kernel(8))
        assert not np.any(np.asarray(block.seq.kernel(32))[8:])   # zero from lag 8 on
    assert isinstance(model.layers[0].seq, TNNLayer)            # the original is left as it was
    np.testing.assert_allclose(cut(x[:, :8]), model(x[:, :8]), atol=1e-5)   # the same model to L
    assert float(jnp.abs(cut(x) - model(x))[:, 8:].max()) > 1e-3           # not beyond it
    with pytest.raises(ValueError, match="L"):
        truncated_model(model, 0)
    with pytest.raises(TypeError, match="StackedModel"):
        truncated_model(model.layers[0].seq, 8)


def test_decaying_kernel_and_consecutive_windows():
    t = np.asarray(kernel(4096, seed=3), np.float64)
    assert t.shape == (4096,) and kernel(8, 3).shape == (8, 3)
    np.testing.assert_array_equal(kernel(64, seed=1), kernel(64, seed=1))   # a function of seed
    assert not np.array_equal(kernel(64, seed=1), kernel(64, seed=2))
    first, last = np.abs(t[:512]).mean(), np.abs(t[-512:]).mean()   # decays by about e^-3
    assert 0.03 < last / first < 0.1
    assert kernel(16, dtype=jnp.float64).dtype == jnp.float64 or not jax.config.jax_enable_x64
    with pytest.raises(ValueError, match="n must be"):
        kernel(0)
    with pytest.raises(ValueError, match="d must be"):
        kernel(8, 0)
    from annotated_s4.data import consecutive_windows
    ids = np.arange(10)
    np.testing.assert_array_equal(consecutive_windows(ids, 3), [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(consecutive_windows(ids, 3, 1), [[0, 1, 2]])
    with pytest.raises(ValueError, match="one window"):
        consecutive_windows(ids, 11)
    with pytest.raises(ValueError, match="L must be"):
        consecutive_windows(ids, 0)


# ---------------------------------------------------------------- any kernel, decay, half

def kinds(n, seed=0, dtype=jnp.float32):
    """The kernel kinds the float32 bound must hold for."""
    k = jax.random.PRNGKey(seed)
    i = jnp.arange(n, dtype=dtype)
    return {
        "uniform [0, 10)": jax.random.uniform(k, (n,), dtype, maxval=10.0),  # large mean
        "white noise": jax.random.normal(k, (n,), dtype),
        "decaying 0.99^i": 0.99 ** i * (1 + jax.random.uniform(k, (n,), dtype)),
        "decaying noise": kernel(n, seed=seed, dtype=dtype),
    }


@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_round_trip_float32_any_kernel_n8192(half):
    for seed in (0, 1):
        for name, t in kinds(8192, seed).items():
            err = rel(ssm_to_toeplitz(*etsc(t, half=half), 8192), t)
            assert err <= 1e-5, (name, seed, err)


def test_round_trip_float64_large_mean_and_decayed():
    with jax.enable_x64(True):
        for name, t in kinds(8192, dtype=jnp.float64).items():
            assert rel(ssm_to_toeplitz(*etsc(t), 8192), t) <= 1e-12, name
            assert rel(ssm_to_toeplitz(*etsc(t, half=True), 8192), t) <= 1e-12, name


@pytest.mark.parametrize("gamma", [1.0, 0.999, 0.99, 0.9])
def test_decayed_conversion_exact_then_bounded(gamma):
    with jax.enable_x64(True):
        n = 500
        r = jax.random.uniform(jax.random.PRNGKey(1), (n,), jnp.float64, maxval=10.0)
        t = gamma ** jnp.arange(n) * r  # TNN: a relative-position kernel times decay
        lambd, b = etsc(t, decay=gamma)
        np.testing.assert_allclose(jnp.abs(lambd), gamma, rtol=1e-12)
        pred = ssm_to_toeplitz(lambd, b, 4 * n)
        assert rel(pred[:n], t) <= 1e-12
        # beyond n: gamma^i times the periodic r_bar = (r, -sum r)
        scale = float(jnp.abs(r).sum())  # max |r_bar|
        i = jnp.arange(n, 4 * n)
        assert bool(jnp.all(jnp.abs(pred[n:]) <= (1 + 1e-9) * gamma ** i * scale))
        np.testing.assert_allclose(pred[n], -gamma ** n * r.sum(), rtol=1e-9)
        # the general (non-grid) path and the literal powers agree
        assert rel(ssm_to_toeplitz_naive(lambd, b, n), t) <= 1e-9


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan")])
def test_bad_decay_raises(bad):
    with pytest.raises(ValueError, match="decay"):
        etsc(kernel(16), decay=bad)


@pytest.mark.parametrize("n", [255, 256])
def test_half_state_equals_full(n):
    """t real => b_{N-k} = conj(b_k): ceil(n/2) modes with 2 b_k give the same
    kernel and the same decoder outputs as the n modes."""
    with jax.enable_x64(True):
        t = kernel(n, 3, dtype=jnp.float64) + 2.0
        for gamma in (None, 0.99):
            full, half = etsc(t, decay=gamma), etsc(t, decay=gamma, half=True)
            assert half[1].shape == ((n + 1) // 2, 3)
            np.testing.assert_allclose(half[0], full[0][: (n + 1) // 2], rtol=1e-14)
            kf, kh = ssm_to_toeplitz(*full, 3 * n), ssm_to_toeplitz(*half, 3 * n)
            assert rel(kh, kf) <= 1e-12
            x = jax.random.normal(jax.random.PRNGKey(2), (n, 3), jnp.float64)
            y = toeplitz_matvec(t, x)
            for exact_phase in (True, False):
                yf = SSMDecoder(*full, exact_phase=exact_phase).decode(x)
                yh = SSMDecoder(*half, exact_phase=exact_phase).decode(x)
                assert rel(yh, yf) <= 1e-10 and rel(yh, y) <= 1e-10


def test_decayed_half_decoder_float32():
    n = 2048
    t = 0.995 ** jnp.arange(n) * jax.random.normal(jax.random.PRNGKey(3), (n,))
    x = jax.random.normal(jax.random.PRNGKey(4), (n, 1))
    y = toeplitz_matvec(t[:, None], x)
    dec = SSMDecoder(*etsc(t[:, None], decay=0.995, half=True))
    assert dec.h == n // 2 and dec.n == n
    assert rel(jax.jit(dec.decode)(x), y) <= 1e-5


def test_toeplitz_layer_decayed_conversion():
    layer = ToeplitzLayer(4, 16, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 4))
    y = layer(u)
    ssm = layer.to_ssm(32, decay=0.9)
    np.testing.assert_allclose(ssm(u), y, atol=1e-4)
    ssm.init_cache(2)
    out = jnp.stack([ssm.step(u[:, i]) for i in range(16)], 1)
    np.testing.assert_allclose(out, y, atol=1e-4)
    with pytest.raises(ValueError, match="decay"):
        layer.to_ssm(32, decay=0.0)


@pytest.mark.parametrize("name", ["tnn", "sgconv"])
@jax.default_matmul_precision("float32")   # a float32 claim
def test_generated_kernel_layers_modes_and_conversion(name):
    cls = {"tnn": TNNLayer, "sgconv": SGConvLayer}[name]
    layer = cls(4, 16, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 4))
    y = layer(u)
    assert layer.kernel(40).shape == (4, 40)  # a kernel at any length
    np.testing.assert_allclose(layer.kernel(40)[:, :16], layer.kernel(16), atol=1e-6)

    def rnn(layer):
        layer.init_cache(2)
        return jnp.stack([layer.step(u[:, i]) for i in range(16)], 1)

    np.testing.assert_allclose(rnn(layer), y, atol=1e-4)
    decay = 0.99 if name == "tnn" else None
    for h in (16, 24):
        conv = layer.to_ssm(h, decay=decay)
        np.testing.assert_allclose(conv(u), y, atol=1e-4)
        np.testing.assert_allclose(rnn(conv), y, atol=1e-4)
    # beyond h the decayed TNN echo is bounded by gamma^i max|r_bar|
    if name == "tnn":
        conv = layer.to_ssm(16, decay=0.99)
        r = layer.rpe_values(16)
        bound = 0.99 ** jnp.arange(16, 64) * jnp.abs(r).sum(0).max()
        assert bool(jnp.all(jnp.abs(conv.kernel(64)[:, 16:]) <= 1.001 * bound))


def test_long_convolution_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="kernel_length"):
        SGConvLayer(4, 16, rngs=nnx.Rngs(0), kernel_length=0)
    with pytest.raises(ValueError, match="h"):
        TNNLayer(4, 16, rngs=nnx.Rngs(0)).to_ssm(0)
    b = etsc(kernel(8, 4))[1]
    with pytest.raises(ValueError, match="b"):
        ETSCLayer(b[:, 0], jnp.ones(4))
    with pytest.raises(ValueError, match="D"):
        ETSCLayer(b, jnp.ones(3))
    with pytest.raises(ValueError, match="init_cache"):
        ETSCLayer(b, jnp.ones(4)).step(jnp.zeros((2, 4)))


def test_gradient_fit_init_replaces_the_random_start():
    n = 32
    t = jax.random.normal(jax.random.PRNGKey(3), (n,))
    grid = dict(r=np.full(n, np.log(n - 1)), theta=2 * np.pi * np.arange(n) / n,
                b_re=np.zeros(n), b_im=np.zeros(n))
    lambd, _, losses = fit_toeplitz_gradient(t, n, steps=1, init=grid)
    # before its first step the fit is at the start it was given: b = 0, loss 1
    assert float(losses[0]) == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(np.abs(lambd), 1 - 1 / n, rtol=1e-4)
    # from that start (phases on a DFT grid) the fit is least squares in b and converges
    _, _, losses = fit_toeplitz_gradient(t, n, steps=800, lr=1e-2, init=grid)
    assert float(np.sqrt(losses.min())) < 1e-2
    with pytest.raises(ValueError, match="unknown names"):
        fit_toeplitz_gradient(t, n, steps=1, init={"phase": np.zeros(n)})
    with pytest.raises(ValueError, match=r"init\['r'\] must have shape"):
        fit_toeplitz_gradient(t, n, steps=1, init={"r": np.zeros(n + 1)})
    with pytest.raises(TypeError, match="init must be a dict"):
        fit_toeplitz_gradient(t, n, steps=1, init=[0.0])


def test_gradient_fit_fixed_holds_lambda_and_fits_b_alone():
    n = 16
    t = jax.random.normal(jax.random.PRNGKey(4), (n,))
    grid = dict(r=np.full(n, np.log(n - 1)), theta=2 * np.pi * np.arange(n) / n,
                b_re=np.zeros(n), b_im=np.zeros(n))
    start = (1 - 1 / n) * np.exp(2j * np.pi * np.arange(n) / n)
    lambd, b, losses = fit_toeplitz_gradient(t, n, steps=300, lr=1e-2, init=grid,
                                             fixed=("r", "theta"))
    np.testing.assert_allclose(np.asarray(lambd), start, rtol=1e-6, atol=1e-6)  # held
    assert float(losses[-1]) < 0.1 * float(losses[0])                      # b fitted
    # Adam on b alone with lambd fixed: its residual is within its own loss of the
    # least-squares residual on the same lambd
    powers = start[None, :] ** np.arange(n)[:, None]
    b_ls = np.linalg.lstsq(powers, np.asarray(t, np.complex128), rcond=None)[0]
    assert np.linalg.norm(powers @ np.asarray(b) - t) < 2 * np.linalg.norm(t) * np.sqrt(
        float(losses[-1])) + np.linalg.norm(powers @ b_ls - t)
    lambd_free, _, _ = fit_toeplitz_gradient(t, n, steps=300, lr=1e-2, init=grid)
    assert not np.allclose(np.asarray(lambd_free), start, rtol=1e-3)   # unfixed, it moves
    with pytest.raises(ValueError, match="unknown names"):
        fit_toeplitz_gradient(t, n, steps=1, fixed=("lambda",))
    with pytest.raises(ValueError, match="nothing would be fitted"):
        fit_toeplitz_gradient(t, n, steps=1, fixed=("r", "theta", "b_re", "b_im"))
    with pytest.raises(TypeError, match="fixed must be a tuple"):
        fit_toeplitz_gradient(t, n, steps=1, fixed="r")


def test_etsc_grid_recognises_rounding_but_does_not_snap():
    from annotated_s4.toeplitz import etsc_grid
    lambd, _ = etsc(kernel(1000))  # float32: the grid, rounded
    assert etsc_grid(lambd) == (1001, None)
    with jax.enable_x64(True):
        t = kernel(1000, dtype=jnp.float64)
        lambd, b = etsc(t)
        assert etsc_grid(lambd) == (1001, None)
        phase = 3e-6 * np.random.default_rng(0).normal(size=1000)
        phase[0] = 0.0
        moved = lambd * jnp.exp(1j * jnp.asarray(phase))  # off the grid by far more than rounding
        assert etsc_grid(moved) is None
        assert rel(ssm_to_toeplitz(moved, b, 1000), ssm_to_toeplitz_naive(moved, b, 1000)) < 1e-9
        # a decay within 1e-6 of 1 is still a decay in float64 (far beyond its rounding)
        lambd, b = etsc(t, decay=0.9999995)
        N, gamma = etsc_grid(lambd)
        assert N == 1001 and abs(gamma - 0.9999995) < 1e-12
        assert rel(ssm_to_toeplitz(lambd, b, 1000), t) < 1e-10


@jax.default_matmul_precision("float32")   # both paths evaluate TNN's network
def test_tnn_converts_its_network_directly_past_float32_decay_range():
    layer = TNNLayer(2, 64, rngs=nnx.Rngs(0), gamma=0.99)
    direct = layer.to_ssm(512, decay=0.99)
    via_t = ETSCLayer.from_kernel(layer.kernel(512), layer.D[...], decay=0.99)
    assert rel(direct.b[...], via_t.b[...]) < 1e-5  # the same SSM
    with pytest.raises(ValueError, match="decay"):
        ETSCLayer.from_kernel(layer.kernel(9000), layer.D[...], decay=0.99)  # 0.99^i underflows
    long = layer.to_ssm(9000, decay=0.99)
    assert bool(jnp.all(jnp.isfinite(long.b[...])))
    assert rel(long.kernel(256), layer.kernel(256)) < 1e-3


def test_decayed_float32_lambda_rounds_gamma_and_exact_gamma_does_not():
    """In float32 the decayed grid's lambd carries a rounded gamma: the kernel
    read off lambd is t_i (gamma_read / gamma)^i, off by about i delta, while the
    same b evaluated with the exact gamma (as the long-convolution layers do)
    is exact to float32 rounding."""
    from annotated_s4.toeplitz import etsc_grid
    n, gamma = 8192, 0.999
    r = np.random.default_rng(6).standard_normal(n)
    t = jnp.asarray(r * gamma ** np.arange(n), jnp.float32)
    lambd, b = etsc(t, decay=gamma)
    gamma_read = etsc_grid(lambd)[1]
    assert gamma_read != gamma and abs(gamma_read / gamma - 1) <= 2.0 ** -23
    from_lambda = ssm_to_toeplitz(lambd, b, n)
    exact = rel(etsc_kernel(b, n, decay=gamma), t)
    assert exact <= 1e-6
    assert rel(from_lambda, t) > 10 * exact  # the rounded gamma's powers show
    drift = jnp.asarray(t * (gamma_read / gamma) ** np.arange(n), jnp.float32)
    assert rel(from_lambda, drift) <= 1e-6  # and they are the whole difference


def test_a_decay_is_refused_where_its_powers_leave_the_normal_numbers():
    """The limit on n follows from gamma and n alone (every gamma^i, i < n, a
    normal float32 number), so it is the same on a CPU, where XLA flushes
    subnormal numbers to zero, on a GPU, where it keeps them, and inside jit."""
    gamma = 0.99
    n_max = int(np.log(np.finfo(np.float32).tiny) / np.log(gamma)) + 1  # gamma^(n_max - 1) normal
    assert np.float32(gamma ** (n_max - 1)) >= np.finfo(np.float32).tiny > np.float32(gamma ** n_max)
    decayed = functools.partial(decay_powers, gamma, dtype=jnp.float32)  # t_i = gamma^i
    lambd, b = etsc(decayed(n_max), decay=gamma)
    assert bool(jnp.all(jnp.isfinite(b)))
    with pytest.raises(ValueError, match="smallest normal float32"):
        etsc(decayed(n_max + 1), decay=gamma)
    with pytest.raises(ValueError, match="decay = 0.99 is too strong"):
        jax.jit(lambda t: etsc(t, decay=gamma))(decayed(n_max + 1))
