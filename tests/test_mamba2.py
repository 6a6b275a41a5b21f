"""Tests for annotated_s4.mamba2: the Mamba-2 block's algorithms against
each other in float64, its RNN mode's constant state, its initialisation,
parameter count, gate and norm, checks and options. (Its SSM core, `ssd`,
is compared with the official ssd_minimal_discrete in test_selective.py; the
layer contract, RNN mode against CNN mode among it, in test_layers.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import Mamba2Block, Mamba2Options, gated_rmsnorm, mamba2_param_count, registry
from annotated_s4.catalog import SSMParam
from annotated_s4.ssd import SSD_ALGORITHMS


@pytest.mark.parametrize("H,expand,N,P,W", [(8, 2, 16, 8, 4), (6, 3, 4, 9, 2), (36, 2, 16, 8, 4)])
def test_parameter_count_is_the_formula(H, expand, N, P, W):
    block = nnx.eval_shape(lambda: Mamba2Block(H, rngs=nnx.Rngs(0), state_size=N, expand=expand,
                                               head_dim=P, conv_width=W))
    assert registry.count_params(block) == mamba2_param_count(H, expand * H, N, P, W)


def test_the_algorithms_are_one_map_in_float64():
    """Recurrent, associative, quadratic and chunked (chunks that do not divide L, and one
    chunk longer than L) give the same outputs to float64 rounding."""
    with jax.enable_x64(True):
        u = jax.random.normal(jax.random.PRNGKey(1), (2, 37, 8), dtype=jnp.float64)
        outputs = {}
        for algorithm, chunk in [("recurrent", 64), ("associative", 64), ("quadratic", 64),
                                 ("chunked", 8), ("chunked", 64)]:
            block = Mamba2Block(8, rngs=nnx.Rngs(0), head_dim=4, state_size=6,
                                algorithm=algorithm, chunk=chunk)
            block = jax.tree.map(lambda v: v.astype(jnp.float64) if hasattr(v, "astype") else v,
                                 block)
            outputs[algorithm, chunk] = np.asarray(block(u))
        ref = outputs["recurrent", 64]
        assert ref.dtype == np.float64
        for key, y in outputs.items():
            np.testing.assert_allclose(y, ref, rtol=0, atol=1e-12 * np.abs(ref).max(), err_msg=key)


@jax.default_matmul_precision("float32")
def test_the_state_per_token_does_not_grow_with_the_prompt():
    """RNN mode keeps the conv's window and the SSM state, of fixed shapes,
    however many tokens came before; its outputs equal CNN mode's."""
    block = Mamba2Block(8, rngs=nnx.Rngs(0), head_dim=4)
    u = jax.random.normal(jax.random.PRNGKey(2), (1, 40, 8))
    step = nnx.jit(lambda block, u_t: block.step(u_t))
    shapes = []
    block.init_cache(1)
    ys = []
    for t in range(40):
        ys.append(step(block, u[:, t]))
        if t in (4, 39):
            shapes.append((block.window[...].shape, block.cache[...].shape))
    assert shapes[0] == shapes[1] == (((1, 4, 16 + 2 * 16)), (1, 4, 4, 16))
    y = block(u)
    np.testing.assert_allclose(jnp.stack(ys, 1), y, atol=1e-4 * float(jnp.abs(y).max()))


def test_initialisation_is_the_official_one():
    block = Mamba2Block(64, rngs=nnx.Rngs(0), head_dim=4)            # 32 heads
    A = -np.asarray(block.A())
    assert A.shape == (32,) and (A >= 1).all() and (A <= 16).all() and A.std() > 2
    dt = np.asarray(jax.nn.softplus(block.dt_bias[...]))
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert (np.asarray(block.D[...]) == 1).all() and (np.asarray(block.norm[...]) == 1).all()
    assert isinstance(block.A_log, SSMParam) and isinstance(block.dt_bias, SSMParam)
    assert not isinstance(block.D, SSMParam)


def test_gated_rmsnorm_gates_then_normalises():
    y = jax.random.normal(jax.random.PRNGKey(3), (5, 12))
    z = jax.random.normal(jax.random.PRNGKey(4), (5, 12))
    out = gated_rmsnorm(y, z, jnp.ones(12))
    g = y * jax.nn.silu(z)
    np.testing.assert_allclose(jnp.sqrt(jnp.mean(out ** 2, -1)), 1.0, rtol=1e-4)
    np.testing.assert_allclose(out / g, (out / g)[:, :1] * jnp.ones(12), rtol=1e-5)  # one scale per row
    np.testing.assert_allclose(gated_rmsnorm(y, z, 2 * jnp.ones(12)), 2 * out, rtol=1e-6)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="head_dim"):
        Mamba2Block(8, rngs=nnx.Rngs(0), head_dim=5)
    with pytest.raises(ValueError, match="algorithm"):
        Mamba2Block(8, rngs=nnx.Rngs(0), algorithm="fft")
    with pytest.raises(ValueError, match="chunk"):
        Mamba2Block(8, rngs=nnx.Rngs(0), chunk=0)
    with pytest.raises(ValueError, match="dt_max"):
        Mamba2Block(8, rngs=nnx.Rngs(0), dt_min=0.1, dt_max=0.01)
    block = Mamba2Block(8, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="init_cache"):
        block.step(jnp.zeros((1, 8)))
    with pytest.raises(ValueError, match="P"):
        mamba2_param_count(8, 16, 4, 5, 4)


def test_the_command_line_builds_the_block():
    config = registry.parse(["--dataset", "mqar", "--layer", "mamba2", "--d-model", "12",
                             "--n-layers", "1", "--head-dim", "6", "--algorithm", "quadratic",
                             "--state-size", "4"])
    assert config.layer_options == Mamba2Options(head_dim=6, algorithm="quadratic",
                                                 state_size=4)
    model = nnx.eval_shape(lambda: registry.build_model(config, registry.load_dataset(config)))
    block = model.model.layers[0].seq
    assert isinstance(block, Mamba2Block)
    assert (block.heads, block.P, block.N, block.algorithm) == (4, 6, 4, "quadratic")
    with pytest.raises(ValueError, match="--algorithm: invalid choice"):
        registry.parse(["--dataset", "mqar", "--layer", "mamba2", "--algorithm", "fft"])
    assert set(SSD_ALGORITHMS) == set(Mamba2Options.__dataclass_fields__["algorithm"]
                                      .metadata["choices"])
