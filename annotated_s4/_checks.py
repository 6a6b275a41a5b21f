"""Argument checks, each written once, called in one line by the public functions.

Every error names the argument and says what was expected. The exception
type follows the kind of mistake:

* ``TypeError``: the argument is the wrong kind of thing (a float where an
  int is needed, an integer array where a float array is needed, ...);
* ``ValueError``: the right kind of thing with a wrong value or shape.

Shapes and dtypes are known while JAX traces a function, so those checks run
under ``jit`` too. *Values* are not: a traced array has no numbers yet, so
the value checks here (``positive``, ``finite``, ``in_range``, token ranges)
check concrete arguments and let tracers through. They guard direct calls;
a compiled function trusts its caller.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

_KINDS = {
    "float": (jnp.floating,),
    "real": (jnp.floating, jnp.integer),
    "complex": (jnp.complexfloating,),
    "number": (jnp.floating, jnp.integer, jnp.complexfloating),
    "int": (jnp.integer,),
}


def _traced(*xs):
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


# --------------------------------------------------------------------------
# Python numbers
# --------------------------------------------------------------------------
def positive_int(value, name, *, minimum=1):
    """`value` as an int, at least `minimum` (a bool is not an int here)."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        want = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {want}, got {value}")
    return int(value)


def flag(value, name):
    """True or False, nothing else (not 0 or 1, not None)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def batch_size(value, n):
    """A positive int batch size, at most n (the number of training sequences)."""
    value = positive_int(value, "batch_size")
    if value > n:
        raise ValueError(f"batch_size ({value}) must not exceed the number of "
                         f"training sequences ({n})")
    return value


def finite_loss(loss, step, lr=None):
    """A training loss that is a finite number (else the run has diverged);
    lr, where known, is named in the error."""
    if not math.isfinite(loss):
        now = "" if lr is None else f" (now {lr})"
        raise FloatingPointError(f"training diverged at step {step}: the loss is {loss}; "
                                 f"try a smaller learning rate{now}")
    return loss


def even_int(value, name):
    """A positive even int (N/2 conjugate pairs of modes)."""
    value = positive_int(value, name)
    if value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def number(value, name, *, low=-math.inf, high=math.inf, low_open=False, high_open=False):
    """A real Python/numpy scalar in [low, high] (ends excluded where `*_open`)."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if math.isnan(value) or too_low or too_high:
        raise ValueError(f"{name} must lie in {'(' if low_open else '['}{low}, {high}"
                         f"{')' if high_open else ']'}, got {value}")
    return value


def positive_number(value, name):
    """A real Python/numpy scalar above 0."""
    return number(value, name, low=0.0, low_open=True)


def choice(value, name, choices):
    """One of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def factories(layer, name):
    """A layer factory, or a non-empty list/tuple of them; returns a list."""
    fs = list(layer) if isinstance(layer, (list, tuple)) else [layer]
    if not fs or not all(callable(f) for f in fs):
        raise TypeError(f"{name} must be a layer factory or a non-empty list of them, "
                        f"got {layer!r}")
    return fs


# --------------------------------------------------------------------------
# Arrays: shape and dtype (run under jit too)
# --------------------------------------------------------------------------
def array(x, name, *, ndim=None, shape=None, kind="number"):
    """`x` as a JAX array with the given number of dims, shape and dtype kind.

    `ndim` is an int or a tuple of allowed ints; `shape` a tuple whose int
    entries must match and whose str (or None) entries name a free size, e.g.
    ("batch", "L", 8); `kind` one of float, real, complex, number, int.
    """
    x = jnp.asarray(x)
    if not any(jnp.issubdtype(x.dtype, k) for k in _KINDS[kind]):
        raise TypeError(f"{name} must be a {kind} array, got dtype {x.dtype}")
    if ndim is not None and x.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {x.shape}")
    if shape is not None and (x.ndim != len(shape) or any(
            _is_int(s) and s != d for s, d in zip(shape, x.shape))):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")
    return x


def kernel(K, L, name="K"):
    """Real convolution kernels K (..., L), one per channel, as long as the input."""
    K = array(K, name, kind="real")
    if K.ndim < 1 or K.shape[-1] != L:
        raise ValueError(f"{name} must have length L = {L} on its last axis (the same "
                         f"length as u's time axis), got shape {K.shape}")
    return K


def ssm(A, B, C, *, dt=None, L=None):
    """A continuous or discrete SSM: A (N, N), B (N, 1), C (1, N); where given,
    a positive step size `dt` and a positive int kernel length `L`."""
    A = array(A, "A", ndim=2)
    N = A.shape[0]
    A = array(A, "A", shape=(N, N))
    _dt_and_length(dt, L)
    return A, array(B, "B", shape=(N, 1)), array(C, "C", shape=(1, N))


def recurrence(Ab, Bb, Cb, u, x0):
    """A discrete SSM (see `ssm`), its inputs u (L, 1) and its state x0 (N,)."""
    Ab, Bb, Cb = ssm(Ab, Bb, Cb)
    return (Ab, Bb, Cb, array(u, "u", shape=("L", 1)),
            array(x0, "x0", shape=(Ab.shape[0],)))


def diagonal(Lambda, B, C, *, dt, L):
    """A diagonal SSM: Lambda, B, C (N,); a positive scalar step size dt; an int L >= 1."""
    Lambda = array(Lambda, "Lambda", ndim=1)
    _dt_and_length(dt, L)
    if jnp.ndim(dt) != 0:
        raise ValueError(f"dt must be a scalar, got shape {jnp.shape(dt)}")
    return [Lambda] + vectors(Lambda.shape[0], B=B, C=C)


def dplr(Lambda, P, Q, B, C, *, dt, L=None):
    """A DPLR SSM: Lambda, P, Q, B, C (N,); a positive step size dt; where given, an int L >= 1."""
    Lambda = array(Lambda, "Lambda", ndim=1)
    _dt_and_length(dt, L)
    return [Lambda] + vectors(Lambda.shape[0], P=P, Q=Q, B=B, C=C)


def cauchy(v, omega, lambd):
    """The Cauchy product's poles lambd (N,), points omega (M,), weights v (N,) or (K, N)."""
    lambd = array(lambd, "lambd", ndim=1)
    v = array(v, "v", ndim=(1, 2))
    if v.shape[-1] != lambd.shape[0]:
        raise ValueError(f"v must have shape (N,) or (K, N) with N = {lambd.shape[0]}, "
                         f"got {v.shape}")
    return v, array(omega, "omega", ndim=1), lambd


def modes(W, log_z, L):
    """Weights W and log-eigenvalues log_z (..., N) that broadcast; an int L >= 1."""
    W, log_z = array(W, "W", kind="number"), array(log_z, "log_z", kind="number")
    positive_int(L, "L")
    if W.ndim < 1 or log_z.ndim < 1:
        raise ValueError(f"W and log_z need a trailing mode axis, got {W.shape}, {log_z.shape}")
    return W, log_z


def toeplitz_kernel(t, name="t"):
    """Real floating kernel(s) t (n,) or (n, d), non-empty and finite."""
    t = array(t, name, ndim=(1, 2), kind="float")
    if t.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {t.shape}")
    return finite(t, name)


def decayed_kernel(t, decay):
    """A kernel t (see `toeplitz_kernel`) and a decay gamma (see `decay_factor`)
    such that t_i / gamma^i stays finite, with gamma^i computed in float64 and
    rounded to t's dtype (as the ETSC conversion does). Every gamma^i must be a
    normal number of that dtype: a subnormal one is flushed to zero by XLA on a
    CPU and kept on a GPU, so the division would differ by device. Returns
    (t, gamma)."""
    t, gamma = toeplitz_kernel(t), decay_factor(decay)
    if gamma is None:
        return t, gamma
    n = t.shape[0]
    powers = np.float64(gamma) ** np.arange(n)
    tiny = float(np.finfo(t.dtype).tiny)
    if float(np.asarray(powers[-1], t.dtype)) < tiny:
        raise ValueError(f"decay = {gamma} is too strong for n = {n}: decay^{n - 1} = "
                         f"{powers[-1]:.1e} is below the smallest normal "
                         f"{np.dtype(t.dtype).name} number, {tiny:.1e}")
    if not _traced(t):
        r = t / jnp.asarray(powers, t.dtype).reshape((-1,) + (1,) * (t.ndim - 1))
        finite(r, f"t / decay^i (decay = {gamma} is too strong for n = {t.shape[0]})")
    return t, gamma


def fit_init(init, names, h, d):
    """None or a dict from some of `names` to finite real arrays of shape (h,)
    or (h, d): the starting values of a fit. Returns the dict ({} for None)."""
    if init is None:
        return {}
    if not isinstance(init, dict):
        raise TypeError(f"init must be a dict or None, got {type(init).__name__}")
    unknown = sorted(set(init) - set(names))
    if unknown:
        raise ValueError(f"init has unknown names {unknown}; expected some of {sorted(names)}")
    out = {}
    for name, value in init.items():
        value = array(value, f"init[{name!r}]", ndim=(1, 2), kind="real")
        if value.shape not in ((h,), (h, d)):
            raise ValueError(f"init[{name!r}] must have shape ({h},) or ({h}, {d}), "
                             f"got {value.shape}")
        out[name] = finite(value, f"init[{name!r}]")
    return out


def fit_fixed(fixed, names):
    """A tuple or list of some of `names`: the parameters a fit holds at their
    starting values. Returns them as a set."""
    if isinstance(fixed, str) or not isinstance(fixed, (tuple, list)):
        raise TypeError(f"fixed must be a tuple of parameter names, got {fixed!r}")
    unknown = sorted(set(fixed) - set(names))
    if unknown:
        raise ValueError(f"fixed has unknown names {unknown}; expected some of {sorted(names)}")
    if set(fixed) == set(names):
        raise ValueError(f"fixed holds every parameter, {sorted(names)}: nothing would be fitted")
    return set(fixed)


def diagonal_ssm(lambd, b):
    """A diagonal SSM's eigenvalues lambd (h,) or (h, d) and input vector b of
    the same leading size (h,) or (h, d), both finite. Returns (lambd, b)."""
    lambd = array(lambd, "lambd", ndim=(1, 2))
    if lambd.shape[0] < 1:
        raise ValueError(f"lambd must have shape (h,) or (h, d), got {lambd.shape}")
    b = array(b, "b", ndim=(1, 2))
    if b.shape[0] != lambd.shape[0] or (lambd.ndim == 2 and b.shape != lambd.shape):
        raise ValueError(f"b must have shape (h,) or (h, d) matching lambd "
                         f"{lambd.shape}, got {b.shape}")
    return finite(lambd, "lambd"), finite(b, "b")


def decay_factor(decay):
    """None (no decay) or a number gamma in (0, 1]."""
    return None if decay is None else number(decay, "decay", low=0, high=1, low_open=True)


def _dt_and_length(dt, L):
    if dt is not None:
        positive(dt, "dt")
    if L is not None:
        positive_int(L, "L")


def selective_input(x, name, lead, D, N, *, fixed=False):
    """A selective SSM's B or C: shared by the channels (*lead, N), or by G groups
    of D/G channels (*lead, G, N); with `fixed`, also one time-invariant (D, N)."""
    x = array(x, name, kind="float")
    want = ((f"(D, N) = ({D}, {N}), " if fixed else "") + f"(*{tuple(lead)}, N) or "
            f"(*{tuple(lead)}, G, N) with N = {N} and G dividing D = {D}")
    ok = ((fixed and x.shape == (D, N)) or x.shape == (*lead, N)
          or (x.shape[:len(lead)] == tuple(lead) and x.ndim == len(lead) + 2
              and x.shape[-1] == N and x.shape[-2] > 0 and D % x.shape[-2] == 0))
    if not ok:
        raise ValueError(f"{name} must have shape {want}, got {x.shape}")
    return x


def selective(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, state=None,
              state_name="initial_state", step=False):
    """The selective SSM's arguments: u, delta and z (batch, L, D) (in a step,
    (batch, D)); A (D, N) real; B and C see `selective_input`; D and delta_bias
    (D,); a state (batch, D, N) (required in a step). Returns them as arrays, in
    this order, the state last (None stays None)."""
    u = array(u, "u", ndim=2 if step else 3, kind="float")
    A = array(A, "A", ndim=2, kind="float")
    Dm, N = u.shape[-1], A.shape[1]
    A = array(A, "A", shape=(Dm, N), kind="float")
    delta = array(delta, "delta", shape=u.shape, kind="float")
    B, C = (selective_input(x, name, u.shape[:-1], Dm, N, fixed=not step)
            for x, name in ((B, "B"), (C, "C")))
    D, delta_bias = (None if x is None else array(x, name, shape=(Dm,), kind="float")
                     for x, name in ((D, "D"), (delta_bias, "delta_bias")))
    z = None if z is None else array(z, "z", shape=u.shape, kind="float")
    if state is not None or step:
        state = array(state, state_name, shape=(u.shape[0], Dm, N), kind="float")
    return u, delta, A, B, C, D, z, delta_bias, state


def first_order(a, b, x0=None):
    """A first-order linear recurrence x_t = a_t x_{t-1} + b_t: a and b (L, ...) of
    one shape, time first; x0 (...) or None."""
    b = array(b, "b", kind="number")
    if b.ndim < 1:
        raise ValueError(f"b must have a time axis first, got shape {b.shape}")
    a = array(a, "a", shape=b.shape)
    return a, b, None if x0 is None else array(x0, "x0", shape=b.shape[1:])


def ssd(X, a, B, C, initial_state=None):
    """SSD's arguments: X (batch, L, H, P); a (batch, L, H), the log-decays; B and C
    (batch, L, H, N); initial_state (batch, H, P, N) or None."""
    X = array(X, "X", ndim=4, kind="float")
    b, L, H, P = X.shape
    a = array(a, "a", shape=(b, L, H), kind="float")
    B = array(B, "B", shape=(b, L, H, None), kind="float")
    C = array(C, "C", shape=B.shape, kind="float")
    if initial_state is not None:
        initial_state = array(initial_state, "initial_state", shape=(b, H, P, B.shape[-1]),
                              kind="float")
    return X, a, B, C, initial_state


def vectors(N, **named):
    """Each named array is a vector of shape (N,); returns them in order."""
    return [array(x, name, shape=(N,)) for name, x in named.items()]


def sequence(u, H, name="u"):
    """A layer's input in CNN mode: shape (batch, L, H), floating point."""
    return array(u, name, shape=("batch", "L", H), kind="float")


def step_input(u_t, H, cache, name="u_t"):
    """A layer's input in RNN mode: (batch, H), after init_cache()."""
    if cache is None:
        raise ValueError("call init_cache(batch_size) before step()")
    return array(u_t, name, shape=("batch", H), kind="float")


def max_length(u, max_len, name="u"):
    """u (batch, length, H) is no longer than the layer's max_len (None: any length)."""
    if max_len is not None and u.shape[1] > max_len:
        raise ValueError(f"{name} has length {u.shape[1]}, more than the layer's "
                         f"max_len = {max_len}")
    return u


def tokens(x, name, vocab_size, *, ndim=2):
    """Integer tokens in [0, vocab_size) with `ndim` dims."""
    x = array(x, name, ndim=ndim, kind="int")
    if not _traced(x) and x.size and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(f"{name} must hold tokens in [0, {vocab_size}), "
                         f"got values in [{int(x.min())}, {int(x.max())}]")
    return x


# --------------------------------------------------------------------------
# Values (concrete arguments only; tracers pass, see the module docstring)
# --------------------------------------------------------------------------
def positive(x, name):
    """Every entry of a real scalar or array is > 0."""
    if _traced(x):
        return x
    a = np.asarray(x)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name} must be a real number or array, got dtype {a.dtype}")
    if not np.all(a > 0):
        raise ValueError(f"{name} must be positive, got {x}")
    return x


def finite(x, name):
    """No NaN or inf in x."""
    if not _traced(x) and not bool(jnp.all(jnp.isfinite(jnp.asarray(x)))):
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return x
