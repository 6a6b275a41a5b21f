"""Part I math: discretization, recurrence, kernel, convolution, the mass-spring example.

Checks that two float32 computations agree run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU may
multiply float32 matrices in TF32 (see annotated_s4.precision).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from annotated_s4 import (K_conv, causal_convolution, discretize, example_force, example_mass,
                          example_force_jumps, example_ssm, memory_ratio, random_SSM,
                          reference_solution, run_SSM, scan_SSM)


def stable_ssm(N, seed=0):
    A, B, C = random_SSM(jax.random.PRNGKey(seed), N)
    return A - N * jnp.eye(N), B, C


def test_random_SSM_shapes():
    A, B, C = random_SSM(jax.random.PRNGKey(0), 5)
    assert (A.shape, B.shape, C.shape) == ((5, 5), (5, 1), (1, 5))


@pytest.mark.parametrize("N", [0, -3])
def test_random_SSM_bad_N(N):
    with pytest.raises(ValueError, match="N"):
        random_SSM(jax.random.PRNGKey(0), N)


@jax.default_matmul_precision("float32")   # a float32 claim
def test_discretize_matches_formula():
    A, B, C = stable_ssm(4)
    dt = 0.05
    Ab, Bb, Cb = discretize(A, B, C, dt)
    I = np.eye(4)
    inv = np.linalg.inv(I - dt / 2 * np.asarray(A))
    np.testing.assert_allclose(Ab, inv @ (I + dt / 2 * np.asarray(A)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Bb, inv @ (dt * np.asarray(B)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(Cb, C)


def test_discretize_scalar_is_pade_of_exp():
    with jax.enable_x64(True):
        a, dt = 2.0, 1e-2
        Ab, _, _ = discretize(jnp.array([[-a]]), jnp.array([[1.0]]), jnp.array([[1.0]]), dt)
        assert abs(float(Ab[0, 0]) - np.exp(-a * dt)) == pytest.approx((a * dt) ** 3 / 12, rel=0.05)


@jax.default_matmul_precision("float32")   # a float32 claim
def test_discretize_keeps_stability():
    A, B, C = stable_ssm(6)
    for dt in [1e-3, 1.0, 1e3]:
        Ab, _, _ = discretize(A, B, C, dt)
        assert float(jnp.max(jnp.abs(jnp.linalg.eigvals(Ab)))) < 1.0


@pytest.mark.parametrize("bad", [
    dict(A=jnp.ones((3, 4))),
    dict(B=jnp.ones((4, 2))),
    dict(C=jnp.ones((4, 1))),
    dict(dt=0.0),
    dict(dt=-1.0),
])
def test_discretize_bad_input(bad):
    args = dict(A=jnp.eye(4), B=jnp.ones((4, 1)), C=jnp.ones((1, 4)), dt=0.1)
    args.update(bad)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        discretize(**args)


@jax.default_matmul_precision("float32")   # a float32 claim
def test_scan_matches_python_loop():
    A, B, C = stable_ssm(3)
    Ab, Bb, Cb = discretize(A, B, C, 0.1)
    u = jax.random.normal(jax.random.PRNGKey(1), (20, 1))
    x0 = jnp.array([0.5, -1.0, 2.0])
    x_last, y = scan_SSM(Ab, Bb, Cb, u, x0)
    x = np.asarray(x0)
    for k in range(20):
        x = np.asarray(Ab) @ x + np.asarray(Bb)[:, 0] * float(u[k, 0])
        np.testing.assert_allclose(y[k, 0], np.asarray(Cb)[0] @ x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x_last, x, rtol=1e-4, atol=1e-5)


def test_scan_bad_shapes():
    Ab, Bb, Cb = discretize(*stable_ssm(3), 0.1)
    with pytest.raises(ValueError, match="u"):
        scan_SSM(Ab, Bb, Cb, jnp.ones((20,)), jnp.zeros(3))
    with pytest.raises(ValueError, match="x0"):
        scan_SSM(Ab, Bb, Cb, jnp.ones((20, 1)), jnp.zeros(4))


def test_run_SSM_shape_and_bad_input():
    A, B, C = stable_ssm(4)
    assert run_SSM(A, B, C, jnp.ones(10)).shape == (10, 1)
    with pytest.raises(ValueError, match="u"):
        run_SSM(A, B, C, jnp.ones((10, 1)))


@jax.default_matmul_precision("float32")   # a float32 claim
def test_K_conv_equals_matrix_powers():
    Ab, Bb, Cb = discretize(*stable_ssm(4), 0.1)
    K = K_conv(Ab, Bb, Cb, 12)
    expected = [float((Cb @ jnp.linalg.matrix_power(Ab, l) @ Bb)[0, 0]) for l in range(12)]
    np.testing.assert_allclose(K, expected, rtol=1e-5, atol=1e-6)


def test_K_conv_bad_length():
    Ab, Bb, Cb = discretize(*stable_ssm(2), 0.1)
    with pytest.raises(ValueError, match="L"):
        K_conv(Ab, Bb, Cb, 0)
    with pytest.raises(TypeError, match="L"):
        K_conv(Ab, Bb, Cb, 3.5)


def test_cnn_equals_rnn():
    A, B, C = random_SSM(jax.random.PRNGKey(1), 4)
    u = jax.random.uniform(jax.random.PRNGKey(2), (16,))
    y_rnn = run_SSM(A, B, C, u)[:, 0]
    y_cnn = causal_convolution(u, K_conv(*discretize(A, B, C, 1.0 / 16), 16))
    np.testing.assert_allclose(y_cnn, y_rnn, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("L", [1, 7, 64, 1000])
@jax.default_matmul_precision("float32")   # a float32 claim
def test_fft_convolution_equals_direct(L):
    u = jax.random.normal(jax.random.PRNGKey(0), (L,))
    K = jax.random.normal(jax.random.PRNGKey(1), (L,))
    direct = np.array([sum(float(K[j]) * float(u[k - j]) for j in range(k + 1)) for k in range(min(L, 40))])
    np.testing.assert_allclose(causal_convolution(u, K, nofft=True)[:40], direct, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(causal_convolution(u, K), causal_convolution(u, K, nofft=True),
                               rtol=1e-4, atol=1e-3)


def test_causal_convolution_is_causal():
    u = jnp.zeros(32).at[20].set(1.0)
    y = causal_convolution(u, jnp.ones(32))
    assert float(jnp.abs(y[:20]).max()) < 1e-6
    np.testing.assert_allclose(y[20:], 1.0, atol=1e-5)


def test_causal_convolution_bad_input():
    with pytest.raises(ValueError, match="same length"):
        causal_convolution(jnp.ones(10), jnp.ones(9))
    with pytest.raises(ValueError, match="u's time axis"):
        causal_convolution(jnp.ones((10, 1)), jnp.ones(10), axis=1)
    with pytest.raises(ValueError, match="K"):
        causal_convolution(jnp.ones(10), jnp.ones((10, 1)))


@jax.default_matmul_precision("float32")   # a float32 claim
def test_example_mass_is_newton():
    A, B, C = example_mass(k=40.0, b=5.0, m=2.0)
    x = jnp.array([0.3, -0.7])  # position, velocity
    u = 1.5
    dx = A @ x + B[:, 0] * u
    assert float(dx[0]) == pytest.approx(-0.7)                          # y' = velocity
    assert float(dx[1]) == pytest.approx((u - 5.0 * -0.7 - 40.0 * 0.3) / 2.0)  # m y'' = u - b y' - k y
    np.testing.assert_array_equal(C, [[1.0, 0.0]])
    with pytest.raises(ValueError, match="m"):
        example_mass(k=1.0, b=1.0, m=0.0)


def test_example_force_is_clipped_sine():
    t = jnp.linspace(0, 2, 1000)
    f = example_force(t)
    s = jnp.sin(10 * t)
    np.testing.assert_allclose(f, jnp.where(s > 0.5, s, 0.0))


@jax.default_matmul_precision("float32")   # a float32 claim
def test_example_ssm_converges_to_ode():
    """The discrete mass-spring position approaches the exact ODE solution as L grows."""
    from scipy.integrate import solve_ivp

    A, B, C = (np.asarray(M, dtype=float) for M in example_mass(40.0, 5.0, 1.0))
    smooth = lambda t: 0.0 * t + 1.0  # a constant push: the solution is smooth  # noqa: E731
    errors = []
    for L in [100, 400]:
        dt = 2.0 / L
        t = np.arange(1, L + 1) * dt
        Ab, Bb, Cb = discretize(A, B, C, dt)
        _, y = scan_SSM(Ab, Bb, Cb, jnp.ones((L, 1)), jnp.zeros(2))
        ref = solve_ivp(lambda s, x: A @ x + B[:, 0] * smooth(s), (0, 2.0), np.zeros(2),
                        t_eval=t, rtol=1e-10, atol=1e-12).y[0]
        errors.append(np.max(np.abs(np.asarray(y[:, 0]) - ref)))
    assert errors[1] < errors[0] / 3  # first order: a factor about 4


def test_example_ssm_shapes_and_bad_input():
    t, u, y = example_ssm(L=50)
    assert t.shape == u.shape == y.shape == (50,)
    assert float(t[-1]) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="T"):
        example_ssm(L=50, T=0.0)


def test_random_SSM_is_stable():
    for N in [1, 4, 16, 64]:
        A, _, _ = random_SSM(jax.random.PRNGKey(N), N)
        sym = np.asarray(A + A.T) / 2
        assert np.linalg.eigvalsh(sym).max() <= -0.5 + 1e-5      # negative definite
        assert np.linalg.eigvals(np.asarray(A)).real.max() <= -0.5 + 1e-5


@jax.default_matmul_precision("float32")   # a float32 claim
def test_scan_returns_last_state():
    """x0 is x_{-1}; scan_SSM returns x_{L-1}, the state after the last input."""
    Ab, Bb, Cb = discretize(*stable_ssm(2), 0.1)
    x_last, _ = scan_SSM(Ab, Bb, Cb, jnp.ones((1, 1)), jnp.zeros(2))
    np.testing.assert_allclose(x_last, Bb[:, 0], rtol=1e-6)  # x_0 = Bb u_0


def test_example_force_jumps():
    jumps = example_force_jumps(5.0)
    assert len(jumps) == 16 and np.all(np.diff(jumps) > 0) and 0 < jumps[0] and jumps[-1] < 5.0
    for tj in jumps:  # the force changes by at least 1/2 across each jump
        before, after = np.asarray(example_force(jnp.array([tj - 1e-4, tj + 1e-4])))
        assert abs(after - before) > 0.49
    with pytest.raises(ValueError, match="T"):
        example_force_jumps(0.0)


def test_reference_solution_matches_closed_form():
    """x' = -x + u with u = 1 for t >= 0.5: y = 1 - exp(-(t - 0.5)) after the jump."""
    force = lambda s: float(s >= 0.5)  # noqa: E731
    t = np.linspace(0.0, 2.0, 41)
    y = reference_solution([[-1.0]], [[1.0]], [[1.0]], force, t, breaks=[0.5])
    np.testing.assert_allclose(y, np.where(t >= 0.5, 1 - np.exp(-(t - 0.5)), 0.0), atol=1e-10)


def test_reference_solution_oscillator_float64():
    """A damped oscillator driven by a constant force from t = 0: closed form to 1e-9."""
    A, B, C = example_mass(40.0, 5.0, 1.0)
    t = np.linspace(0.0, 3.0, 31)
    y = reference_solution(A, B, C, lambda s: 1.0, t)
    w = np.sqrt(40.0 - 2.5 ** 2)
    exact = (1 - np.exp(-2.5 * t) * (np.cos(w * t) + 2.5 / w * np.sin(w * t))) / 40.0
    np.testing.assert_allclose(y, exact, atol=1e-9)


def test_reference_solution_bad_input():
    with pytest.raises(ValueError, match="B"):
        reference_solution(np.eye(2), np.ones((3, 1)), np.ones((1, 2)), lambda s: 0.0, [0.0, 1.0])
    with pytest.raises(ValueError, match="t"):
        reference_solution(np.eye(2), np.ones((2, 1)), np.ones((1, 2)), lambda s: 0.0, [-1.0, 1.0])


def test_reference_solution_at_time_zero():
    y = reference_solution(np.eye(2) * -1, np.ones((2, 1)), np.ones((1, 2)), lambda s: 1.0, [0.0])
    np.testing.assert_array_equal(y, [0.0])


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


# --- memory_ratio: what is left of the first input ------------------------------


def test_memory_ratio_of_one_mode_is_its_power():
    a, dt = -0.5 + 3j, 0.01
    ab = (1 + dt * a / 2) / (1 - dt * a / 2)  # the bilinear Ab of a 1 x 1 system
    lengths = [1, 2, 64, 1000]
    got = memory_ratio(np.array([[a]]), np.array([[2.0]]), dt, lengths)
    np.testing.assert_allclose(got, [abs(ab) ** (2 * (L - 1)) for L in lengths], rtol=1e-12)


def test_memory_ratio_does_not_depend_on_the_basis():
    """The ratio is a ratio of norms: a unitary change of basis leaves it alone."""
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(6, 6)) - 3 * np.eye(6), rng.normal(size=(6, 1))
    U, _ = np.linalg.qr(rng.normal(size=(6, 6)) + 1j * rng.normal(size=(6, 6)))
    np.testing.assert_allclose(memory_ratio(U @ A @ U.conj().T, U @ B, 0.01, [10, 300]),
                               memory_ratio(A, B, 0.01, [10, 300]), rtol=1e-9)


def test_memory_ratio_below_float32():
    """At step 0.1 and L = 4096 the slowest mode of -I keeps
    |(1 - 0.05) / (1 + 0.05)|^8190 ~ 1e-355 of its energy: below float64's
    smallest number too, so exactly 0, but never NaN; at L = 1024 (1e-89) the
    float64 value is exact where float32 would give 0."""
    got = memory_ratio(-np.eye(3), np.ones((3, 1)), 0.1, [1024, 4096])
    np.testing.assert_allclose(got[0], (0.95 / 1.05) ** 2046, rtol=1e-9)
    assert got[0] > 0 and got[1] == 0


def test_memory_ratio_bad_arguments():
    with pytest.raises(ValueError, match="B"):
        memory_ratio(np.eye(3), np.ones((2, 1)), 0.1, [4])
    with pytest.raises(ValueError, match="dt"):
        memory_ratio(np.eye(3), np.ones((3, 1)), 0.0, [4])
    with pytest.raises(ValueError, match="L"):
        memory_ratio(np.eye(3), np.ones((3, 1)), 0.1, [0])
