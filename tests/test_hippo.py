import numpy as np
import pytest
import scipy.linalg
from scipy.integrate import solve_ivp

from annotated_s4.hippo import (
    gram_schmidt_monomials,
    hippo_legs_states,
    legs_history_matrix,
    legendre_reconstruct,
    legs_projection,
    make_DPLR_HiPPO,
    make_HiPPO,
    make_NPLR_HiPPO,
    shifted_legendre,
)


def test_hippo_entries():
    A = make_HiPPO(5)
    assert A[3, 1] == pytest.approx(-np.sqrt(7 * 3))
    assert A[2, 2] == pytest.approx(-3.0)
    assert np.all(np.triu(A, 1) == 0)


def test_nplr_is_normal():
    A, P, B = make_NPLR_HiPPO(16)
    S = A + np.outer(P, P)
    assert np.allclose(S @ S.T, S.T @ S, atol=1e-10)
    assert np.allclose(np.diag(S), -0.5)
    assert np.allclose(B, np.sqrt(2 * np.arange(16) + 1))


@pytest.mark.parametrize("N", [4, 16, 64])
def test_dplr_reconstructs_hippo(N):
    Lambda, P, B, V = make_DPLR_HiPPO(N)
    A = V @ (np.diag(Lambda) - np.outer(P, P.conj())) @ V.conj().T
    Ahippo = make_HiPPO(N)
    assert np.abs(A - Ahippo).max() / np.abs(Ahippo).max() < 1e-8
    assert np.allclose(V.conj().T @ V, np.eye(N), atol=1e-10)
    assert np.allclose(Lambda.real, -0.5)
    _, _, B0 = make_NPLR_HiPPO(N)
    assert np.allclose(V @ B, B0, atol=1e-10)


def test_legs_reconstructs_smooth_history():
    L, N = 500, 32
    t = np.arange(1, L + 1) / L
    u = np.sin(8 * t) + t**2
    c = hippo_legs_states(u, N)
    rec = legendre_reconstruct(c[-1], L, np.arange(1, L + 1) - 0.5)
    # discretisation error O(1/L), largest over the first steps (coarse 1/k)
    assert np.abs(rec - u).mean() < 5e-3
    assert np.abs(rec - u).max() < 2e-2
    rec_half = legendre_reconstruct(c[L // 2 - 1], L // 2, np.arange(1, L // 2 + 1) - 0.5)
    assert np.abs(rec_half - u[: L // 2]).mean() < 5e-3


def test_errors():
    with pytest.raises(ValueError, match="N"):
        make_HiPPO(0)
    with pytest.raises(TypeError, match="N"):
        make_DPLR_HiPPO(3.0)
    with pytest.raises(ValueError, match="u"):
        hippo_legs_states(np.zeros((3, 2)), 4)
    with pytest.raises(ValueError, match="t"):
        legendre_reconstruct(np.zeros(3), 0.0, 0.5)
    with pytest.raises(ValueError, match="s must lie"):
        legendre_reconstruct(np.zeros(3), 1.0, [0.5, 1.5])
    with pytest.raises(ValueError, match="s must lie"):
        legendre_reconstruct(np.zeros(3), 1.0, -0.1)


def test_dplr_eigenvalues_come_from_a_hermitian_matrix():
    """-i (S + I/2) is Hermitian with real eigenvalues Im(Lambda); -i S is not."""
    N = 16
    A, P0, _ = make_NPLR_HiPPO(N)
    S = A + np.outer(P0, P0)
    H = -1j * (S + 0.5 * np.eye(N))
    assert np.allclose(H, H.conj().T, atol=1e-12)
    assert not np.allclose(-1j * S, (-1j * S).conj().T)
    Lambda, _, _, V = make_DPLR_HiPPO(N)
    assert np.allclose(H @ V, V * Lambda.imag, atol=1e-10)
    assert np.allclose(np.sort(np.linalg.eigvalsh(H)), np.sort(Lambda.imag), atol=1e-10)


def test_eigh_of_minus_i_S_reads_it_as_minus_i_J():
    """eigh(-i S), as the Annotated S4 and the S4 authors' code call it, ignores the
    imaginary diagonal i/2 of -i S: it returns the eigenpairs of the Hermitian -i J."""
    N = 16
    A, P0, _ = make_NPLR_HiPPO(N)
    S = A + np.outer(P0, P0)
    theta, V = np.linalg.eigh(-1j * S)
    Lambda, _, _, _ = make_DPLR_HiPPO(N)
    assert np.allclose(theta, Lambda.imag, atol=1e-12)
    assert np.allclose(S @ V, V * (-0.5 + 1j * theta), atol=1e-10)   # eigenpairs of S itself
    # the diagonal's imaginary part is what eigh drops: change it and nothing moves
    assert np.allclose(np.linalg.eigvalsh(-1j * S + 5j * np.eye(N)), theta, atol=1e-12)


def test_history_matrix_matches_online_run_and_is_orthogonal():
    N, t = 8, 200
    u = np.random.RandomState(0).randn(t)
    M = legs_history_matrix(N, t)
    assert np.allclose(M @ u, hippo_legs_states(u, N)[-1], atol=1e-12)
    # HiPPO's rows are (nearly) orthogonal with equal norms: the state is an
    # orthogonal projection of the history; a random stable A is not.
    s = np.linalg.svd(M, compute_uv=False)
    assert s.min() / s.max() > 0.5
    rng = np.random.RandomState(1)
    Ar, Br = rng.randn(N, N) / np.sqrt(N) - np.eye(N), rng.randn(N)
    sr = np.linalg.svd(legs_history_matrix(N, t, Ar, Br), compute_uv=False)
    assert sr.min() / sr.max() < 1e-3
    with pytest.raises(ValueError, match="A"):
        legs_history_matrix(N, t, np.eye(3), Br)


def test_dplr_conjugate_half_reconstructs_hippo():
    N = 16
    Lambda, P, B, V = make_DPLR_HiPPO(N, conj=True)
    assert Lambda.shape == P.shape == B.shape == (N // 2,) and V.shape == (N, N // 2)
    assert np.all(Lambda.imag > 0)
    Vf = np.concatenate([V, V.conj()], axis=1)
    Lf, Pf = np.concatenate([Lambda, Lambda.conj()]), np.concatenate([P, P.conj()])
    assert np.allclose(Vf.conj().T @ Vf, np.eye(N), atol=1e-12)
    A = Vf @ (np.diag(Lf) - np.outer(Pf, Pf.conj())) @ Vf.conj().T
    assert np.allclose(A, make_HiPPO(N), atol=1e-10)
    with pytest.raises(ValueError, match="even"):
        make_DPLR_HiPPO(5, conj=True)


def test_hippo_forgets_at_its_eigenvalues_in_either_form():
    """HiPPO-LegS is lower triangular, so its eigenvalues are -1, ..., -N; the
    energy of an impulse left after L - 1 bilinear steps is the same in the
    original basis and in the DPLR form (all N modes, Q = P), a unitary change
    of basis, and lies below what the slowest mode alone would keep."""
    from annotated_s4.ssm import memory_ratio

    N, dt, lengths = 16, 1e-3, [64, 1024, 4096]
    A, _, B = make_NPLR_HiPPO(N)
    assert np.all(np.triu(A, 1) == 0)
    np.testing.assert_allclose(np.diag(A), -np.arange(1, N + 1), rtol=1e-14)
    Lambda, P, Bd, _ = make_DPLR_HiPPO(N)
    Ad = np.diag(Lambda) - np.outer(P, P.conj())
    original = memory_ratio(A, B[:, None], dt, lengths)
    np.testing.assert_allclose(memory_ratio(Ad, Bd[:, None], dt, lengths), original, rtol=1e-6)
    slowest = ((1 - dt / 2) / (1 + dt / 2)) ** (2 * (np.array(lengths) - 1))
    assert np.all(original < slowest)
    assert 6.2e-3 < original[1] < 6.4e-3


# --- the eigenvalue-monomial fact (chapter 4), all in float64 -----------------------------


@pytest.mark.parametrize("N", [1, 2, 5, 8])
def test_gram_schmidt_of_monomials_is_shifted_legendre(N):
    T = shifted_legendre(N)
    G = gram_schmidt_monomials(N)
    assert np.abs(G - T).max() / np.abs(T).max() < 1e-7
    # and T's rows are orthonormal on [0, 1]: check by Gauss quadrature on the polynomials
    y, w = np.polynomial.legendre.leggauss(2 * N + 2)
    x, w = (y + 1) / 2, w / 2
    values = T @ x[None, :] ** np.arange(N)[:, None]           # (N, nodes): p_n(x)
    assert np.allclose((values * w) @ values.T, np.eye(N), atol=1e-9)
    # the rows are the Legendre polynomials sqrt(2n+1) P_n(2x - 1) themselves
    ref = np.polynomial.legendre.legvander(y, N - 1).T * np.sqrt(2 * np.arange(N) + 1.0)[:, None]
    assert np.allclose(values, ref, atol=1e-9)


@pytest.mark.parametrize("N", [2, 6, 10])
def test_hippo_is_the_diagonal_system_in_legendre_coordinates(N):
    """A = T D T^{-1} and B = T 1, with D = diag(-1, ..., -N): T holds eigenvectors."""
    A, _, B = make_NPLR_HiPPO(N)
    T = shifted_legendre(N)
    D = np.diag(-np.arange(1.0, N + 1))
    assert np.abs(T @ D @ np.linalg.inv(T) - A).max() / np.abs(A).max() < 1e-8
    assert np.allclose(T @ np.ones(N), B, atol=1e-8)
    assert np.allclose(A @ T, T @ D, rtol=0, atol=1e-9 * np.abs(T).max() * N)
    np.testing.assert_allclose(np.sort(np.linalg.eigvals(make_HiPPO(N)).real), -np.arange(N, 0, -1.0),
                               atol=1e-9)


def test_history_matrix_of_hippo_is_T_times_the_diagonal_one():
    """The discrete recurrence commutes with the change of basis: M_hippo = T M_diag."""
    N, t = 8, 300
    T = shifted_legendre(N)
    M_hippo = legs_history_matrix(N, t)
    M_diag = legs_history_matrix(N, t, np.diag(-np.arange(1.0, N + 1)), np.ones(N))
    assert np.abs(T @ M_diag - M_hippo).max() / np.abs(M_hippo).max() < 1e-9
    # the same row space, hence the same least-squares readout; a different spectrum differs
    assert scipy.linalg.subspace_angles(M_hippo.T, M_diag.T).max() < 1e-7
    rng = np.random.RandomState(0)
    Q, _ = np.linalg.qr(rng.randn(N, N))
    M_normal = legs_history_matrix(N, t, Q @ np.diag(-np.arange(1.0, N + 1)) @ Q.T, rng.randn(N))
    assert scipy.linalg.subspace_angles(M_hippo.T, M_normal.T).max() < 1e-6
    M_other = legs_history_matrix(N, t, np.diag(-np.arange(1.0, N + 1) - 0.5), np.ones(N))
    assert scipy.linalg.subspace_angles(M_hippo.T, M_other.T).max() > 1e-2
    u = np.cos(7 * np.arange(t) / t)
    rec_h = np.linalg.lstsq(M_hippo, M_hippo @ u, rcond=None)[0]
    rec_d = np.linalg.lstsq(M_diag, M_diag @ u, rcond=None)[0]
    assert np.abs(rec_h - rec_d).max() < 1e-6


@pytest.mark.parametrize("a", [1.0, 2.0, 5.0, 12.0])
def test_eigenvalue_minus_a_stores_the_monomial(a):
    """In the 1/t system a mode -a, b = 1 has impulse response (1/t)(s/t)^(a-1); the
    bilinear recurrence matches it at the sample midpoints s = j - 1/2 to O(1/t)."""
    t = 1000
    row = legs_history_matrix(1, t, np.array([[-a]]), np.ones(1))[0]
    s = np.arange(1, t + 1) - 0.5
    ref = (s / t) ** (a - 1) / t
    assert np.abs(row - ref).max() / ref.max() < 1 / t


def test_history_matrix_rows_do_not_depend_on_N():
    """A is lower triangular: the first n coordinates never see the later ones."""
    M = legs_history_matrix(12, 200)
    np.testing.assert_allclose(legs_history_matrix(5, 200), M[:5], rtol=0, atol=1e-14)


def test_legs_projection_is_exact_for_polynomials_and_solves_the_ode():
    N = 8
    # u(s) = s^3 at t = 2: c_n = int_0^1 8 x^3 p_n(x) dx, c_0 = 2 and c_n = 0 for n > 3
    c = legs_projection(lambda s: s**3, 2.0, N)
    assert c[0] == pytest.approx(2.0, rel=1e-13) and np.abs(c[4:]).max() < 1e-12
    # a polynomial of degree < N is reconstructed exactly from its coefficients
    poly = lambda s: 1 - 2 * s + 0.5 * s**5   # noqa: E731
    s = np.linspace(0, 3, 7)
    assert np.allclose(legendre_reconstruct(legs_projection(poly, 3.0, N), 3.0, s), poly(s), atol=1e-11)
    # the LegS ODE carries the projection forward
    A, _, B = make_NPLR_HiPPO(N)
    u = lambda s: np.sin(5 * s) + s  # noqa: E731
    sol = solve_ivp(lambda t, c: (A @ c + B * u(t)) / t, (1e-3, 1.0), legs_projection(u, 1e-3, N),
                    t_eval=[0.5, 1.0], method="DOP853", rtol=1e-11, atol=1e-13)
    direct = np.stack([legs_projection(u, t, N) for t in (0.5, 1.0)], axis=1)
    assert np.abs(sol.y - direct).max() < 1e-9
    # ... and a wrong B (one sign flipped) does not
    B_wrong = B * np.where(np.arange(N) == 2, -1, 1)
    bad = solve_ivp(lambda t, c: (A @ c + B_wrong * u(t)) / t, (1e-3, 1.0), legs_projection(u, 1e-3, N),
                    t_eval=[1.0], method="DOP853", rtol=1e-11, atol=1e-13)
    assert np.abs(bad.y[:, 0] - direct[:, 1]).max() > 1e-3


def test_new_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match="N"):
        shifted_legendre(0)
    with pytest.raises(TypeError, match="N"):
        gram_schmidt_monomials(2.5)
    with pytest.raises(ValueError, match="t must be positive"):
        legs_projection(np.sin, 0.0, 4)
    with pytest.raises(ValueError, match="order"):
        legs_projection(np.sin, 1.0, 4, order=0)
