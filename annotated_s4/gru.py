"""A gated recurrent layer (GRU) under the layer contract of `models`: the
kind of model S4 displaced on sequential MNIST, and S4's baseline there.

Unlike the SSM layers, its recurrence is nonlinear, so there is no kernel and
no convolution: CNN mode is the RNN run over the sequence with `jax.lax.scan`
(one step after another, L sequential steps), and RNN mode is one step of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import LayerOptions, register_layer

__all__ = ["GRULayer"]


class GRULayer(nnx.Module):
    """A GRU with H inputs and a state of H numbers (flax's `nnx.GRUCell`):

        r = sigmoid(W_r u_t + U_r h + b_r),   z = sigmoid(W_z u_t + U_z h + b_z),
        n = tanh(W_n u_t + b_n + r * (U_n h)),   h' = (1 - z) n + z h,

    (the reset gate applied after U_n, as cuDNN's GRU does; the recurrent
    matrices U have no bias, so 6 H^2 + 3 H parameters in all),

    and the output at step t is the new state h'. L, if given, is the longest
    input accepted (the contract's length limit; the recurrence has none).
    """

    def __init__(self, H, L=None, *, rngs: nnx.Rngs):
        self.H = checks.positive_int(H, "H")
        self.max_len = None if L is None else checks.positive_int(L, "L")
        self.cell = nnx.GRUCell(H, H, rngs=rngs)
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.max_length(checks.sequence(u, self.H), self.max_len)
        h0 = jnp.zeros((u.shape[0], self.H), u.dtype)
        _, y = jax.lax.scan(self.cell, h0, jnp.swapaxes(u, 0, 1))  # time-major scan
        return jnp.swapaxes(y, 0, 1)

    def init_cache(self, batch_size):
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.H)))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        h, _ = self.cell(self.cache[...], u_t)
        self.cache[...] = h
        return h


register_layer("gru", LayerOptions, lambda options, L: functools.partial(GRULayer, L=L),
               help="a gated recurrent layer, S4's baseline on sequential MNIST")
