"""Tests for annotated_s4.precision: TF32 rounding, its emulation on the CPU,
and the float32 claims of the other tests checked as a GPU would compute them.

On an NVIDIA GPU of compute capability >= 8.0, JAX multiplies float32 matrices
in TF32 by default; XLA's CPU backend never does. `emulate_tf32()` makes the CPU
do it, so the claims that failed there (CNN mode == RNN mode, H3 == its
Algorithm 1, state passing, the DPLR kernel at L = 16384, ETSC's round trip)
are checked here as the GPU computes them: each states that it holds at float32
precision, and must then hold under the emulation too.
"""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import test_h3
import test_layers
import test_s4
import test_sample
import test_toeplitz
from annotated_s4 import S4Layer, SSMLayer, StackedModel
from annotated_s4.precision import (FLOAT32_UNIT_ROUNDOFF, TF32_UNIT_ROUNDOFF, emulate_tf32,
                                    emulating_tf32, matmul_unit_roundoff, round_to_tf32)
from annotated_s4.sample import rnn_log_probs


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


# --- round_to_tf32 ------------------------------------------------------------

def test_round_to_tf32_is_exact_on_ten_bit_mantissas():
    rng = np.random.default_rng(0)
    mantissa = rng.integers(0, 2**10, 1000)
    exponent = rng.integers(-126, 127, 1000)
    sign = rng.choice([-1.0, 1.0], 1000)
    x = (sign * (1 + mantissa / 2**10) * 2.0**exponent).astype(np.float32)
    np.testing.assert_array_equal(_bits(round_to_tf32(jnp.asarray(x))), _bits(x))


def test_round_to_tf32_error_bound_idempotence_and_ten_bits():
    x = jax.random.normal(jax.random.key(0), (100_000,)) * jnp.exp(
        jax.random.uniform(jax.random.key(1), (100_000,), minval=-40, maxval=40))
    r = round_to_tf32(x)
    rel = np.abs(np.asarray(r, np.float64) - np.asarray(x, np.float64)) / np.abs(np.asarray(x))
    assert rel.max() <= 2.0**-11
    assert rel.max() > 0.9 * 2.0**-11          # the bound is reached: 10 bits, not more
    np.testing.assert_array_equal(_bits(round_to_tf32(r)), _bits(r))
    assert not (_bits(r) & np.uint32(2**13 - 1)).any()   # the 13 dropped bits are zero
    np.testing.assert_array_equal(np.sign(r), np.sign(x))


def test_round_to_tf32_ties_to_even_and_special_values():
    one_ulp = 2.0**-10                                  # TF32's spacing at 1
    ties = np.float32([1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + one_ulp / 2)])
    np.testing.assert_array_equal(round_to_tf32(jnp.asarray(ties)),
                                  np.float32([1, 1 + 2 * one_ulp, -1]))
    np.testing.assert_array_equal(round_to_tf32(jnp.float32(1 + 0.6 * one_ulp)),
                                  np.float32(1 + one_ulp))
    special = jnp.asarray(np.float32([0.0, -0.0, np.inf, -np.inf]))
    np.testing.assert_array_equal(_bits(round_to_tf32(special)), _bits(special))
    assert np.isnan(round_to_tf32(jnp.float32(np.nan)))
    # the largest float32 lies beyond TF32's largest value plus half a spacing
    assert round_to_tf32(jnp.float32(np.finfo(np.float32).max)) == np.inf


def test_round_to_tf32_complex_and_bad_dtype():
    z = jnp.asarray([1 + 2**-12 + 1j * (3 + 2**-9)], jnp.complex64)
    np.testing.assert_array_equal(round_to_tf32(z), np.complex64([1 + 1j * (3 + 2**-9)]))
    with pytest.raises(TypeError, match="x must be float32 or complex64"):
        round_to_tf32(jnp.arange(3))


# --- emulate_tf32 -------------------------------------------------------------

def _operands():
    a = jax.random.normal(jax.random.key(0), (32, 48))
    b = jax.random.normal(jax.random.key(1), (48, 16))
    return a, b


def _paths(a, b):
    """Every way the package writes a matrix product."""
    linear = nnx.Linear(48, 16, use_bias=False, rngs=nnx.Rngs(0))
    linear.kernel[...] = b
    dims = (((1,), (0,)), ((), ()))
    return {
        "jnp.dot": lambda: jnp.dot(a, b),
        "@": lambda: a @ b,
        "jnp.matmul": lambda: jnp.matmul(a, b),
        "jnp.einsum": lambda: jnp.einsum("ij,jk->ik", a, b),
        "lax.dot_general": lambda: jax.lax.dot_general(a, b, dims),
        "jit": lambda: jax.jit(lambda x, y: x @ y)(a, b),
        "vmap": lambda: jax.vmap(lambda row: row @ b)(a),
        "nnx.Linear": lambda: linear(a),
        "nnx.jit(nnx.Linear)": lambda: nnx.jit(lambda m, x: m(x))(linear, a),
    }


def _full_float32_by_default():
    """Whether a product at JAX's default precision is a full float32 one here:
    on a CPU, unless the whole process emulates TF32 (ANNOTATED_S4_EMULATE_TF32=1);
    on an NVIDIA GPU of compute capability >= 8.0 it is TF32."""
    return matmul_unit_roundoff() == FLOAT32_UNIT_ROUNDOFF


def test_emulation_covers_every_path_and_honours_the_precision_setting():
    a, b = _operands()
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    tf32 = np.asarray(round_to_tf32(a), np.float64) @ np.asarray(round_to_tf32(b), np.float64)
    assert np.abs(tf32 - exact).max() > 1e-4        # the two are told apart
    paths = _paths(a, b)
    before = {name: np.asarray(f()) for name, f in paths.items()}  # traced and cached outside
    if _full_float32_by_default():
        for name, product in before.items():
            np.testing.assert_allclose(product, exact, atol=1e-5, err_msg=name)
    # Inside, "bfloat16" is left to the device where one has it (a GPU multiplies
    # in bfloat16 there, below TF32); on a CPU the emulation reads it as TF32.
    lower = ("tensorfloat32", "default") + (("bfloat16",) if jax.default_backend() == "cpu"
                                            else ())
    with emulate_tf32():
        assert emulating_tf32()
        for name, f in paths.items():
            np.testing.assert_allclose(f(), tf32, atol=1e-5, err_msg=name)
        for setting in ("float32", "highest"):
            with jax.default_matmul_precision(setting):
                for name, f in paths.items():
                    np.testing.assert_allclose(f(), exact, atol=1e-5, err_msg=f"{name}, {setting}")
        for setting in lower:
            with jax.default_matmul_precision(setting):
                np.testing.assert_allclose(a @ b, tf32, atol=1e-5, err_msg=setting)
        np.testing.assert_allclose(jnp.dot(a, b, precision="highest"), exact, atol=1e-5)
    for name, f in paths.items():                   # and nothing is left behind
        np.testing.assert_allclose(f(), before[name], rtol=1e-6, atol=1e-6, err_msg=name)


def test_emulation_rounds_complex_and_backward_products_but_not_integers():
    a, b = _operands()
    z = jax.lax.complex(a, a[::-1])
    exact_z = np.asarray(z, np.complex128) @ np.asarray(z, np.complex128).T
    i = jnp.arange(12).reshape(3, 4)
    with emulate_tf32():
        assert np.abs(z @ z.T - exact_z).max() > 1e-3
        np.testing.assert_array_equal(i @ i.T, np.arange(12).reshape(3, 4) @ np.arange(12).reshape(3, 4).T)
        # d/da sum(a @ b) = rows of sum_k b[:, k], a product of b with ones: rounded b
        g = jax.grad(lambda x: (x @ b).sum())(a)
    np.testing.assert_allclose(g[0], np.asarray(round_to_tf32(b)).sum(1), rtol=1e-6)
    assert np.abs(g[0] - np.asarray(b).sum(1)).max() > 1e-5


def test_matmul_unit_roundoff_follows_the_setting():
    device = jax.devices()[0]
    tf32_device = (device.platform in ("gpu", "cuda")
                   and float(getattr(device, "compute_capability", 0) or 0) >= 8.0)
    emulated = emulating_tf32()       # the whole process, with ANNOTATED_S4_EMULATE_TF32=1
    default = TF32_UNIT_ROUNDOFF if tf32_device or emulated else FLOAT32_UNIT_ROUNDOFF
    assert matmul_unit_roundoff() == default
    with jax.default_matmul_precision("float32"):
        assert matmul_unit_roundoff() == FLOAT32_UNIT_ROUNDOFF
    with emulate_tf32():
        assert matmul_unit_roundoff() == TF32_UNIT_ROUNDOFF
        with jax.default_matmul_precision("float32"):
            assert matmul_unit_roundoff() == FLOAT32_UNIT_ROUNDOFF
    assert emulating_tf32() == emulated and matmul_unit_roundoff() == default


# --- the claims that a GPU's default precision broke ---------------------------
# Each runs the other tests' own check under the emulation: the check states the
# precision it holds at, so it must pass as a GPU computes it.

@pytest.mark.parametrize("name", ["s4", "h3", "attention-flash"])
def test_layer_contract_under_tf32(name):
    with emulate_tf32():
        test_layers.test_layer_contract(name)


def test_h3_matches_algorithm1_and_state_passing_under_tf32():
    with emulate_tf32():
        test_h3.test_h3_matches_algorithm1_loop(4)
        test_h3.test_state_passing_equals_full_convolution()


def test_rnn_log_probs_equal_cnn_log_probs_under_tf32():
    model = StackedModel(functools.partial(SSMLayer, N=4, L=12), 5, 8, 2, rngs=nnx.Rngs(0),
                         vocab_size=5, classification=False)
    with emulate_tf32():
        test_sample.test_rnn_log_probs_equal_cnn_log_probs(model)


def test_dplr_kernel_at_16k_and_etsc_round_trip_under_tf32():
    with emulate_tf32():
        test_s4.test_kernel_DPLR_float32_accurate_at_16k()
        test_toeplitz.test_round_trip_channels_and_inclusion_equation()


def test_tf32_is_what_breaks_the_claims_without_their_precision():
    """The checks above would fail under the emulation at the default precision:
    the emulation sees what the GPU saw."""
    layer = S4Layer(4, N=8, L=32, rngs=nnx.Rngs(0))
    u = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 4))
    model = StackedModel(functools.partial(SSMLayer, N=4, L=12), 5, 8, 2, rngs=nnx.Rngs(0),
                         vocab_size=5, classification=False)
    model.eval()
    x = jax.random.randint(jax.random.key(1), (3, 12), 0, 5)

    def gaps():
        layer.init_cache(2)
        rnn = jnp.stack([layer.step(u[:, k]) for k in range(32)], axis=1)
        y = layer(u)
        return (float(jnp.abs(rnn - y).max() / jnp.abs(y).max()),
                float(jnp.abs(rnn_log_probs(model, x) - model(x)).max()))

    with emulate_tf32():
        layer_gap, logp_gap = gaps()
        with jax.default_matmul_precision("float32"):
            layer_gap32, logp_gap32 = gaps()
    # 1e-4: the tolerance both claims use (relative for the layer, absolute for log-probs)
    assert layer_gap32 < 1e-4 < layer_gap and logp_gap32 < 1e-4 < logp_gap


def test_the_environment_variable_switches_the_emulation_on_for_the_process():
    code = ("import annotated_s4, gc, jax, jax.numpy as jnp; gc.collect(); "
            "x = jnp.float32(1 + 2**-12) * jnp.ones((1, 1)); "
            "print(annotated_s4.emulating_tf32(), float((x @ x)[0, 0]) == 1.0)")
    env = {**os.environ, "ANNOTATED_S4_EMULATE_TF32": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True"]            # on, and 1 + 2^-12 rounded to 1 in the product
    env["ANNOTATED_S4_EMULATE_TF32"] = "yes"
    bad = subprocess.run([sys.executable, "-c", "import annotated_s4"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "ANNOTATED_S4_EMULATE_TF32 must be 0 or 1" in bad.stderr
