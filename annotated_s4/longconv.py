"""Long-convolution layers and the SSMs that ETSC makes of them.

`ToeplitzLayer` learns its kernel explicitly (L lags per channel); `TNNLayer`
and `SGConvLayer` generate theirs at any length. All three follow the layer
contract of `models` (CNN mode ``layer(u)``, RNN mode ``init_cache`` then
``step``), and ``to_ssm(h)`` returns a new layer, an `ETSCLayer`: the diagonal
SSM with h states per channel that `toeplitz.etsc` makes of the kernel's first
h lags, with the same skip D. The converted layer decodes in O(h H) per token
whatever the position; the original is left as it was.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import _checks as checks
from ._types import Array, Float
from .catalog import LayerOptions, register_layer
from .decoders import SSMDecoder
from .ssm import causal_convolution
from .toeplitz import decay_powers, etsc, etsc_kernel

__all__ = ["ToeplitzLayer", "TNNLayer", "SGConvLayer", "ETSCLayer", "converted_model",
           "truncated_model"]


class _LongConvolution(nnx.Module):
    """What the long convolutions share: H channels, y = T u + D u with the
    kernel ``kernel(L)`` (H, L) of each subclass, and RNN mode as the Cache
    strategy, a buffer of the last L inputs (O(L H) per token, exact for
    positions < L)."""

    max_len = None  # the kernel exists at every length: any input length is exact

    def __init__(self, H, L):
        self.H, self.L = checks.positive_int(H, "H"), checks.positive_int(L, "L")
        self.D = nnx.Param(jnp.ones((H,)))
        self.cache = nnx.data(None)  # set by init_cache (RNN mode)

    def __call__(self, u: Float[Array, "batch L H"]) -> Float[Array, "batch L H"]:
        checks.sequence(u, self.H)
        return causal_convolution(u, self.kernel(u.shape[1]), axis=1) + self.D[...] * u

    def init_cache(self, batch_size):
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.L, self.H)))  # oldest first

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        buf = jnp.concatenate([self.cache[...][:, 1:], u_t[:, None]], axis=1)
        self.cache[...] = buf
        y = jnp.einsum("blh,hl->bh", buf, self.kernel(self.L)[:, ::-1])
        return y + self.D[...] * u_t

    def to_ssm(self, h=None, decay=None):
        """A new `ETSCLayer` with h states per channel (h = L by default): the
        ETSC SSM of this layer's kernel's first h lags, with lambd = decay *
        omega^k if a decay is given, and the same skip D."""
        h = self.L if h is None else checks.positive_int(h, "h")
        return ETSCLayer.from_kernel(self.kernel(h), self.D[...], decay=decay)


class ToeplitzLayer(_LongConvolution):
    """A TNN-style long convolution with an explicit learned kernel.

    Each of the H channels has its own kernel t of length L (a parameter, shape
    (H, L)) and a skip D: y = T u + D u, with t zero beyond lag L-1. CNN mode is
    the batched FFT convolution; RNN mode keeps the last L inputs. At
    initialisation t_i is drawn N(0, 1/4) times the envelope
    exp(-i / envelope_length) (L/8 by default): recent lags first.
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, envelope_length=None):
        super().__init__(H, L)
        envelope_length = L / 8 if envelope_length is None else envelope_length
        envelope = jnp.exp(-jnp.arange(L) / envelope_length)  # favour recent lags at init
        self.t = nnx.Param(0.5 * jax.random.normal(rngs.params(), (H, L)) * envelope)

    def kernel(self, L):
        """The kernel applied to a length-L input, (H, L): t, zero beyond lag L-1."""
        t = self.t[...]
        return t[:, :L] if L <= self.L else jnp.pad(t, ((0, 0), (0, L - self.L)))

    def to_ssm(self, h=None, decay=None):
        """The ETSC SSM of the whole kernel, zero-padded to h >= L lags."""
        if h is not None and checks.positive_int(h, "h") < self.L:
            raise ValueError(f"h must be at least the kernel length {self.L}, got {h}")
        return super().to_ssm(h, decay)


class TNNLayer(_LongConvolution):
    """Toeplitz neural network layer (Qin et al., 2023): the kernel is a relative
    position encoder times an exponential decay, t_i = gamma^i RPE(i).

    RPE is a small MLP of the relative position i (scaled by 1/L, L the
    training length): Linear(1, rpe_dim), ReLU, Linear(rpe_dim, rpe_dim),
    ReLU, Linear(rpe_dim, H). It defines a kernel at every length, which is how
    TNN extrapolates, and ``to_ssm(h, decay=gamma)`` converts it with its own
    decay folded into the eigenvalues (lambd = gamma omega^k, as the ETSC
    authors' code does).
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, gamma=0.99, rpe_dim=32):
        super().__init__(H, L)
        self.gamma = checks.decay_factor(gamma)
        self.rpe = nnx.List([nnx.Linear(1, rpe_dim, rngs=rngs),
                             nnx.Linear(rpe_dim, rpe_dim, rngs=rngs),
                             nnx.Linear(rpe_dim, H, rngs=rngs)])

    def rpe_values(self, L):
        """RPE(i) for i = 0..L-1: (L, H)."""
        z = (jnp.arange(L, dtype=jnp.float32) / self.L)[:, None]
        for i, lin in enumerate(self.rpe):
            z = lin(z) if i == 0 else lin(jax.nn.relu(z))
        return z

    def kernel(self, L):
        """t_i = gamma^i RPE(i), i < L: (H, L)."""
        return (self.rpe_values(L) * decay_powers(self.gamma, L, jnp.float32)[:, None]).T

    def to_ssm(self, h=None, decay=None):
        """With the layer's own decay (decay == gamma), RPE's values r are
        converted directly, the same SSM as converting t = gamma^i r and
        dividing the decay back out, but without forming gamma^i, which
        leaves float32's normal range at long h (near 8,700 lags for 0.99)."""
        h = self.L if h is None else checks.positive_int(h, "h")
        if decay is None or checks.decay_factor(decay) != self.gamma:
            return super().to_ssm(h, decay)
        return ETSCLayer(etsc(self.rpe_values(h))[1], self.D[...], decay=self.gamma)


class SGConvLayer(_LongConvolution):
    """SGConv-style layer (Li et al., 2023): the kernel is a concatenation of
    sub-kernels, sub-kernel s a learned (k, H) kernel upsampled 2^s times
    (linear interpolation) and scaled by alpha^s, covering lags
    k(2^s - 1) .. k(2^{s+1} - 1). Enough scales are built to cover
    `kernel_length` lags (8 L by default); beyond that the kernel is zero.
    """

    def __init__(self, H, L, *, rngs: nnx.Rngs, k=16, alpha=0.5, kernel_length=None):
        super().__init__(H, L)
        self.k, self.alpha = checks.positive_int(k, "k"), alpha
        kernel_length = 8 * L if kernel_length is None else kernel_length
        S = int(np.ceil(np.log2(checks.positive_int(kernel_length, "kernel_length") / k + 1)))
        self.w = nnx.Param(jax.random.normal(rngs.params(), (S, k, H)) / np.sqrt(k))

    def kernel(self, L):
        """The sub-kernels, upsampled, scaled and concatenated, cut or padded to L: (H, L)."""
        w, k = self.w[...], self.k
        pieces = [jax.image.resize(w[s], (k * 2 ** s, self.H), "linear") * self.alpha ** s
                  for s in range(w.shape[0])]
        t = jnp.concatenate(pieces, axis=0)
        t = t[:L] if L <= t.shape[0] else jnp.pad(t, ((0, L - t.shape[0]), (0, 0)))
        return t.T


register_layer("tnn", LayerOptions, lambda options, L: functools.partial(TNNLayer, L=L),
               help="TNN: a kernel from a relative-position MLP and a decay")
register_layer("sgconv", LayerOptions, lambda options, L: functools.partial(SGConvLayer, L=L),
               help="SGConv: a kernel of upsampled, decaying sub-kernels")


class ETSCLayer(_LongConvolution):
    """A long convolution held as its ETSC diagonal SSM: per channel h states
    with lambd_k = gamma omega^k (omega = exp(2 pi i/(h+1)), k = 1..h, gamma = 1
    without decay), complex input coefficients b (h, H), C = 1, and a skip D.

    Its kernel t_i = Re sum_k b_k lambd_k^i equals the converted kernel at lags
    i < h and repeats with period h + 1, times gamma^i, beyond. CNN mode
    convolves with that kernel; RNN mode runs `decoders.SSMDecoder`'s
    exact-phase recurrence mapped over the batch: O(h H) per token and O(h H)
    state whatever the position. Built by the long convolutions' ``to_ssm``.
    """

    def __init__(self, b, D, decay=None):
        b = checks.array(b, "b", ndim=2, kind="complex")
        super().__init__(b.shape[1], b.shape[0])  # H channels, L = h exact lags
        self.b = nnx.Param(b)
        self.D = nnx.Param(checks.array(D, "D", shape=(self.H,), kind="float"))
        self.decay = checks.decay_factor(decay)
        self.phase = nnx.data(None)  # set by init_cache (RNN mode)

    @classmethod
    def from_kernel(cls, t, D, decay=None):
        """The ETSC SSM of kernels t (H, h), one per channel, and skip D (H,)."""
        gamma = checks.decay_factor(decay)
        return cls(etsc(jnp.asarray(t).T, decay=gamma)[1], D, decay=gamma)

    def kernel(self, L):
        return etsc_kernel(self.b[...], L, decay=self.decay).T

    def init_cache(self, batch_size):
        z, p = SSMDecoder.from_etsc(self.b[...], decay=self.decay).empty_cache()  # (h, H), (h,)
        self.phase = nnx.Cache(p)  # p_k = ik mod (h+1), shared by the batch
        self.cache = nnx.Cache(jnp.broadcast_to(z, (batch_size,) + z.shape))

    def step(self, u_t: Float[Array, "batch H"]) -> Float[Array, "batch H"]:
        checks.step_input(u_t, self.H, self.cache)
        decoder = SSMDecoder.from_etsc(self.b[...], decay=self.decay)
        (z, p), y = jax.vmap(decoder.step, in_axes=((0, None), 0), out_axes=((0, None), 0))(
            (self.cache[...], self.phase[...]), u_t)
        self.cache[...], self.phase[...] = z, p
        return y + self.D[...] * u_t


def _with_sequence_layers(model, make):
    """A copy of `model` (a StackedModel of long-convolution layers) with every
    block's sequence layer replaced by make(layer); the original is left as it is."""
    if not all(hasattr(getattr(block, "seq", None), "to_ssm")
               for block in getattr(model, "layers", [None])):
        raise TypeError("model must be a StackedModel whose every sequence layer has "
                        "to_ssm (ToeplitzLayer, TNNLayer, SGConvLayer)")
    m = nnx.clone(model)
    for block in m.layers:
        block.seq = make(block.seq)
    return m


def converted_model(model, h, decay=None):
    """A copy of `model` (a StackedModel of long-convolution layers) whose every
    long convolution is replaced by its ETSC SSM of h states (`to_ssm`; eigenvalues
    decay * omega^k if a decay is given). The original is left as it is."""
    return _with_sequence_layers(model, lambda seq: seq.to_ssm(h, decay=decay))


def truncated_model(model, L):
    """A copy of `model` (a StackedModel of long-convolution layers) whose every
    long convolution keeps only the first L lags of its kernel: a ToeplitzLayer
    holding kernel(L), zero from lag L on, and the same D. On inputs of at most
    L steps it is the original model; on longer ones it forgets what is L or
    more steps back. The original is left as it is."""
    L = checks.positive_int(L, "L")

    def cut(seq):
        layer = ToeplitzLayer(seq.H, L, rngs=nnx.Rngs(0))
        layer.t[...], layer.D[...] = seq.kernel(L), seq.D[...]
        return layer

    return _with_sequence_layers(model, cut)
