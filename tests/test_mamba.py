"""Tests for annotated_s4.mamba: the Mamba block against the official one (the
``Mamba`` module of state-spaces/mamba's mamba_simple.py, run once by
tools/mamba_fixtures.py into tests/fixtures/mamba_block.npz), its RNN mode
against its CNN mode, its initialisation, parameter count, checks and options.

float32 comparisons run at float32 matmul precision (`jax.default_matmul_precision`):
at JAX's default a GPU would multiply in TF32 (see annotated_s4.precision).
"""

import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import (MambaBlock, MambaOptions, StackedModel, causal_depthwise_conv,
                          inverse_softplus, mamba_param_count, registry)
from annotated_s4.catalog import SSMParam
from annotated_s4.sample import rnn_log_probs
from annotated_s4.selective import SCANS, selective_scan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mamba_fixtures  # noqa: E402  (numpy only at import; torch only in its main)

# float32 against float32: PyTorch and XLA sum and round in other orders, so
# the two blocks agree to a few float32 ulps (2^-24 = 6e-8 relative) of the
# largest output, after two projections, a conv, softplus, exp and twelve scan
# steps; errors are relative to max |official|. Measured: 1.9e-7 (forward, every
# scan) and 2.6e-7 (step), about 3 ulps; the bound leaves room for other
# CPUs' and XLA versions' summation orders, as tests/test_selective.py's does.
RTOL32 = 1e-5


def fixture():
    with np.load(ROOT / "tests" / "fixtures" / "mamba_block.npz") as data:
        return {k: data[k] for k in data.files}


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return np.abs(ours - ref).max() / np.abs(ref).max()


def _transpose(w):
    return w.T


# The official parameter's name -> (ours, and how its layout becomes ours).
# PyTorch's Linear stores (out, in), nnx's (in, out); its Conv1d (E, 1, W), ours
# (W, E) with the taps oldest first in both.
OFFICIAL_NAMES = {
    "in_proj.weight": ("in_proj.kernel", _transpose),
    "conv1d.weight": ("conv_w", lambda w: w[:, 0, :].T),
    "conv1d.bias": ("conv_b", None),
    "x_proj.weight": ("x_proj.kernel", _transpose),
    "dt_proj.weight": ("dt_proj.kernel", _transpose),
    "dt_proj.bias": ("dt_bias", None),
    "A_log": ("A_log", None),
    "D": ("D", None),
    "out_proj.weight": ("out_proj.kernel", _transpose),
}


def _variable(block, dotted):
    obj = block
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def official_block(r, scan="recurrent"):
    """A MambaBlock of the fixture's sizes holding the official weights."""
    block = MambaBlock(int(r["d_model"]), rngs=nnx.Rngs(0), state_size=int(r["d_state"]),
                       expand=int(r["expand"]), conv_width=int(r["d_conv"]),
                       dt_rank=int(r["dt_rank"]), scan=scan)
    for name, (ours, layout) in OFFICIAL_NAMES.items():
        value = r[f"weight__{name}"]
        value = value if layout is None else layout(value)
        variable = _variable(block, ours)
        assert variable[...].shape == value.shape, name
        variable[...] = jnp.asarray(value)
    return block


def _rnn(block, u):
    block.init_cache(u.shape[0])
    step = nnx.jit(lambda block, u_t: block.step(u_t))
    return jnp.stack([step(block, u[:, t]) for t in range(u.shape[1])], axis=1)


def test_fixture_comes_from_the_pinned_commit():
    r = fixture()
    assert str(r["commit"]) == mamba_fixtures.PINNED
    assert r["out"].dtype == np.float32


def test_the_official_block_has_our_parameters():
    """The name map is one to one: every official parameter has its place in
    ours, and ours holds nothing else (the same parameter count)."""
    r = fixture()
    official = {k.removeprefix("weight__") for k in r if k.startswith("weight__")}
    assert official == set(OFFICIAL_NAMES)
    block = official_block(r)
    ours = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(block, nnx.Param))}
    assert ours == {name for name, _ in OFFICIAL_NAMES.values()}
    E = int(r["expand"]) * int(r["d_model"])
    assert sum(r[f"weight__{k}"].size for k in official) == mamba_param_count(
        int(r["d_model"]), E, int(r["d_state"]), int(r["dt_rank"]), int(r["d_conv"]))


@pytest.mark.parametrize("scan", sorted(SCANS))
@jax.default_matmul_precision("float32")
def test_block_equals_the_official_forward(scan):
    r = fixture()
    y = nnx.jit(lambda block, u: block(u))(official_block(r, scan), r["u"])
    assert rel_err(y, r["out"]) < RTOL32


@jax.default_matmul_precision("float32")
def test_step_equals_the_official_step():
    """Token by token from zero states: the outputs, and the states it leaves
    (the conv's window and the SSM state) in the official layout."""
    r = fixture()
    block = official_block(r)
    y = _rnn(block, jnp.asarray(r["u"]))
    assert rel_err(y, r["step_out"]) < RTOL32
    assert rel_err(jnp.swapaxes(block.window[...], 1, 2), r["conv_state"]) < RTOL32
    assert rel_err(block.cache[...], r["ssm_state"]) < RTOL32
    # and the official step agrees with the official forward, as ours do
    assert rel_err(r["step_out"], r["out"]) < RTOL32


@jax.default_matmul_precision("float32")
def test_rnn_mode_equals_cnn_mode():
    """A freshly initialised block, longer than the fixture's and wider than
    the conv and dt_rank's defaults would make it: step by step == parallel."""
    block = MambaBlock(24, rngs=nnx.Rngs(2), state_size=8, expand=2, conv_width=3)
    assert block.R == 2
    u = jax.random.normal(jax.random.PRNGKey(3), (3, 50, 24))
    y = nnx.jit(lambda block, u: block(u))(block, u)
    assert rel_err(_rnn(block, u), y) < RTOL32


def test_initialisation_is_the_official_one():
    H, N = 40, 6
    block = MambaBlock(H, rngs=nnx.Rngs(0), state_size=N, expand=3, dt_min=0.002, dt_max=0.05)
    E, R = 3 * H, math.ceil(H / 16)
    assert (block.E, block.R) == (E, R) == (120, 3)
    np.testing.assert_allclose(block.A(), -np.broadcast_to(np.arange(1, N + 1), (E, N)),
                               rtol=1e-6)
    np.testing.assert_array_equal(block.D[...], np.ones(E))
    dt = jax.nn.softplus(block.dt_bias[...])  # the initial Δ, with a zero input
    assert float(dt.min()) >= 0.002 * (1 - 1e-5) and float(dt.max()) <= 0.05 * (1 + 1e-5)
    assert np.log(float(dt.max()) / float(dt.min())) > 0.8 * np.log(0.05 / 0.002)
    assert float(jnp.abs(block.dt_proj.kernel[...]).max()) <= R ** -0.5
    assert float(jnp.abs(block.conv_w[...]).max()) <= block.W ** -0.5
    # the floor: step sizes below dt_floor start at dt_floor
    low = MambaBlock(8, rngs=nnx.Rngs(0), dt_min=1e-6, dt_max=1e-5, dt_floor=1e-4)
    np.testing.assert_allclose(jax.nn.softplus(low.dt_bias[...]), 1e-4, rtol=1e-4)


def test_inverse_softplus_inverts_softplus():
    y = jnp.logspace(-5, 1.5, 200)   # 1e-5 .. 32, in float32
    np.testing.assert_allclose(jax.nn.softplus(inverse_softplus(y)), y, rtol=1e-5)


def test_causal_depthwise_conv_of_an_impulse_is_the_filter_reversed():
    """An impulse at t = 0 reads out each channel's taps, newest first: y_t - b =
    w_{W-1-t} for t < W, then nothing (causal, and W steps long)."""
    W, E, L = 4, 3, 7
    w = jax.random.normal(jax.random.PRNGKey(0), (W, E))
    b = jnp.arange(E, dtype=jnp.float32)
    x = jnp.zeros((1, L, E)).at[0, 0].set(1.0)
    y = causal_depthwise_conv(x, w, b)[0] - b
    np.testing.assert_allclose(y[:W], w[::-1], rtol=1e-6)
    np.testing.assert_array_equal(y[W:], 0.0)


@pytest.mark.parametrize("H,expand,N,dt_rank,W", [(8, 2, 4, "auto", 4), (40, 3, 16, "auto", 2),
                                                  (16, 1, 5, 7, 1)])
def test_parameter_count_is_the_formula(H, expand, N, dt_rank, W):
    block = MambaBlock(H, rngs=nnx.Rngs(0), state_size=N, expand=expand, conv_width=W,
                       dt_rank=dt_rank)
    counted = sum(x.size for x in jax.tree.leaves(nnx.state(block, nnx.Param)))
    assert counted == mamba_param_count(H, expand * H, N, block.R, W)
    with pytest.raises(TypeError, match="dt_rank"):
        mamba_param_count(H, expand * H, N, "auto", W)


def test_the_time_invariant_block_selects_nothing():
    """--time-invariant keeps the block and drops the selection: 2 E R fewer
    parameters (x_proj and dt_proj's weights for B and C); Δ, B and C do not
    depend on the input; the SSM's response to an impulse is the same whenever
    the impulse comes (a convolution); RNN mode equals CNN mode."""
    H, N = 8, 4
    block = MambaBlock(H, rngs=nnx.Rngs(0), state_size=N, time_invariant=True)
    selective = MambaBlock(H, rngs=nnx.Rngs(0), state_size=N)
    counted = sum(x.size for x in jax.tree.leaves(nnx.state(block, nnx.Param)))
    assert counted == mamba_param_count(H, 2 * H, N, None, 4, time_invariant=True)
    assert counted == mamba_param_count(H, 2 * H, N, selective.R, 4) - 2 * 2 * H * selective.R
    x1, x2 = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 9, 2 * H))
    for one, two in zip(block.selection(x1), block.selection(x2)):
        np.testing.assert_array_equal(one, two)
    assert not np.allclose(selective.selection(x1)[1], selective.selection(x2)[1])
    L, E = 24, 2 * H
    delta, B, C = block.selection(jnp.zeros((1, L, E)))

    def response(at):
        u = jnp.zeros((1, L, E)).at[0, at].set(1.0)
        return selective_scan(u, delta, block.A(), B, C, delta_bias=block.dt_bias[...],
                              delta_softplus=True)[0]

    early, late = response(2), response(9)
    np.testing.assert_allclose(late[9:], early[2:L - 7], rtol=1e-6, atol=1e-7)
    assert float(jnp.abs(early[2:]).max()) > 0.01
    u = jax.random.normal(jax.random.PRNGKey(2), (2, 20, H))
    with jax.default_matmul_precision("float32"):
        parallel = block(u)
        block.init_cache(2)
        steps = jnp.stack([block.step(u[:, t]) for t in range(20)], axis=1)
    np.testing.assert_allclose(steps, parallel, atol=1e-5 * float(jnp.abs(parallel).max()))
    with pytest.raises(TypeError, match="time_invariant"):
        MambaBlock(H, rngs=nnx.Rngs(0), time_invariant=1)


def test_state_space_parameters_and_gradients():
    """A_log and the Δ bias are the SSMParams (their own learning rate, no decay);
    every parameter gets a finite gradient, none identically zero."""
    block = MambaBlock(8, rngs=nnx.Rngs(0), state_size=4)
    declared = {path for path, _ in nnx.to_flat_state(nnx.state(block, SSMParam))}
    assert declared == {("A_log",), ("dt_bias",)}
    u = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 8))
    grads = nnx.grad(lambda m: jnp.sum(jnp.sin(m(u))))(block)
    for path, g in nnx.to_flat_state(grads):
        assert bool(jnp.all(jnp.isfinite(g[...]))) and float(jnp.abs(g[...]).max()) > 0, path


def test_bad_arguments_are_refused_by_name():
    rngs = nnx.Rngs(0)
    for kwargs, error, name in [({"state_size": 0}, ValueError, "state_size"),
                                ({"expand": 1.5}, TypeError, "expand"),
                                ({"conv_width": 0}, ValueError, "conv_width"),
                                ({"dt_rank": "full"}, TypeError, "dt_rank"),
                                ({"dt_min": 0.0}, ValueError, "dt_min"),
                                ({"dt_min": 0.1, "dt_max": 0.01}, ValueError, "dt_max"),
                                ({"scan": "fft"}, ValueError, "scan")]:
        with pytest.raises(error, match=name):
            MambaBlock(8, rngs=rngs, **kwargs)
    with pytest.raises(ValueError, match="H"):
        MambaBlock(0, rngs=rngs)
    block = MambaBlock(8, rngs=rngs, state_size=4)
    with pytest.raises(ValueError, match="init_cache"):
        block.step(jnp.zeros((2, 8)))
    with pytest.raises(ValueError, match="u"):
        block(jnp.zeros((2, 5, 9)))
    block.init_cache(2)
    with pytest.raises(ValueError, match="u_t"):
        block.step(jnp.zeros((2, 9)))
    with pytest.raises(TypeError, match="batch_size"):
        block.init_cache(2.0)


def test_the_command_line_builds_the_block(tmp_path):
    """--layer mamba takes its options in the second stage, refuses a bad one
    naming its flag, trains through the CLI, and its run reloads from the
    checkpoint to the same metrics."""
    from annotated_s4 import cli, runner

    config = registry.parse(["--layer", "mamba", "--expand", "3", "--dt-rank", "2",
                             "--conv-width", "2", "--scan", "chunked", "--state-size", "5"])
    assert config.layer_options == MambaOptions(expand=3, dt_rank=2, conv_width=2,
                                                scan="chunked", state_size=5)
    # built abstract (shapes only: no initialiser runs or compiles)
    block = nnx.eval_shape(lambda: registry.LAYERS["mamba"].build(config.layer_options, 16)(
        8, rngs=nnx.Rngs(0)))
    assert (block.E, block.R, block.W, block.N, block.scan) == (24, 2, 2, 5, "chunked")
    default = nnx.eval_shape(lambda: registry.LAYERS["mamba"].build(MambaOptions(), 16)(
        40, rngs=nnx.Rngs(0)))
    assert default.R == 3                                   # "auto": ceil(40 / 16)
    assert not default.time_invariant
    lti = registry.parse(["--layer", "mamba", "--time-invariant"]).layer_options
    assert lti == MambaOptions(time_invariant=True)
    block = nnx.eval_shape(lambda: registry.LAYERS["mamba"].build(lti, 16)(8, rngs=nnx.Rngs(0)))
    assert block.time_invariant and block.B.shape == block.C.shape == (16, 16)
    for bad in (["--dt-rank", "0"], ["--expand", "0"], ["--dt-min", "0"],
                ["--scan", "fft"]):
        with pytest.raises(ValueError, match=bad[0]):
            registry.parse(["--layer", "mamba", *bad])
    out = tmp_path / "mamba"
    # the digits run of test_registry's test_every_layer_trains_on_both_kinds_of_data[mamba]
    # (its programs are compiled once)
    cli.main(["train", "--dataset", "digits", "--layer", "mamba", "--n-layers", "1",
              "--d-model", "8", "--state-size", "4", "--batch-size", "16", "--lr", "1e-2",
              "--steps", "1", "--log-every", "100", "--out", str(out)])
    options = json.loads((out / "config.json").read_text())["layer_options"]
    assert options == {"state_size": 4, "dt_min": 0.001, "dt_max": 0.1, "expand": 2,
                       "conv_width": 4, "dt_rank": None, "scan": "recurrent",
                       "time_invariant": False}
    metrics, run = runner.evaluate_run(str(out))
    assert isinstance(run["model"].layers[0].seq, MambaBlock)
    assert not runner.compare(run["metrics"], metrics)     # within float32 rounding


@jax.default_matmul_precision("float32")
def test_generation_model_rnn_matches_cnn():
    """Stacked as a language model, RNN-mode log-probabilities equal CNN mode's."""
    model = StackedModel(registry.LAYERS["mamba"].build(MambaOptions(state_size=4), 16),
                         d_output=5, d_model=8, n_layers=2, rngs=nnx.Rngs(0), vocab_size=5,
                         classification=False)
    x = jax.random.randint(jax.random.PRNGKey(4), (2, 16), 0, 5)
    np.testing.assert_allclose(rnn_log_probs(model, x), model(x), atol=1e-5)
