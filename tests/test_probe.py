"""The linear memory probe: states of a frozen SSM, least-squares readouts of
past inputs, held-out R^2 (float64 throughout)."""

import numpy as np
import pytest

from annotated_s4 import delay_memory, memory_curve, ssm_states


def shift_register(N):
    """x_k = (u_k, u_{k-1}, ..., u_{k-N+1}): the state keeps exactly N inputs."""
    return np.eye(N, k=-1), np.eye(N)[0]


def test_states_follow_the_recurrence():
    rng = np.random.default_rng(0)
    A = 0.15 * rng.standard_normal((2, 5, 5)) + 0.1j * rng.standard_normal((2, 5, 5))
    assert np.abs(np.linalg.eigvals(A)).max() < 1                # stable
    B = rng.standard_normal((2, 5)) + 1j * rng.standard_normal((2, 5))
    u = rng.standard_normal(300)
    x, loop = np.zeros((2, 5), complex), []
    for u_k in u:
        x = np.einsum("bnm,bm->bn", A, x) + B * u_k
        loop.append(x)
    X = ssm_states(A, B, u)
    assert X.shape == (2, 300, 5) and X.dtype == np.complex128
    np.testing.assert_allclose(X, np.stack(loop, axis=1), rtol=0, atol=1e-12)
    X_real = ssm_states(A.real, B.real, u)
    assert X_real.dtype == np.float64


def test_a_shift_register_remembers_exactly_N_inputs():
    N = 8
    R2 = memory_curve(*shift_register(N), delays=np.arange(2 * N), T=4096)
    np.testing.assert_allclose(R2[:N], 1.0, atol=1e-12)      # u_k .. u_{k-N+1}: exact
    assert np.all(np.abs(R2[N:]) < 0.02)                      # older inputs: gone


def test_a_leaky_integrator_matches_its_closed_form():
    """x_k = a x_{k-1} + u_k: Var x = 1 / (1 - a^2) and E[x_k u_{k-d}] = a^d, so
    the best readout of u_{k-d} explains R^2(d) = a^(2d) (1 - a^2) of it."""
    a, delays = 0.9, np.arange(0, 30, 3)
    R2 = memory_curve(np.array([[a]]), np.array([1.0]), delays, T=40000, burn_in=200)
    np.testing.assert_allclose(R2, a ** (2 * delays) * (1 - a ** 2), atol=0.01)


def test_R2_does_not_depend_on_the_state_basis():
    rng = np.random.default_rng(1)
    A = np.diag(np.linspace(0.5, 0.95, 6)) + 0.05 * rng.standard_normal((6, 6))
    u = rng.standard_normal(5000)
    X = ssm_states(A, rng.standard_normal(6), u)
    M = rng.standard_normal((6, 6)) + 3 * np.eye(6)           # invertible, not orthogonal
    delays = np.arange(0, 40, 4)
    before, after = delay_memory(X, u, delays), delay_memory(X @ M.T, u, delays)
    assert before[0] > 0.5                                     # a nontrivial memory
    np.testing.assert_allclose(after, before, atol=1e-9)
    # the same states as complex numbers (Re, Im as features): the same R^2
    np.testing.assert_allclose(delay_memory(X[:, :3] + 1j * X[:, 3:], u, delays), before,
                               atol=1e-9)


def test_a_state_that_never_saw_u_scores_nothing():
    rng = np.random.default_rng(2)
    X = ssm_states(*shift_register(4), rng.standard_normal(4000))
    R2 = delay_memory(X, rng.standard_normal(4000), np.arange(4))   # another input
    assert np.all(R2 < 0.01)


def test_memory_curve_keeps_the_batch_shape():
    A, B = shift_register(3)
    R2 = memory_curve(np.stack([A, 0.5 * A]), np.stack([B, B]), np.arange(5), T=600)
    assert R2.shape == (2, 5)
    np.testing.assert_allclose(R2[:, :3], 1.0, atol=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda: ssm_states(np.eye(3), np.ones(2), np.ones(10)), "Ab"),
    (lambda: ssm_states(np.eye(3), np.ones(3), np.ones((10, 1))), "u"),
    (lambda: delay_memory(np.ones((100, 2)), np.ones(100), [-1, 2]), "delays"),
    (lambda: delay_memory(np.ones((100, 2)), np.ones(100), []), "delays"),
    (lambda: delay_memory(np.ones((100, 2)), np.ones(99), [1]), "u"),
    (lambda: delay_memory(np.ones((100, 2)), np.ones(100), [5], start=3), "start"),
    (lambda: delay_memory(np.ones((30, 2)), np.ones(30), [25]), "too few"),
    (lambda: delay_memory(np.ones((100, 2)), np.ones(100), [1], rcond=2.0), "rcond"),
    (lambda: memory_curve(np.eye(2), np.ones(2), [1], T=100.0), "T"),
    (lambda: memory_curve(np.eye(2), np.ones(2), [1], T=100, burn_in=-1), "burn_in"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_delays_must_be_ints():
    with pytest.raises(TypeError, match="delays"):
        delay_memory(np.ones((100, 2)), np.ones(100), [1.5])
