"""The catalogue of sequence layers: each layer declares itself here, once.

A layer module registers each of its layers right after defining it:

    register_layer("s4d", S4DOptions, build_s4d, help="S4D: diagonal ...")

* ``S4DOptions`` is a frozen dataclass of the layer's options, each field made
  by `option` (its default, a one-line help, a check, allowed choices); the
  command line's options and config.json's ``"layer_options"`` are generated
  from it, and ``validate()`` refuses a bad value naming its flag.
* ``build(options, L)`` returns the layer factory ``factory(H, rngs=...)`` of
  the layer contract (`annotated_s4.models`) for sequences of length L, or a
  list of factories that the blocks use in turn.

A layer also declares which of its parameters are state-space parameters
(the state matrix, B, the step size Δ) by making them `SSMParam`s: training
(`annotated_s4.train`) finds them by that type and gives them their own
learning rate, without weight decay.

`LAYERS` maps each name to its `LayerEntry`. The package imports every layer
module (annotated_s4/__init__.py), so the catalogue is complete once the
package is imported; a layer defined elsewhere registers itself the same way
and is then a ``--layer`` like the others.
"""

from __future__ import annotations

import dataclasses
import typing

from flax import nnx

__all__ = ["LAYERS", "LayerEntry", "LayerOptions", "SSMParam", "option", "register_layer",
           "unregister_layer", "flag", "option_type"]


class SSMParam(nnx.Param):
    """A state-space parameter: the state matrix (A, or Lambda and P), the input
    vector B, the log step size log_dt. `train.make_optimizer` finds them by
    this type and trains them at their own learning rate, without weight decay."""


def option(default, help, *, check=None, choices=None):
    """A field of a layer's options: its default, one line of help, and how a
    value is checked (``check(value, flag)``, one of `_checks`' validators,
    skipped for None) or the values allowed (`choices`)."""
    return dataclasses.field(default=default, metadata={"help": help, "check": check,
                                                        "choices": choices})


def flag(name):
    """The command-line flag of an option: state_size -> --state-size."""
    return "--" + name.replace("_", "-")


def option_type(options_cls, name):
    """The type of an option (int, float, str or bool), from its annotation
    (``float | None`` is a float that may be None)."""
    kind = typing.get_type_hints(options_cls)[name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


@dataclasses.dataclass(frozen=True)
class LayerOptions:
    """The base of every layer's options: ``validate()`` runs each field's
    check and choices; a subclass adds the rules that tie fields together."""

    def validate(self):
        """Refuse a bad value with ValueError/TypeError naming its flag; returns self."""
        for f in dataclasses.fields(self):
            value, name = getattr(self, f.name), flag(f.name)
            if f.metadata["choices"] is not None and value not in f.metadata["choices"]:
                raise ValueError(f"{name} must be one of {list(f.metadata['choices'])}, "
                                 f"got {value!r}")
            if f.metadata["check"] is not None and value is not None:
                f.metadata["check"](value, name)
        return self


@dataclasses.dataclass(frozen=True)
class LayerEntry:
    """A registered layer: its name, options class, builder and help line."""

    name: str
    options: type
    build: typing.Callable
    help: str


LAYERS: dict[str, LayerEntry] = {}


def register_layer(name, options_cls, build, help):
    """Add layer `name` to the catalogue (see the module's docstring);
    returns its `LayerEntry`. A name already taken is refused."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if name in LAYERS:
        raise ValueError(f"a layer named {name!r} is already registered")
    if not (isinstance(options_cls, type) and issubclass(options_cls, LayerOptions)
            and "__dataclass_params__" in vars(options_cls)):  # itself a dataclass
        raise TypeError(f"options_cls of {name!r} must be a frozen dataclass subclassing "
                        f"LayerOptions, got {options_cls!r}")
    for f in dataclasses.fields(options_cls):
        if "help" not in f.metadata or f.default is dataclasses.MISSING:
            raise TypeError(f"option {f.name} of {name!r} must be made by catalog.option "
                            f"(a default and a help line)")
        if option_type(options_cls, f.name) not in (int, float, str, bool):
            raise TypeError(f"option {f.name} of {name!r} must be an int, float, str or bool")
    if not callable(build):
        raise TypeError(f"build of {name!r} must be callable, got {build!r}")
    LAYERS[name] = LayerEntry(name, options_cls, build, help)
    return LAYERS[name]


def unregister_layer(name):
    """Remove layer `name` from the catalogue (a layer defined for a while,
    as in a test)."""
    if name not in LAYERS:
        raise ValueError(f"no layer named {name!r} is registered")
    del LAYERS[name]
