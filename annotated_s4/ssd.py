"""Mamba-2's state space duality (SSD): one SSM, a scan and a matrix.

Mamba-2 restricts S6's diagonal A to a scalar times the identity, one scalar
per head. Head h of width P then runs, with a_t = Delta_t A_h <= 0 and
X_t = Delta_t x_t (P,) (the Delta B u of `discretize_selective`),

    h_t = exp(a_t) h_{t-1} + X_t B_t^T   (P, N),     y_t = h_t C_t   (P,).

Unrolled, y_t = sum_{s <= t} (C_t . B_s) exp(a_{s+1} + ... + a_t) X_s: the
sequence map is y = M X with the lower-triangular matrix

    M[t, s] = (C_t . B_s) exp(segsum(a)[t, s]),

a product of a rank-N matrix C B^T and a 1-semiseparable decay matrix. The
duality is that the same map runs as a recurrence (linear in L, sequential) or
as this masked, attention-like matrix product (quadratic in L, all matmuls),
and the chunked algorithm mixes the two: quadratic inside chunks of Q steps,
the recurrence between them.

Layout as in Mamba-2: X (batch, L, H, P), a (batch, L, H), B and C
(batch, L, H, N) (groups of heads sharing B, C are repeated by the caller),
states (batch, H, P, N).
"""

from __future__ import annotations

import jax.numpy as jnp

from . import _checks as checks
from .selective import pick_scan, scan_recurrent

__all__ = [
    "discretize_ssd",
    "segsum",
    "semiseparable",
    "ssd_quadratic",
    "ssd_scan",
    "ssd_chunked",
    "ssd_step",
    "SSD_ALGORITHMS",
]  # and `ssd`, left out of the package's namespace, where the name is this module's


def discretize_ssd(x, dt, A):
    """Mamba-2's discretisation with a scalar A per head: (X, a) = (Delta x, Delta A).

    x (batch, L, H, P), dt the steps Delta (batch, L, H), A (H,) negative.
    The state's decay is exp(a_t) = exp(Delta_t A_h), and X_t B_t^T is the
    input term Delta_t B_t x_t of `discretize_selective`, Euler's as in Mamba.
    """
    x = checks.array(x, "x", ndim=4, kind="float")
    dt = checks.array(dt, "dt", shape=x.shape[:3], kind="float")
    A = checks.array(A, "A", shape=(x.shape[2],), kind="float")
    return x * dt[..., None], dt * A


def segsum(a):
    """The segment sums S[..., t, s] = a_{s+1} + ... + a_t (s <= t), -inf above.

    a (..., T) -> S (..., T, T). exp(S) is the decay from step s to step t,
    exactly 0 where s > t (the future). The stable way: add up the terms
    themselves, a masked cumulative sum down each column, rather than subtract
    two prefix sums cumsum(a)_t - cumsum(a)_s, which loses the small
    difference of two large numbers to rounding once the sums grow long.
    """
    T = a.shape[-1]
    t, s = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    terms = jnp.where(t > s, a[..., :, None], 0.0)       # [t, s] = a_t where s < t
    return jnp.where(t >= s, jnp.cumsum(terms, axis=-2), -jnp.inf)


def semiseparable(a, B, C):
    """The SSD matrix M (batch, H, L, L), y = M X: M[t, s] = (C_t . B_s) exp(segsum(a)[t, s]).

    a (batch, L, H); B, C (batch, L, H, N). Lower triangular; every block on or
    below the diagonal (rows t >= j, columns s <= j) has rank at most N, since
    it factors through the state at j: that is what 'N-semiseparable' means.
    """
    decay = jnp.exp(segsum(jnp.moveaxis(a, 1, -1)))        # (batch, H, L, L)
    return jnp.einsum("bthn,bshn->bhts", C, B) * decay


def ssd_quadratic(X, a, B, C):
    """The dual form: Y = M X, like masked attention with C as queries, B as keys,
    X as values and the decay matrix as the mask. O(L^2) work, all matmuls.

    X (batch, L, H, P), a (batch, L, H), B and C (batch, L, H, N) -> Y like X.
    """
    X, a, B, C, _ = checks.ssd(X, a, B, C)
    return jnp.einsum("bhts,bshp->bthp", semiseparable(a, B, C), X)


def ssd_scan(X, a, B, C, initial_state=None, method="recurrent", chunk=64):
    """The linear form: h_t = exp(a_t) h_{t-1} + X_t B_t^T, y_t = h_t C_t.

    `method` and `chunk` pick a scan (`pick_scan`: recurrent, associative,
    chunked), which keep every state (batch, L, H, P, N). Returns (Y like X, final state
    (batch, H, P, N)); initial_state is h_{-1} (zero when None).
    """
    X, a, B, C, h0 = checks.ssd(X, a, B, C, initial_state)
    scan = pick_scan(method, chunk)
    b = jnp.moveaxis(X[..., None] * B[..., None, :], 1, 0)   # (L, batch, H, P, N)
    decay = jnp.broadcast_to(jnp.exp(jnp.moveaxis(a, 1, 0))[..., None, None], b.shape)
    h = scan(decay, b, h0)
    return jnp.einsum("tbhpn,bthn->bthp", h, C), h[-1]


def ssd_chunked(X, a, B, C, chunk, initial_state=None):
    """The chunked SSD algorithm; `ssd_minimal_discrete`'s semantics.

    Cut the sequence into chunks of Q = `chunk` steps (the tail padded with
    a = 0, X = B = C = 0, which leaves the state alone) and split M into blocks:

    1. diagonal blocks, within a chunk: the quadratic form on each chunk;
    2. chunk states: the state each chunk leaves from a zero start,
       sum_s exp(a_{s+1} + ... + a_end) X_s B_s^T;
    3. between chunks, the recurrence h_c = exp(a summed over chunk c) h_{c-1}
       + state_c, one step per chunk: the state entering each chunk;
    4. off-diagonal blocks: the entering state read out, exp(a_first + ... + a_t)
       h_in C_t.

    O(L Q) work in the quadratic parts, O(L / Q) sequential steps. Returns
    (Y like X, final state (batch, H, P, N)).
    """
    X, a, B, C, h0 = checks.ssd(X, a, B, C, initial_state)
    Q, (b, L, H, P) = checks.positive_int(chunk, "chunk"), X.shape
    pad = -L % Q
    X, a, B, C = (jnp.pad(v, [(0, 0), (0, pad)] + [(0, 0)] * (v.ndim - 2)) for v in (X, a, B, C))
    X, a, B, C = (v.reshape(b, -1, Q, *v.shape[2:]) for v in (X, a, B, C))  # (b, c, Q, ...)
    n_chunks = X.shape[1]

    # 1. within each chunk: the dual form on a batch of b * c short sequences
    Y_diag = ssd_quadratic(*(v.reshape(b * n_chunks, Q, *v.shape[3:]) for v in (X, a, B, C)))
    # 2. each chunk's final state from a zero start
    a_cum = jnp.cumsum(a, axis=2)                                    # (b, c, Q, H)
    to_end = jnp.exp(a_cum[:, :, -1:] - a_cum)                       # decay s -> chunk end
    states = jnp.einsum("bcsh,bcshp,bcshn->cbhpn", to_end, X, B)    # (c, b, H, P, N)
    # 3. the states entering each chunk, by the recurrence across chunks
    chunk_decay = jnp.exp(jnp.moveaxis(a_cum[:, :, -1], 1, 0))[..., None, None]
    h = scan_recurrent(jnp.broadcast_to(chunk_decay, states.shape), states, h0)
    h_in = jnp.concatenate([jnp.zeros_like(h[:1]) if h0 is None else h0[None], h[:-1]])
    # 4. the entering state, decayed to each step and read out by C
    Y_off = jnp.einsum("bcthn,cbhpn,bcth->bcthp", C, h_in, jnp.exp(a_cum))
    Y = Y_diag.reshape(Y_off.shape) + Y_off
    return Y.reshape(b, -1, H, P)[:, :L], h[-1]


def ssd_step(state, X_t, a_t, B_t, C_t):
    """One step of the recurrence (RNN mode): h_t = exp(a_t) h_{t-1} + X_t B_t^T, y_t = h_t C_t.

    state (batch, H, P, N) is h_{t-1}; X_t (batch, H, P); a_t (batch, H);
    B_t and C_t (batch, H, N). Returns (h_t, y_t (batch, H, P)): a scalar decay
    per head, a rank-one write, a matrix-vector read; O(H P N) work.
    """
    h = jnp.exp(a_t)[..., None, None] * state + X_t[..., None] * B_t[..., None, :]
    return h, jnp.einsum("bhpn,bhn->bhp", h, C_t)


# The algorithms of one map X -> Y, each a function (X, a, B, C, chunk) -> Y: the
# recurrence by jax.lax.scan (L sequential steps) and by jax.lax.associative_scan
# (O(log L) rounds), the quadratic dual form, and the chunked algorithm.
SSD_ALGORITHMS = {
    "recurrent": lambda X, a, B, C, chunk: ssd_scan(X, a, B, C, method="recurrent")[0],
    "associative": lambda X, a, B, C, chunk: ssd_scan(X, a, B, C, method="associative")[0],
    "quadratic": lambda X, a, B, C, chunk: ssd_quadratic(X, a, B, C),
    "chunked": lambda X, a, B, C, chunk: ssd_chunked(X, a, B, C, chunk)[0],
}


def ssd(X, a, B, C, algorithm="chunked", chunk=64):
    """Y = M X by one of `SSD_ALGORITHMS` (the same numbers, up to rounding):
    the recurrence (linear in L, sequential or in a parallel scan), the dual
    form (quadratic in L, matmuls) or the chunked algorithm (chunks of `chunk`
    steps)."""
    algorithm = checks.choice(algorithm, "algorithm", SSD_ALGORITHMS)
    return SSD_ALGORITHMS[algorithm](X, a, B, C, chunk)
