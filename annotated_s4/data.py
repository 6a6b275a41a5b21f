"""Datasets that are real and install offline, plus generated tasks.

* `load_digits_sequences`: the 8x8 handwritten digits that ship with
  scikit-learn (1,797 images, 17 grey levels), read pixel by pixel as
  64-step sequences, or bilinearly upsampled to 28x28 = 784 steps.
* `load_text_corpus`: the Python documentation topics that ship with every
  Python (``pydoc_data.topics``), about 465k characters of English prose
  and code, for character-level language modelling.

Every split is deterministic (fixed seed) so that chapters and tests agree.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DIGIT_LEVELS",
    "load_digits_sequences",
    "load_text_corpus",
    "batches",
]

DIGIT_LEVELS = 17  # the sklearn digits take the integer values 0..16


def _upsample(images, size):
    """Bilinear resize of (n, h, w) images to (n, size, size) with numpy only."""
    n, h, w = images.shape
    ys = np.linspace(0, h - 1, size)
    xs = np.linspace(0, w - 1, size)
    y0 = np.floor(ys).astype(int)
    x0 = np.floor(xs).astype(int)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (ys - y0)[None, :, None]
    wx = (xs - x0)[None, None, :]
    top = images[:, y0][:, :, x0] * (1 - wx) + images[:, y0][:, :, x1] * wx
    bot = images[:, y1][:, :, x0] * (1 - wx) + images[:, y1][:, :, x1] * wx
    return top * (1 - wy) + bot * wy


def load_digits_sequences(side=8, test_fraction=0.2, seed=0, quantize=False):
    """The sklearn digits as pixel sequences of length side**2.

    Returns a dict with ``x_train``, ``y_train``, ``x_test``, ``y_test``.
    With ``quantize=False``, x has shape (n, side**2, 1), floats in [0, 1]
    (for classification). With ``quantize=True``, x has shape (n, side**2)
    with integer grey levels 0..16 (for next-pixel generation). ``side`` is 8
    (the original images) or larger (bilinear upsampling, e.g. 28 for 784 steps).
    """
    from sklearn.datasets import load_digits

    if not isinstance(side, int) or side < 8:
        raise ValueError(f"side must be an int >= 8 (the original size), got {side!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    digits = load_digits()
    images = digits.images.astype(np.float64)  # (1797, 8, 8), values 0..16
    if side != 8:
        images = _upsample(images, side)
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(test_fraction * len(images)))
    test, train = order[:n_test], order[n_test:]
    seqs = images.reshape(len(images), side * side)
    if quantize:
        x = np.clip(np.rint(seqs), 0, DIGIT_LEVELS - 1).astype(np.int32)
    else:
        x = (seqs / 16.0).astype(np.float32)[..., None]
    return {
        "x_train": x[train], "y_train": labels[train],
        "x_test": x[test], "y_test": labels[test],
    }


def load_text_corpus(valid_fraction=0.1):
    """Character-level text from the Python docs that ship with Python.

    Returns a dict with ``train`` and ``valid`` int32 arrays of character ids
    and ``vocab``, the sorted list of characters. The split is by position:
    the last ``valid_fraction`` of the text is held out.
    """
    import pydoc_data.topics

    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must lie in (0, 1), got {valid_fraction}")
    topics = pydoc_data.topics.topics
    text = "\n\n".join(topics[key] for key in sorted(topics))
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = np.array([index[ch] for ch in text], dtype=np.int32)
    cut = int(len(ids) * (1 - valid_fraction))
    return {"train": ids[:cut], "valid": ids[cut:], "vocab": vocab}


def batches(rng, n, batch_size):
    """Endless shuffled mini-batch index arrays over range(n) (epoch by epoch)."""
    if batch_size < 1 or batch_size > n:
        raise ValueError(f"batch_size must lie in [1, {n}], got {batch_size}")
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start:start + batch_size]
