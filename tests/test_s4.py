"""Tests for annotated_s4.s4 and annotated_s4.hippo.

Checks that two computations agree in float32 run at float32 matmul precision
(`@jax.default_matmul_precision("float32")`): at JAX's default, a GPU multiplies
float32 matrices in TF32 (see annotated_s4.precision and tests/test_precision.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

from annotated_s4.hippo import make_DPLR_HiPPO, make_HiPPO, make_NPLR_HiPPO
from annotated_s4.s4 import (
    K_gen_inverse,
    K_gen_simple,
    cauchy,
    conv_from_gen,
    discrete_DPLR,
    discretize_diagonal,
    dplr_A0,
    dplr_A1,
    dplr_rnn,
    dplr_step,
    hippo_ssm,
    K_diagonalised,
    kernel_DPLR,
    kernel_diagonal,
    s4d_inv_init,
    s4d_lin_init,
    unfold_conj,
    vandermonde,
)
from annotated_s4.ssm import K_conv, discretize, random_SSM


def _rel(a, b):
    return float(jnp.abs(a - b).max() / jnp.abs(b).max())


def test_generating_functions_recover_kernel():
    with enable_x64():
        N, L = 6, 16
        A, B, C = random_SSM(jax.random.PRNGKey(0), N)
        Ab, Bb, Cb = discretize(jnp.asarray(make_HiPPO(N)), B, C, 1.0 / L)
        K = K_conv(Ab, Bb, Cb, L)
        assert _rel(conv_from_gen(K_gen_simple(Ab, Bb, Cb, L), L), K) < 1e-12
        assert _rel(conv_from_gen(K_gen_inverse(Ab, Bb, Cb, L), L), K) < 1e-12


def test_cauchy_matches_dense():
    rng = np.random.RandomState(0)
    v, lam = rng.randn(5) + 1j * rng.randn(5), rng.randn(5) + 1j * rng.randn(5)
    om = rng.randn(7) + 1j * rng.randn(7)
    expect = (1.0 / (om[:, None] - lam[None, :])) @ v
    with enable_x64():
        assert np.allclose(cauchy(v, om, lam), expect, rtol=1e-12)
        both = cauchy(np.stack([v, 2 * v]), om, lam)
        assert both.shape == (2, 7) and np.allclose(both[1], 2 * expect, rtol=1e-12)


@pytest.mark.parametrize("N,L", [(8, 16), (16, 256)])
def test_kernel_DPLR_matches_dense(N, L):
    with enable_x64():
        Lambda, P, B, _ = make_DPLR_HiPPO(N)
        A = np.diag(Lambda) - np.outer(P, P.conj())
        rng = np.random.RandomState(1)
        C = rng.randn(N) + 1j * rng.randn(N)
        Ab, Bb, Cb = discretize(jnp.asarray(A), jnp.asarray(B)[:, None], jnp.asarray(C)[None, :], 1.0 / L)
        dense = K_conv(Ab, Bb, Cb.conj(), L).real
        Ct = (np.eye(N) - np.linalg.matrix_power(np.asarray(Ab), L)).conj().T @ np.asarray(Cb).ravel()
        fast = kernel_DPLR(Lambda, P, P, B, Ct, 1.0 / L, L)
        assert _rel(fast, dense) < 1e-8


def test_kernel_DPLR_matches_hippo_in_original_basis():
    # The real HiPPO SSM (A, B, C) and its DPLR form give the same kernel.
    with enable_x64():
        N, L, dt = 16, 128, 0.01
        A, _, B0 = make_NPLR_HiPPO(N)
        C0 = np.random.RandomState(2).randn(N)
        Ab, Bb, Cb = discretize(jnp.asarray(A), jnp.asarray(B0)[:, None], jnp.asarray(C0)[None, :], dt)
        assert all(jnp.array_equal(x, y) for x, y in zip((Ab, Bb, Cb), hippo_ssm(N, C0, dt)))
        dense = K_conv(Ab, Bb, Cb, L)
        Lambda, P, B, V = make_DPLR_HiPPO(N)
        # C in the eigenbasis is C0 V; C~ = C (I - Ab^L); the kernel uses conj(C~).
        AbV = V.conj().T @ np.asarray(Ab) @ V
        Ct = ((C0 @ V) @ (np.eye(N) - np.linalg.matrix_power(AbV, L))).conj()
        fast = kernel_DPLR(Lambda, P, P, B, Ct, dt, L)
        assert _rel(fast, dense) < 1e-8


def test_K_diagonalised_is_exact_while_W_is_well_conditioned():
    """Through A = W diag(w) W^{-1} the kernel is right at N = 4 and garbage
    at N = 64, where cond(W) is astronomical (chapter 5, step 5)."""
    with enable_x64():
        for N, ok in ((4, True), (64, False)):
            C0 = np.random.RandomState(1).randn(N) / np.sqrt(N)
            K, cond_W = K_diagonalised(N, C0, 0.01, 256)
            err = _rel(K, K_conv(*hippo_ssm(N, C0, 0.01), 256))
            assert (err < 1e-8) if ok else (err > 1e10 and cond_W > 1e20), (N, err, cond_W)
    with pytest.raises(ValueError, match="C must be a vector of N = 8"):
        K_diagonalised(8, np.ones(7), 0.01, 16)
    with pytest.raises(ValueError, match="C must be a vector of N = 8"):
        hippo_ssm(8, np.ones((1, 8)), 0.01)


def test_discrete_DPLR_unrolls_to_kernel():
    with enable_x64():
        N, L = 8, 64
        Lambda, P, B, _ = make_DPLR_HiPPO(N)
        rng = np.random.RandomState(3)
        Ct = rng.randn(N) + 1j * rng.randn(N)
        K = kernel_DPLR(Lambda, P, P, B, Ct, 0.05, L)
        Ab, Bb, Cb = discrete_DPLR(Lambda, P, P, B, Ct, 0.05, L)
        assert Ab.shape == (N, N) and Bb.shape == (N, 1) and Cb.shape == (1, N)
        assert _rel(K_conv(Ab, Bb, Cb, L).real, K) < 1e-8
        # Ab is the bilinear discretisation of the DPLR matrix
        A = np.diag(Lambda) - np.outer(P, P.conj())
        Ab2, Bb2, _ = discretize(jnp.asarray(A), jnp.asarray(B)[:, None], jnp.ones((1, N)), 0.05)
        assert np.allclose(Ab, Ab2, atol=1e-10) and np.allclose(Bb, Bb2, atol=1e-10)


@pytest.mark.parametrize("L", [128, 127, 2, 1])
def test_conjugate_pairs_give_the_full_kernel(L):
    """N/2 stored modes with conj=True (evaluated at the L // 2 + 1 roots
    irfft reads) == all N modes at all L roots, float64, odd and even L."""
    with enable_x64():
        N = 16
        Lambda, P, B, _ = make_DPLR_HiPPO(N, conj=True)
        rng = np.random.RandomState(5)
        C = rng.randn(N // 2) + 1j * rng.randn(N // 2)
        half = kernel_DPLR(Lambda, P, P, B, C, 0.02, L, conj=True)
        full = kernel_DPLR(*unfold_conj(Lambda, P, P, B, C), 0.02, L)
        assert _rel(half, full) < 1e-12
        v = rng.randn(N // 2) + 1j * rng.randn(N // 2)
        om = 1j * rng.randn(5)
        assert np.allclose(cauchy(v, om, Lambda, conj=True),
                           cauchy(*unfold_conj(v, Lambda)[:1], om, unfold_conj(Lambda)),
                           rtol=1e-12)


@pytest.mark.parametrize("conj", [False, True])
def test_dplr_step_equals_dense_step(conj):
    """The O(N) step (A0 then Woodbury A1) == the dense Ab = A1 @ A0 step, float64."""
    with enable_x64():
        N, L, dt = 16, 64, 0.05
        Lambda, P, B, _ = make_DPLR_HiPPO(N, conj=conj)
        rng = np.random.RandomState(6)
        C = rng.randn(Lambda.shape[0]) + 1j * rng.randn(Lambda.shape[0])
        full = unfold_conj(Lambda, P, B, C) if conj else (Lambda, P, B, C)
        Lf, Pf, Bf, Cf = full
        Ab, Bb, Cb = discrete_DPLR(Lf, Pf, Pf, Bf, Cf, dt, L)
        A = np.diag(Lf) - np.outer(Pf, Pf.conj())
        x = rng.randn(Lf.shape[0]) + 1j * rng.randn(Lf.shape[0])
        if conj:
            x[N // 2:] = x[:N // 2].conj()
        half = slice(0, Lambda.shape[0])
        A0x = dplr_A0(x[half], Lambda, P, P, dt, conj)
        assert np.allclose(A0x, ((2 / dt) * np.eye(N) + A)[half] @ x, rtol=1e-12)
        y = np.asarray(A0x if not conj else unfold_conj(A0x))
        A1y = dplr_A1(y[half], Lambda, P, P, dt, conj)
        assert np.allclose(A1y, np.linalg.solve((2 / dt) * np.eye(N) - A, y)[half], rtol=1e-10)
        Bb2, Cb2 = dplr_rnn(Lambda, P, P, B, C, dt, L, conj)
        assert np.allclose(Bb2, Bb[half, 0], rtol=1e-12)
        assert np.allclose(Cb2, Cb[0, half], rtol=1e-12)
        u = rng.randn(L)
        xd, xs, err = np.zeros(N, complex), jnp.zeros(Lambda.shape[0], complex), 0.0
        for k in range(L):
            xd = np.asarray(Ab) @ xd + np.asarray(Bb)[:, 0] * u[k]
            xs = dplr_step(xs, jnp.asarray(u[k]), Lambda, P, P, Bb2, dt, conj)
            yd = (np.asarray(Cb)[0] @ xd).real
            ys = (2.0 * (Cb2 @ xs).real) if conj else (Cb2 @ xs).real
            err = max(err, abs(float(ys) - yd) / max(abs(yd), 1e-300))
        assert err < 1e-10


@jax.default_matmul_precision("float32")
def test_kernel_DPLR_float32_accurate_at_16k():
    N, L = 64, 16384
    Lambda, P, B, _ = make_DPLR_HiPPO(N)
    Ct = np.random.RandomState(4).randn(N) * (1 + 0j)
    with enable_x64():
        ref = np.asarray(kernel_DPLR(Lambda, P, P, B, Ct, 1.0 / L, L))
    k32 = kernel_DPLR(*(jnp.asarray(x, jnp.complex64) for x in (Lambda, P, P, B, Ct)), 1.0 / L, L)
    assert k32.dtype == jnp.float32
    assert np.abs(np.asarray(k32) - ref).max() / np.abs(ref).max() < 1e-3


def test_s4d_inits_and_kernel():
    lin, inv = s4d_lin_init(8), s4d_inv_init(8)
    assert lin.shape == inv.shape == (4,)
    assert np.allclose(lin.real, -0.5) and np.allclose(lin.imag, np.pi * np.arange(4))
    assert np.allclose(inv.imag, (8 / np.pi) * (8 / (2 * np.arange(4) + 1) - 1), rtol=1e-6)
    # diagonal kernel == kernel of the dense diagonal SSM (ZOH)
    with enable_x64():
        Lam = np.asarray(lin, np.complex128)
        B, C = np.ones(4) + 0j, np.arange(1, 5) + 1j
        K = kernel_diagonal(Lam, B, C, 0.1, 20)
        Lb = np.exp(0.1 * Lam)
        Bb = (Lb - 1) / Lam * B
        dense = np.array([(C * Lb**l * Bb).sum().real for l in range(20)])
        assert np.allclose(K, dense, rtol=1e-10)
        # conj=True: the 4 modes stand for 4 conjugate pairs, the kernel of the
        # real SSM of size 8 built from all of them
        full = [np.concatenate([x, x.conj()]) for x in (Lam, B, C)]
        K_pairs = kernel_diagonal(Lam, B, C, 0.1, 20, conj=True)
        assert np.allclose(K_pairs, kernel_diagonal(*full, 0.1, 20), rtol=1e-10)
        assert np.allclose(K_pairs, 2 * K, rtol=1e-10)


def test_errors():
    with pytest.raises(ValueError, match="N must be even"):
        s4d_lin_init(5)
    Lambda, P, B, _ = make_DPLR_HiPPO(4)
    with pytest.raises(ValueError, match="C"):
        kernel_DPLR(Lambda, P, P, B, np.ones(3), 0.1, 8)
    with pytest.raises(ValueError, match="dt"):
        kernel_DPLR(Lambda, P, P, B, np.ones(4), -0.1, 8)
    with pytest.raises(TypeError, match="L"):
        discrete_DPLR(Lambda, P, P, B, np.ones(4), 0.1, 8.0)
    with pytest.raises(ValueError, match="v must"):
        cauchy(np.ones(4), np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="omega"):
        cauchy(np.ones(3), np.ones((2, 2)), np.ones(3))


def test_diagonal_and_generating_function_errors():
    lam, b = s4d_lin_init(4), np.ones(2)
    with pytest.raises(ValueError, match="Lambda and B"):
        discretize_diagonal(lam, np.ones(3), 0.1)
    with pytest.raises(ValueError, match="dt must be positive"):
        discretize_diagonal(lam, b, 0.0)
    with pytest.raises(TypeError, match="dt"):
        discretize_diagonal(lam, b, 1j)
    with pytest.raises(ValueError, match="broadcast"):
        discretize_diagonal(lam, b, np.full((3, 1), 0.1))
    # the per-channel form used by S4DLayer: (H, N/2) with dt (H, 1)
    Lb, Bb = discretize_diagonal(np.stack([lam, lam]), np.ones((2, 2)), np.array([[0.1], [0.2]]))
    assert Lb.shape == Bb.shape == (2, 2)
    with pytest.raises(TypeError, match="L"):
        kernel_diagonal(lam, b, b, 0.1, 8.0)
    with pytest.raises(ValueError, match="L"):
        kernel_diagonal(lam, b, b, 0.1, 0)
    with pytest.raises(ValueError, match="dt must be positive"):
        kernel_diagonal(lam, b, b, -0.1, 8)
    with pytest.raises(ValueError, match="dt must be a scalar"):
        kernel_diagonal(lam, b, b, np.array([0.1, 0.2]), 8)
    with pytest.raises(TypeError, match="gen"):
        conv_from_gen(np.ones(8), 8)


def test_vandermonde_equals_reference_kernel_float64():
    with enable_x64():
        H, N = 5, 16
        rng = np.random.default_rng(0)
        Lambda = jnp.asarray(-np.exp(rng.normal(size=(H, N)) - 1) + 1j * np.pi * np.arange(N))
        C = jnp.asarray(rng.normal(size=(H, N)) + 1j * rng.normal(size=(H, N)))
        dt = jnp.asarray(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), H)))
        _, B_bar = discretize_diagonal(Lambda, jnp.ones_like(Lambda), dt[:, None])
        for L in (1, 2, 7, 64, 1000, 4099):
            ref = jax.vmap(kernel_diagonal, in_axes=(0, 0, 0, 0, None))(
                Lambda, jnp.ones_like(Lambda), 2 * C, dt, L)
            fast = vandermonde(2 * C * B_bar, dt[:, None] * Lambda, L)
            assert fast.dtype == jnp.float64 and fast.shape == (H, L)
            rel = float(jnp.abs(fast - ref).max() / jnp.abs(ref).max())
            assert rel < 1e-10, (L, rel)


def test_vandermonde_gradient_equals_reference_float64():
    """The hand-written backward pass (two Vandermonde sums) against JAX's
    derivative of the dense product, for W and log_z in every broadcast form."""
    def dense(W, log_z, L):
        return jnp.sum(W[..., None] * jnp.exp(log_z[..., None] * jnp.arange(L)), axis=-2).real

    with enable_x64():
        rng = np.random.default_rng(1)
        H, N = 3, 8
        log_z = jnp.asarray(-np.exp(rng.normal(size=(H, N)) - 4) + 1j * rng.uniform(0, 3, (H, N)))
        W = jnp.asarray(rng.normal(size=(H, N)) + 1j * rng.normal(size=(H, N)))
        for L in (1, 5, 64, 1001):
            g = jnp.asarray(rng.normal(size=(H, L)))
            for args in ((W, log_z), (W[0], log_z), (W, log_z[0]), (W.real, log_z)):
                def loss(f, W, log_z):
                    return jnp.sum(g * f(W, log_z, L))
                # each derivative one compiled program (eagerly, each of its many
                # operations would be compiled on its own, for every shape)
                fast = jax.jit(jax.grad(lambda W, z: loss(vandermonde, W, z),
                                        argnums=(0, 1)))(*args)
                ref = jax.jit(jax.grad(lambda W, z: loss(dense, W, z), argnums=(0, 1)))(*args)
                for a, b in zip(fast, ref):  # (at L = 1, d/dlog_z is exactly 0)
                    assert a.shape == b.shape and a.dtype == b.dtype
                    err, size = float(jnp.abs(a - b).max()), float(jnp.abs(b).max())
                    assert err <= 1e-10 * size or err == 0.0, (L, err, size)


def test_vandermonde_checks_its_arguments():
    with pytest.raises(ValueError, match="L"):
        vandermonde(jnp.ones(3), jnp.ones(3), 0)
    with pytest.raises(TypeError, match="W"):
        vandermonde(jnp.ones(3, int).astype(bool), jnp.ones(3), 4)
