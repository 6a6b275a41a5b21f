"""A training run's configuration: one dataclass, the single source of every
option's default and help text.

`RunConfig` generates the command line's options (`add_arguments`) and a
run's config.json (`recorded`, the options that define the run) and reads it
back (`from_recorded`). Its fields that are not recorded (logging,
checkpointing, the output directory) only say how a run is carried out.
The names of datasets and layers are the registry's
(`annotated_s4.registry`); this module checks values only.
"""

from __future__ import annotations

import dataclasses

from . import _checks as checks
from .checkpoint import CHECKPOINT_DTYPES
from .layers import S4_INITS, S4D_INITS

__all__ = ["RunConfig", "add_arguments", "from_namespace"]

# Keys a config.json may hold besides the recorded options: the hash of the
# text a language model was trained on (the registry's charlm dataset).
EXTRA_KEYS = ("corpus_sha256",)


def _option(default, help, group, record=True):
    return dataclasses.field(default=default,
                             metadata={"help": help, "group": group, "record": record})


_MODEL, _TRAINING = "data and model", "training"


@dataclasses.dataclass
class RunConfig:
    """The options of one training run (their help texts are the fields')."""

    dataset: str = _option("digits", "the dataset (see the list of names and what each is "
                           "below the options)", _MODEL)
    layer: str = _option("s4", "the sequence layer; hybrid: H3 and attention alternating; "
                         "tnn, sgconv: the long convolutions of chapter 8; gru: a gated RNN",
                         _MODEL)
    n_layers: int = _option(2, "number of residual blocks", _MODEL)
    d_model: int = _option(32, "width H of the model (channels of every block)", _MODEL)
    state_size: int = _option(16, "N, the SSM state size (a real dimension: N/2 complex "
                              "modes for the diagonal layers and H3)", _MODEL)
    dt_min: float = _option(0.001, "smallest initial SSM step size (log-uniform in "
                            "[dt-min, dt-max])", _MODEL)
    dt_max: float = _option(0.1, "largest initial SSM step size", _MODEL)
    init: str | None = _option(None, "the state matrix's initialisation: for s4, hippo "
                               "(default), random (HiPPO's scale, random frequencies) or "
                               "gaussian (a random Gaussian matrix in NPLR form, the S4 "
                               "paper's ablation); for s4d, lin (default) or inv", _MODEL)
    b_clip: float | None = _option(None, "s4 only: clip the imaginary part of B (in the "
                                   "DPLR basis) to +-B_CLIP at initialisation, as the S4 "
                                   "authors' code does (B_clip = 2)", _MODEL)
    independent: bool = _option(False, "s4 only: every channel its own Lambda, P, B (the S4 "
                                "paper's layer) instead of one copy shared by the channels",
                                _MODEL)
    head_dim: int = _option(8, "H3 head dimension d_h", _MODEL)
    n_heads: int = _option(4, "attention heads", _MODEL)
    vocab_size: int | None = _option(None, "vocabulary of the recall tasks (default: 20 for "
                                     "induction-head, 10 for associative-recall, as in the "
                                     "H3 paper; 16 for delayed-recall)", _MODEL)
    seq_len: int | None = _option(None, "sequence length of the recall tasks (default: 30 "
                                  "for induction-head, 20 for associative-recall, 256 for "
                                  "delayed-recall) and of the charlm windows (default 128)",
                                  _MODEL)
    seed_data: int = _option(0, "seed of the train/test split (or of the generated data)",
                             _MODEL)
    steps: int = _option(500, "training steps", _TRAINING)
    batch_size: int = _option(64, "sequences per step (split over the devices)", _TRAINING)
    lr: float = _option(3e-3, "peak learning rate (AdamW, cosine schedule)", _TRAINING)
    ssm_lr: float = _option(1e-3, "learning rate of the state-space parameters (A or Lambda, "
                            "P, B, log step), trained without weight decay (S4's recipe); 0: "
                            "train them like every other parameter", _TRAINING)
    weight_decay: float = _option(0.01, "AdamW weight decay", _TRAINING)
    ssm_weight_decay: float = _option(0.0, "AdamW weight decay of the state-space parameters "
                                      "when they have their own group (--ssm-lr above 0); "
                                      "S4's recipe: 0", _TRAINING)
    dropout: float = _option(0.0, "dropout rate in every block", _TRAINING)
    seed: int = _option(0, "model init and batch order", _TRAINING)
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

    def check(self):
        """Refuse impossible values, naming the option; returns self."""
        for name in ("n_layers", "d_model", "state_size", "head_dim", "n_heads", "steps",
                     "batch_size", "log_every"):
            checks.positive_int(getattr(self, name), _flag(name))
        for name in ("seq_len", "vocab_size"):
            if getattr(self, name) is not None:
                checks.positive_int(getattr(self, name), _flag(name))
        for name in ("eval_every", "ckpt_every", "seed", "seed_data"):
            checks.positive_int(getattr(self, name), _flag(name), minimum=0)
        checks.number(self.weight_decay, "--weight-decay", low=0.0)
        checks.number(self.lr, "--lr", low=0.0, low_open=True)
        checks.number(self.ssm_lr, "--ssm-lr", low=0.0)
        checks.number(self.ssm_weight_decay, "--ssm-weight-decay", low=0.0)
        if self.ssm_weight_decay and not self.ssm_lr:
            raise ValueError("--ssm-weight-decay needs --ssm-lr above 0 (with --ssm-lr 0 every "
                             "parameter trains with --weight-decay)")
        checks.number(self.dropout, "--dropout", low=0.0, high=1.0, high_open=True)
        checks.number(self.dt_min, "--dt-min", low=0.0, low_open=True)
        checks.number(self.dt_max, "--dt-max", low=self.dt_min)
        inits = {"s4": tuple(S4_INITS), "s4d": tuple(S4D_INITS)}
        if self.init is not None and self.init not in inits.get(self.layer, ()):
            raise ValueError(f"--init {self.init} does not apply to --layer {self.layer} "
                             f"(choices: {', '.join(f'{k}: {v}' for k, v in inits.items())})")
        if self.b_clip is not None:
            checks.number(self.b_clip, "--b-clip", low=0.0, low_open=True)
            if self.layer != "s4":
                raise ValueError(f"--b-clip applies to --layer s4 only, not {self.layer}")
        if self.independent and self.layer != "s4":
            raise ValueError(f"--independent applies to --layer s4 only, not {self.layer}")
        if self.checkpoint_dtype is not None and self.checkpoint_dtype not in CHECKPOINT_DTYPES:
            raise ValueError(f"--checkpoint-dtype must be one of {list(CHECKPOINT_DTYPES)}, "
                             f"got {self.checkpoint_dtype!r}")
        if self.resume and not self.out:
            raise ValueError("--resume needs --out DIR")
        return self

    def recorded(self):
        """The options that define the run, as config.json records them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["record"]}

    @classmethod
    def from_recorded(cls, config, source="config.json"):
        """The configuration a config.json dict records (other options at their
        defaults); a key this code does not know is refused."""
        known = {f.name for f in dataclasses.fields(cls) if f.metadata["record"]}
        unknown = sorted(set(config) - known - set(EXTRA_KEYS))
        if unknown:
            raise ValueError(f"{source} has options this code does not know: {unknown}")
        return cls(**{k: v for k, v in config.items() if k in known})


def _flag(name):
    return "--" + name.replace("_", "-")


def add_arguments(parser, choices=None):
    """Add every field of `RunConfig` to `parser` as an option, in argument
    groups ("data and model", "training"); `choices` maps a field to its
    allowed values (the registry's dataset and layer names)."""
    choices = choices or {}
    groups = {}
    for f in dataclasses.fields(RunConfig):
        title = f.metadata["group"]
        group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
        kwargs = {"default": f.default, "help": f.metadata["help"], "dest": f.name}
        kind = f.type.split(" |")[0]  # the annotation's text: int, float, str, bool
        if kind == "bool":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = {"int": int, "float": float, "str": str}[kind]
            kwargs["metavar"] = f.name.upper()
        if f.name in choices:
            kwargs["choices"] = sorted(choices[f.name])
            kwargs.pop("metavar", None)
        group.add_argument(_flag(f.name), **kwargs)
    return parser


def from_namespace(namespace):
    """The `RunConfig` of parsed arguments (ignoring attributes it has no field for)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(**{k: v for k, v in vars(namespace).items() if k in names})
