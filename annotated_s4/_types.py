"""The array types of the shape annotations.

The signatures of the book's functions carry their shapes, written with
jaxtyping: ``Float[Array, "batch L H"]`` is a floating-point array of shape
(batch, L, H), and a name used twice in one call (N in A and in B) must be
the same size both times. Callers pass NumPy or JAX arrays, so `Array` is
either. The annotations document; nothing checks them while the package runs
(the tests do, with ``jaxtyping.jaxtyped`` and beartype).
"""

from __future__ import annotations

from typing import Union

import jax
import numpy as np
from jaxtyping import Complex, Float, Inexact, Int, Num, Real

__all__ = ["Array", "Scalar", "Complex", "Float", "Inexact", "Int", "Num", "Real"]

Array = Union[jax.Array, np.ndarray]
"""A JAX or a NumPy array."""

Scalar = Union[int, float, np.integer, np.floating, Real[Array, ""]]
"""A real number: a Python or NumPy scalar, or an array of shape ()."""
