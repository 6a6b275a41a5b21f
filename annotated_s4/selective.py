"""The selective state space model (Mamba's S6) and three ways to scan it.

S4 and its diagonal relatives are time-invariant: the same (A, B, C, Δ)
at every position, which is what lets them run as a convolution. Mamba makes
the step Delta and the matrices B and C functions of the input, one value per
position, so that the model can choose what to remember and what to forget:

    x_t = Abar_t x_{t-1} + Bbar_t u_t,     y_t = C_t x_t (+ D u_t),

with Abar_t = exp(Delta_t A). Every channel d of the input runs its own
N-state diagonal SSM, so the recurrence is elementwise in (d, n). There is no
kernel to convolve with any more, but the recurrence is still a first-order
*linear* one, x_t = a_t x_{t-1} + b_t, and that is enough for a parallel scan.

Layout: sequences are (batch, L, D), channels last as in the book's layers;
the state is (batch, D, N). A is real here (Mamba's A = -exp(A_log)); the
reference code's complex-A variant (S4D-style conjugate pairs, with B and C
holding real and imaginary parts side by side) is not covered.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from . import _checks as checks

__all__ = [
    "selective_delta",
    "discretize_selective",
    "combine",
    "scan_recurrent",
    "scan_associative",
    "scan_chunked",
    "SCANS",
    "pick_scan",
    "selective_scan",
    "selective_step",
]


def selective_delta(delta, delta_bias=None, delta_softplus=False):
    """The step Delta = softplus(delta + delta_bias), each part optional.

    delta (..., D) is the projection of the input a layer computes; the bias
    (D,) and the softplus, which keeps every step positive, are applied here
    (where Mamba's kernel applies them) rather than by the caller.
    """
    if delta_bias is not None:
        delta = delta + delta_bias
    return jax.nn.softplus(delta) if checks.flag(delta_softplus, "delta_softplus") else delta


def discretize_selective(delta, A, B, u):
    """Mamba's discretisation: (Abar, Bbar u) = (exp(Delta A), Delta B u).

    delta and u (..., D); A (D, N) real and diagonal per channel (each row holds
    the N eigenvalues of channel d); B broadcasts against (..., D, N). Returns
    a and b of the recurrence x_t = a_t x_{t-1} + b_t, both (..., D, N).

    A is discretised by the zero-order hold (ZOH), exactly: between samples
    x' = A x decays by exp(Delta A). The exact ZOH input term would be

        Bbar = (Delta A)^{-1} (exp(Delta A) - I) Delta B = (exp(Delta A) - 1) / A * B,

    (what `discretize_diagonal` in annotated_s4.s4 computes). Mamba's code uses its
    first-order part Delta B instead, Euler's input term, since
    (exp(Delta A) - 1) / A = Delta (1 + Delta A / 2 + O(Delta^2)): the two agree
    to first order in Delta A. The authors describe it as ZOH for A, Euler for B,
    simpler to compute and no worse in practice. B is the input's projection
    anyway, so a layer can learn whatever scale the exact term would add.
    """
    dt = delta[..., None]                                  # (..., D, 1)
    return jnp.exp(dt * A), dt * B * u[..., None]


# --------------------------------------------------------------------------
# The first-order linear recurrence x_t = a_t x_{t-1} + b_t, three ways
# --------------------------------------------------------------------------
def combine(first, second):
    """The associative operator of x_t = a_t x_{t-1} + b_t.

    An element (a, b) is the affine map x -> a x + b. Doing `first` = (a1, b1)
    and then `second` = (a2, b2) is the map x -> a2 (a1 x + b1) + b2, so

        (a1, b1) o (a2, b2) = (a1 a2, a2 b1 + b2).

    Composition of maps is associative, hence so is o; it is not commutative.
    The prefix "sums" (a_1 .. a_t, x_t with x_0 = 0 folded in) are the states.
    """
    a1, b1 = first
    a2, b2 = second
    return a1 * a2, a2 * b1 + b2


def _fold_initial(a, b, x0):
    """Fold the state before the first input into the first b: b_0 + a_0 x0."""
    return b if x0 is None else b.at[0].add(a[0] * x0)


def scan_recurrent(a, b, x0=None):
    """All states x_0 .. x_{L-1} of x_t = a_t x_{t-1} + b_t, one step at a time.

    a, b (L, ...) with time first; x0 (...) is the state before the first step
    (zero when None). O(L) work in L sequential steps (jax.lax.scan).
    """
    a, b, x0 = checks.first_order(a, b, x0)

    def step(x, ab):
        x = ab[0] * x + ab[1]
        return x, x

    return jax.lax.scan(step, jnp.zeros_like(b[0]) if x0 is None else x0, (a, b))[1]


def scan_associative(a, b, x0=None):
    """The same states by a parallel prefix scan with `combine` (Blelloch).

    jax.lax.associative_scan combines neighbours in a tree: O(L) work in
    O(log L) sequential rounds, because `combine` is associative.
    """
    a, b, x0 = checks.first_order(a, b, x0)
    return jax.lax.associative_scan(combine, (a, _fold_initial(a, b, x0)))[1]


def scan_chunked(a, b, x0=None, chunk=64):
    """The same states, chunk by chunk: parallel within a chunk, sequential across.

    Within each chunk of `chunk` steps, an associative scan from a zero state
    gives the local states s_t and the products P_t = a_first .. a_t. The true
    state is then x_t = P_t x_in + s_t, with x_in the state the previous chunk
    ends with, carried by a scan over the L / chunk chunks. L need not be a
    multiple of `chunk`: the tail is padded with a = 1, b = 0 and dropped.
    """
    a, b, x0 = checks.first_order(a, b, x0)
    chunk, L = checks.positive_int(chunk, "chunk"), b.shape[0]
    pad = [(0, -L % chunk)] + [(0, 0)] * (b.ndim - 1)
    a = jnp.pad(a, pad, constant_values=1).reshape(-1, chunk, *b.shape[1:])
    b = jnp.pad(b, pad).reshape(a.shape)
    P, s = jax.lax.associative_scan(combine, (a, b), axis=1)   # (L / chunk, chunk, ...)

    def carry(x_in, Ps):
        x = Ps[0] * x_in + Ps[1]
        return x[-1], x

    x_in = jnp.zeros_like(b[0, 0]) if x0 is None else x0
    return jax.lax.scan(carry, x_in, (P, s))[1].reshape(-1, *b.shape[2:])[:L]


SCANS = {"recurrent": scan_recurrent, "associative": scan_associative, "chunked": scan_chunked}


def pick_scan(method, chunk=64):
    """The scan of `SCANS` called `method`, as a function of (a, b, x0); the
    chunked one with chunks of `chunk` steps."""
    scan = SCANS[checks.choice(method, "method", SCANS)]
    if method == "chunked":
        return functools.partial(scan, chunk=checks.positive_int(chunk, "chunk"))
    return scan


# --------------------------------------------------------------------------
# The selective scan (S6) and its one-step form
# --------------------------------------------------------------------------
def _per_channel(X, lead, D):
    """B or C as an array that broadcasts against (*lead, D, N): a fixed (D, N)
    as it is, a shared (*lead, N) on a new channel axis, a grouped (*lead, G, N)
    repeated so that group g serves channels g D/G .. (g + 1) D/G - 1."""
    if X.ndim == len(lead) + 1:
        return X[..., None, :]
    if X.ndim == len(lead) + 2:
        return jnp.repeat(X, D // X.shape[-2], axis=-2)
    return X


def _readout(x, C, u, D, z):
    """y = C x (+ D u), then gated: y silu(z) where z is given."""
    y = jnp.sum(x * C, axis=-1)
    y = y if D is None else y + D * u
    return y if z is None else y * jax.nn.silu(z)


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, initial_state=None, method="recurrent", chunk=64):
    """The selective SSM (S6) over a whole sequence; `selective_scan_ref`'s semantics.

    u, delta, z (batch, L, D); A (D, N); B and C each one of (D, N) time-invariant,
    (batch, L, N) shared by all channels, or (batch, L, G, N) shared by groups of
    D / G channels; D and delta_bias (D,). With Delta = `selective_delta`:

        x_t = exp(Delta_t A) x_{t-1} + Delta_t B_t u_t,   y_t = C_t x_t + D u_t,

    output y silu(z) if z is given. `method` and `chunk` pick the scan
    (`pick_scan`; all give the same states); initial_state (batch, D, N) is x_{-1} (zero when None).
    Returns y (batch, L, D), and the last state (batch, D, N) if asked.
    """
    u, delta, A, B, C, D, z, delta_bias, x0 = checks.selective(u, delta, A, B, C, D, z,
                                                               delta_bias, state=initial_state)
    scan, last = pick_scan(method, chunk), checks.flag(return_last_state, "return_last_state")
    lead = u.shape[:2]
    delta = selective_delta(delta, delta_bias, delta_softplus)
    a, b = discretize_selective(delta, A, _per_channel(B, lead, A.shape[0]), u)
    x = jax.vmap(scan)(a, b, x0)                           # (batch, L, D, N)
    y = _readout(x, _per_channel(C, lead, A.shape[0]), u, D, z)
    return (y, x[:, -1]) if last else y


def selective_step(state, u, delta, A, B, C, D=None, z=None, delta_bias=None,
                   delta_softplus=False):
    """One step of the selective SSM (RNN mode); `selective_state_update_ref`'s semantics.

    state (batch, D, N) is x_{t-1}; u, delta, z (batch, D) the inputs at t;
    A (D, N); B and C (batch, N) or (batch, G, N); D and delta_bias (D,).
    Returns (x_t, y_t): the new state (batch, D, N) and the output (batch, D),
    the same numbers `selective_scan` gives at position t. (Mamba-2's heads
    form, state (batch, H, P, N), is this with D = H P channels and B, C in G
    groups.)
    """
    u, delta, A, B, C, D, z, delta_bias, state = checks.selective(
        u, delta, A, B, C, D, z, delta_bias, state=state, state_name="state", step=True)
    delta = selective_delta(delta, delta_bias, delta_softplus)
    a, b = discretize_selective(delta, A, _per_channel(B, u.shape[:1], A.shape[0]), u)
    state = a * state + b
    return state, _readout(state, _per_channel(C, u.shape[:1], A.shape[0]), u, D, z)
