"""H3 (Hungry Hungry Hippos): shift and diagonal SSMs, the H3 layer, attention.

H3 (Fu et al., 2023) is linear attention whose keys go through a *shift SSM*
(a short learned filter, so a key can be paired with the value that follows
it) and whose key-value memory is accumulated by a *diagonal SSM* (S4D)
instead of a plain running sum:

    O = Q * SSM_diag(SSM_shift(K) * V)

Every module here follows the layer contract of `annotated_s4.layers`
(``layer(u)`` on (batch, L, H); ``init_cache`` / ``step`` for RNN mode), so
`StackedModel` stacks them like any other layer. `CausalSelfAttention` is the
softmax-attention baseline, with a key-value cache for generation.
"""

from __future__ import annotations

import math

import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx

from .layers import _check_input, _check_step_input, log_step_initializer
from .s4 import discretize_diagonal, kernel_diagonal

__all__ = [
    "shift_matrix",
    "shift_kernel",
    "fft_conv",
    "toeplitz_conv",
    "causal_conv",
    "ShiftSSM",
    "DiagonalSSM",
    "H3Layer",
    "CausalSelfAttention",
    "LastTokenModel",
    "hybrid",
]


# --- The two SSMs as pure functions ------------------------------------------


def _check_size(name, value):
    """A positive Python or numpy integer (not a bool); returns it as an int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def shift_matrix(N):
    """The N x N shift matrix: ones on the subdiagonal, so (A x)_n = x_{n-1}."""
    N = _check_size("N", N)
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
    L = _check_size("L", L)
    if L >= N:
        return jnp.pad(C, [(0, 0)] * (C.ndim - 1) + [(0, L - N)])
    return C[..., :L]


def fft_conv(u, K, axis=1):
    """Causal convolution along `axis` of u with kernels K (..., L) by FFT.

    K's leading axes broadcast against u with the time axis moved last; the
    kernel is transformed once, however many channels share it (H3 shares one
    diagonal-SSM kernel among the d_h x d_h entries of a head's memory).
    """
    L = u.shape[axis]
    if K.shape[-1] != L:
        raise ValueError(f"K must have length L = {L} on its last axis, got {K.shape}")
    u = jnp.moveaxis(u, axis, -1)
    y = jnp.fft.irfft(jnp.fft.rfft(u, n=2 * L) * jnp.fft.rfft(K, n=2 * L), n=2 * L)
    return jnp.moveaxis(y[..., :L], -1, axis)


def toeplitz_conv(u, K, axis=1):
    """The same causal convolution as `fft_conv`, as a product with the
    lower-triangular L x L Toeplitz matrix T[t, s] = K[t - s] (zero for s > t).

    O(L^2) per channel instead of O(L log L), but one dense matrix product:
    on a CPU it beats the FFT for the short sequences of the recall tasks.
    """
    L = u.shape[axis]
    if K.shape[-1] != L:
        raise ValueError(f"K must have length L = {L} on its last axis, got {K.shape}")
    lag = jnp.arange(L)[:, None] - jnp.arange(L)[None, :]          # t - s
    T = jnp.where(lag >= 0, K[..., jnp.clip(lag, 0, L - 1)], 0.0)   # (..., L, L)
    y = jnp.matmul(T, jnp.moveaxis(u, axis, -1)[..., None])[..., 0]
    return jnp.moveaxis(y, -1, axis)


# Up to this length `causal_conv` multiplies by the Toeplitz matrix; beyond
# it, it uses the FFT (measured on a CPU: the direct product is 2-4x faster
# for the H3 layer's forward and backward pass at L <= 256).
DIRECT_CONV_MAX_LEN = 256


def causal_conv(u, K, axis=1):
    """Causal convolution of u with K along `axis`, by whichever of
    `toeplitz_conv` (short sequences) and `fft_conv` (long ones) is faster."""
    conv = toeplitz_conv if u.shape[axis] <= DIRECT_CONV_MAX_LEN else fft_conv
    return conv(u, K, axis)


# --- Layers --------------------------------------------------------------------


class ShiftSSM(nnx.Module):
    """H independent shift SSMs with N states: y_k = sum_{j<N} C_j u_{k-j}.

    The state x_k = (u_k, u_{k-1}, ..., u_{k-N+1}) is the last N inputs; the
    kernel is the learned length-N filter C (`shift_kernel`). C_0 acts as the
    direct term D, so there is no separate D.
    """

    def __init__(self, H, N=4, *, rngs: nnx.Rngs):
        H, N = _check_size("H", H), _check_size("N", N)
        self.H, self.N = H, N
        self.C = nnx.Param(jax.random.normal(rngs.params(), (H, N)) / math.sqrt(N))
        self.cache = nnx.data(None)

    def kernel(self, L):
        return shift_kernel(self.C[...], L)  # (H, L)

    def __call__(self, u):
        """The convolution with the N-tap kernel, as the sum it is:
        y_k = sum_{j<N} C_j u_{k-j} (with u_{k-j} = 0 before the start)."""
        _check_input(u, self.H)
        L = u.shape[1]
        C = self.kernel(min(L, self.N))                       # (H, taps)
        padded = jnp.pad(u, ((0, 0), (C.shape[1] - 1, 0), (0, 0)))
        return sum(C[:, j] * padded[:, C.shape[1] - 1 - j:][:, :L]
                   for j in range(C.shape[1]))

    def init_cache(self, batch_size):
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N)))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        # x_k = A x_{k-1} + B u_k: shift the window down, put u_k on top
        x = jnp.concatenate([u_t[..., None], self.cache[...][..., :-1]], axis=-1)
        self.cache[...] = x
        return jnp.einsum("hn,bhn->bh", self.C[...], x)


def _s4d_lin_init(rngs, H, N, dt_min, dt_max):
    """S4D-Lin: Lambda_n = -1/2 + i pi n, B = 1, C ~ complex normal, log step."""
    Lambda = (-0.5 + 1j * jnp.pi * jnp.arange(N)).astype(jnp.complex64)
    C = jax.random.normal(rngs.params(), (H, N, 2)) * math.sqrt(0.5)
    log_step = log_step_initializer(rngs.params(), (H,), dt_min, dt_max)
    # strongly typed float32 copies: a weakly typed parameter would make the
    # first optimizer update change its type and trigger a second compilation
    return (
        jnp.array(jnp.broadcast_to(Lambda.real, (H, N)), jnp.float32),
        jnp.array(jnp.broadcast_to(Lambda.imag, (H, N)), jnp.float32),
        C,
        log_step,
    )


class DiagonalSSM(nnx.Module):
    """H independent diagonal SSMs with N complex modes each: S4D-Lin in the
    form H3 uses.

    Lambda = -exp(log_Lambda_re) + i Lambda_im keeps the real part negative
    (stable); B = 1 is fixed (only C, Lambda, the step and D are learned); the
    kernel K_l = 2 Re sum_n C_n B_bar_n Lambda_bar_n^l is `kernel_diagonal`
    with ZOH. (`layers.S4DLayer` of chapter 5 differs: N/2 conjugate modes and
    a learned B.) Used on its own it is the S4D baseline of chapter 7; H3 uses
    one per head on the key-value memory.
    """

    def __init__(self, H, N=32, *, rngs: nnx.Rngs, dt_min=0.001, dt_max=0.1):
        H, N = _check_size("H", H), _check_size("N", N)
        self.H, self.N = H, N
        re, im, C, log_step = _s4d_lin_init(rngs, H, N, dt_min, dt_max)
        self.log_Lambda_re = nnx.Param(jnp.log(-re))
        self.Lambda_im = nnx.Param(im)
        self.C = nnx.Param(C)
        self.D = nnx.Param(jnp.ones((H,)))
        self.log_step = nnx.Param(log_step)
        self.cache = nnx.data(None)

    def params(self):
        """(Lambda, C, step): complex (H, N), complex (H, N), real (H,)."""
        Lambda = -jnp.exp(self.log_Lambda_re[...]) + 1j * self.Lambda_im[...]
        C = self.C[...][..., 0] + 1j * self.C[...][..., 1]
        return Lambda, C, jnp.exp(self.log_step[...])

    def kernel(self, L):
        Lambda, C, step = self.params()
        B = jnp.ones_like(Lambda)
        return jax.vmap(kernel_diagonal, in_axes=(0, 0, 0, 0, None))(
            Lambda, B, 2 * C, step, L
        )  # (H, L)

    def discrete(self):
        """(Lambda_bar, B_bar, C): each complex (H, N)."""
        Lambda, C, step = self.params()
        Lambda_bar, B_bar = discretize_diagonal(Lambda, jnp.ones_like(Lambda), step[:, None])
        return Lambda_bar, B_bar, C

    def __call__(self, u):
        _check_input(u, self.H)
        return causal_conv(u, self.kernel(u.shape[1]), axis=1) + self.D[...] * u

    def init_cache(self, batch_size):
        Lambda_bar, B_bar, C = self.discrete()
        self.Lambda_bar, self.B_bar, self.C_rnn = (
            nnx.Cache(Lambda_bar), nnx.Cache(B_bar), nnx.Cache(C))
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H, self.N), jnp.complex64))

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        x = self.Lambda_bar[...] * self.cache[...] + self.B_bar[...] * u_t[..., None]
        self.cache[...] = x
        y = 2 * jnp.einsum("hn,bhn->bh", self.C_rnn[...], x).real
        return y + self.D[...] * u_t


class H3Layer(nnx.Module):
    """The H3 layer, Algorithm 1 of Fu et al. (2023).

    1. Q, K, V = u W_Q, u W_K, u W_V                                (batch, L, H)
    2. K_bar = SSM_shift(K)                        one shift SSM per channel
    3. split Q, K_bar, V into n_heads = H / head_dim heads of size d_h
    4. KV_t = SSM_diag(K_bar_t V_t^T)   (d_h x d_h per step, one diagonal SSM
                                        per head, shared by its d_h^2 entries)
    5. O_t = Q_t KV_t                                            per head
    6. concatenate the heads, output projection W_O.

    With SSM_diag a running sum and no shift this is causal linear attention;
    the shift lets the memory store (previous key, current value) pairs.
    """

    def __init__(self, H, *, rngs: nnx.Rngs, head_dim=8, state_size=32,
                 shift_size=4, L=None, dt_min=0.001, dt_max=0.1):
        # L is unused (the kernels are built for the input's length); it is
        # accepted because the training CLI passes L to every layer factory.
        H, head_dim = _check_size("H", H), _check_size("head_dim", head_dim)
        state_size = _check_size("state_size", state_size)
        shift_size = _check_size("shift_size", shift_size)
        if H % head_dim:
            raise ValueError(f"head_dim must divide H, got H={H}, head_dim={head_dim}")
        self.H, self.head_dim, self.n_heads = H, head_dim, H // head_dim
        self.state_size, self.L = state_size, L
        self.W_Q = nnx.Linear(H, H, rngs=rngs)
        self.W_K = nnx.Linear(H, H, rngs=rngs)
        self.W_V = nnx.Linear(H, H, rngs=rngs)
        self.W_O = nnx.Linear(H, H, rngs=rngs)
        self.shift = ShiftSSM(H, shift_size, rngs=rngs)
        self.diag = DiagonalSSM(self.n_heads, state_size, rngs=rngs,
                                dt_min=dt_min, dt_max=dt_max)
        self.cache = nnx.data(None)

    def _heads(self, x):  # (..., H) -> (..., n_heads, d_h)
        return x.reshape(*x.shape[:-1], self.n_heads, self.head_dim)

    def qkv(self, u):
        """Steps 1-3: Q, shifted K, V, each (batch, L, n_heads, d_h)."""
        q, k, v = self.W_Q(u), self.W_K(u), self.W_V(u)
        return self._heads(q), self._heads(self.shift(k)), self._heads(v)

    def __call__(self, u):
        _check_input(u, self.H)
        q, k, v = self.qkv(u)
        kv = k[..., :, None] * v[..., None, :]            # (b, L, heads, d_h, d_h)
        K = self.diag.kernel(u.shape[1])                  # (heads, L): one FFT each
        D = self.diag.D[...][:, None, None]
        kv = causal_conv(kv, K[:, None, None, :], axis=1) + D * kv
        o = jnp.einsum("blhi,blhij->blhj", q, kv)         # Q_t KV_t per head
        return self.W_O(o.reshape(u.shape))

    # -- State passing: a long sequence in chunks ------------------------------

    def init_state(self, batch_size):
        """The carried state: the last shift_size - 1 keys and the diagonal
        SSM state of every head's memory entry (complex)."""
        N_shift = self.shift.N
        return (
            jnp.zeros((batch_size, N_shift - 1, self.H)),
            jnp.zeros((batch_size, self.n_heads, self.head_dim, self.head_dim,
                       self.state_size), jnp.complex64),
        )

    def chunk(self, u, state):
        """Run one chunk u (batch, T, H) from `state`; returns (y, new state).

        Inside the chunk everything is a convolution (`causal_conv`). The past
        enters through the state: the shift SSM sees the previous keys
        prepended, and the diagonal SSM adds 2 Re C Lambda_bar^{t+1} x_prev to
        step t.
        """
        _check_input(u, self.H)
        self._check_state(state, u.shape[0])
        k_prev, x_prev = state
        T, P = u.shape[1], k_prev.shape[1]
        q, v = self._heads(self.W_Q(u)), self._heads(self.W_V(u))
        k_raw = jnp.concatenate([k_prev, self.W_K(u)], axis=1)
        k = self._heads(self.shift(k_raw)[:, P:])
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
        decay = Lambda_bar[:, :, None] ** jnp.arange(T - 1, -1, -1)  # Lambda_bar^{T-1-t}
        x_new = powers[None, :, None, None, :, -1] * x_prev + jnp.einsum(
            "hnt,bthij->bhijn", B_bar[:, :, None] * decay, kv.astype(jnp.complex64))
        k_new = k_raw[:, k_raw.shape[1] - P:] if P else k_prev
        return self.W_O(o), (k_new, x_new)

    def _check_state(self, state, batch_size):
        expected = tuple(s.shape for s in self.init_state(batch_size))
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError("state must be a pair (k_prev, x_prev) as returned by "
                            f"init_state, got {type(state).__name__}")
        got = tuple(jnp.shape(s) for s in state)
        if got != expected:
            raise ValueError(f"state must have shapes {expected} (k_prev, x_prev) for "
                             f"batch {batch_size}, got {got}")

    def chunked(self, u, chunk_size):
        """The layer on a long u, `chunk_size` steps at a time (state passing)."""
        _check_input(u, self.H)
        chunk_size = _check_size("chunk_size", chunk_size)
        if u.shape[1] % chunk_size:
            raise ValueError(
                f"chunk_size must divide L = {u.shape[1]}, got {chunk_size}")
        state = self.init_state(u.shape[0])
        outs = []
        for s in range(0, u.shape[1], chunk_size):
            y, state = self.chunk(u[:, s:s + chunk_size], state)
            outs.append(y)
        return jnp.concatenate(outs, axis=1)

    # -- RNN mode ---------------------------------------------------------------

    def init_cache(self, batch_size):
        self.shift.init_cache(batch_size)
        Lambda_bar, B_bar, C = self.diag.discrete()
        self.Lambda_bar, self.B_bar, self.C_rnn = (
            nnx.Cache(Lambda_bar), nnx.Cache(B_bar), nnx.Cache(C))
        self.cache = nnx.Cache(self.init_state(batch_size)[1])

    def step(self, u_t):
        """One token: shift state (last keys) + per head a d_h x d_h x N state."""
        _check_step_input(u_t, self.H, self.cache)
        q, v = self._heads(self.W_Q(u_t)), self._heads(self.W_V(u_t))
        k = self._heads(self.shift.step(self.W_K(u_t)))
        kv = k[..., :, None] * v[..., None, :]                        # (b, h, i, j)
        Lb, Bb = self.Lambda_bar[...], self.B_bar[...]
        x = Lb[:, None, None, :] * self.cache[...] + Bb[:, None, None, :] * kv[..., None]
        self.cache[...] = x
        y = 2 * jnp.einsum("hn,bhijn->bhij", self.C_rnn[...], x).real
        y = y + self.diag.D[...][:, None, None] * kv
        o = jnp.einsum("bhi,bhij->bhj", q, y).reshape(u_t.shape)
        return self.W_O(o)


# --- The attention baseline ----------------------------------------------------


def _rotary(x, positions):
    """Rotary position embedding of x (..., T, heads, d) at integer positions (T,)."""
    d = x.shape[-1]
    half = d // 2
    freqs = 1.0 / (10000.0 ** (jnp.arange(half) / half))
    angle = positions[:, None] * freqs[None, :]                    # (T, half)
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return jnp.concatenate([rotated, x[..., 2 * half:]], axis=-1)


class CausalSelfAttention(nnx.Module):
    """Multi-head causal softmax attention with rotary positions (the baseline).

    ``step`` decodes with a key-value cache of ``max_len`` positions: each new
    token attends to all cached keys, so a step costs O(t H) and the cache
    grows with t, where H3's state stays the same size. Sequences longer than
    ``max_len`` are refused: ``__call__`` raises ValueError, and so does
    ``step`` when its position is a concrete number; under ``jit`` (position
    traced) a step past the cache returns NaN instead of overwriting a slot.
    """

    def __init__(self, H, *, rngs: nnx.Rngs, n_heads=4, max_len=2048):
        H, n_heads = _check_size("H", H), _check_size("n_heads", n_heads)
        max_len = _check_size("max_len", max_len)
        if H % n_heads:
            raise ValueError(f"n_heads must divide H, got H={H}, n_heads={n_heads}")
        self.H, self.n_heads, self.head_dim, self.max_len = H, n_heads, H // n_heads, max_len
        self.W_QKV = nnx.Linear(H, 3 * H, rngs=rngs)
        self.W_O = nnx.Linear(H, H, rngs=rngs)
        self.cache = nnx.data(None)

    def _split(self, x):
        q, k, v = jnp.split(self.W_QKV(x), 3, axis=-1)
        shape = (*x.shape[:-1], self.n_heads, self.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def __call__(self, u):
        _check_input(u, self.H)
        L = u.shape[1]
        if L > self.max_len:
            raise ValueError(f"u has length {L}, more than max_len = {self.max_len}")
        q, k, v = self._split(u)                                    # (b, L, h, d)
        pos = jnp.arange(L)
        q, k = _rotary(q, pos), _rotary(k, pos)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        mask = jnp.tril(jnp.ones((L, L), bool))
        scores = jnp.where(mask, scores, -jnp.inf)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return self.W_O(o.reshape(u.shape))

    def init_cache(self, batch_size):
        shape = (batch_size, self.max_len, self.n_heads, self.head_dim)
        self.k_cache = nnx.Cache(jnp.zeros(shape))
        self.v_cache = nnx.Cache(jnp.zeros(shape))
        self.cache = nnx.Cache(jnp.zeros((), jnp.int32))             # next position

    def step(self, u_t):
        _check_step_input(u_t, self.H, self.cache)
        t = self.cache[...]
        if not isinstance(t, jax.core.Tracer) and int(t) >= self.max_len:
            raise ValueError(f"the key-value cache is full: step {int(t)} needs "
                             f"max_len > {int(t)}, got max_len = {self.max_len}")
        q, k, v = self._split(u_t[:, None])                         # (b, 1, h, d)
        q, k = _rotary(q, t[None]), _rotary(k, t[None])
        self.k_cache[...] = jax.lax.dynamic_update_slice_in_dim(self.k_cache[...], k, t, axis=1)
        self.v_cache[...] = jax.lax.dynamic_update_slice_in_dim(self.v_cache[...], v, t, axis=1)
        self.cache[...] = t + 1
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, self.k_cache[...]) / math.sqrt(self.head_dim)
        scores = jnp.where(jnp.arange(self.max_len) <= t, scores, -jnp.inf)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), self.v_cache[...])
        out = self.W_O(o.reshape(u_t.shape))
        # traced past the end: dynamic_update_slice clamped t, so the write
        # above overwrote the last slot; make the result unmistakably wrong
        return jnp.where(t < self.max_len, out, jnp.nan)


# --- Reading a next-token model at the last position ---------------------------


class LastTokenModel(nnx.Module):
    """Wraps a next-step `StackedModel` (classification=False, vocab_size set)
    to predict the token that follows x (batch, L): returns (batch, vocab)
    log-probabilities, so `train.fit` treats it as a classifier whose label is
    the answer of a recall task."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        # StackedModel shifts its input right: output k sees x_0 .. x_{k-1}.
        # Append a placeholder so that the last output sees all of x.
        x = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
        return self.model(x)[:, -1]


def hybrid(*factories):
    """A layer factory for `StackedModel` that cycles through `factories`:
    ``hybrid(h3, attention)`` builds H3 in layer 0, attention in layer 1, and
    so on. Each factory is called as ``factory(H, rngs=rngs)``.

    `StackedModel` builds its layers one after another with one `nnx.Rngs`;
    the position in the cycle restarts whenever the factory is called with a
    different `rngs` object, so every model built with its own `rngs` starts
    at ``factories[0]``, however many layers the previous one had. (Two models
    built from the *same* `rngs` object continue one cycle.)"""
    if not factories:
        raise ValueError("hybrid needs at least one layer factory")
    if not all(callable(f) for f in factories):
        raise TypeError("hybrid's arguments must be layer factories (callables)")
    last = {"rngs": None, "count": 0}   # holds rngs, so its identity stays unique

    def make(H, *, rngs):
        if rngs is not last["rngs"]:
            last["rngs"], last["count"] = rngs, 0
        layer = factories[last["count"] % len(factories)](H, rngs=rngs)
        last["count"] += 1
        return layer

    return make
