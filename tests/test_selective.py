"""Part V math: the selective scan (S6) and SSD, against the official reference
implementations (fixtures written by tools/mamba_fixtures.py) and against each other."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64

from annotated_s4 import (combine, discretize_diagonal, discretize_selective,
                          discretize_ssd, scan_associative, scan_chunked, scan_recurrent, segsum,
                          selective_delta, selective_scan, selective_step, semiseparable,
                          ssd_chunked, ssd_quadratic, ssd_scan)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tools"))
import mamba_fixtures  # noqa: E402  (numpy only at import; torch only in its main)

# float32 against float32: the reference and this package round differently
# (einsum orders, exp), so the outputs agree to a few float32 ulps of their
# largest entry; errors are relative to max |reference|.
RTOL32 = 1e-5
TOL64 = 1e-10

# Compiled once per shape: op-by-op dispatch of the scans costs more than compiling them.
SCAN = jax.jit(selective_scan, static_argnames=("delta_softplus", "return_last_state", "method",
                                                 "chunk"))
STEP = jax.jit(selective_step, static_argnames="delta_softplus")
SSD_SCAN = jax.jit(ssd_scan, static_argnames="method")
SSD_CHUNKED = jax.jit(ssd_chunked, static_argnames="chunk")
SSD_QUADRATIC = jax.jit(ssd_quadratic)


def fixture(name, case):
    with np.load(FIXTURES / f"mamba_{name}.npz") as data:
        return {k.split("__", 1)[1]: data[k] for k in data.files if k.startswith(case + "__")}


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return np.abs(ours - ref).max() / np.abs(ref).max()


def time_last_to_second(x):
    """The reference's (batch, ..., L) layout to ours, (batch, L, ...); (D, N) stays."""
    return x if x.ndim == 2 else np.moveaxis(x, -1, 1)


def test_fixtures_come_from_the_pinned_commit():
    for name in ("selective_scan", "state_update", "ssd"):
        with np.load(FIXTURES / f"mamba_{name}.npz") as data:
            assert str(data["commit"]) == mamba_fixtures.PINNED


# --------------------------------------------------------------------------
# Against the official reference functions
# --------------------------------------------------------------------------
@pytest.mark.parametrize("case", [c[0] for c in mamba_fixtures.SCAN_CASES])
def test_selective_scan_equals_selective_scan_ref(case):
    r = fixture("selective_scan", case)
    assert r["out"].dtype == np.float32
    args = {k: time_last_to_second(r[k]) for k in ("u", "delta", "B", "C", "z") if k in r}
    with jax.default_matmul_precision("float32"):
        result = SCAN(**args, A=r["A"], D=r.get("D"), delta_bias=r.get("delta_bias"),
                                delta_softplus=bool(r["delta_softplus"]),
                                return_last_state=bool(r["return_last_state"]))
    y, last = result if r["return_last_state"] else (result, None)
    assert rel_err(np.swapaxes(y, 1, 2), r["out"]) < RTOL32
    if last is not None:
        assert rel_err(last, r["last_state"]) < RTOL32


def test_the_fixture_tells_euler_from_zoh():
    """The reference's input term is Delta B u: the exact ZOH term gives other numbers."""
    r = fixture("selective_scan", "plain")
    u, delta, B, C = (time_last_to_second(r[k]) for k in ("u", "delta", "B", "C"))
    A = r["A"]
    zoh = (np.exp(delta[..., None] * A) - 1) / A * B[:, :, None, :] * u[..., None]
    x = jax.vmap(scan_recurrent)(jnp.exp(delta[..., None] * A), zoh)
    y = jnp.sum(x * C[:, :, None, :], axis=-1)
    assert rel_err(np.swapaxes(y, 1, 2), r["out"]) > 100 * RTOL32


@pytest.mark.parametrize("case", ["flat", "heads"])
def test_selective_step_equals_selective_state_update_ref(case):
    r = fixture("state_update", case)
    state, out = r["state"], r["out"]
    b, N = state.shape[0], state.shape[-1]
    flat = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731 heads (.., H, P) -> channels H P
    with jax.default_matmul_precision("float32"):
        new_state, y = STEP(
            state.reshape(b, -1, N), flat(r["x"]), flat(r["dt"]), r["A"].reshape(-1, N),
            r["B"], r["C"], D=r["D"].reshape(-1), z=flat(r["z"]),
            delta_bias=r["dt_bias"].reshape(-1), delta_softplus=True)
    assert rel_err(np.reshape(y, out.shape), out) < RTOL32
    assert rel_err(np.reshape(new_state, state.shape), r["new_state"]) < RTOL32


@pytest.mark.parametrize("case", ["zero_start", "initial_state"])
def test_ssd_equals_ssd_minimal_discrete(case):
    r = fixture("ssd", case)
    h0 = r["initial_states"][:, 0] if "initial_states" in r else None
    with enable_x64():
        args = [jnp.asarray(r[k]) for k in ("X", "A", "B", "C")]
        assert args[0].dtype == jnp.float64
        # the reference's chunk length; with an initial state, one that leaves a tail
        Y, h = SSD_CHUNKED(*args, int(r["block_len"]) if h0 is None else 10, initial_state=h0)
        assert rel_err(Y, r["Y"]) < TOL64 and rel_err(h, r["final_state"]) < TOL64
        if h0 is None:
            Y, h = SSD_SCAN(*args)
            assert rel_err(Y, r["Y"]) < TOL64 and rel_err(h, r["final_state"]) < TOL64
            assert rel_err(SSD_QUADRATIC(*args), r["Y"]) < TOL64


# --------------------------------------------------------------------------
# Invariants in float64
# --------------------------------------------------------------------------
def _random(shape, seed, low=None):
    x = np.random.default_rng(seed).standard_normal(shape)
    return x if low is None else low + (1 - low) * np.abs(np.tanh(x))


def test_combine_composes_affine_maps_and_is_associative():
    rng = np.random.default_rng(0)
    p, q, r = ((rng.standard_normal(5), rng.standard_normal(5)) for _ in range(3))
    x = rng.standard_normal(5)
    a, b = combine(p, q)
    np.testing.assert_allclose(a * x + b, q[0] * (p[0] * x + p[1]) + q[1], rtol=1e-12)
    for u, v in zip(combine(combine(p, q), r), combine(p, combine(q, r))):
        np.testing.assert_allclose(u, v, rtol=1e-12)
    assert not np.allclose(combine(p, q)[1], combine(q, p)[1])  # order matters


def test_the_three_scans_equal_the_python_loop(L=13):
    a, b, x0 = _random((L, 3, 2), 1, low=0.5), _random((L, 3, 2), 2), _random((3, 2), 3)
    x, loop = x0, []
    for t in range(L):
        x = a[t] * x + b[t]
        loop.append(x)
    with enable_x64():
        for scan in (scan_recurrent, scan_associative):
            np.testing.assert_allclose(jax.jit(scan)(a, b, x0), loop, rtol=1e-12, atol=1e-12)
        chunked = jax.jit(scan_chunked, static_argnames="chunk")
        for chunk in (5, L + 3):                       # a padded tail; one chunk
            np.testing.assert_allclose(chunked(a, b, x0, chunk), loop, rtol=1e-12, atol=1e-12)
        # from a zero start the states differ by x0 decayed: -(a_0 ... a_t) x0
        x = jax.jit(scan_recurrent)(a, b) - np.asarray(loop)
        np.testing.assert_allclose(x[-1], -np.prod(a, 0) * x0, rtol=1e-12)


def _selective_args(batch=2, L=13, D=6, N=3, G=3, seed=0):
    k = iter(range(seed, seed + 10))
    return dict(u=_random((batch, L, D), next(k)), delta=_random((batch, L, D), next(k)),
                A=-np.exp(_random((D, N), next(k))), B=_random((batch, L, G, N), next(k)),
                C=_random((batch, L, N), next(k)), D=_random((D,), next(k)),
                z=_random((batch, L, D), next(k)), delta_bias=_random((D,), next(k)),
                delta_softplus=True)


def test_selective_scan_methods_and_steps_agree():
    args = _selective_args()
    x0 = _random((2, 6, 3), 20)
    with enable_x64():
        y, last = SCAN(**args, initial_state=x0, return_last_state=True)
        for method in ("associative", "chunked"):
            y_m, last_m = SCAN(**args, initial_state=x0, return_last_state=True, method=method,
                              chunk=4)
            np.testing.assert_allclose(y_m, y, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(last_m, last, rtol=1e-12, atol=1e-12)
        state, per_step = x0, dict(args)
        for t in range(y.shape[1]):
            step = {k: v[:, t] if k in ("u", "delta", "B", "C", "z") else v
                    for k, v in per_step.items()}
            state, y_t = STEP(state, **step)
            np.testing.assert_allclose(y_t, y[:, t], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state, last, rtol=1e-12, atol=1e-12)


def test_euler_input_term_is_zoh_to_first_order():
    """Delta B - (exp(Delta A) - 1) / A B = -Delta^2 A B / 2 + O(Delta^3)."""
    A, B = -np.exp(_random((4, 3), 0)), _random((4, 3), 1)
    with enable_x64():
        for dt in (1e-2, 1e-3):
            _, euler = discretize_selective(jnp.full((4,), dt), A, B, jnp.ones(4))
            _, zoh = discretize_diagonal(A, B, dt)
            # relative error of the leading term: |Delta A| / 3 + O(Delta^2)
            np.testing.assert_allclose((euler - zoh) / dt**2, -A * B / 2, rtol=dt * np.abs(A).max())


def test_segsum_is_the_decay_exponent():
    a = _random((2, 9), 4)
    with enable_x64():
        S = np.asarray(segsum(a))
    for t in range(9):
        for s in range(9):
            want = a[:, s + 1:t + 1].sum(-1) if s <= t else -np.inf
            np.testing.assert_allclose(S[:, t, s], want, rtol=1e-12, atol=1e-14)


def test_segsum_is_stable_where_differences_of_cumsums_are_not():
    """float32, T = 1024: one-step sums come out exact; cumsum differences lose digits."""
    a = -jnp.asarray(np.random.default_rng(5).uniform(0, 1, 1024), jnp.float32)
    S = segsum(a)
    one_step = jnp.diagonal(S, offset=-1)                     # S[t, t-1] = a_t
    assert jnp.array_equal(one_step, a[1:])
    c = jnp.cumsum(a)
    assert float(jnp.abs((c[1:] - c[:-1]) - a[1:]).max()) > 1e-5


def test_ssd_forms_agree_with_the_matrix_and_with_s6():
    """quadratic == scan == chunked == M x, and == S6 with A = a_h I (the associative
    and chunked scans equal the recurrent one in the tests above)."""
    b, L, H, P, N = 2, 19, 2, 3, 4
    x, dt = _random((b, L, H, P), 0), np.log1p(np.exp(_random((b, L, H), 1)))
    A_h, B, C = -np.exp(_random((H,), 2)), _random((b, L, H, N), 3), _random((b, L, H, N), 4)
    with enable_x64():
        X, a = discretize_ssd(x, dt, A_h)
        M, a = np.asarray(jax.jit(semiseparable)(a, B, C)), np.asarray(a)
        for t in range(L):                   # M[t, s] = C_t . B_s exp(a_{s+1} + ... + a_t)
            for s in range(L):
                decay = np.exp(a[:, s + 1:t + 1].sum(1)) if s <= t else 0.0
                want = np.einsum("bhn,bhn->bh", C[:, t], B[:, s]) * decay
                np.testing.assert_allclose(M[:, :, t, s], want, rtol=1e-12, atol=1e-14)
        Y = np.einsum("bhts,bshp->bthp", M, X)
        outs = [SSD_QUADRATIC(X, a, B, C), SSD_SCAN(X, a, B, C)[0],
                SSD_CHUNKED(X, a, B, C, 4)[0]]                           # chunks with a tail
        # S6 with D = H P channels: channel (h, p) has A = A_h in every state, step dt_h,
        # and B, C shared by the P channels of its head (H groups)
        s6 = SCAN(u=x.reshape(b, L, H * P), delta=np.repeat(dt, P, axis=-1),
                            A=np.repeat(A_h, P)[:, None] * np.ones(N), B=B, C=C)
        outs.append(s6.reshape(b, L, H, P))
        for out in outs:
            np.testing.assert_allclose(out, Y, rtol=1e-12, atol=1e-12)


def test_ssd_chunked_gradient_is_the_scans():
    """The -inf above segsum's diagonal must not leak NaN into the gradient."""
    b, L, H, P, N = 1, 21, 2, 2, 3
    X, B, C = _random((b, L, H, P), 5), _random((b, L, H, N), 6), _random((b, L, H, N), 7)
    a = -_random((b, L, H), 8, low=0.1)
    with enable_x64():
        loss = lambda f: lambda a: f(X, a, B, C).sum()  # noqa: E731
        g = jax.jit(jax.grad(loss(lambda *v: ssd_chunked(*v, 8)[0])))(jnp.asarray(a))
        g_s = jax.jit(jax.grad(loss(lambda *v: ssd_scan(*v)[0])))(jnp.asarray(a))
        assert bool(jnp.all(jnp.isfinite(g)))
        np.testing.assert_allclose(g, g_s, rtol=1e-10, atol=1e-12)


def test_selective_delta():
    d, bias = np.array([[-30.0, 0.0, 2.0]]), np.array([0.5, 0.5, 0.5])
    np.testing.assert_allclose(selective_delta(d, bias), d + bias)
    np.testing.assert_allclose(selective_delta(d, bias, True), np.log1p(np.exp(d + bias)),
                               rtol=1e-6)
    with pytest.raises(TypeError, match="delta_softplus"):
        selective_delta(d, delta_softplus=1)


# --------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------
@pytest.mark.parametrize("name,bad,error", [
    ("u", np.ones((13, 6)), ValueError),
    ("u", np.ones((2, 13, 6), np.int32), TypeError),
    ("delta", np.ones((2, 13, 5)), ValueError),
    ("A", np.ones((5, 3)), ValueError),
    ("A", np.ones((6, 3), np.complex64), TypeError),
    ("B", np.ones((2, 13, 4, 3)), ValueError),        # 4 groups do not divide D = 6
    ("B", np.ones((2, 13, 2)), ValueError),           # N = 2, A says 3
    ("C", np.ones((6, 2)), ValueError),
    ("D", np.ones(5), ValueError),
    ("z", np.ones((2, 12, 6)), ValueError),
    ("delta_bias", np.ones((6, 1)), ValueError),
    ("method", "parallel", ValueError),
    ("chunk", 0, ValueError),
    ("initial_state", np.ones((2, 6, 4)), ValueError),
    ("return_last_state", 1, TypeError),
])
def test_selective_scan_bad_arguments(name, bad, error):
    args = _selective_args()
    args.update({"method": "chunked"} if name == "chunk" else {}, **{name: bad})
    with pytest.raises(error, match=f"^{name} "):
        selective_scan(**args)


def test_selective_step_bad_arguments():
    args = {k: v[:, 0] if k in ("u", "delta", "B", "C", "z") else v
            for k, v in _selective_args().items()}
    with pytest.raises(ValueError, match="^state "):
        selective_step(np.ones((2, 6, 4)), **args)
    with pytest.raises(ValueError, match="^B "):   # a step has no time-invariant (D, N) B
        selective_step(np.ones((2, 6, 3)), **{**args, "B": np.ones((6, 3))})


def test_scans_and_ssd_bad_arguments():
    a, b = np.ones((5, 2)), np.ones((5, 2))
    with pytest.raises(ValueError, match="^a "):
        scan_recurrent(np.ones((5, 3)), b)
    with pytest.raises(ValueError, match="^x0 "):
        scan_associative(a, b, np.ones(3))
    with pytest.raises(ValueError, match="^b "):
        scan_recurrent(np.ones(()), np.ones(()))
    with pytest.raises(TypeError, match="^chunk "):
        scan_chunked(a, b, chunk=2.0)
    X, a, B = np.ones((1, 8, 2, 3)), -np.ones((1, 8, 2)), np.ones((1, 8, 2, 4))
    with pytest.raises(ValueError, match="^X "):
        ssd_quadratic(X[0], a, B, B)
    with pytest.raises(ValueError, match="^a "):
        ssd_scan(X, a[:, :7], B, B)
    with pytest.raises(ValueError, match="^C "):
        ssd_chunked(X, a, B, B[..., :3], 4)
    with pytest.raises(ValueError, match="^initial_state "):
        ssd_chunked(X, a, B, B, 4, initial_state=np.ones((1, 2, 3, 3)))
    with pytest.raises(ValueError, match="^chunk "):
        ssd_chunked(X, a, B, B, 0)
    with pytest.raises(ValueError, match="^method "):
        ssd_scan(X, a, B, B, method="fast")
    with pytest.raises(ValueError, match="^dt "):
        discretize_ssd(X, np.ones((1, 8, 3)), np.ones(2))
