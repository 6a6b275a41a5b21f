"""Tests for annotated_s4.catalog: a layer declares itself once, and the
command line, config.json and the run directory follow. A layer defined here,
outside the package, trains, saves, reloads and evaluates through the same
path as the CLI."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import _checks as checks
from annotated_s4 import catalog, registry, runner
from annotated_s4.catalog import (LayerOptions, SSMParam, option, register_layer,
                                  unregister_layer)


class ToyDiagonal(nnx.Module):
    """H channels of a real diagonal SSM x_k = a x_{k-1} + u_k, y_k = c . x_k
    (a = exp(-exp(log_rate)) in (0, 1)), under the layer contract."""

    max_len = None

    def __init__(self, H, N, *, rngs, rate=0.1):
        self.H, self.N = H, N
        self.log_rate = SSMParam(jnp.log(jnp.full((H, N), rate)) +
                                 0.1 * jax.random.normal(rngs.params(), (H, N)))
        self.c = nnx.Param(jax.random.normal(rngs.params(), (H, N)) / N ** 0.5)
        self.cache = nnx.data(None)

    def decay(self):
        return jnp.exp(-jnp.exp(self.log_rate[...]))

    def __call__(self, u):
        checks.sequence(u, self.H)
        K = jnp.einsum("hn,hnl->hl", self.c[...],
                       self.decay()[..., None] ** jnp.arange(u.shape[1]))  # (H, L)
        return _conv(u, K)

    def init_cache(self, batch_size):
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N)))

    def step(self, u_t):
        x = self.decay() * self.cache[...] + u_t[..., None]
        self.cache[...] = x
        return jnp.einsum("hn,bhn->bh", self.c[...], x)


def _conv(u, K):
    """y_l = sum_j K_j u_{l-j} per channel: u (batch, L, H), K (H, L)."""
    L = u.shape[1]
    T = jnp.tril(K[:, jnp.arange(L)[:, None] - jnp.arange(L)[None, :]])  # (H, L, L)
    return jnp.einsum("hlj,bjh->blh", T, u)


@dataclasses.dataclass(frozen=True)
class ToyOptions(LayerOptions):
    state: int = option(4, "modes per channel", check=checks.positive_int)
    rate: float = option(0.1, "initial decay rate per step", check=checks.positive_number)


@pytest.fixture
def toy_layer():
    register_layer("toy", ToyOptions,
                   lambda o, L: functools.partial(ToyDiagonal, N=o.state, rate=o.rate),
                   help="a diagonal SSM defined in a test")
    yield
    unregister_layer("toy")
    assert "toy" not in catalog.LAYERS


def test_a_layer_defined_outside_the_package_trains_saves_and_reloads(tmp_path, toy_layer):
    out = tmp_path / "toy"
    config = registry.parse(["--dataset", "digits", "--layer", "toy", "--state", "3",
                             "--rate", "0.2", "--n-layers", "1", "--d-model", "8",
                             "--batch-size", "16", "--steps", "3", "--out", str(out)])
    assert config.layer_options == ToyOptions(state=3, rate=0.2)
    result = runner.run(config, log=None)
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["layer"] == "toy" and recorded["layer_options"] == {"state": 3, "rate": 0.2}
    layer = result["model"].layers[0].seq
    assert isinstance(layer, ToyDiagonal) and layer.log_rate[...].shape == (8, 3)
    # reloaded from the run directory: the same model, the same metrics
    metrics, run = runner.evaluate_run(str(out))
    assert metrics["test_loss"] == pytest.approx(result["test_loss"], rel=1e-5)
    np.testing.assert_array_equal(run["model"].layers[0].seq.c[...], layer.c[...])
    with pytest.raises(ValueError, match="--rate"):
        registry.parse(["--layer", "toy", "--rate", "0"])
    assert "--layer toy: a diagonal SSM defined in a test" in registry.parser().format_help()


@jax.default_matmul_precision("float32")
def test_the_toy_layer_keeps_the_contract(toy_layer):
    """Its CNN mode equals its RNN mode (what sampling relies on), to float32
    rounding (at float32 matmul precision: a GPU's TF32 products err ~2^-11)."""
    layer = registry.LAYERS["toy"].build(ToyOptions(), 16)(3, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 3))
    layer.init_cache(2)
    rnn = jnp.stack([layer.step(u[:, k]) for k in range(16)], axis=1)
    np.testing.assert_allclose(layer(u), rnn, rtol=1e-5, atol=1e-5)


def test_registration_refuses_what_it_cannot_use(toy_layer):
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_layer("toy", ToyOptions, lambda o, L: None, help="again")

    class Undecorated(LayerOptions):  # its field would not be an option
        n: int = option(1, "n")

    with pytest.raises(TypeError, match="frozen dataclass"):
        register_layer("undecorated", Undecorated, lambda o, L: None, help="")

    @dataclasses.dataclass(frozen=True)
    class NoHelp(LayerOptions):
        n: int = 1

    with pytest.raises(TypeError, match="catalog.option"):
        register_layer("nohelp", NoHelp, lambda o, L: None, help="")
    with pytest.raises(ValueError, match="no layer named 'lstm'"):
        unregister_layer("lstm")
    assert set(catalog.LAYERS) >= {"toy", "s4"} and "undecorated" not in catalog.LAYERS
