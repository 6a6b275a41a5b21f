import numpy as np
import pytest

from annotated_s4.hippo import (
    hippo_legs_states,
    legs_history_matrix,
    legendre_reconstruct,
    make_DPLR_HiPPO,
    make_HiPPO,
    make_NPLR_HiPPO,
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

    N, step, lengths = 16, 1e-3, [64, 1024, 4096]
    A, _, B = make_NPLR_HiPPO(N)
    assert np.all(np.triu(A, 1) == 0)
    np.testing.assert_allclose(np.diag(A), -np.arange(1, N + 1), rtol=1e-14)
    Lambda, P, Bd, _ = make_DPLR_HiPPO(N)
    Ad = np.diag(Lambda) - np.outer(P, P.conj())
    original = memory_ratio(A, B[:, None], step, lengths)
    np.testing.assert_allclose(memory_ratio(Ad, Bd[:, None], step, lengths), original, rtol=1e-6)
    slowest = ((1 - step / 2) / (1 + step / 2)) ** (2 * (np.array(lengths) - 1))
    assert np.all(original < slowest)
    assert 6.2e-3 < original[1] < 6.4e-3
