"""How much of its past input a frozen SSM's state holds: a linear memory probe.

Drive a discrete SSM x_k = Ab x_{k-1} + Bb u_k with white noise u, collect the
states X = (x_0, ..., x_{T-1}), and ask, for each delay d, how well the best
linear readout w_d recovers the input d steps back:

    u_{k-d}  ~  w_d . x_k,     w_d = argmin_w sum_{k in train} (u_{k-d} - w . x_k)^2,

scored by R^2 on time steps the readout was not fitted on. R^2(d) = 1 means
the state still holds u_{k-d} exactly, next to everything else it holds;
R^2(d) = 0 that no linear readout finds it among the other inputs. The
noise is part of the question: every other input is noise for the readout
of u_{k-d}.

A least-squares readout sees the state only through the space its
coordinates span, so R^2 does not change when the state is written in
another basis (x -> M x, M invertible): it measures the SSM, not its
coordinates. For i.i.d. inputs the R^2(d) of a linear state sum over d to at
most N, the state size (Jaeger's memory capacity); an initialisation decides
how that budget is spread over the delays.

NumPy in float64 (complex128 for complex states): the states of a slow SSM
are nearly collinear, and the least squares needs the precision.
"""

from __future__ import annotations

import numpy as np
import scipy.fft

from . import _checks as checks

__all__ = ["ssm_states", "delay_memory", "memory_curve"]


def ssm_states(Ab, Bb, u):
    """The states x_k = Ab x_{k-1} + Bb u_k, k = 0 .. T-1, from x_{-1} = 0.

    Unrolled, x_k = sum_{j <= k} h_j u_{k-j} with the impulse response
    h_j = Ab^j Bb (the SSM's convolution kernel, one per state coordinate):
    h is built by doubling, h_{m..2m-1} = Ab^m h_{0..m-1}, and convolved with
    u by FFT. Ab (..., N, N) and Bb (..., N), real or complex, for one SSM or
    a batch of them; u (T,) real, the input every SSM of the batch reads.
    Returns X of shape (..., T, N), float64 or complex128. Meant for stable
    SSMs (every |eigenvalue of Ab| < 1): the FFT's rounding is relative to the
    largest state, and a growing SSM's early states would drown in it.
    """
    checks.array(Ab, "Ab", kind="number"), checks.array(Bb, "Bb", kind="number")
    Ab, Bb = np.asarray(Ab), np.asarray(Bb)              # as given: no cast to float32
    if Ab.ndim < 2 or Ab.shape[-1] != Ab.shape[-2] or Bb.shape != Ab.shape[:-1]:
        raise ValueError(f"Ab must have shape (..., N, N) and Bb (..., N), got {Ab.shape} "
                         f"and {Bb.shape}")
    checks.array(u, "u", ndim=1, kind="real")
    u, T = np.asarray(u, dtype=np.float64), np.shape(u)[0]
    dtype = np.result_type(Ab.dtype, Bb.dtype, np.float64)
    power, h = np.asarray(Ab, dtype=dtype), np.asarray(Bb, dtype=dtype)[..., None]
    while h.shape[-1] < T:                               # column j of h: h_j = Ab^j Bb
        h = np.concatenate([h, power @ h], axis=-1)
        power = power @ power
        for z in (h, power):                             # no subnormal numbers: they
            z[np.abs(z) < 1e-200] = 0                    # are slow, and far below use
    n = scipy.fft.next_fast_len(2 * T)                   # zero-padded to >= 2T: causal,
    fft, ifft = (scipy.fft.rfft, scipy.fft.irfft) if dtype == np.float64 else (scipy.fft.fft, scipy.fft.ifft)
    X = ifft(fft(h[..., :T], n=n) * fft(u, n=n), n=n)[..., :T]   # not circular
    return np.swapaxes(X, -1, -2)


def delay_memory(X, u, delays, start=None, rcond=None):
    """R^2(d) of the least-squares readout of u_{k-d} from x_k, held out.

    X (T, N) holds the states x_k (complex states give the real features
    Re x, Im x), u (T,) the inputs that made them, and `delays` the d >= 0 to
    probe. Every delay uses the same time steps k = start .. T-1 (start
    defaults to max(delays); a later start skips the state's transient from
    x_{-1} = 0): the readout w_d is fitted on their first half and scored on
    the second, R^2 = 1 - sum (u_{k-d} - w_d . x_k)^2 / sum (u_{k-d} - mean)^2.
    The fit is NumPy's least squares: directions of the fitted states whose
    singular value is below rcond times the largest are dropped (None:
    machine precision). With rcond=None the readout depends on the states only
    through the space they span, so R^2 is the same in any basis x -> M x.
    A larger rcond says what a readout of limited precision can use: a
    direction of the state 1e-9 of its size, say, is below float32's
    rounding. Returns R^2, one per delay (below 0 where the readout does
    worse than the mean).
    """
    checks.array(X, "X", ndim=2, kind="number")
    checks.array(u, "u", shape=(np.shape(X)[0],), kind="real")
    checks.array(delays, "delays", ndim=1, kind="int")
    X, u, delays = np.asarray(X), np.asarray(u, dtype=np.float64), np.asarray(delays)
    if delays.size == 0 or delays.min() < 0:
        raise ValueError(f"delays must be a non-empty list of ints >= 0, got {delays}")
    start = int(delays.max()) if start is None else checks.positive_int(start, "start", minimum=0)
    if start < delays.max():
        raise ValueError(f"start must be at least max(delays) = {delays.max()}, got {start}")
    if rcond is not None:
        rcond = checks.number(rcond, "rcond", low=0, high=1)
    X = np.concatenate([X.real, X.imag], axis=1) if np.iscomplexobj(X) else X
    X = np.asarray(X, dtype=np.float64)
    k = np.arange(start, X.shape[0])                        # the time steps used
    if k.size < 4 * X.shape[1]:
        raise ValueError(f"X has {X.shape[0]} time steps, too few to fit {X.shape[1]} "
                         f"features from step {start} on (need at least "
                         f"{start + 4 * X.shape[1]})")
    fit, held_out = k[:k.size // 2], k[k.size // 2:]
    Y = u[k[:, None] - delays[None, :]]                     # column d: u_{k-d}
    Y_fit, Y_out = Y[:fit.size], Y[fit.size:]
    W = np.linalg.lstsq(X[fit], Y_fit, rcond=rcond)[0]      # one readout per delay
    residual = Y_out - X[held_out] @ W
    spread = Y_out - Y_out.mean(axis=0)
    return 1.0 - (residual ** 2).sum(axis=0) / (spread ** 2).sum(axis=0)


def memory_curve(Ab, Bb, delays, T, burn_in=0, rcond=None, seed=0):
    """R^2(d) (see `delay_memory`) of each SSM in a batch (Ab (..., N, N),
    Bb (..., N)), all driven by one white noise u ~ N(0, 1) drawn with `seed`:
    burn_in steps to forget x_{-1} = 0, then T steps probed (half to fit the
    readouts, half to score them). Returns R^2 of shape (..., len(delays))."""
    T = checks.positive_int(T, "T")
    burn_in = checks.positive_int(burn_in, "burn_in", minimum=0)
    u = np.random.default_rng(checks.positive_int(seed, "seed", minimum=0)).standard_normal(
        burn_in + T)
    Ab, Bb = np.asarray(Ab), np.asarray(Bb)
    start = max(burn_in, int(np.max(delays)))
    R2 = [delay_memory(ssm_states(A, B, u), u, delays, start=start, rcond=rcond)
          for A, B in zip(Ab.reshape((-1,) + Ab.shape[-2:]), Bb.reshape((-1,) + Bb.shape[-1:]))]
    return np.reshape(R2, Bb.shape[:-1] + (len(delays),))
