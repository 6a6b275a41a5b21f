"""Shared test set-up: import the package before any test computes, so that
its XLA flag (see annotated_s4/__init__.py) is set when the CPU backend starts."""

import annotated_s4  # noqa: F401
