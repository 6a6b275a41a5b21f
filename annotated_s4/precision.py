"""The arithmetic of float32 matrix products, and a way to see a GPU's on a CPU.

On an NVIDIA GPU of compute capability 8.0 or later (A100, H100, ...), JAX's
default matmul precision (`jax_default_matmul_precision` unset) lets XLA
multiply float32 matrices in TensorFloat-32: each operand is reduced to TF32
(float32's 8 exponent bits, 10 explicit mantissa bits: unit roundoff 2^-11 when
rounded to nearest, 2^-10 when the other bits are dropped, instead of float32's
2^-24), and the products are accumulated in float32. Convolutions
(`lax.conv_general_dilated`) may do the same; this package does not use them.
Which products go to TF32 is XLA's choice: JAX documents only that they may,
and XLA need not send every one (a matrix-vector product, say) to the tensor
cores. XLA's CPU backend ignores the setting and always multiplies in full
float32, so a float32 comparison tuned on a CPU can fail on a GPU.

- `round_to_tf32(x)` rounds float32 (or complex64) values to TF32, to nearest
  with ties to even.
- `emulate_tf32()` is a context manager under which every float32 and complex64
  `dot_general` (what `jnp.dot`, `@`, `jnp.einsum` and `nnx.Linear` compile to)
  whose effective precision is below `"highest"` rounds its operands to TF32
  (to nearest) first: every product in TF32, up to the order of the float32
  sums. This models one plausible GPU at that precision; hardware or kernels
  that drop the extra mantissa bits instead of rounding them err more.
- `matmul_unit_roundoff()` is the unit roundoff of a float32 matrix product on
  the default device at the precision in force, for tolerances derived from the
  arithmetic rather than tuned to one machine.

Setting the environment variable `ANNOTATED_S4_EMULATE_TF32=1` before
`import annotated_s4` switches the emulation on for the whole process (a test
run, a notebook kernel): the book then runs on a CPU with every float32
product rounded to TF32.
An accuracy measurement that holds only in float32 states it with
`with jax.default_matmul_precision("float32"):`, which the emulation honours.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.interpreters import mlir
from jax._src.lax import lax as _lax_internal

__all__ = ["round_to_tf32", "emulate_tf32", "emulating_tf32", "matmul_unit_roundoff",
           "FLOAT32_UNIT_ROUNDOFF", "TF32_UNIT_ROUNDOFF", "BF16_UNIT_ROUNDOFF"]

FLOAT32_UNIT_ROUNDOFF = 2.0**-24   # 23 explicit mantissa bits
TF32_UNIT_ROUNDOFF = 2.0**-11      # 10 explicit mantissa bits
BF16_UNIT_ROUNDOFF = 2.0**-8       # 7 explicit mantissa bits

# float32's 23 mantissa bits less TF32's 10: the bits that rounding clears.
_DROPPED_BITS = 13


def _round_float32(x):
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    # Round to nearest, ties to even: add half an ulp of TF32 less one, plus the
    # last kept bit, then clear the dropped bits. A carry out of the mantissa
    # steps the exponent up, as rounding up to the next binade should (and
    # the largest values round to infinity, as they should); infinities have
    # no dropped bits to round. NaNs are passed through (a carry could turn
    # them into infinities).
    lsb = (bits >> _DROPPED_BITS) & jnp.uint32(1)
    rounded = (bits + jnp.uint32((1 << (_DROPPED_BITS - 1)) - 1) + lsb) \
        & jnp.uint32(~((1 << _DROPPED_BITS) - 1) & 0xFFFFFFFF)
    return jnp.where(jnp.isnan(x), x, lax.bitcast_convert_type(rounded, jnp.float32))


@jax.custom_jvp
def round_to_tf32(x):
    """`x` (float32 or complex64) rounded to TF32's 10 explicit mantissa bits.

    Round to nearest, ties to even, with float32's exponent range: exact on
    values with at most 10 significant mantissa bits, relative error at most
    2^-11 otherwise; signs, zeros, infinities and NaNs are kept. The real and
    imaginary parts of a complex64 value are rounded separately. The derivative
    is taken to be the identity (the rounding's own derivative is zero almost
    everywhere, which would stop gradients through an emulated matmul).
    """
    x = jnp.asarray(x)
    if x.dtype == jnp.float32:
        return _round_float32(x)
    if x.dtype == jnp.complex64:
        return lax.complex(_round_float32(x.real), _round_float32(x.imag))
    raise TypeError(f"x must be float32 or complex64, got {x.dtype}")


@round_to_tf32.defjvp
def _round_to_tf32_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return round_to_tf32(x), t


# --- the emulation -----------------------------------------------------------

# Patching the function `jax.lax.dot_general` would not be enough: `jnp.einsum`
# keeps a reference to the original as a default argument, bound when JAX was
# imported. Wrapping the primitive's `bind` would catch every call, but would
# round the tangents of automatic differentiation inside the linear program that
# JAX then transposes, which it cannot. So the emulation acts where XLA's GPU
# backend does: when a program is lowered for the compiler, every `dot_general`
# (from `jnp.dot`, `@`, `jnp.einsum`, `nnx.Linear`, or a gradient's backward
# products) gets its operands rounded first, according to its `precision`
# parameter, which JAX resolved against `jax_default_matmul_precision` when it
# traced the product.
_DOT_GENERAL = _lax_internal.dot_general_p
_ROUNDED = (np.dtype(np.float32), np.dtype(np.complex64))
_depth = 0
_saved = {}


def _uses_tf32(precision):
    """Whether a GPU of compute capability >= 8.0 may multiply float32 in TF32
    at `precision` (the dot_general primitive's canonical parameter)."""
    if precision is None:
        return True
    if isinstance(precision, tuple) and all(isinstance(p, lax.Precision) for p in precision):
        return max(p.value for p in precision) < lax.Precision.HIGHEST.value
    preset = getattr(precision, "name", str(precision))
    return preset in ("DEFAULT", "TF32_TF32_F32")


def _round_plain(x):
    if x.dtype == jnp.complex64:
        return lax.complex(_round_float32(x.real), _round_float32(x.imag))
    return _round_float32(x)


def _rounding_rule(rule):
    """`rule`, a lowering of dot_general, with its operands rounded to TF32 first."""
    round_lowering = mlir.lower_fun(_round_plain, multiple_results=False)

    def lower(ctx, lhs, rhs, **params):
        avals = ctx.avals_in
        if _uses_tf32(params["precision"]) and all(a.dtype in _ROUNDED for a in avals):
            lhs, rhs = (round_lowering(ctx.replace(avals_in=[a], avals_out=[a]), x)[0]
                        for a, x in zip(avals, (lhs, rhs)))
        return rule(ctx, lhs, rhs, **params)
    return lower


def _switch(on):
    tables = [mlir._lowerings] + list(mlir._platform_specific_lowerings.values())
    if on:
        for table in tables:
            if _DOT_GENERAL in table:
                entry = table[_DOT_GENERAL]
                _saved[id(table)] = (table, entry)
                table[_DOT_GENERAL] = type(entry)(_rounding_rule(entry.rule), entry.inline)
    else:
        for table, entry in _saved.values():
            table[_DOT_GENERAL] = entry
        _saved.clear()
    # Programs traced or compiled before the switch would bypass (or keep) it.
    jax.clear_caches()


def emulating_tf32():
    """Whether float32 matrix products are being rounded to TF32 (see `emulate_tf32`)."""
    return _depth > 0


@contextlib.contextmanager
def emulate_tf32():
    """Multiply float32 and complex64 matrices as a GPU of compute capability >= 8.0
    may at most: every product in TF32.

    Inside the block, every `dot_general` whose effective precision (its
    `precision=` argument, else `jax_default_matmul_precision`) is below
    `"highest"`/`"float32"` rounds its float32 or complex64 operands to TF32
    (`round_to_tf32`) before multiplying; the products are accumulated in
    float32, as on the GPU. On a real GPU, XLA may compute some of these
    products in full float32; the emulation rounds them all (to nearest: a
    GPU kernel that truncates the operands errs more).
    Gradients go through (the backward products are rounded too). JAX's
    caches are cleared on entry and exit, so that programs compiled outside
    the block are traced again. Blocks nest.
    """
    global _depth
    if _depth == 0:
        _switch(True)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _switch(False)


def _emulate_from_environment():
    """`ANNOTATED_S4_EMULATE_TF32=1`: emulate TF32 for the rest of the process
    (called once, by `import annotated_s4`)."""
    value = os.environ.get("ANNOTATED_S4_EMULATE_TF32", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"ANNOTATED_S4_EMULATE_TF32 must be 0 or 1, got {value!r}")
    global _depth
    if value == "1" and not emulating_tf32():
        # not `emulate_tf32().__enter__()`: the generator would be closed, and the
        # emulation switched off, as soon as it is garbage-collected
        _switch(True)
        _depth += 1


# --- the unit roundoff -------------------------------------------------------

def _precision_in_force():
    """The canonical precision a `dot_general` without `precision=` gets now."""
    return _lax_internal.canonicalize_precision(None)


def matmul_unit_roundoff(device=None):
    """The unit roundoff of a float32 matrix product's operands on `device`
    (default: JAX's default device) at the precision in force.

    2^-24 (float32) on a CPU, and anywhere at `"highest"`/`"float32"` precision;
    2^-11 (TF32, rounded to nearest; a product XLA keeps in float32 does better)
    at lower precision on an NVIDIA GPU of compute capability 8.0 or later, and
    under `emulate_tf32()`; 2^-24 on older GPUs (such as a T4), which
    have no TF32; 2^-8 (bfloat16, one pass) at default precision on a TPU, 2^-16
    at `"high"` (three bfloat16 passes carry about 16 bits). The error of a
    product of length-n vectors is then at most about (n + 2) u |a|.|b|,
    the float32 sums' share being n 2^-24.
    """
    precision = _precision_in_force()
    highest = precision is not None and not _uses_tf32(precision)
    if highest:
        return FLOAT32_UNIT_ROUNDOFF
    if emulating_tf32():
        return TF32_UNIT_ROUNDOFF
    device = device if device is not None else jax.devices()[0]
    if device.platform == "gpu" or device.platform == "cuda":
        capability = getattr(device, "compute_capability", None)
        if capability is not None and float(capability) >= 8.0:
            return TF32_UNIT_ROUNDOFF
        return FLOAT32_UNIT_ROUNDOFF
    if device.platform == "tpu":
        if isinstance(precision, tuple) and max(p.value for p in precision) == lax.Precision.HIGH.value:
            return 2.0**-16
        return BF16_UNIT_ROUNDOFF
    return FLOAT32_UNIT_ROUNDOFF
