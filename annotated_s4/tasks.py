"""Generated recall tasks: H3's induction head and associative recall,
delayed recall, a test of how long a layer remembers, Mamba's selective
copying, and Zoology's multi-query associative recall.

Every recall task is a batch of integer-token sequences whose last token is
the answer: the model reads x, the first seq_len - 1 tokens, and must predict
y, the token at position seq_len - 1. Accuracy is measured on that position
only. Selective copying has an answer of several tokens: y holds one row of
answers per sequence, and each answer is predicted after its own marker
token at the end of x. The tasks draw from the numpy Generator they are
given, so a seed fixes the data.

`most_frequent_token` is the baseline that reads no query: it answers the
candidate token that occurs most often in a sequence.
"""

from __future__ import annotations

import numpy as np

from . import _checks as checks

__all__ = ["induction_head", "delayed_recall", "associative_recall", "selective_copying",
           "multi_query_recall", "most_frequent_token"]


def _check_task_args(n, seq_len, vocab_size, min_len, min_vocab):
    checks.positive_int(n, "n")
    checks.positive_int(seq_len, "seq_len", minimum=min_len)
    checks.positive_int(vocab_size, "vocab_size", minimum=min_vocab)


def induction_head(rng, n, seq_len=30, vocab_size=20):
    """Induction-head sequences: after the special token, recall what followed it.

    Token ``vocab_size - 1`` is the special token; the other tokens are drawn
    uniformly from 0..vocab_size-2. The special token appears exactly twice:
    once at a random position p followed by the token y = x[p + 1], and once
    at the very end of x. The answer is y.

    Returns (x, y): x int32 of shape (n, seq_len - 1), y int32 of shape (n,).
    """
    _check_task_args(n, seq_len, vocab_size, 4, 3)
    special = vocab_size - 1
    x = rng.integers(0, special, size=(n, seq_len - 1))
    p = rng.integers(0, seq_len - 3, size=n)  # x[p + 1] lies before the final special
    rows = np.arange(n)
    x[rows, p] = special
    x[:, -1] = special
    y = x[rows, p + 1]
    return x.astype(np.int32), y.astype(np.int32)


def delayed_recall(rng, n, seq_len=256, vocab_size=16):
    """Remember the first token across the whole sequence.

    x[0] is one of the vocab_size // 2 *signal* tokens 0..vocab_size//2 - 1;
    the other tokens are *noise*, drawn from the remaining tokens. The answer
    is x[0], asked for after seq_len - 1 tokens: a model that reads causally
    must carry one token through its state for the whole length, and chance
    is 1 / (vocab_size // 2).

    Returns (x, y): x int32 of shape (n, seq_len - 1), y int32 of shape (n,).
    """
    _check_task_args(n, seq_len, vocab_size, 3, 4)
    n_signals = vocab_size // 2
    x = rng.integers(n_signals, vocab_size, size=(n, seq_len - 1))
    x[:, 0] = rng.integers(0, n_signals, size=n)
    x = x.astype(np.int32)
    return x, x[:, 0].copy()


def associative_recall(rng, n, seq_len=20, vocab_size=10):
    """Associative-recall sequences: key-value pairs, then a key; answer its value.

    Keys are the tokens 0..vocab_size//2 - 1, values the rest. Each sequence
    draws its own random map from keys to values, then (seq_len - 2) // 2
    pairs (key, value of that key) with keys drawn with replacement, then a
    query key that occurred among the pairs. The answer is its value, so the
    whole sequence (x, y) is seq_len tokens long: "a 2 c 4 b 3 d 1 a -> 2".

    Returns (x, y): x int32 of shape (n, seq_len - 1), y int32 of shape (n,).
    """
    _check_task_args(n, seq_len, vocab_size, 4, 4)
    if seq_len % 2:
        raise ValueError(f"seq_len must be even (pairs, a query and its answer), got {seq_len}")
    n_keys = vocab_size // 2
    n_values = vocab_size - n_keys
    n_pairs = (seq_len - 2) // 2
    mapping = rng.integers(0, n_values, size=(n, n_keys)) + n_keys  # key -> value token
    keys = rng.integers(0, n_keys, size=(n, n_pairs))
    rows = np.arange(n)[:, None]
    values = mapping[rows, keys]
    x = np.empty((n, seq_len - 1), dtype=np.int64)
    x[:, 0:-1:2] = keys
    x[:, 1:-1:2] = values
    query = keys[np.arange(n), rng.integers(0, n_pairs, size=n)]
    x[:, -1] = query
    y = mapping[np.arange(n), query]
    return x.astype(np.int32), y.astype(np.int32)


def selective_copying(rng, n, seq_len=64, vocab_size=10, n_tokens=8):
    """Selective copying: n_tokens data tokens scattered among noise, then
    copied out in order, one after each of n_tokens markers.

    Tokens 0..vocab_size-3 are data, vocab_size-2 is the noise token and
    vocab_size-1 the marker. x has seq_len tokens: a region of
    seq_len - n_tokens positions, n_tokens of them (drawn without replacement,
    a new draw per sequence) holding data tokens drawn uniformly and the rest
    noise, then n_tokens markers. y holds the data tokens in the order they
    occur. Where the data sit changes from sequence to sequence, so a layer
    whose kernel is the same for every input cannot fetch them by position:
    it must decide by content what to keep.

    Returns (x, y): x int32 of shape (n, seq_len), y int32 of shape (n, n_tokens).
    """
    checks.positive_int(n_tokens, "n_tokens")
    _check_task_args(n, seq_len, vocab_size, 2 * n_tokens, 3)
    noise, marker = vocab_size - 2, vocab_size - 1
    region = seq_len - n_tokens
    # n_tokens distinct positions per row, in increasing order: the first
    # n_tokens of a random permutation of the region, sorted
    where = np.sort(np.argsort(rng.random((n, region)), axis=1)[:, :n_tokens], axis=1)
    y = rng.integers(0, noise, size=(n, n_tokens))
    x = np.full((n, seq_len), noise)
    x[np.arange(n)[:, None], where] = y
    x[:, region:] = marker
    return x.astype(np.int32), y.astype(np.int32)


def _distinct(rng, n, pool, k):
    """k distinct integers from range(pool) for each of n rows, in random order (n, k)."""
    return np.argsort(rng.random((n, pool)), axis=1)[:, :k]


def multi_query_recall(rng, n, seq_len=24, vocab_size=64):
    """Multi-query associative recall (MQAR): D key-value pairs, then every key
    asked for once, in a new order; answer each with its value.

    Keys are the tokens 0..vocab_size//2 - 1, values the rest. With D =
    seq_len // 3, each sequence draws D distinct keys and D distinct values,
    pairs them, lists the pairs (2D tokens), then the D keys again in a random
    order (D tokens): "a 2 c 4 b 3 | c b a -> 4 3 2". y holds the D answers;
    answer i is predicted after query i, so all D pairs must be held at once,
    and read out D times, from a state that has seen each pair only once.

    Zoology's version (Arora et al. 2023) spreads the queries over a longer
    sequence at gaps drawn from a power law, with noise between them; here
    they follow the pairs directly, so seq_len sets only D.

    Returns (x, y): x int32 of shape (n, seq_len), y int32 of shape (n, D).
    """
    _check_task_args(n, seq_len, vocab_size, 3, 2)
    if seq_len % 3:
        raise ValueError(f"seq_len must be a multiple of 3 (D pairs and D queries), "
                         f"got {seq_len}")
    n_keys, D = vocab_size // 2, seq_len // 3
    if D > n_keys:
        raise ValueError(f"seq_len // 3 = {D} pairs need as many distinct keys, but "
                         f"vocab_size {vocab_size} has {n_keys}")
    keys = _distinct(rng, n, n_keys, D)
    values = _distinct(rng, n, vocab_size - n_keys, D) + n_keys
    order = _distinct(rng, n, D, D)                     # which pair each query asks for
    rows = np.arange(n)[:, None]
    x = np.empty((n, seq_len), dtype=np.int64)
    x[:, 0:2 * D:2], x[:, 1:2 * D:2] = keys, values
    x[:, 2 * D:] = keys[rows, order]
    return x.astype(np.int32), values[rows, order].astype(np.int32)


def most_frequent_token(x, candidates):
    """The answer of a rule that never compares the query with anything.

    For each sequence (row) of x, the token among `candidates` that occurs
    most often in it; a tie goes to the candidate listed first. On associative
    recall, with the value tokens as candidates, this is the value that occurs
    most often among the pairs: since several keys of a sequence can share a
    value, it is often the answer. On induction head, with the ordinary tokens
    as candidates, it is the most frequent ordinary token.

    x: int array (n, length); candidates: distinct ints, one dimension.
    Returns int32 of shape (n,).
    """
    x = np.asarray(checks.array(x, "x", ndim=2, kind="int"))
    candidates = np.asarray(checks.array(candidates, "candidates", ndim=1, kind="int"))
    if candidates.size == 0 or len(np.unique(candidates)) != candidates.size:
        raise ValueError(f"candidates must be distinct tokens, at least one, got {candidates}")
    counts = (x[:, :, None] == candidates).sum(axis=1)  # (n, candidates)
    return candidates[np.argmax(counts, axis=1)].astype(np.int32)
