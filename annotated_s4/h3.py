"""H3 (Hungry Hungry Hippos): the shift SSM, FlashConv's block FFT and the H3 layer.

H3 (Fu et al., 2023) is linear attention whose keys go through a *shift SSM*
(a short learned filter, so a key can be paired with the value that follows
it) and whose key-value memory is accumulated by a *diagonal SSM*
(`S4DLayer` with B = 1) instead of a plain running sum. Per head of
dimension d_h,

    O_t = Q_t^T SSM_diag(K_bar V^T)_t,    K_bar = SSM_shift(K),

a d_h x d_h memory of outer products read by the query; for d_h = 1 this is
the elementwise O = Q * SSM_diag(SSM_shift(K) * V).

Every module here follows the layer contract described in `models`
(``layer(u)`` on (batch, L, H); ``init_cache`` / ``step`` for RNN mode), so
`StackedModel` stacks them like any other layer. The softmax-attention
baseline is `attention.CausalSelfAttention`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import option, register_layer
from .layers import Linear, S4DLayer, SSMOptions, scale_channels
from .ssm import causal_convolution

__all__ = [
    "shift_matrix",
    "shift_kernel",
    "dft_matrix",
    "block_fft",
    "causal_conv",
    "ShiftSSM",
    "H3Layer",
    "H3Options",
]


# --- The two SSMs as pure functions ------------------------------------------


def shift_matrix(N):
    """The N x N shift matrix: ones on the subdiagonal, so (A x)_n = x_{n-1}."""
    N = checks.positive_int(N, "N")
    return jnp.eye(N, k=-1)


def shift_kernel(C, L):
    """Kernel of the shift SSM (A = shift matrix, B = e_0) with output weights C.

    K_l = C A^l B = C_l for l < N and 0 afterwards: the learned filter C,
    zero-padded to length L. C has shape (..., N); returns (..., L).
    """
    C = jnp.asarray(C)
    if C.ndim < 1:
        raise ValueError(f"C must have a trailing state axis of size N, got shape {C.shape}")
    N = C.shape[-1]
    L = checks.positive_int(L, "L")
    if L >= N:
        return jnp.pad(C, [(0, 0)] * (C.ndim - 1) + [(0, L - N)])
    return C[..., :L]


# Up to this length `causal_conv` multiplies by the Toeplitz matrix; beyond
# it, it uses the FFT. At the recall tasks' lengths (20 and 30) the two do
# arithmetic of the same order and the FFT's other costs decide; at 1,024 steps
# the Toeplitz product does many times the FFT's (counts and CPU timings on
# the page "H3 at length"). 256 is not where the flop counts cross (XLA
# already charges the Toeplitz product more there): it is a round cut between
# those lengths, the same for every backend, not a measured optimum.
DIRECT_CONV_MAX_LEN = 256


def causal_conv(u, K, axis=1):
    """`ssm.causal_convolution` of u with K along `axis`: by the Toeplitz
    product up to DIRECT_CONV_MAX_LEN steps (short sequences, where the
    FFT's costs other than arithmetic weigh most) and by the FFT beyond (long
    ones, where its O(L log L) does). The cut is fixed, not tuned per backend."""
    return causal_convolution(u, K, axis, nofft=u.shape[axis] <= DIRECT_CONV_MAX_LEN)


# --- FlashConv's block FFT ----------------------------------------------------


def dft_matrix(n, dtype=None):
    """The n x n DFT matrix F[k, m] = exp(-2 pi i k m / n), so that F @ x = fft(x).

    The exponent k m is reduced mod n first, so every entry is one of the n
    roots of unity computed to full accuracy.
    """
    n = checks.positive_int(n, "n")
    k = jnp.arange(n)
    F = jnp.exp(-2j * jnp.pi * ((k[:, None] * k[None, :]) % n) / n)
    return F if dtype is None else F.astype(dtype)


def block_fft(x, n1):
    """fft(x) along the last axis (length n = n1 n2) as two batches of small DFT
    matrix products and one twiddle multiplication (Cooley-Tukey, one level).

    Write the input index as j = n2 j1 + j2 and the
    output index k = k1 + n1 k2 (j1, k1 < n1; j2, k2 < n2). Then

        X[k1 + n1 k2] = sum_j2 w_n^(k1 j2) [sum_j1 x[n2 j1 + j2] w_n1^(k1 j1)]
                        w_n2^(j2 k2)

    with w_M = exp(-2 pi i / M): reshape x to an (n1, n2) table, multiply by
    the n1 x n1 DFT matrix from the left (n2 DFTs of length n1), multiply
    elementwise by the twiddle factors w_n^(k1 j2), multiply by the n2 x n2
    DFT matrix from the right (n1 DFTs of length n2), and read the result out
    column by column. Two matrix products of O(n (n1 + n2)) work: more
    arithmetic than the FFT's O(n log n), but all of it in matrix products,
    the form that a GPU's tensor cores run fastest. As written (complex64 at
    Precision.HIGHEST, which excludes TF32) it would not use the tensor cores
    even on a GPU; FlashFFTConv runs its DFT matrices in fp16 or bf16.
    """
    x = checks.array(x, "x", kind="number")
    n1 = checks.positive_int(n1, "n1")
    n = x.shape[-1] if x.ndim else 0
    if x.ndim < 1 or n % n1:
        raise ValueError(f"n1 must divide the length of x's last axis, got n1 = {n1}, "
                         f"x of shape {x.shape}")
    n2 = n // n1
    ctype = jnp.result_type(x.dtype, jnp.complex64)
    table = x.reshape(*x.shape[:-1], n1, n2).astype(ctype)             # [j1, j2]
    k1, j2 = jnp.arange(n1)[:, None], jnp.arange(n2)[None, :]
    twiddle = jnp.exp(-2j * jnp.pi * ((k1 * j2) % n) / n).astype(ctype)
    hi = jax.lax.Precision.HIGHEST
    A = jnp.einsum("km,...mj->...kj", dft_matrix(n1, ctype), table, precision=hi)
    B = jnp.einsum("...kj,jl->...kl", A * twiddle, dft_matrix(n2, ctype), precision=hi)
    return jnp.swapaxes(B, -1, -2).reshape(x.shape)                    # X[k1 + n1 k2]


# --- Layers --------------------------------------------------------------------

class ShiftSSM(nnx.Module):
    """H independent shift SSMs with N states: y_k = sum_{j<N} C_j u_{k-j}.

    The state x_k = (u_k, u_{k-1}, ..., u_{k-N+1}) is the last N inputs; the
    kernel is the learned length-N filter C (`shift_kernel`). C_0 acts as the
    direct term D, so there is no separate D.
    """

    def __init__(self, H, N=4, *, rngs: nnx.Rngs):
        H, N = checks.positive_int(H, "H"), checks.positive_int(N, "N")
        self.H, self.N = H, N
        self.C = nnx.Param(jax.random.normal(rngs.params(), (H, N)) / math.sqrt(N))
        self.cache = nnx.data(None)

    def kernel(self, L):
        return shift_kernel(self.C[...], L)  # (H, L)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        """The convolution with the N-tap kernel, as the sum it is:
        y_k = sum_{j<N} C_j u_{k-j} (with u_{k-j} = 0 before the start)."""
        checks.sequence(u, self.H)
        L = u.shape[1]
        C = self.kernel(min(L, self.N))                       # (H, taps)
        padded = jnp.pad(u, ((0, 0), (C.shape[1] - 1, 0), (0, 0)))
        return sum(scale_channels(C[:, j], padded[:, C.shape[1] - 1 - j:][:, :L])
                   for j in range(C.shape[1]))

    def init_cache(self, batch_size):
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N)))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        # x_k = A x_{k-1} + B u_k: shift the window down, put u_k on top
        x = jnp.concatenate([u_t[..., None], self.cache[...][..., :-1]], axis=-1)
        self.cache[...] = x
        return jnp.einsum("hn,bhn->bh", self.C[...], x)


class H3Layer(nnx.Module):
    """The H3 layer, Algorithm 1 of Fu et al. (2023).

    1. Q, K, V = u W_Q, u W_K, u W_V                                (batch, L, H)
    2. K_bar = SSM_shift(K)                        one shift SSM per channel
    3. split Q, K_bar, V into n_heads = H / head_dim heads of size d_h
    4. KV_t = SSM_diag(K_bar_t V_t^T)   (d_h x d_h per step, one diagonal SSM
                                        per head, shared by its d_h^2 entries:
                                        an S4DLayer of state size N =
                                        state_size per head and B = 1)
    5. O_t = Q_t^T KV_t    (per head; Q_t, K_bar_t, V_t are columns, O_t a row)
    6. concatenate the heads, output projection W_O.

    With SSM_diag a running sum and no shift this is causal linear attention;
    the shift lets the memory store (previous key, current value) pairs.
    """

    max_len = None  # the kernels are built for the input's length

    def __init__(self, H, *, rngs: nnx.Rngs, head_dim=8, state_size=64,
                 shift_size=4, dt_min=0.001, dt_max=0.1):
        H, head_dim = checks.positive_int(H, "H"), checks.positive_int(head_dim, "head_dim")
        state_size = checks.even_int(state_size, "state_size")  # N, as S4D's
        shift_size = checks.positive_int(shift_size, "shift_size")
        if H % head_dim:
            raise ValueError(f"head_dim must divide H, got H={H}, head_dim={head_dim}")
        self.H, self.head_dim, self.n_heads = H, head_dim, H // head_dim
        self.state_size = state_size
        self.W_Q = Linear(H, H, rngs=rngs)
        self.W_K = Linear(H, H, rngs=rngs)
        self.W_V = Linear(H, H, rngs=rngs)
        self.W_O = Linear(H, H, rngs=rngs)
        self.shift = ShiftSSM(H, shift_size, rngs=rngs)
        self.diag = S4DLayer(self.n_heads, state_size, rngs=rngs, learn_B=False,
                             dt_min=dt_min, dt_max=dt_max)
        self.cache = nnx.data(None)

    def _heads(self, x):  # (..., H) -> (..., n_heads, d_h)
        return x.reshape(*x.shape[:-1], self.n_heads, self.head_dim)

    def qkv(self, u):
        """Steps 1-3: Q, shifted K, V, each (batch, L, n_heads, d_h)."""
        q, k, v = self.W_Q(u), self.W_K(u), self.W_V(u)
        return self._heads(q), self._heads(self.shift(k)), self._heads(v)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.sequence(u, self.H)
        q, k, v = self.qkv(u)
        kv = k[..., :, None] * v[..., None, :]            # (b, L, heads, d_h, d_h)
        K = self.diag.kernel(u.shape[1])                   # (heads, L)
        D = jnp.broadcast_to(self.diag.D[...][:, None, None], kv.shape[2:])
        kv = causal_conv(kv, K[:, None, None, :], axis=1) + scale_channels(D, kv)
        o = jnp.einsum("blhi,blhij->blhj", q, kv)         # Q_t^T KV_t per head
        return self.W_O(o.reshape(u.shape))

    # -- State passing: a long sequence in chunks ------------------------------

    def empty_cache(self, batch_size):
        """The state a chunk starts from, before any input: the last
        shift_size - 1 keys and the diagonal SSM state of every head's memory
        entry (complex), all zero. Unlike `init_cache` it is returned, not
        stored, so that `chunk` can pass it on."""
        N_shift = self.shift.N
        return (
            jnp.zeros((batch_size, N_shift - 1, self.H)),
            jnp.zeros((batch_size, self.n_heads, self.head_dim, self.head_dim,
                       self.state_size // 2), jnp.result_type(self.diag.Lambda_im[...], 1j)),
        )

    def chunk(self, u, cache):
        """Run one chunk u (batch, T, H) from `cache`; returns (y, new cache).

        Inside the chunk everything is a convolution (`causal_conv`). The past
        enters through the cache: the shift SSM sees the previous keys
        prepended, and the diagonal SSM adds 2 Re C Lambda_bar^{t+1} x_prev to
        step t.
        """
        checks.sequence(u, self.H)
        self._check_cache(cache, u.shape[0])
        k_prev, x_prev = cache
        T, n_prev = u.shape[1], k_prev.shape[1]  # new steps, previous keys kept
        q, v = self._heads(self.W_Q(u)), self._heads(self.W_V(u))
        k_raw = jnp.concatenate([k_prev, self.W_K(u)], axis=1)
        k = self._heads(self.shift(k_raw)[:, n_prev:])
        kv = k[..., :, None] * v[..., None, :]                      # (b, T, h, i, j)
        Lambda_bar, B_bar, C = self.diag.discrete()                  # (h, N)
        K = self.diag.kernel(T)
        D = self.diag.D[...][:, None, None]
        y = causal_conv(kv, K[:, None, None, :], axis=1) + D * kv
        powers = Lambda_bar[:, :, None] ** jnp.arange(1, T + 1)     # (h, N, T)
        y = y + 2 * jnp.einsum("hn,bhijn,hnt->bthij", C, x_prev, powers).real
        o = jnp.einsum("bthi,bthij->bthj", q, y).reshape(u.shape)
        # new state: x_T = Lambda_bar^T x_prev + sum_t Lambda_bar^{T-1-t} B_bar kv_t
        # (powers computed directly: dividing by Lambda_bar would give 0/0 = NaN
        # once Lambda_bar^T underflows)
        later = Lambda_bar[:, :, None] ** jnp.arange(T - 1, -1, -1)  # Lambda_bar^{T-1-t}
        x_new = powers[None, :, None, None, :, -1] * x_prev + jnp.einsum(
            "hnt,bthij->bhijn", B_bar[:, :, None] * later, kv.astype(B_bar.dtype))
        k_new = k_raw[:, k_raw.shape[1] - n_prev:] if n_prev else k_prev
        return self.W_O(o), (k_new, x_new)

    def _check_cache(self, cache, batch_size):
        expected = tuple(s.shape for s in self.empty_cache(batch_size))
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise TypeError("cache must be a pair (k_prev, x_prev) as returned by "
                            f"empty_cache, got {type(cache).__name__}")
        got = tuple(jnp.shape(s) for s in cache)
        if got != expected:
            raise ValueError(f"cache must have shapes {expected} (k_prev, x_prev) for "
                             f"batch {batch_size}, got {got}")

    def chunked(self, u, chunk_size):
        """The layer on a long u, `chunk_size` steps at a time (state passing)."""
        checks.sequence(u, self.H)
        chunk_size = checks.positive_int(chunk_size, "chunk_size")
        if u.shape[1] % chunk_size:
            raise ValueError(
                f"chunk_size must divide L = {u.shape[1]}, got {chunk_size}")
        cache = self.empty_cache(u.shape[0])
        outs = []
        for piece in jnp.split(u, u.shape[1] // chunk_size, axis=1):
            y, cache = _run_chunk(self, piece, cache)  # `chunk`, compiled once per shape
            outs.append(y)
        return jnp.concatenate(outs, axis=1)

    # -- RNN mode ---------------------------------------------------------------

    def init_cache(self, batch_size):
        self.shift.init_cache(batch_size)
        Lambda_bar, B_bar, C = self.diag.discrete()
        self.Lambda_bar, self.B_bar, self.C2 = (
            nnx.Cache(Lambda_bar), nnx.Cache(B_bar), nnx.Cache(2 * C))
        self.cache = nnx.Cache(self.empty_cache(batch_size)[1])

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        """One token: shift state (last keys) + per head a d_h x d_h x N state."""
        checks.step_input(u_t, self.H, self.cache)
        q, v = self._heads(self.W_Q(u_t)), self._heads(self.W_V(u_t))
        k = self._heads(self.shift.step(self.W_K(u_t)))
        kv = k[..., :, None] * v[..., None, :]                        # (b, h, i, j)
        Lb, Bb = self.Lambda_bar[...], self.B_bar[...]
        x = Lb[:, None, None, :] * self.cache[...] + Bb[:, None, None, :] * kv[..., None]
        self.cache[...] = x
        y = jnp.einsum("hn,bhijn->bhij", self.C2[...], x).real
        y = y + self.diag.D[...][:, None, None] * kv
        o = jnp.einsum("bhi,bhij->bhj", q, y).reshape(u_t.shape)
        return self.W_O(o)


@nnx.jit
def _run_chunk(layer, u, cache):
    """`layer.chunk(u, cache)` as one compiled program (run op by op, each of
    its operations would be compiled on its own, for every chunk length)."""
    return layer.chunk(u, cache)


@dataclasses.dataclass(frozen=True)
class H3Options(SSMOptions):
    """The options of `H3Layer` on the command line: the head dimension, the
    keys' shift, and the state size and initial step sizes Δ of each head's diagonal SSM."""

    state_size: int = option(16, "N, the state size of each head's diagonal SSM (even: "
                             "N/2 complex modes)", check=checks.even_int)
    head_dim: int = option(8, "the head dimension d_h (it divides --d-model)",
                           check=checks.positive_int)
    shift_size: int = option(4, "m, the keys' shift SSM: each key mixes itself and the m - 1 "
                             "before it (1: no shift, the current key only)",
                             check=checks.positive_int)


def build_h3(options, L):
    """The `H3Layer` factory of `options` (any length L: its kernels are built
    for the input's)."""
    return functools.partial(H3Layer, head_dim=options.head_dim, state_size=options.state_size,
                             shift_size=options.shift_size, **options.dt_range())


register_layer("h3", H3Options, build_h3,
               help="H3: shifted keys and a diagonal-SSM memory")
