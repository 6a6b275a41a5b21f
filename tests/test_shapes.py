"""The shape annotations of the book's functions and layers, checked.

The package writes shapes into its signatures with jaxtyping and checks
nothing while it runs. Here each annotated function is wrapped in
``jaxtyping.jaxtyped(typechecker=beartype)``: with consistent shapes it runs
and returns what its annotation says (checked again by hand), and with one
size out of line (B with another N than A, ...) the type checker refuses the
call before the function's own checks see it. Tiny shapes, eager calls.
"""

import functools
import importlib
import inspect
import pkgutil
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beartype import beartype
from flax import nnx
from jaxtyping import TypeCheckError, jaxtyped

import annotated_s4
from annotated_s4 import catalog
from annotated_s4.decoders import CacheDecoder, FFTDecoder, SSMDecoder
from annotated_s4.h3 import ShiftSSM
from annotated_s4.layers import SSMLayer
from annotated_s4.longconv import ToeplitzLayer
from annotated_s4.models import LastTokenModel, SequenceBlock, StackedModel
from annotated_s4.s4 import cauchy, discretize_diagonal, kernel_DPLR, vandermonde
from annotated_s4.ssm import K_conv, discretize, scan_SSM
from annotated_s4.toeplitz import etsc


def checked(fn):
    return jaxtyped(typechecker=beartype)(fn)


def shape_of(fn, *arrays, **static):
    """The shapes `fn` returns, traced (`jax.eval_shape`) under the type
    checker; the sizes, steps and flags in `static` stay Python values."""
    out = jax.eval_shape(functools.partial(checked(fn), **static), *arrays)
    return jax.tree.map(lambda x: x.shape, out)


N, L = 4, 6
rng = np.random.default_rng(0)
A = rng.standard_normal((N, N)) - 2 * np.eye(N)  # NumPy in, as readers pass
B, C = rng.standard_normal((N, 1)), rng.standard_normal((1, N))


def test_annotations_resolve():
    """Every name in the annotations is importable from its module's globals
    (the annotations are strings, under ``from __future__ import annotations``)."""
    fns = [discretize, scan_SSM, K_conv, discretize_diagonal, vandermonde, cauchy,
           kernel_DPLR, etsc]
    methods = [getattr(cls, m) for cls in _layer_classes() + [SequenceBlock, StackedModel]
               for m in ("__call__", "step")] + [LastTokenModel.__call__]
    for fn in fns + methods:
        hints = typing.get_type_hints(fn)
        assert "return" in hints and len(hints) > 1, fn.__qualname__


def test_discretize_scan_K_conv():
    Ab, Bb, Cb = checked(discretize)(A, B, C, 0.1)  # run, on NumPy arrays
    assert (Ab.shape, Bb.shape, Cb.shape) == ((N, N), (N, 1), (1, N))
    assert shape_of(scan_SSM, Ab, Bb, Cb, jnp.ones((L, 1)), jnp.zeros(N)) == ((N,), (L, 1))
    assert shape_of(K_conv, Ab, Bb, Cb, L=L) == (L,)
    with pytest.raises(TypeCheckError):  # B with N + 1 states
        checked(discretize)(A, np.ones((N + 1, 1)), C, 0.1)
    with pytest.raises(TypeCheckError):  # x0 with N + 1 states
        checked(scan_SSM)(Ab, Bb, Cb, jnp.ones((L, 1)), jnp.zeros(N + 1))
    with pytest.raises(TypeCheckError):  # u of width 2
        checked(scan_SSM)(Ab, Bb, Cb, jnp.ones((L, 2)), jnp.zeros(N))
    with pytest.raises(TypeCheckError):  # C a row of N - 1
        checked(K_conv)(Ab, Bb, Cb[:, 1:], L)


def test_discretize_diagonal():
    Lambda = -0.5 + 1j * np.arange(1, N + 1)
    for shape, dt in [((N,), 0.1), ((3, N), np.full((3, 1), 0.1))]:
        out = shape_of(discretize_diagonal, np.broadcast_to(Lambda, shape), np.ones(shape),
                       dt=dt)
        assert out == (shape, shape)
    with pytest.raises(TypeCheckError):  # B with N - 1 modes
        checked(discretize_diagonal)(Lambda, np.ones(N - 1), 0.1)
    with pytest.raises(TypeCheckError):  # a dt for 2 channels, Lambda of 3
        checked(discretize_diagonal)(np.ones((3, N)), np.ones((3, N)), np.ones((2, 1)))


def test_vandermonde():
    W, log_z = np.ones((3, N), complex), -0.1 + 1j * np.arange(N)
    assert shape_of(vandermonde, W, log_z, L=L) == (3, L)  # log_z broadcasts
    assert shape_of(vandermonde, W[0], log_z, L=L) == (L,)
    with pytest.raises(TypeCheckError):  # N + 1 weights for N modes
        checked(vandermonde)(np.ones((3, N + 1)), log_z, L)


def test_cauchy_and_kernel_DPLR():
    lambd, omega = -0.5 + 1j * np.arange(N), np.exp(1j * np.arange(5))
    assert shape_of(cauchy, np.ones(N), omega, lambd) == (5,)
    assert shape_of(cauchy, np.ones((2, N)), omega, lambd, conj=True) == (2, 5)
    with pytest.raises(TypeCheckError):  # v over N + 1 poles
        checked(cauchy)(np.ones((2, N + 1)), omega, lambd)
    v = np.ones(N, complex)
    for conj in (False, True):
        assert shape_of(kernel_DPLR, lambd, v, v, v, v, dt=0.1, L=L, conj=conj) == (L,)
    with pytest.raises(TypeCheckError):  # P of N - 1
        checked(kernel_DPLR)(lambd, v[1:], v, v, v, 0.1, L)


def test_etsc():
    n = 5
    assert shape_of(etsc, np.linspace(1.0, 0.0, n)) == ((n,), (n,))
    assert shape_of(etsc, np.ones((n, 2)), decay=0.9, half=True) == ((3,), (3, 2))
    with pytest.raises(TypeCheckError):  # a complex kernel: t is Float
        checked(etsc)(np.ones(n, complex))


def _layer_classes():
    """Every class of the package that defines a sequence layer's __call__ or
    step (a class with `init_cache`, outside `models`), found by walking the
    package's modules: a new layer module needs no entry here."""
    classes = []
    for info in pkgutil.iter_modules(annotated_s4.__path__):
        if info.name.startswith("__") or info.name == "models":
            continue
        module = importlib.import_module(f"annotated_s4.{info.name}")
        classes += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                    if cls.__module__ == module.__name__ and hasattr(cls, "init_cache")
                    and {"__call__", "step"} & set(vars(cls))]
    return classes


H, BATCH = 8, 2  # every registered layer's default heads divide H


def _layers():
    """{name: factory(H, rngs)}: each registered layer at its default options
    (the hybrid's two), and the layers that are parts of them or made by them."""
    made = {}
    for name, entry in catalog.LAYERS.items():
        built = entry.build(entry.options(), L)
        for i, factory in enumerate(built if isinstance(built, list) else [built]):
            made[f"{name}[{i}]" if isinstance(built, list) else name] = factory
    made["shift"] = functools.partial(ShiftSSM, N=3)
    made["toeplitz"] = functools.partial(ToeplitzLayer, L=L)
    made["etsc"] = lambda H, rngs: ToeplitzLayer(H, L, rngs=rngs).to_ssm(L)
    return made


LAYERS = _layers()


def _abstract(name):
    """Layer `name`, its parameters as shapes only (`nnx.eval_shape`)."""
    return nnx.eval_shape(lambda: LAYERS[name](H, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_call_and_step(name):
    """Traced, not run (`nnx.eval_shape`): the annotations are checked on the
    tracers' shapes, and nothing is compiled."""
    layer = _abstract(name)
    call, step = checked(type(layer).__call__), checked(type(layer).step)
    u = jnp.ones((BATCH, L, H))
    assert nnx.eval_shape(call, layer, u).shape == (BATCH, L, H)

    def first_step(layer, u_t):
        layer.init_cache(BATCH)
        return step(layer, u_t)

    assert nnx.eval_shape(first_step, layer, u[:, 0]).shape == (BATCH, H)
    with pytest.raises(TypeCheckError):  # one position without its batch axis
        call(layer, u[0])
    with pytest.raises(TypeCheckError):  # a whole sequence given to step
        step(layer, u)


def test_every_layer_class_is_tested():
    """Each class with an annotated __call__ or step has an instance above,
    and the search for those classes finds the class of every instance."""
    made = {type(_abstract(name)) for name in LAYERS}
    classes = _layer_classes()
    for cls in classes:
        assert any(issubclass(m, cls) for m in made), cls.__name__
    assert all(any(issubclass(m, cls) for cls in classes) for m in made)


def test_models():
    """The stacks around the layers: tokens or float inputs in, log-probabilities
    out, per position for a next-step model and per sequence for a classifier;
    a recall task's answer span from LastTokenModel."""
    V, D_IN = 5, 3
    layer = functools.partial(SSMLayer, N=2, L=L)
    lm = nnx.eval_shape(lambda: StackedModel(layer, V, H, 1, rngs=nnx.Rngs(0), vocab_size=V,
                                             classification=False))
    clf = nnx.eval_shape(lambda: StackedModel(layer, V, H, 1, rngs=nnx.Rngs(0), d_input=D_IN))
    call, step = checked(StackedModel.__call__), checked(StackedModel.step)
    tokens = jnp.zeros((BATCH, L), jnp.int32)
    assert nnx.eval_shape(call, lm, tokens).shape == (BATCH, L, V)
    assert nnx.eval_shape(call, clf, jnp.ones((BATCH, L, D_IN))).shape == (BATCH, V)

    def first_step(model, x):
        model.init_cache(BATCH)
        return step(model, x)

    assert nnx.eval_shape(first_step, lm, tokens[:, 0]).shape == (BATCH, V)
    block = checked(SequenceBlock.__call__)
    assert nnx.eval_shape(block, lm.layers[0], jnp.ones((BATCH, L, H))).shape == (BATCH, L, H)
    last = checked(LastTokenModel.__call__)
    assert nnx.eval_shape(last, LastTokenModel(lm), tokens).shape == (BATCH, V)
    assert nnx.eval_shape(last, LastTokenModel(lm, answer_len=2), tokens).shape == (BATCH, 2, V)
    with pytest.raises(TypeCheckError):  # one sequence without its batch axis
        call(lm, tokens[0])
    with pytest.raises(TypeCheckError):  # a whole sequence of tokens given to step
        step(lm, tokens)
    with pytest.raises(TypeCheckError):  # one position given to the block's __call__
        block(lm.layers[0], jnp.ones((BATCH, H)))


def test_decoders():
    """The decoders of `decoders`: one token of d channels per step, a whole
    (L, d) sequence per decode, and the cache a step returns has the shapes
    of the cache it was given."""
    n, d = 6, 3
    t = rng.standard_normal((n, d))
    for dec in (FFTDecoder(t), CacheDecoder(t), SSMDecoder(*etsc(t))):
        step, decode = checked(type(dec).step), checked(type(dec).decode)
        cache = dec.empty_cache()
        new, y_t = step(dec, cache, jnp.ones(d))
        assert y_t.shape == (d,)
        assert jax.tree.map(jnp.shape, new) == jax.tree.map(jnp.shape, cache)
        assert decode(dec, jnp.ones((n, d))).shape == (n, d)
        with pytest.raises(TypeCheckError):  # a batch of tokens, not one
            step(dec, cache, jnp.ones((2, d)))
    one = CacheDecoder(t[:, 0])          # one channel: a 1-D sequence is accepted
    assert checked(CacheDecoder.decode)(one, jnp.ones(n)).shape == (n, 1)
