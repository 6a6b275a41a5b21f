"""The Mamba block: the selective SSM (S6) inside its gated block.

Gu and Dao (2023) wrap the selective scan of `selective` in one block that
replaces both the SSM layer and the MLP of earlier models. With E = expand H
inner channels and N states per channel, a sequence u (batch, L, H) goes

    x, z   = u W_in                    two branches, (batch, L, E) each
    x      = silu(conv(x))             causal depthwise conv of width W, per channel
    Δ, B, C = selection(x)             Δ (batch, L, E) through a rank-R bottleneck,
                                       B, C (batch, L, N) shared by the channels
    y      = S6(x; Δ, A, B, C) + D x   `selective_scan`, A = -exp(A_log) (E, N)
    y      = y silu(z)                 the gate
    out    = y W_out                   back to (batch, L, H)

With ``time_invariant`` the block keeps everything but the selection: Δ,
B and C become trained parameters, one per channel (and state), and the SSM
is a time-invariant S4D-Real layer inside Mamba's block (the "Mamba + S4"
rows of the paper's ablations).

In RNN mode the same block runs one token at a time: the conv keeps
the last W inputs of x, the SSM its state (batch, E, N), so a token costs the
same work at position 10 as at position 10,000 (`MambaBlock.step`).

The block follows the layer contract of `models`, so `StackedModel` stacks it
(inside the package's residual `SequenceBlock`) and ``--layer mamba`` names it.
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
from .catalog import SSMParam, option, register_layer
from .layers import Linear, SSMOptions, log_dt_initializer
from .selective import SCANS, selective_scan, selective_step

__all__ = [
    "causal_depthwise_conv",
    "inverse_softplus",
    "mamba_param_count",
    "MambaBlock",
    "MambaOptions",
]


def causal_depthwise_conv(x, w, b):
    """Each channel convolved with its own short filter, causally.

    x (batch, L, E); w (W, E), its taps oldest first; b (E,). Output t sees the
    window x_{t-W+1} .. x_t (zeros before the start):

        y_t = b + sum_k w_k x_{t-W+1+k},   k = 0 .. W-1.

    Returns (batch, L, E). (PyTorch's Conv1d with groups = E and W - 1 zeros
    of padding on the left computes the same cross-correlation.)
    """
    W, L = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (W - 1, 0), (0, 0)))
    return b + sum(w[k] * padded[:, k:k + L] for k in range(W))


def inverse_softplus(y):
    """The x with softplus(x) = log(1 + e^x) = y > 0: x = log(e^y - 1), written
    y + log(1 - e^{-y}) so that neither a small nor a large y loses digits."""
    return y + jnp.log(-jnp.expm1(-y))


def mamba_param_count(H, E, N, dt_rank, conv_width, time_invariant=False):
    """The number of trained numbers in a `MambaBlock`:

        W_in        H x 2E          (no bias)
        conv        W x E + E       (taps and bias)
        x_proj      E x (R + 2N)    (Δ's low-rank input, B, C; no bias)
        dt_proj     R x E + E       (weights and the Δ bias)
        A_log, D    E x N + E
        W_out       E x H           (no bias)

    in all E (3H + W + 2R + 3N + 3), with R = dt_rank and W = conv_width. The
    state space part proper (A_log, D, the Δ bias) is E (N + 2): the projections
    dominate, as in a Transformer's MLP. The time-invariant block trades
    x_proj and dt_proj's weights for B and C (E x N each): E (3H + W + 3N + 3),
    2 E R fewer (dt_rank is then not used).
    """
    H, E, N, W = (checks.positive_int(v, name) for v, name in
                  ((H, "H"), (E, "E"), (N, "N"), (conv_width, "conv_width")))
    if checks.flag(time_invariant, "time_invariant"):
        return E * (3 * H + W + 3 * N + 3)
    return E * (3 * H + W + 2 * checks.positive_int(dt_rank, "dt_rank") + 3 * N + 3)


def _uniform(rngs, shape, bound):
    return jax.random.uniform(rngs.params(), shape, minval=-bound, maxval=bound)


def dt_bias_initializer(rngs, shape, dt_min, dt_max, dt_floor):
    """The Δ bias of Mamba's blocks, softplus^{-1}(Δ_0) with Δ_0 log-uniform in
    [dt_min, dt_max] and at least dt_floor: at initialisation the bias alone
    puts softplus(bias) = Δ_0 in that range. A `SSMParam` of `shape`."""
    dt = jnp.exp(log_dt_initializer(rngs.params(), shape, dt_min, dt_max))
    return SSMParam(inverse_softplus(jnp.maximum(dt, dt_floor)))


class MambaBlock(nnx.Module):
    """The Mamba block on H channels (Gu and Dao 2023, section 3.4 and figure 3).

    E = expand H inner channels, N = state_size states per channel, a causal
    conv of width W = conv_width, and Δ's projection of rank R = dt_rank
    ("auto": ceil(H / 16), as the authors' code). Initialisation as theirs:

    * A_log (E, N) = log(1 .. N) in every channel: A = -(1 .. N), S4D-Real;
    * D (E,) = 1;
    * the Δ bias = softplus^{-1}(Δ_0), Δ_0 log-uniform in [dt_min, dt_max]
      (at least dt_floor): the bias alone puts Δ in that range, and the
      projection of the input, small at initialisation, moves it a little;
    * dt_proj's weights uniform in +-R^{-1/2}, which keeps the projected Δ
      input of order one; the conv's taps and bias uniform in +-W^{-1/2}
      (PyTorch's default for a depthwise conv); the other projections
      lecun-normal (the package's `Linear`).

    A_log and the Δ bias are `SSMParam`s (the state matrix and the step size Δ), so
    ``--ssm-lr`` trains them at their own rate without weight decay. `scan`
    picks the scan of `selective.SCANS` (all give the same states).

    time_invariant=True drops the selection (x_proj, dt_proj): Δ = softplus(Δ
    bias) per channel, B (E, N) = 1 and C (E, N) ~ N(0, 1), S4D-Real's
    initialisation, trained as ordinary parameters; the rest is unchanged.
    Parameters: `mamba_param_count`.
    """

    max_len = None  # the scan takes any length

    def __init__(self, H, *, rngs: nnx.Rngs, state_size=16, expand=2, conv_width=4,
                 dt_rank="auto", dt_min=0.001, dt_max=0.1, dt_floor=1e-4, scan="recurrent",
                 time_invariant=False):
        H = checks.positive_int(H, "H")
        N = checks.positive_int(state_size, "state_size")
        E = H * checks.positive_int(expand, "expand")
        W = checks.positive_int(conv_width, "conv_width")
        R = (math.ceil(H / 16) if isinstance(dt_rank, str) and dt_rank == "auto"
             else checks.positive_int(dt_rank, "dt_rank"))
        dt_min = checks.positive_number(dt_min, "dt_min")
        dt_max = checks.number(dt_max, "dt_max", low=dt_min)
        dt_floor = checks.positive_number(dt_floor, "dt_floor")
        self.scan = checks.choice(scan, "scan", SCANS)
        self.time_invariant = checks.flag(time_invariant, "time_invariant")
        self.H, self.E, self.N, self.W, self.R = H, E, N, W, R
        self.in_proj = Linear(H, 2 * E, use_bias=False, rngs=rngs)
        self.conv_w = nnx.Param(_uniform(rngs, (W, E), W ** -0.5))
        self.conv_b = nnx.Param(_uniform(rngs, (E,), W ** -0.5))
        if self.time_invariant:
            self.B = nnx.Param(jnp.ones((E, N)))
            self.C = nnx.Param(jax.random.normal(rngs.params(), (E, N)))
        else:
            self.x_proj = Linear(E, R + 2 * N, use_bias=False, rngs=rngs)
            self.dt_proj = Linear(R, E, use_bias=False, rngs=rngs,
                                  kernel_init=lambda key, shape, dtype: jax.random.uniform(
                                      key, shape, dtype, -R ** -0.5, R ** -0.5))
        self.dt_bias = dt_bias_initializer(rngs, (E,), dt_min, dt_max, dt_floor)
        self.A_log = SSMParam(jnp.log(jnp.broadcast_to(jnp.arange(1.0, N + 1), (E, N))))
        self.D = nnx.Param(jnp.ones((E,)))
        self.out_proj = Linear(E, H, use_bias=False, rngs=rngs)
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def A(self):
        """The state matrix, diagonal per channel: A = -exp(A_log), (E, N), all < 0."""
        return -jnp.exp(self.A_log[...])

    def selection(self, x):
        """What makes the SSM selective: Δ's input (before its bias and softplus),
        B and C, all functions of x (..., E). Δ goes through the rank-R
        bottleneck E -> R -> E; B, C (..., N) are shared by the E channels.

        The time-invariant block selects nothing: Δ's input is 0 (Δ is its
        bias's softplus) and B, C are its parameters, one (N,) row per channel,
        broadcast to (..., E, N)."""
        if self.time_invariant:
            lead = x.shape[:-1]
            return (jnp.zeros_like(x), jnp.broadcast_to(self.B[...], (*lead, self.E, self.N)),
                    jnp.broadcast_to(self.C[...], (*lead, self.E, self.N)))
        delta, B, C = jnp.split(self.x_proj(x), [self.R, self.R + self.N], axis=-1)
        return self.dt_proj(delta), B, C

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        """CNN mode (all positions at once): u (batch, L, H) -> (batch, L, H)."""
        checks.sequence(u, self.H)
        x, z = jnp.split(self.in_proj(u), 2, axis=-1)                  # (batch, L, E) each
        x = jax.nn.silu(causal_depthwise_conv(x, self.conv_w[...], self.conv_b[...]))
        delta, B, C = self.selection(x)
        y = selective_scan(x, delta, self.A(), B, C, self.D[...], z=z,
                           delta_bias=self.dt_bias[...], delta_softplus=True, method=self.scan)
        return self.out_proj(y)

    # -- RNN mode ---------------------------------------------------------------

    def init_cache(self, batch_size):
        """Zero the two states: the conv's window, the last W inputs x of each
        channel (batch, W, E), oldest first; the SSM's state (batch, E, N)."""
        batch_size = checks.positive_int(batch_size, "batch_size")
        self.window = nnx.Cache(jnp.zeros((batch_size, self.W, self.E)))
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.E, self.N)))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        """One token u_t (batch, H) -> (batch, H): slide the window, one step
        of the conv and one of the SSM (`selective_step`). O(E (W + N) + H E)
        work, whatever the position."""
        checks.step_input(u_t, self.H, self.cache)
        x, z = jnp.split(self.in_proj(u_t), 2, axis=-1)                # (batch, E) each
        window = jnp.concatenate([self.window[...][:, 1:], x[:, None]], axis=1)
        self.window[...] = window
        x = jax.nn.silu(jnp.sum(window * self.conv_w[...], axis=1) + self.conv_b[...])
        delta, B, C = self.selection(x)
        state, y = selective_step(self.cache[...], x, delta, self.A(), B, C, self.D[...], z=z,
                                  delta_bias=self.dt_bias[...], delta_softplus=True)
        self.cache[...] = state
        return self.out_proj(y)


@dataclasses.dataclass(frozen=True)
class MambaOptions(SSMOptions):
    """The options of `MambaBlock` on the command line (--state-size, --dt-min
    and --dt-max as every SSM layer's)."""

    expand: int = option(2, "E / d_model, the inner width's expansion factor",
                         check=checks.positive_int)
    conv_width: int = option(4, "W, the width of the causal depthwise convolution",
                             check=checks.positive_int)
    dt_rank: int | None = option(None, "R, the rank of the step size's projection (default: "
                                 "ceil(d_model / 16))", check=checks.positive_int)
    scan: str = option("recurrent", "how the selective scan runs: one step at a time "
                       "(recurrent), a parallel prefix scan (associative), or chunks "
                       "(chunked); the same states", choices=tuple(SCANS))
    time_invariant: bool = option(False, "no selection: the step size, B and C are trained "
                                  "parameters, not functions of the input (an LTI, "
                                  "S4D-Real SSM in Mamba's block)")


def build_mamba(options, L):
    """The `MambaBlock` factory of `options` (any length L)."""
    return functools.partial(MambaBlock, state_size=options.state_size, expand=options.expand,
                             conv_width=options.conv_width,
                             dt_rank="auto" if options.dt_rank is None else options.dt_rank,
                             scan=options.scan, time_invariant=options.time_invariant,
                             **options.dt_range())


register_layer("mamba", MambaOptions, build_mamba,
               help="Mamba: a selective SSM in a gated block with a short conv")
