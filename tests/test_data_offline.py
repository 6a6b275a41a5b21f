"""The offline datasets: sklearn digits as pixel sequences, and Python's own docs as text."""

import numpy as np
import pytest

from annotated_s4.data import DIGIT_LEVELS, batches, load_digits_sequences, load_text_corpus


def test_digits_classification_split():
    d = load_digits_sequences()
    assert d["x_train"].shape == (1438, 64, 1) and d["x_test"].shape == (359, 64, 1)
    assert d["x_train"].dtype == np.float32
    assert 0.0 <= d["x_train"].min() and d["x_train"].max() <= 1.0
    assert set(np.unique(d["y_train"])) == set(range(10))
    # Deterministic, and train/test do not overlap.
    again = load_digits_sequences()
    np.testing.assert_array_equal(d["x_test"], again["x_test"])
    train_rows = {row.tobytes() for row in d["x_train"]}
    overlap = sum(row.tobytes() in train_rows for row in d["x_test"])
    assert overlap < 5  # sklearn digits contain a handful of exact duplicates


def test_digits_784_upsampled_keeps_corners_and_range():
    small = load_digits_sequences(quantize=False)
    big = load_digits_sequences(side=28, quantize=False)
    assert big["x_train"].shape == (1438, 784, 1)
    img8 = small["x_train"][0, :, 0].reshape(8, 8)
    img28 = big["x_train"][0, :, 0].reshape(28, 28)
    for (i, j), (p, q) in [((0, 0), (0, 0)), ((0, 7), (0, 27)), ((7, 0), (27, 0)), ((7, 7), (27, 27))]:
        assert img28[p, q] == pytest.approx(img8[i, j])
    assert img28.min() >= 0 and img28.max() <= 1


def test_digits_quantized_tokens():
    d = load_digits_sequences(quantize=True)
    assert d["x_train"].shape == (1438, 64) and d["x_train"].dtype == np.int32
    assert d["x_train"].min() == 0 and d["x_train"].max() == DIGIT_LEVELS - 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(side=4), "side"), (dict(side=8.5), "side"), (dict(test_fraction=1.5), "test_fraction"),
])
def test_digits_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_digits_sequences(**kwargs)


def test_text_corpus():
    d = load_text_corpus()
    text = "".join(d["vocab"][i] for i in d["train"][:200])
    assert "statement" in text or "assert" in text  # English prose from the Python docs
    assert len(d["train"]) > 300_000 and len(d["valid"]) > 30_000
    assert d["train"].max() < len(d["vocab"]) and d["train"].dtype == np.int32
    with pytest.raises(ValueError, match="valid_fraction"):
        load_text_corpus(valid_fraction=0.0)


def test_batches_cover_each_epoch():
    gen = batches(np.random.default_rng(0), 10, 5)
    first_epoch = np.concatenate([next(gen), next(gen)])
    assert sorted(first_epoch) == list(range(10))
    with pytest.raises(ValueError, match="batch_size"):
        next(batches(np.random.default_rng(0), 10, 11))
