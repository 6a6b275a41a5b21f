"""Flax NNX sequence layers built on the pure math of `ssm`, `hippo` and `s4`:
the dense SSM layer, S4 and S4D. Each follows the layer contract described
in `models` (CNN mode ``layer(u)``, RNN mode ``init_cache`` then ``step``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import LayerOptions, SSMParam, option, register_layer
from .hippo import make_DPLR_HiPPO, make_NPLR_HiPPO
from .s4 import (discretize_diagonal, dplr_rnn, dplr_step, kernel_DPLR,
                 s4d_inv_init, s4d_lin_init, vandermonde)
from .ssm import K_conv, causal_convolution, discretize

__all__ = [
    "log_dt_initializer",
    "SSMParam",
    "SSMLayer",
    "SSMOptions",
    "DenseSSMOptions",
    "SSM_INITS",
    "S4Options",
    "S4DOptions",
    "S4Layer",
    "S4_INITS",
    "S4D_INITS",
    "random_DPLR_like",
    "random_NPLR",
    "S4DLayer",
    "Linear",
    "scale_channels",
]


SSM_INITS = ("gaussian", "hippo")


def log_dt_initializer(rng, shape, dt_min=0.001, dt_max=0.1):
    """log(dt), the log of the step size Δ, drawn uniformly in [log dt_min, log dt_max]."""
    return jax.random.uniform(rng, shape) * (
        jnp.log(dt_max) - jnp.log(dt_min)
    ) + jnp.log(dt_min)


class SSMLayer(nnx.Module):
    """H independent N-state SSMs with learned A, B, C, D and log step size Δ (log_dt).

    A (H, N, N), B (H, N, 1) and C (H, 1, N) are H separate copies, each drawn
    with lecun_normal over its own (N, N), (N, 1), (1, N) shape (the channel
    axis is a batch axis, not part of the fan-in): std(A) = 1/sqrt(N).
    ``init="hippo"`` starts every channel's A and B at HiPPO-LegS's instead
    (`make_NPLR_HiPPO`), trained as freely: the S4 paper's dense ablation.
    The kernel is built with the naive `K_conv`-style power iteration, which
    costs O(N^2 L) per channel and is numerically fragile: the layer S4 improves on.
    L is the default kernel length; any input length works (max_len is None).
    """

    max_len = None

    def __init__(self, H, N, L, *, rngs: nnx.Rngs, init="gaussian", dt_min=0.001, dt_max=0.1):
        self.H, self.N, self.L = (checks.positive_int(H, "H"), checks.positive_int(N, "N"),
                                  checks.positive_int(L, "L"))
        checks.choice(init, "init", SSM_INITS)
        normal = jax.nn.initializers.lecun_normal(batch_axis=(0,))
        # drawn for either init, so that C and dt come from the same keys
        A, B = normal(rngs.params(), (H, N, N)), normal(rngs.params(), (H, N, 1))
        if init == "hippo":  # the same dense, free parameters, started from HiPPO-LegS
            A_hippo, _, B_hippo = make_NPLR_HiPPO(N)
            A = jnp.broadcast_to(jnp.asarray(A_hippo, A.dtype), (H, N, N))
            B = jnp.broadcast_to(jnp.asarray(B_hippo, B.dtype)[:, None], (H, N, 1))
        self.A = SSMParam(A)
        self.B = SSMParam(B)
        self.C = nnx.Param(normal(rngs.params(), (H, 1, N)))
        self.D = nnx.Param(jnp.ones((H,)))
        self.log_dt = SSMParam(log_dt_initializer(rngs.params(), (H,), dt_min, dt_max))
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def discrete(self):
        """(Ab, Bb, Cb) for every channel: shapes (H, N, N), (H, N, 1), (H, 1, N)."""
        dt = jnp.exp(self.log_dt[...])
        return jax.vmap(discretize)(self.A[...], self.B[...], self.C[...], dt)

    def kernel(self, L=None):
        """The per-channel convolution kernel `K_conv`, shape (H, L)."""
        L = self.L if L is None else L
        return jax.vmap(K_conv, in_axes=(0, 0, 0, None))(*self.discrete(), L)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.sequence(u, self.H)
        K = self.kernel(u.shape[1])
        return causal_convolution(u, K, axis=1) + self.D[...] * u

    def init_cache(self, batch_size):
        Ab, Bb, Cb = self.discrete()
        self.Ab, self.Bb, self.Cb = nnx.Cache(Ab), nnx.Cache(Bb[..., 0]), nnx.Cache(Cb[:, 0])
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N)))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        x = jnp.einsum("hnm,bhm->bhn", self.Ab[...], self.cache[...])
        x = x + self.Bb[...] * u_t[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhn->bh", self.Cb[...], x)
        return y + self.D[...] * u_t


@dataclasses.dataclass(frozen=True)
class SSMOptions(LayerOptions):
    """The options of the dense SSM layer: the state size and the range of
    the initial step sizes Δ (S4's, S4D's and H3's options start from these)."""

    state_size: int = option(16, "N, the SSM state size", check=checks.positive_int)
    dt_min: float = option(0.001, "smallest initial SSM step size (log-uniform in "
                           "[dt-min, dt-max])", check=checks.positive_number)
    dt_max: float = option(0.1, "largest initial SSM step size", check=checks.positive_number)

    def validate(self):
        super().validate()
        checks.number(self.dt_max, "--dt-max", low=self.dt_min)
        return self

    def dt_range(self):
        """The keyword arguments dt_min, dt_max: the range of the initial step sizes Δ."""
        return {"dt_min": self.dt_min, "dt_max": self.dt_max}


@dataclasses.dataclass(frozen=True)
class DenseSSMOptions(SSMOptions):
    """The options of the dense `SSMLayer` on the command line."""

    init: str = option("gaussian", "A's and B's initialisation: gaussian (lecun_normal) or "
                       "hippo (HiPPO-LegS's A and B, as freely trained: the S4 paper's dense "
                       "ablation)", choices=SSM_INITS)


register_layer("ssm", DenseSSMOptions,
               lambda o, L: functools.partial(SSMLayer, N=o.state_size, L=L, init=o.init,
                                              **o.dt_range()),
               help="the dense SSM: a learned A per channel, its kernel by powers of Ab")


# --------------------------------------------------------------------------
# S4 and S4D layers
# --------------------------------------------------------------------------
def _from_pair(p):
    """A (..., 2) float parameter read as a complex array (real, imag): the
    inverse of `_as_pair`."""
    return p[..., 0] + 1j * p[..., 1]


def _float_dtype():
    """JAX's default float dtype: float32, or float64 under `jax_enable_x64`."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def _as_pair(z, dtype=None):
    """A complex array stored as a (..., 2) float array (real, imag)."""
    z = jnp.asarray(z)
    return jnp.stack([z.real, z.imag], axis=-1).astype(dtype or _float_dtype())


S4_INITS = ("hippo", "random", "gaussian")
S4D_INITS = {"lin": s4d_lin_init, "inv": s4d_inv_init}


def random_DPLR_like(key, Lambda, P, B):
    """A random DPLR state matrix on the scale of a given one (the HiPPO
    ablation): Re Lambda as given, Im Lambda uniform in [0, max Im Lambda]
    (the same range; for HiPPO, Lambda holds the eigenvalues of the normal
    part S = A + P P^T, not of A), P and B complex Gaussian rescaled to the
    given norms. What it loses is HiPPO's particular spectrum and low-rank
    term, the structure that makes the state a projection of the past."""
    k1, k2, k3 = jax.random.split(key, 3)
    n = Lambda.shape[0]
    w = jnp.sort(jax.random.uniform(k1, (n,)) * jnp.max(Lambda.imag))

    def like(k, z):
        g = jax.random.normal(k, (n, 2)) @ jnp.array([1.0, 1j])
        return g * jnp.linalg.norm(z) / jnp.linalg.norm(g)

    return Lambda.real + 1j * w, like(k2, P), like(k3, B)


def random_NPLR(key, N):
    """A random Gaussian state matrix in NPLR form, A = diag(Lambda) - P P^*
    (the S4 paper's random ablation): N/2 modes Lambda = -|x| + i|y| with x, y
    ~ N(0, N/4), so E|Lambda|^2 = N/2, the mean square eigenvalue of an N x N
    matrix of unit Gaussians (the circular law spreads those uniformly over
    the disc of radius sqrt(N)); the real part is reflected to the stable side
    and the imaginary part to the upper half (the modes stored, `conj=True`).
    P and B are complex Gaussian with E|P_n|^2 = E|B_n|^2 = 1.
    Returns (Lambda, P, B), each complex of shape (N/2,)."""
    k1, k2, k3 = jax.random.split(key, 3)
    x, y = jax.random.normal(k1, (2, N // 2)) * (N / 4) ** 0.5
    z = lambda k: jax.lax.complex(*jax.random.normal(k, (N // 2, 2)).T) / 2**0.5  # noqa: E731
    return -jnp.abs(x) + 1j * jnp.abs(y), z(k2), z(k3)


def _channel_params(rngs, H, N, dt_min, dt_max):
    """The parameters of every channel in S4 and S4D: its readout C (S4's C~),
    N/2 complex numbers drawn N(0, 1/2) in each part; its skip D = 1; and its
    log step size Δ (log_dt)."""
    C = jax.random.normal(rngs.params(), (H, N // 2, 2), _float_dtype()) * 0.5**0.5
    log_dt = log_dt_initializer(rngs.params(), (H,), dt_min, dt_max)
    return nnx.Param(C), nnx.Param(jnp.ones((H,))), SSMParam(log_dt)


def _per_channel(fn, shared, Lambda, P, B, C, dt):
    """fn(Lambda, P, B, C~, dt) for each channel, stacked: Lambda, P, B are
    the copy all channels share, or (shared=False) each channel's own."""
    own = None if shared else 0
    return jax.vmap(fn, in_axes=(own, own, own, 0, 0))(Lambda, P, B, C, dt)


# Compiled as one program each: called eagerly (a reader's first call), the
# kernels and the convolution would otherwise compile operation by operation.
@functools.partial(jax.jit, static_argnames=("L", "shared"))
def _dplr_kernels(Lambda, P, B, C, dt, *, L, shared):
    """`kernel_DPLR` of every channel, (H, L): Lambda, P, B shared or (H, N/2)."""
    kernel = lambda Lambda, P, B, C, s: kernel_DPLR(Lambda, P, P, B, C, s, L, conj=True)  # noqa: E731
    return _per_channel(kernel, shared, Lambda, P, B, C, dt)


@functools.partial(jax.jit, static_argnums=4)
def _diagonal_kernels(Lambda, B, C, dt, L):
    """The kernels 2 Re(sum_n C_n B_bar_n Lambda_bar_n^l) of H diagonal SSMs, (H, L)."""
    _, B_bar = discretize_diagonal(Lambda, B, dt[:, None])
    return vandermonde(2 * C * B_bar, dt[:, None] * Lambda, L)


@jax.jit
def _conv_skip(u, K, D):
    """y = K * u + D u along the time axis of u (batch, L, H), K (H, L)."""
    return causal_convolution(u, K, axis=1) + D * u


class S4Layer(nnx.Module):
    """H channels of an S4 SSM with a DPLR state matrix, HiPPO-initialised.

    The state matrix is A = diag(Lambda) - P P^*, where diag(Lambda) is the
    normal part S = A + P P^T of a real matrix (HiPPO's, at init) in S's
    eigenbasis, so its N modes come in N/2 conjugate pairs: Lambda, P, B and C~ hold the
    N/2 modes with Im Lambda > 0 and the kernel sums over both halves
    (`kernel_DPLR(..., conj=True)`); N must be even.

    Parameters: Lambda, P, B of the DPLR HiPPO (init="hippo"; init="random"
    draws them with `random_DPLR_like`, init="gaussian" with `random_NPLR`),
    by default ONE copy shared by the H channels (this book's choice; sharing
    stores N/2 instead of H x N/2 of each); shared=False gives every channel
    its own copy, all starting equal, as the S4 paper and the Annotated S4 do.
    b_clip clips Im B to [-b_clip, b_clip] at initialisation (the S4 authors'
    code does, with 2; the default None keeps HiPPO's B). One C~ (the kernel's
    C (I - Ab^L)), D and log step size Δ (log_dt) per channel, so every channel
    reads the HiPPO memory at its own time-scale through its own output vector.
    The Cauchy matrix still depends on the channel's step size Δ (dt)
    (through g = (2/dt)(1 - z)/(1 + z)): CNN mode builds one of shape
    (L, N/2) per channel, (H, L, N/2) in all. Q = P, which keeps the
    Hermitian part Re(Lambda) - P P^* of A negative definite while Re Lambda < 0.
    Complex parameters are (real, imag) pairs in JAX's default float dtype;
    Re Lambda is stored as its log-negative, so it stays < 0.

    CNN mode: the length-L kernel by `kernel_DPLR` on every call, its first
    u.shape[1] taps. RNN mode: `init_cache` computes Bb and Cb once
    (`dplr_rnn`); each `step` is `dplr_step`, O(N) per channel.
    """

    def __init__(self, H, N, L, *, rngs: nnx.Rngs, init="hippo", dt_min=0.001, dt_max=0.1,
                 shared=True, b_clip=None):
        checks.positive_int(H, "H"), checks.even_int(N, "N"), checks.positive_int(L, "L")
        checks.choice(init, "init", S4_INITS), checks.flag(shared, "shared")
        self.H, self.N, self.L, self.shared = H, N, L, shared
        Lambda, P, B, _ = make_DPLR_HiPPO(N, conj=True)  # N/2 modes
        if init == "random":
            Lambda, P, B = random_DPLR_like(rngs.params(), Lambda, P, B)
        elif init == "gaussian":
            Lambda, P, B = random_NPLR(rngs.params(), N)
        if b_clip is not None:  # Im B to [-b_clip, b_clip], as the S4 authors' code does
            b_clip = checks.positive(b_clip, "b_clip")
            B = B.real + 1j * jnp.clip(B.imag, -b_clip, b_clip)
        if not shared:  # one copy per channel: (H, N/2) each
            Lambda, P, B = (jnp.broadcast_to(z, (H, N // 2)) for z in (Lambda, P, B))
        dtype = _float_dtype()
        self.Lambda_log_neg_re = SSMParam(jnp.log(-Lambda.real).astype(dtype))
        self.Lambda_im = SSMParam(jnp.asarray(Lambda.imag, dtype=dtype))
        self.P = SSMParam(_as_pair(P))
        self.B = SSMParam(_as_pair(B))
        self.C, self.D, self.log_dt = _channel_params(rngs, H, N, dt_min, dt_max)
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def ssm_params(self):
        """(Lambda, P, B (N/2,), or (H, N/2) each unless shared, C~ (H, N/2),
        dt (H,)) as complex / real arrays."""
        Lambda = -jnp.exp(self.Lambda_log_neg_re[...]) + 1j * self.Lambda_im[...]
        return (Lambda, _from_pair(self.P[...]), _from_pair(self.B[...]),
                _from_pair(self.C[...]), jnp.exp(self.log_dt[...]))

    def kernel(self, L=None):
        """The per-channel kernel, shape (H, L); L defaults to (and may not
        exceed) self.L.

        C~ = C (I - Ab^L) ties the kernel to its length self.L, so a longer
        kernel is not available: asking for one raises.
        """
        L = self.L if L is None else L
        if checks.positive_int(L, "L") > self.L:
            raise ValueError(f"L must be at most self.L = {self.L}, got {L}")
        return _dplr_kernels(*self.ssm_params(), L=self.L, shared=self.shared)[:, :L]

    max_len = property(lambda self: self.L, doc="The contract's length limit: L.")

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.max_length(checks.sequence(u, self.H), self.max_len)
        return _conv_skip(u, self.kernel(u.shape[1]), self.D[...])

    def init_cache(self, batch_size):
        Bb, Cb = _per_channel(
            lambda Lambda, P, B, C, s: dplr_rnn(Lambda, P, P, B, C, s, self.L, conj=True),
            self.shared, *self.ssm_params())
        self.Bb, self.Cb = nnx.Cache(Bb), nnx.Cache(Cb)  # (H, N/2) each
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N // 2), Bb.dtype))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        Lambda, P, _, _, dt = self.ssm_params()
        x = dplr_step(self.cache[...], u_t, Lambda, P, P, self.Bb[...], dt[:, None], conj=True)
        self.cache[...] = x
        y = 2.0 * jnp.einsum("hn,bhn->bh", self.Cb[...], x).real
        return y + self.D[...] * u_t


_EVEN_STATE = "N, the SSM state size (even: N/2 complex modes)"


@dataclasses.dataclass(frozen=True)
class S4Options(SSMOptions):
    """The options of `S4Layer` on the command line."""

    state_size: int = option(16, _EVEN_STATE, check=checks.even_int)
    init: str = option("hippo", "the state matrix's initialisation: hippo, random (HiPPO's "
                       "scale, random frequencies) or gaussian (a random Gaussian matrix in "
                       "NPLR form, the S4 paper's ablation)", choices=S4_INITS)
    b_clip: float | None = option(None, "clip the imaginary part of B (in the DPLR basis) to "
                                  "+-B_CLIP at initialisation, as the S4 authors' code does "
                                  "(B_clip = 2)", check=checks.positive_number)
    independent: bool = option(False, "every channel its own Lambda, P, B (the S4 paper's "
                               "layer) instead of one copy shared by the channels",
                               check=checks.flag)


def _build_s4(o, L):
    return functools.partial(S4Layer, N=o.state_size, L=L, shared=not o.independent,
                             init=o.init, b_clip=o.b_clip, **o.dt_range())


register_layer("s4", S4Options, _build_s4,
               help="S4: a DPLR state matrix, HiPPO-initialised")


class S4DLayer(nnx.Module):
    """H channels of a diagonal SSM (S4D): N/2 complex modes per channel.

    x_k = Lambda_bar x_{k-1} + B_bar u_k,  y_k = 2 Re(C x_k) + D u_k,
    with the zero-order-hold discretisation of `discretize_diagonal`. The N/2
    modes stand for N/2 conjugate pairs (a real state of size N), hence the 2.
    Lambda starts at S4D-Lin (init="lin") or S4D-Inv (init="inv"), B at 1,
    C ~ N(0, 1/2) per part; Lambda's real part is stored as its log-negative.
    With learn_B=False, B stays 1 (H3's diagonal SSM). L, if
    given, is the longest input accepted. The kernel is `kernel_diagonal`'s
    Vandermonde product, computed blockwise by `vandermonde`.
    """

    def __init__(self, H, N, L=None, *, rngs: nnx.Rngs, init="lin", learn_B=True,
                 dt_min=0.001, dt_max=0.1):
        H, N = checks.positive_int(H, "H"), checks.even_int(N, "N")
        L = None if L is None else checks.positive_int(L, "L")
        init, learn_B = checks.choice(init, "init", S4D_INITS), checks.flag(learn_B, "learn_B")
        self.H, self.N, self.L = H, N, L
        dtype = _float_dtype()
        Lambda = jnp.broadcast_to(S4D_INITS[init](N), (H, N // 2))
        self.Lambda_log_neg_re = SSMParam(jnp.log(-Lambda.real).astype(dtype))
        self.Lambda_im = SSMParam(Lambda.imag.astype(dtype))
        self.B = SSMParam(_as_pair(jnp.ones((H, N // 2)))) if learn_B else None
        self.C, self.D, self.log_dt = _channel_params(rngs, H, N, dt_min, dt_max)
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def ssm_params(self):
        """(Lambda, B, C, dt) with shapes (H, N/2) complex x3 and (H,)."""
        Lambda = -jnp.exp(self.Lambda_log_neg_re[...]) + 1j * self.Lambda_im[...]
        B = jnp.ones_like(Lambda) if self.B is None else _from_pair(self.B[...])
        return Lambda, B, _from_pair(self.C[...]), jnp.exp(self.log_dt[...])

    def discrete(self):
        """(Lambda_bar, B_bar, C), each complex (H, N/2)."""
        Lambda, B, C, dt = self.ssm_params()
        return *discretize_diagonal(Lambda, B, dt[:, None]), C

    def kernel(self, L=None):
        """The per-channel kernel 2 Re(sum_n C_n B_bar_n Lambda_bar_n^l), (H, L)."""
        return _diagonal_kernels(*self.ssm_params(), L or self.L)

    max_len = property(lambda self: self.L, doc="The contract's length limit: L, or None.")

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.max_length(checks.sequence(u, self.H), self.max_len)
        return _conv_skip(u, self.kernel(u.shape[1]), self.D[...])

    def init_cache(self, batch_size):
        Lambda_bar, B_bar, C = self.discrete()
        self.Lambda_bar, self.B_bar, self.C2 = (
            nnx.Cache(Lambda_bar), nnx.Cache(B_bar), nnx.Cache(2 * C))
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N // 2), Lambda_bar.dtype))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        x = self.Lambda_bar[...] * self.cache[...] + self.B_bar[...] * u_t[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhn->bh", self.C2[...], x).real
        return y + self.D[...] * u_t


@dataclasses.dataclass(frozen=True)
class S4DOptions(SSMOptions):
    """The options of `S4DLayer` on the command line."""

    state_size: int = option(16, _EVEN_STATE, check=checks.even_int)
    init: str = option("lin", "the diagonal's initialisation: lin (S4D-Lin) or inv (S4D-Inv)",
                       choices=tuple(S4D_INITS))


register_layer("s4d", S4DOptions,
               lambda o, L: functools.partial(S4DLayer, N=o.state_size, L=L, init=o.init,
                                              **o.dt_range()),
               help="S4D: a diagonal state matrix")


# --------------------------------------------------------------------------
# Per-channel weights, written for a fast gradient
# --------------------------------------------------------------------------
def scale_channels(c, x):
    """x * c for a per-channel c whose shape is x's trailing shape, with the
    positions flattened: (positions, channels) * (channels,).

    The same numbers as the broadcast product. The difference is in c's
    gradient, a sum over the batch and every position: JAX sums over the
    axes along which c was broadcast, for a batch of one the middle axis of
    a (1, L, H) array; here it is always the first axis of a (B L, H) array,
    batch and positions flattened together, whatever the batch size B.
    Which of the two a backend sums faster depends on the backend and its
    version (the H3 chapter times both); every per-channel weight of the
    package (`Linear`'s bias too) is written this way, so that layers
    compared with each other pay the same for these sums.
    """
    return (x.reshape(-1, c.size) * c.reshape(-1)).reshape(x.shape)


class Linear(nnx.Linear):
    """`nnx.Linear` applied to x flattened to (positions, features), so that
    the gradient of its bias is a sum over the first axis (as in
    `scale_channels`)."""

    def __call__(self, x):
        return super().__call__(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
