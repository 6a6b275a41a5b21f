"""Tests for annotated_s4.layers: SSMLayer, S4Layer and S4DLayer, and the layer
contract (see `models`) checked on every layer of the package.

Checks that two computations agree in float32 run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU multiplies
float32 matrices in TF32 (see annotated_s4.precision and tests/test_precision.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import K_conv, S4DLayer, S4Layer, SSMLayer, StackedModel
from annotated_s4.attention import CausalSelfAttention
from annotated_s4 import catalog
from annotated_s4.h3 import H3Layer
from annotated_s4.hippo import make_DPLR_HiPPO
from annotated_s4.layers import log_dt_initializer
from annotated_s4.sample import rnn_log_probs
from annotated_s4.longconv import TNNLayer, ToeplitzLayer


def test_log_dt_initializer_range():
    x = log_dt_initializer(jax.random.PRNGKey(0), (1000,), 0.001, 0.1)
    assert float(x.min()) >= np.log(0.001) and float(x.max()) <= np.log(0.1)
    assert float(x.max()) - float(x.min()) > 0.9 * (np.log(0.1) - np.log(0.001))


def test_ssm_layer_kernel_is_K_conv():
    layer = SSMLayer(H=3, N=5, L=16, rngs=nnx.Rngs(0))
    Ab, Bb, Cb = layer.discrete()
    K = layer.kernel()
    assert K.shape == (3, 16)
    for h in range(3):
        np.testing.assert_allclose(K[h], K_conv(Ab[h], Bb[h], Cb[h], 16), rtol=1e-5, atol=1e-6)


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


def test_ssm_layer_hippo_init_changes_only_A_and_B():
    """init="hippo": every channel's A and B are HiPPO-LegS's (A_nk = -sqrt(2n+1)
    sqrt(2k+1) below the diagonal, -(n+1) on it; B_n = sqrt(2n+1)); C, D and the
    step sizes (log_dt) are what the Gaussian layer of the same seed draws."""
    H, N = 3, 4
    gaussian = SSMLayer(H, N, 8, rngs=nnx.Rngs(0))
    hippo = SSMLayer(H, N, 8, rngs=nnx.Rngs(0), init="hippo")
    A = np.array([[-1, 0, 0, 0], [-3 ** .5, -2, 0, 0], [-5 ** .5, -15 ** .5, -3, 0],
                  [-7 ** .5, -21 ** .5, -35 ** .5, -4]])
    for h in range(H):
        np.testing.assert_allclose(hippo.A[...][h], A, rtol=1e-6)
        np.testing.assert_allclose(hippo.B[...][h, :, 0], np.sqrt([1, 3, 5, 7]), rtol=1e-6)
    for name in ("C", "D", "log_dt"):
        np.testing.assert_array_equal(getattr(hippo, name)[...], getattr(gaussian, name)[...])
    with pytest.raises(ValueError, match="init must be one of"):
        SSMLayer(H, N, 8, rngs=nnx.Rngs(0), init="legt")


# --- S4Layer and S4DLayer -----------------------------------------------------


H, N, L, BATCH = 3, 8, 32, 2

LAYERS = [
    ("s4", functools.partial(S4Layer, N=N, L=L)),
    ("s4-independent", functools.partial(S4Layer, N=N, L=L, shared=False)),
    ("s4-gaussian", functools.partial(S4Layer, N=N, L=L, init="gaussian")),
    ("s4d-lin", functools.partial(S4DLayer, N=N, L=L, init="lin")),
    ("s4d-inv", functools.partial(S4DLayer, N=N, L=L, init="inv")),
]


def _rnn(layer, u):
    layer.init_cache(u.shape[0])
    step = nnx.jit(lambda layer, u_t: layer.step(u_t))
    return jnp.stack([step(layer, u[:, k]) for k in range(u.shape[1])], axis=1)


# --- The layer contract, on every layer and variant ---------------------------


def registered_variants(L):
    """{name: factory} of every registered layer at its default options, and
    once more for each other choice of each option that has choices and for
    each flag option turned on (a layer that alternates several factories
    gives one entry each)."""
    variants = {}
    for name, entry in catalog.LAYERS.items():
        default = entry.options()
        cases = {name: default}
        for f in dataclasses.fields(default):
            others = ([c for c in f.metadata["choices"] if c != f.default]
                      if f.metadata["choices"] is not None
                      else [True] if catalog.option_type(entry.options, f.name) is bool else [])
            cases.update({f"{name}-{f.name}={v}": dataclasses.replace(default, **{f.name: v})
                          for v in others})
        for label, options in cases.items():
            built = entry.build(options, L)
            if isinstance(built, list):
                variants.update({f"{label}[{i}]": f for i, f in enumerate(built)})
            else:
                variants[label] = built
    return variants


CONTRACT = {
    **registered_variants(L),
    # variants that are not --layer options
    "s4d-fixed-B": functools.partial(S4DLayer, N=N, learn_B=False),  # H3's diagonal SSM
    "h3-heads": functools.partial(H3Layer, head_dim=2, state_size=4, shift_size=3),
    "attention-flash": functools.partial(CausalSelfAttention, n_heads=2, max_len=L,
                                         flash_block=8),
    "toeplitz": functools.partial(ToeplitzLayer, L=L),
    # what to_ssm returns: ETSC's diagonal SSM of a kernel, plain and with TNN's decay
    "etsc": lambda H, rngs: ToeplitzLayer(H, L, rngs=rngs).to_ssm(L),
    "etsc-decayed": lambda H, rngs: TNNLayer(H, L, rngs=rngs).to_ssm(L, decay=0.99),
}
WIDTH = 8  # channels: every registered layer's default heads divide it


@pytest.mark.parametrize("name", sorted(CONTRACT))
@jax.default_matmul_precision("float32")
def test_layer_contract(name):
    """(batch, L, H) in and out, under jit as eagerly; RNN mode (a jitted step)
    equals CNN mode; causal and batch-independent; max_len enforced."""
    layer = CONTRACT[name](WIDTH, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (BATCH, L, WIDTH))
    jitted = nnx.jit(lambda layer, u: layer(u))
    y = jitted(layer, u)
    assert y.shape == (BATCH, L, WIDTH)
    scale = float(jnp.abs(y).max())
    np.testing.assert_allclose(layer(u), y, atol=1e-5 * scale)
    np.testing.assert_allclose(_rnn(layer, u), y, atol=1e-4 * scale)
    # changing sequence 1 from step 10 on changes neither sequence 0 nor
    # sequence 1's outputs before step 10 (the program compiled above: the
    # eager mode is checked against it once, above)
    y2 = jitted(layer, u.at[1, 10:].set(0.0))
    np.testing.assert_allclose(y2[0], y[0], atol=1e-5 * scale)
    np.testing.assert_allclose(y2[1, :10], y[1, :10], atol=1e-5 * scale)
    assert not np.allclose(y2[1, 10:], y[1, 10:], atol=1e-3 * scale)
    if layer.max_len is None:   # compiled: eagerly, every operation would compile anew at 2L
        assert jitted(layer, jnp.zeros((1, 2 * L, WIDTH))).shape == (1, 2 * L, WIDTH)
    else:
        assert layer.max_len == L
        with pytest.raises(ValueError, match="max_len"):
            layer(jnp.zeros((1, L + 1, WIDTH)))
    with pytest.raises(ValueError, match="u"):
        layer(jnp.zeros((1, L, WIDTH + 1)))


@pytest.mark.parametrize("name,make", LAYERS)
def test_params_get_gradients(name, make):
    layer = make(H, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(3), (BATCH, L, H))
    grads = nnx.grad(lambda m: jnp.sum(m(u) ** 2))(layer)
    leaves = jax.tree_util.tree_leaves(grads)
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert float(jnp.abs(grads.log_dt[...]).sum()) > 0
    assert float(jnp.abs(grads.C[...]).sum()) > 0


def test_s4_is_hippo_initialised_and_stable():
    layer = S4Layer(H, N, L, rngs=nnx.Rngs(0))
    Lambda, P, B, C, dt = layer.ssm_params()
    Lambda0, P0, B0, _ = make_DPLR_HiPPO(N, conj=True)
    assert np.allclose(Lambda.real, -0.5, atol=1e-6)
    # the whole DPLR HiPPO, not only its real part: one shared copy (float32)
    # of the N/2 modes with Im Lambda > 0 (the others are their conjugates)
    assert Lambda.shape == P.shape == B.shape == (N // 2,)
    assert np.all(Lambda.imag > 0)
    np.testing.assert_allclose(Lambda.imag, Lambda0.imag, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(P, P0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(B, B0, rtol=1e-6, atol=1e-6)
    assert C.shape == (H, N // 2) and dt.shape == (H,)
    with pytest.raises(ValueError, match="N must be even"):
        S4Layer(H, 7, L, rngs=nnx.Rngs(0))


@jax.default_matmul_precision("float32")   # a float32 claim: a GPU's default rounds to TF32
def test_s4_independent_copies_start_as_the_shared_one():
    shared = S4Layer(H, N, L, rngs=nnx.Rngs(0))
    own = S4Layer(H, N, L, rngs=nnx.Rngs(0), shared=False)
    assert shared.Lambda_im[...].shape == (N // 2,)
    assert own.Lambda_im[...].shape == own.Lambda_log_neg_re[...].shape == (H, N // 2)
    assert own.P[...].shape == own.B[...].shape == (H, N // 2, 2)
    for name in ("Lambda_im", "Lambda_log_neg_re", "P", "B"):   # each channel's copy
        np.testing.assert_array_equal(getattr(own, name)[...],
                                      np.broadcast_to(getattr(shared, name)[...],
                                                      getattr(own, name)[...].shape))
    np.testing.assert_allclose(own.kernel(), shared.kernel(), rtol=1e-6, atol=1e-7)
    # every channel's copy gets its own gradient
    u = jax.random.normal(jax.random.PRNGKey(3), (BATCH, L, H))
    grads = nnx.grad(lambda m: (m(u) ** 2).sum())(own)
    g = np.asarray(grads.Lambda_im[...])
    assert not np.allclose(g[0], g[1])
    with pytest.raises(TypeError, match="shared"):
        S4Layer(H, N, L, rngs=nnx.Rngs(0), shared="no")


def test_s4_kernel_length_is_at_most_L():
    layer = S4Layer(H, N, L, rngs=nnx.Rngs(0))
    assert layer.kernel(10).shape == (H, 10)
    np.testing.assert_allclose(layer.kernel(10), layer.kernel()[:, :10], rtol=1e-6)
    with pytest.raises(ValueError, match="L must be at most"):
        layer.kernel(L + 1)
    with pytest.raises(ValueError, match="L must be a positive int"):
        layer.kernel(0)


# The float64 checks run in this process, under `jax.enable_x64` (the package
# keeps no arrays between calls, so nothing made here outlives the block).


def test_O_N_step_equals_dense_step_float64():
    """S4Layer.step (diagonal plus rank one, O(N)) == the dense Ab step, 1e-10 in float64."""
    from annotated_s4.s4 import discrete_DPLR, unfold_conj

    H, N, L = 3, 16, 64
    with jax.enable_x64():
        layer = S4Layer(H, N, L, rngs=nnx.Rngs(0))
        u = jax.random.normal(jax.random.PRNGKey(1), (2, L, H))
        layer.init_cache(2)
        assert layer.cache[...].shape == (2, H, N // 2)
        assert layer.cache[...].dtype == jnp.complex128
        y_fast = jnp.stack([layer.step(u[:, k]) for k in range(L)], axis=1)
        # the dense step: Ab (H, N, N) over all N modes, unfolded from the N/2 stored ones
        Lambda, P, B, C, dt = layer.ssm_params()
        Ab, Bb, Cb = jax.vmap(lambda C, s: discrete_DPLR(*unfold_conj(Lambda, P, P, B, C), s, L))(
            C, dt)
        x = jnp.zeros((2, H, N), complex)
        ys = []
        for k in range(L):
            x = jnp.einsum("hnm,bhm->bhn", Ab, x) + Bb[..., 0] * u[:, k, :, None]
            ys.append(jnp.einsum("hn,bhn->bh", Cb[:, 0], x).real + layer.D[...] * u[:, k])
        y_dense = jnp.stack(ys, axis=1)
        assert y_dense.dtype == jnp.float64
        err = float(jnp.abs(y_fast - y_dense).max() / jnp.abs(y_dense).max())
    assert err < 1e-10, err


def test_cnn_equals_rnn_float64():
    """In float64 the two modes agree to 1e-10 relative: the float32 gap is rounding."""
    with jax.enable_x64():
        u = jax.random.normal(jax.random.PRNGKey(1), (2, 64, 3))
        for make in [functools.partial(S4Layer, N=16, L=64),
                     functools.partial(S4DLayer, N=16, L=64, init="lin"),
                     functools.partial(S4DLayer, N=16, L=64, init="inv")]:
            layer = make(3, rngs=nnx.Rngs(0))
            assert layer.C[...].dtype == jnp.float64 and layer.Lambda_im[...].dtype == jnp.float64
            y_cnn = layer(u)
            layer.init_cache(2)
            assert layer.cache[...].dtype == jnp.complex128
            y_rnn = jnp.stack([layer.step(u[:, k]) for k in range(64)], axis=1)
            assert y_cnn.dtype == y_rnn.dtype == jnp.float64
            err = float(jnp.abs(y_cnn - y_rnn).max() / jnp.abs(y_cnn).max())
            assert err < 1e-10, (type(layer).__name__, err)


def test_params_follow_default_float_dtype():
    for layer in [S4Layer(H, N, L, rngs=nnx.Rngs(0)), S4DLayer(H, N, L, rngs=nnx.Rngs(0))]:
        for leaf in jax.tree_util.tree_leaves(nnx.state(layer, nnx.Param)):
            assert leaf.dtype == jnp.float32


@pytest.mark.parametrize("learn_B", [True, False])
@jax.default_matmul_precision("float32")   # to 1e-5: a float32 claim
def test_s4d_kernel_is_the_reference_formula(learn_B):
    from annotated_s4.s4 import kernel_diagonal

    layer = S4DLayer(4, 16, rngs=nnx.Rngs(0), learn_B=learn_B)
    if learn_B:  # a B that is not 1, so that B_bar's factor B is tested
        layer.B[...] = jax.random.normal(jax.random.PRNGKey(1), layer.B[...].shape)
    Lambda, B, C, dt = layer.ssm_params()
    ref = jax.vmap(kernel_diagonal, in_axes=(0, 0, 0, 0, None))(Lambda, B, 2 * C, dt, 300)
    assert jnp.allclose(layer.kernel(300), ref, atol=1e-5 * float(jnp.abs(ref).max()))
    assert (layer.B is None) == (not learn_B)


def test_s4d_errors():
    with pytest.raises(ValueError, match="init"):
        S4DLayer(H, N, L, rngs=nnx.Rngs(0), init="legs")
    with pytest.raises(ValueError, match="N must be even"):
        S4DLayer(H, 5, L, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="learn_B must be True or False"):
        S4DLayer(H, N, L, rngs=nnx.Rngs(0), learn_B=0)
    layer = S4DLayer(H, N, L, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="more than the layer's max_len"):
        layer(jnp.zeros((1, L + 1, H)))
    assert S4DLayer(H, N, rngs=nnx.Rngs(0))(jnp.zeros((1, L + 1, H))).shape == (1, L + 1, H)
    with pytest.raises(ValueError, match="init_cache"):
        layer.step(jnp.zeros((1, H)))


@jax.default_matmul_precision("float32")
def test_generation_model_rnn_matches_cnn():
    model = StackedModel(functools.partial(S4Layer, N=N, L=16), d_output=5, d_model=4,
                         n_layers=2, rngs=nnx.Rngs(0), vocab_size=5, classification=False)
    x = jax.random.randint(jax.random.PRNGKey(4), (2, 16), 0, 5)
    logp = model(x)
    assert np.allclose(rnn_log_probs(model, x), logp, atol=1e-4)


def test_random_NPLR_is_a_stable_gaussian_spectrum():
    from annotated_s4.layers import random_NPLR

    Lambda, P, B = random_NPLR(jax.random.PRNGKey(0), 4096)
    assert Lambda.shape == P.shape == B.shape == (2048,)
    assert np.all(Lambda.real < 0) and np.all(Lambda.imag > 0)
    # E|Lambda|^2 = N / 2, the circular law's mean square for unit Gaussians
    np.testing.assert_allclose(np.mean(np.abs(Lambda) ** 2), 4096 / 2, rtol=0.05)
    np.testing.assert_allclose(np.mean(np.abs(P) ** 2), 1.0, rtol=0.1)  # 4 sigma
    np.testing.assert_allclose(np.mean(np.abs(B) ** 2), 1.0, rtol=0.1)
    # A = diag(Lambda) - P P^* (with the conjugate half) is stable
    Lambda, P, _ = random_NPLR(jax.random.PRNGKey(1), 16)
    L2, P2 = np.concatenate([Lambda, Lambda.conj()]), np.concatenate([P, P.conj()])
    A = np.diag(L2) - np.outer(P2, P2.conj())
    assert np.linalg.eigvals(A).real.max() < 0
    layer = S4Layer(2, 16, 8, rngs=nnx.Rngs(3), init="gaussian")
    assert not np.allclose(layer.ssm_params()[0].imag, make_DPLR_HiPPO(16, conj=True)[0].imag)


def test_random_DPLR_keeps_the_scale_of_hippo_but_not_its_structure():
    from annotated_s4.hippo import make_DPLR_HiPPO
    from annotated_s4.layers import random_DPLR_like

    Lambda, P, B, _ = make_DPLR_HiPPO(16, conj=True)
    rL, rP, rB = random_DPLR_like(jax.random.PRNGKey(0), Lambda, P, B)
    np.testing.assert_allclose(rL.real, Lambda.real)
    assert 0 <= rL.imag.min() and rL.imag.max() <= Lambda.imag.max()
    np.testing.assert_allclose(np.linalg.norm(rP), np.linalg.norm(P), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(rB), np.linalg.norm(B), rtol=1e-5)
    assert not np.allclose(np.abs(rP), np.abs(P), rtol=0.1)
    with pytest.raises(ValueError, match="init"):
        S4Layer(4, 8, 16, rngs=nnx.Rngs(0), init="legs")


def test_s4_b_clip_clips_the_imaginary_part_of_B_only():
    hippo = S4Layer(4, 16, 32, rngs=nnx.Rngs(0))
    clipped = S4Layer(4, 16, 32, rngs=nnx.Rngs(0), b_clip=2.0)
    B, B_clip = hippo.ssm_params()[2], clipped.ssm_params()[2]
    assert float(jnp.abs(B.imag).max()) > 2.0
    np.testing.assert_allclose(B_clip.real, B.real)
    np.testing.assert_allclose(B_clip.imag, jnp.clip(B.imag, -2.0, 2.0))
    with pytest.raises(ValueError, match="b_clip"):
        S4Layer(4, 16, 32, rngs=nnx.Rngs(0), b_clip=0.0)


def test_linear_and_scale_channels_equal_the_plain_forms():
    """The flattened forms compute the same values and gradients as nnx.Linear
    and the broadcast product, for a batch of one and of several."""
    from annotated_s4.layers import Linear, scale_channels

    flat, plain = Linear(6, 4, rngs=nnx.Rngs(0)), nnx.Linear(6, 4, rngs=nnx.Rngs(0))
    c = jax.random.normal(jax.random.PRNGKey(1), (3, 2))
    for batch in (1, 5):
        x = jax.random.normal(jax.random.PRNGKey(2), (batch, 7, 6))
        assert jnp.allclose(flat(x), plain(x), rtol=1e-6, atol=1e-6)
        grads = [nnx.grad(lambda m: jnp.sum(jnp.sin(m(x))))(m) for m in (flat, plain)]
        for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
            assert jnp.allclose(a, b, rtol=1e-5, atol=1e-6)
        y = jax.random.normal(jax.random.PRNGKey(3), (batch, 7, 3, 2))
        assert jnp.array_equal(scale_channels(c, y), c * y)
        g_flat, g_plain = (jax.grad(lambda c: jnp.sum(jnp.sin(f(c, y))))(c)
                           for f in (scale_channels, lambda c, y: c * y))
        assert jnp.allclose(g_flat, g_plain, rtol=1e-5, atol=1e-6)
