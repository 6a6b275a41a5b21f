"""A training run's configuration: one dataclass, the single source of every
option's default and help text.

`RunConfig` holds the options every run has, the name of its layer and that
layer's options: an instance of the options class the layer registered
(`annotated_s4.catalog`). It generates the command line's options
(`add_arguments`, and `add_layer_arguments` for a layer's) and a run's
config.json (`recorded`: the options that define the run, the layer's under
"layer_options") and reads it back (`from_recorded`, which also reads the
flat config.json of the runs made before the layers declared their options).
Its fields that are not recorded (logging, checkpointing, the output
directory) only say how a run is carried out. The names of datasets are the
registry's (`annotated_s4.registry`); this module checks values only.
"""

from __future__ import annotations

import dataclasses

from . import _checks as checks
from .catalog import LAYERS, LayerOptions, flag, option_type
from .checkpoint import CHECKPOINT_DTYPES
from .train import SCHEDULES

__all__ = ["RunConfig", "add_arguments", "add_layer_arguments", "from_namespace",
           "layer_options"]

# Keys a config.json may hold besides the recorded options: the hash of the
# text a language model was trained on (the registry's charlm dataset).
EXTRA_KEYS = ("corpus_sha256",)

# The layers' options that config.json held at the top level before each
# layer declared its own, with their defaults then. `from_recorded` moves the
# ones a run's layer takes into its options; the others were never read by
# that layer's builder (attention runs recorded a --state-size, for one), and
# are dropped.
FLAT_LAYER_OPTIONS = {"state_size": 16, "dt_min": 0.001, "dt_max": 0.1, "init": None,
                      "b_clip": None, "independent": False, "head_dim": 8, "n_heads": 4}


def _option(default, help, group, record=True, cli=True):
    return dataclasses.field(default=default, metadata={"help": help, "group": group,
                                                        "record": record, "cli": cli})


_MODEL, _TRAINING = "data and model", "training"


@dataclasses.dataclass
class RunConfig:
    """The options of one training run (their help texts are the fields').
    `layer_options` None means the layer's defaults."""

    dataset: str = _option("digits", "the dataset (see the list of names and what each is "
                           "below the options)", _MODEL)
    layer: str = _option("s4", "the sequence layer (each layer's options are listed below "
                         "the options)", _MODEL)
    layer_options: LayerOptions | None = _option(None, "the layer's options", _MODEL, cli=False)
    n_layers: int = _option(2, "number of residual blocks", _MODEL)
    d_model: int = _option(32, "width H of the model (channels of every block)", _MODEL)
    vocab_size: int | None = _option(None, "vocabulary of the recall tasks (default: the "
                                     "task's, listed with the datasets below)", _MODEL)
    seq_len: int | None = _option(None, "sequence length of the recall tasks and of the charlm "
                                  "windows (default: the dataset's, listed below)", _MODEL)
    seed_data: int = _option(0, "seed of the train/test split (or of the generated data)",
                             _MODEL)
    steps: int = _option(500, "training steps", _TRAINING)
    batch_size: int = _option(64, "sequences per step (split over the devices)", _TRAINING)
    lr: float = _option(3e-3, "peak learning rate (AdamW; see --schedule)", _TRAINING)
    warmup: int = _option(0, "steps over which the learning rates rise linearly from 0 to "
                          "their peaks before the cosine decay (0: start at the peaks)",
                          _TRAINING)
    schedule: str = _option("cosine", "the learning rates after the warm-up: cosine (decay to "
                            "1%% of the peak at the last step) or constant (no decay)",
                            _TRAINING)
    ssm_lr: float = _option(1e-3, "learning rate of the state-space parameters (A or Lambda, "
                            "P, B, log dt), trained without weight decay (S4's recipe); 0: "
                            "train them like every other parameter", _TRAINING)
    weight_decay: float = _option(0.01, "AdamW weight decay", _TRAINING)
    ssm_weight_decay: float = _option(0.0, "AdamW weight decay of the state-space parameters "
                                      "when they have their own group (--ssm-lr above 0); "
                                      "S4's recipe: 0", _TRAINING)
    dropout: float = _option(0.0, "dropout rate in every block", _TRAINING)
    seed: int = _option(0, "model init, dropout masks and batch order", _TRAINING)
    checkpoint_dtype: str | None = _option(
        None, "store the finished run's weights at this precision (float16: half the "
        "file); its final metrics are then computed from the rounded weights, so that "
        "the run is what its checkpoint holds (default: the model's own, float32)",
        _TRAINING)
    eval_every: int = _option(0, "evaluate on the test split every this many steps (0: at "
                              "the end)", _TRAINING, record=False)
    log_every: int = _option(50, "print the training loss every this many steps",
                             _TRAINING, record=False)
    ckpt_every: int = _option(100, "save a checkpoint every this many steps (and at the "
                              "end)", _TRAINING, record=False)
    out: str | None = _option(None, "output directory: checkpoint.npz, config.json, "
                              "history.json, metrics.json", _TRAINING, record=False)
    resume: bool = _option(False, "continue from OUT/checkpoint.npz if it exists",
                           _TRAINING, record=False)


    def __post_init__(self):
        if self.layer_options is None and self.layer in LAYERS:
            self.layer_options = LAYERS[self.layer].options()

    def check(self):
        """Refuse impossible values, naming the option; returns self."""
        if self.layer not in LAYERS:
            raise ValueError(f"--layer must be one of {sorted(LAYERS)}, got {self.layer!r}")
        expected = LAYERS[self.layer].options
        if type(self.layer_options) is not expected:
            raise TypeError(f"layer_options must be {expected.__name__} (the options of "
                            f"--layer {self.layer}), got {self.layer_options!r}")
        self.layer_options.validate()
        for name in ("n_layers", "d_model", "steps", "batch_size", "log_every"):
            checks.positive_int(getattr(self, name), flag(name))
        for name in ("seq_len", "vocab_size"):
            if getattr(self, name) is not None:
                checks.positive_int(getattr(self, name), flag(name))
        for name in ("eval_every", "ckpt_every", "seed", "seed_data", "warmup"):
            checks.positive_int(getattr(self, name), flag(name), minimum=0)
        if self.warmup >= self.steps:
            raise ValueError(f"--warmup must be below --steps ({self.steps}), got {self.warmup}")
        checks.number(self.weight_decay, "--weight-decay", low=0.0)
        checks.number(self.lr, "--lr", low=0.0, low_open=True)
        checks.number(self.ssm_lr, "--ssm-lr", low=0.0)
        checks.number(self.ssm_weight_decay, "--ssm-weight-decay", low=0.0)
        if self.ssm_weight_decay and not self.ssm_lr:
            raise ValueError("--ssm-weight-decay needs --ssm-lr above 0 (with --ssm-lr 0 every "
                             "parameter trains with --weight-decay)")
        checks.number(self.dropout, "--dropout", low=0.0, high=1.0, high_open=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.checkpoint_dtype is not None and self.checkpoint_dtype not in CHECKPOINT_DTYPES:
            raise ValueError(f"--checkpoint-dtype must be one of {list(CHECKPOINT_DTYPES)}, "
                             f"got {self.checkpoint_dtype!r}")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out DIR")
        return self

    def recorded(self):
        """The options that define the run, as config.json records them (the
        layer's as a dict under "layer_options")."""
        recorded = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.metadata["record"]}
        recorded["layer_options"] = dataclasses.asdict(self.layer_options)
        return recorded

    @classmethod
    def from_recorded(cls, config, source="config.json"):
        """The configuration a config.json dict records (other options at their
        defaults); a key this code does not know is refused. A flat
        config.json (the layer's options at the top level) is migrated first."""
        if "layer_options" not in config:
            config = _migrate(config)
        known = {f.name for f in dataclasses.fields(cls) if f.metadata["record"]}
        unknown = sorted(set(config) - known - set(EXTRA_KEYS))
        if unknown:
            raise ValueError(f"{source} has options this code does not know: {unknown}")
        values = {k: v for k, v in config.items() if k in known}
        layer = values.get("layer", cls.layer)
        if layer not in LAYERS:
            raise ValueError(f"{source} names a layer this code does not know: {layer!r} "
                             f"(the layers: {sorted(LAYERS)})")
        values["layer_options"] = layer_options(layer, values["layer_options"], source)
        return cls(**values)


def layer_options(layer, values, source="layer_options"):
    """The options of `layer` (a registered name) from the dict `values`, the
    others at their defaults; an option that the layer does not take is refused."""
    cls = LAYERS[layer].options
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"{source}: --layer {layer} has no option {unknown} (its options: "
                         f"{names or 'none'})")
    return cls(**values)


def _migrate(config):
    """A flat config.json (made before "layer_options") in the present layout:
    each old per-layer key that the layer's options know moves into them (None
    for an option whose default is not None meant the layer's default); the
    others are dropped (the layer's builder never read them)."""
    config = dict(config)
    layer = config.get("layer", RunConfig.layer)
    defaults = ({f.name: f.default for f in dataclasses.fields(LAYERS[layer].options)}
                if layer in LAYERS else {})
    options = {}
    for name in FLAT_LAYER_OPTIONS:
        value = config.pop(name, None)
        if name in defaults and not (value is None and defaults[name] is not None):
            options[name] = value
    config["layer_options"] = options
    return config


def add_arguments(parser, choices=None):
    """Add every field of `RunConfig` to `parser` as an option, in argument
    groups ("data and model", "training"); `choices` maps a field to its
    allowed values (the registry's dataset and layer names). The layer's own
    options are parsed once --layer is known (`add_layer_arguments`)."""
    choices = choices or {}
    groups = {}
    for f in dataclasses.fields(RunConfig):
        if not f.metadata["cli"]:
            continue
        title = f.metadata["group"]
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        kwargs = _argument(RunConfig, f)
        if f.name in choices:
            kwargs["choices"] = sorted(choices[f.name])
            kwargs.pop("metavar", None)
        group.add_argument(flag(f.name), **kwargs)
    return parser


def add_layer_arguments(parser, layer):
    """Add the options of `layer` (a registered name), generated from its
    options class, to `parser` (or an argument group)."""
    cls = LAYERS[layer].options
    for f in dataclasses.fields(cls):
        kwargs = _argument(cls, f)
        if f.metadata["choices"] is not None:
            kwargs["choices"] = list(f.metadata["choices"])
            kwargs.pop("metavar")
        parser.add_argument(flag(f.name), **kwargs)
    return parser


def _argument(cls, f):
    """argparse's keywords for the field `f` of the dataclass `cls`."""
    kwargs = {"default": f.default, "help": f.metadata["help"], "dest": f.name}
    kind = option_type(cls, f.name)
    if kind is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs["type"], kwargs["metavar"] = kind, f.name.upper()
    return kwargs


def from_namespace(namespace, layer_options=None):
    """The `RunConfig` of parsed arguments (ignoring attributes it has no field
    for) with the layer's options `layer_options` (None: its defaults)."""
    names = {f.name for f in dataclasses.fields(RunConfig) if f.metadata["cli"]}
    return RunConfig(**{k: v for k, v in vars(namespace).items() if k in names},
                     layer_options=layer_options)
