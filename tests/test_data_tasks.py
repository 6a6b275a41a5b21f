"""Tests for the synthetic recall tasks in annotated_s4.data."""

import numpy as np
import pytest

from annotated_s4.data import associative_recall, delayed_recall, induction_head


def test_induction_head_structure():
    x, y = induction_head(np.random.default_rng(0), 500, seq_len=30, vocab_size=20)
    assert x.shape == (500, 29) and y.shape == (500,)
    assert x.dtype == np.int32 and y.dtype == np.int32
    special = 19
    assert (x[:, -1] == special).all()
    assert ((x == special).sum(1) == 2).all()
    p = np.argmax(x == special, axis=1)
    assert (x[np.arange(500), p + 1] == y).all()
    assert (y < special).all() and (x >= 0).all()
    # the answer is not a constant: every ordinary token occurs
    assert len(np.unique(y)) == 19


def test_associative_recall_structure():
    x, y = associative_recall(np.random.default_rng(1), 500, seq_len=20, vocab_size=10)
    assert x.shape == (500, 19) and y.shape == (500,)
    keys, values = x[:, 0:-1:2], x[:, 1:-1:2]
    assert (keys < 5).all() and (values >= 5).all() and (values < 10).all()
    for i in range(500):
        pairs = {}
        for k, v in zip(keys[i], values[i]):
            assert pairs.setdefault(k, v) == v  # one value per key
        assert pairs[x[i, -1]] == y[i]
    assert len(np.unique(y)) == 5


def test_delayed_recall_structure():
    x, y = delayed_recall(np.random.default_rng(2), 500, seq_len=64, vocab_size=16)
    assert x.shape == (500, 63) and y.shape == (500,)
    assert x.dtype == np.int32 and y.dtype == np.int32
    assert (x[:, 0] == y).all() and (y < 8).all()                 # a signal token first
    assert (x[:, 1:] >= 8).all() and (x[:, 1:] < 16).all()        # then noise only
    assert len(np.unique(y)) == 8 and len(np.unique(x[:, 1:])) == 8


def test_tasks_are_deterministic():
    a = associative_recall(np.random.default_rng(3), 10)
    b = associative_recall(np.random.default_rng(3), 10)
    assert all((p == q).all() for p, q in zip(a, b))


@pytest.mark.parametrize("gen", [induction_head, associative_recall, delayed_recall])
def test_task_bad_arguments(gen):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n must be positive"):
        gen(rng, 0)
    with pytest.raises(ValueError, match="seq_len"):
        gen(rng, 4, seq_len=2)
    with pytest.raises(ValueError, match="vocab_size"):
        gen(rng, 4, vocab_size=2)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        gen(rng, 4, seq_len=20.0)


def test_associative_recall_needs_even_length():
    with pytest.raises(ValueError, match="even"):
        associative_recall(np.random.default_rng(0), 4, seq_len=21)
