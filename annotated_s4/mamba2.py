"""The Mamba-2 block: state space duality (`ssd`) inside a simplified Mamba block.

Dao and Gu (2024, section 7) change Mamba's block in two ways. The SSM's A is a
scalar per head (times the identity), so that the chunked SSD algorithm can run
it with matrix products; and the SSM's inputs Δ, B, C are produced at the
block's start, in parallel with x, instead of from x after the conv. With
E = expand H inner channels in E / P heads of width P, N states, and B, C
shared by all heads (one group), a sequence u (batch, L, H) goes

    z, xBC, Δ = u W_in                 (batch, L, E), (batch, L, E + 2N), (batch, L, heads)
    x, B, C   = silu(conv(xBC))         one causal depthwise conv of width W over all three
    Δ         = softplus(Δ + Δ bias)    one step size per head
    y         = SSD(Δ x, Δ A; B, C) + D x     A = -exp(A_log) (heads,), D (heads,)
    y         = rmsnorm(y silu(z)) g    the gate, then a normalisation (weights g (E,))
    out       = y W_out                 back to (batch, L, H)

`ssd` runs the SSM by any of its algorithms (the same map). In RNN
mode the block keeps the conv's window of the last W rows of xBC and the
state (batch, heads, P, N), a constant amount per token (`Mamba2Block.step`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import SSMParam, option, register_layer
from .layers import Linear, SSMOptions
from .mamba import _uniform, causal_depthwise_conv, dt_bias_initializer
from .ssd import SSD_ALGORITHMS, discretize_ssd, ssd, ssd_step

__all__ = ["mamba2_param_count", "Mamba2Block", "Mamba2Options", "gated_rmsnorm"]


def mamba2_param_count(H, E, N, P, conv_width):
    """The number of trained numbers in a `Mamba2Block`, with heads = E / P:

        W_in        H x (2E + 2N + heads)   (z, x, B, C and Δ; no bias)
        conv        W x (E + 2N) + E + 2N   (taps and bias, over x, B and C)
        A_log, D, Δ bias   3 heads
        norm        E
        W_out       E x H                   (no bias)

    Mamba's per-channel state matrix (E x N) and its Δ projection are gone;
    the state space part proper is 3 numbers per head.
    """
    H, E, N, P, W = (checks.positive_int(v, name) for v, name in
                     ((H, "H"), (E, "E"), (N, "N"), (P, "P"), (conv_width, "conv_width")))
    if E % P:
        raise ValueError(f"P ({P}) must divide E ({E})")
    heads = E // P
    return H * (2 * E + 2 * N + heads) + (W + 1) * (E + 2 * N) + 3 * heads + E + E * H


def gated_rmsnorm(y, z, weight, eps=1e-5):
    """Mamba-2's output gate and normalisation: g = y silu(z), then g divided by
    its root mean square over the channels (last axis) and scaled by `weight`."""
    g = y * jax.nn.silu(z)
    return g * jax.lax.rsqrt(jnp.mean(g * g, axis=-1, keepdims=True) + eps) * weight


class Mamba2Block(nnx.Module):
    """The Mamba-2 block on H channels (Dao and Gu 2024, section 7).

    E = expand H inner channels in E / P heads of P = head_dim channels, N =
    state_size states, B and C shared by the heads, a causal conv of width W =
    conv_width over x, B and C. `algorithm` picks how the SSM runs
    (`ssd.SSD_ALGORITHMS`: the recurrence, sequential or as a parallel
    scan, the dual form, or chunked in chunks of `chunk`). Initialisation as
    the authors' code (Mamba2Simple), except the projections:

    * A_log (heads,) = log a, a uniform in [1, 16]: each head decays at its own rate;
    * the Δ bias = softplus^{-1}(Δ_0), Δ_0 log-uniform in [dt_min, dt_max]
      (at least dt_floor), one per head;
    * D (heads,) = 1, the norm's weights 1;
    * the conv's taps and bias uniform in +-W^{-1/2} (PyTorch's default);
    * the projections lecun-normal (the package's `Linear`, as in every layer
      of the book), where PyTorch's default is uniform in +-fan_in^{-1/2}, a
      third of that variance.

    A_log and the Δ bias are `SSMParam`s (their own learning rate, no weight
    decay). Parameters: `mamba2_param_count`.
    """

    max_len = None  # every algorithm takes any length

    def __init__(self, H, *, rngs: nnx.Rngs, state_size=16, expand=2, head_dim=8, conv_width=4,
                 dt_min=0.001, dt_max=0.1, dt_floor=1e-4, algorithm="chunked", chunk=64):
        H = checks.positive_int(H, "H")
        N = checks.positive_int(state_size, "state_size")
        E = H * checks.positive_int(expand, "expand")
        P = checks.positive_int(head_dim, "head_dim")
        if E % P:
            raise ValueError(f"head_dim ({P}) must divide the inner width expand * H ({E})")
        W = checks.positive_int(conv_width, "conv_width")
        dt_min = checks.positive_number(dt_min, "dt_min")
        dt_max = checks.number(dt_max, "dt_max", low=dt_min)
        dt_floor = checks.positive_number(dt_floor, "dt_floor")
        self.algorithm = checks.choice(algorithm, "algorithm", SSD_ALGORITHMS)
        self.chunk = checks.positive_int(chunk, "chunk")
        self.H, self.E, self.N, self.P, self.W, self.heads = H, E, N, P, W, E // P
        self.in_proj = Linear(H, 2 * E + 2 * N + self.heads, use_bias=False, rngs=rngs)
        self.conv_w = nnx.Param(_uniform(rngs, (W, E + 2 * N), W ** -0.5))
        self.conv_b = nnx.Param(_uniform(rngs, (E + 2 * N,), W ** -0.5))
        self.dt_bias = dt_bias_initializer(rngs, (self.heads,), dt_min, dt_max, dt_floor)
        self.A_log = SSMParam(jnp.log(jax.random.uniform(rngs.params(), (self.heads,),
                                                         minval=1.0, maxval=16.0)))
        self.D = nnx.Param(jnp.ones((self.heads,)))
        self.norm = nnx.Param(jnp.ones((E,)))
        self.out_proj = Linear(E, H, use_bias=False, rngs=rngs)
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def A(self):
        """The state matrix of each head, a scalar times the identity: A = -exp(A_log) (heads,)."""
        return -jnp.exp(self.A_log[...])

    def _split(self, zxbcdt):
        """W_in's output (..., 2E + 2N + heads) -> z (..., E), xBC (..., E + 2N), Δ's input (..., heads)."""
        return jnp.split(zxbcdt, [self.E, 2 * self.E + 2 * self.N], axis=-1)

    def _heads(self, xBC, delta):
        """After the conv: x as heads (..., heads, P), B and C (..., heads, N)
        (one group, repeated for every head) and the step size Δ (dt) (..., heads)."""
        x, B, C = jnp.split(xBC, [self.E, self.E + self.N], axis=-1)
        lead = x.shape[:-1]
        B, C = (jnp.broadcast_to(v[..., None, :], (*lead, self.heads, self.N)) for v in (B, C))
        return (x.reshape(*lead, self.heads, self.P), B, C,
                jax.nn.softplus(delta + self.dt_bias[...]))

    def _output(self, y, x, z):
        """The skip D x, the gate and norm, W_out: y and x (..., heads, P), z (..., E)."""
        y = (y + self.D[...][:, None] * x).reshape(*z.shape)
        return self.out_proj(gated_rmsnorm(y, z, self.norm[...]))

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        """CNN mode (all positions at once): u (batch, L, H) -> (batch, L, H)."""
        checks.sequence(u, self.H)
        z, xBC, delta = self._split(self.in_proj(u))
        xBC = jax.nn.silu(causal_depthwise_conv(xBC, self.conv_w[...], self.conv_b[...]))
        x, B, C, dt = self._heads(xBC, delta)
        X, a = discretize_ssd(x, dt, self.A())
        return self._output(ssd(X, a, B, C, self.algorithm, self.chunk), x, z)

    # -- RNN mode ---------------------------------------------------------------

    def init_cache(self, batch_size):
        """Zero the two states: the conv's window, the last W rows of xBC
        (batch, W, E + 2N), oldest first; the SSM's state (batch, heads, P, N)."""
        batch_size = checks.positive_int(batch_size, "batch_size")
        self.window = nnx.Cache(jnp.zeros((batch_size, self.W, self.E + 2 * self.N)))
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.heads, self.P, self.N)))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        """One token u_t (batch, H) -> (batch, H): slide the window, one step of
        the conv and one of the recurrence (`ssd_step`). O(H E + W E + E N)
        work, whatever the position."""
        checks.step_input(u_t, self.H, self.cache)
        z, xBC, delta = self._split(self.in_proj(u_t))
        window = jnp.concatenate([self.window[...][:, 1:], xBC[:, None]], axis=1)
        self.window[...] = window
        xBC = jax.nn.silu(jnp.sum(window * self.conv_w[...], axis=1) + self.conv_b[...])
        x, B, C, dt = self._heads(xBC, delta)
        state, y = ssd_step(self.cache[...], x * dt[..., None], dt * self.A(), B, C)
        self.cache[...] = state
        return self._output(y, x, z)


@dataclasses.dataclass(frozen=True)
class Mamba2Options(SSMOptions):
    """The options of `Mamba2Block` on the command line (--state-size, --dt-min
    and --dt-max as every SSM layer's)."""

    expand: int = option(2, "E / d_model, the inner width's expansion factor",
                         check=checks.positive_int)
    head_dim: int = option(8, "P, the channels of each head (it divides expand * d_model)",
                           check=checks.positive_int)
    conv_width: int = option(4, "W, the width of the causal depthwise convolution",
                             check=checks.positive_int)
    algorithm: str = option("chunked", "how the SSM runs: the recurrence, one step at a time "
                            "(recurrent) or as a parallel scan (associative), the dual "
                            "attention-like form (quadratic) or the chunked SSD algorithm "
                            "(chunked); the same map", choices=tuple(SSD_ALGORITHMS))
    chunk: int = option(64, "Q, the chunk length of the chunked algorithm",
                        check=checks.positive_int)


def build_mamba2(options, L):
    """The `Mamba2Block` factory of `options` (any length L)."""
    return functools.partial(Mamba2Block, state_size=options.state_size, expand=options.expand,
                             head_dim=options.head_dim, conv_width=options.conv_width,
                             algorithm=options.algorithm, chunk=options.chunk,
                             **options.dt_range())


register_layer("mamba2", Mamba2Options, build_mamba2,
               help="Mamba-2: scalar-A heads run by the SSD algorithm, in a simplified block")
