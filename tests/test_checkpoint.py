"""Tests for annotated_s4.checkpoint: saving and loading a model and its optimizer."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import checkpoint, train
from annotated_s4 import SSMLayer, StackedModel
from annotated_s4.checkpoint import write_history


def test_checkpoint_leaves_out_rnn_caches(tmp_path):
    """A model whose RNN-mode cache is set (after generating) saves the same
    arrays as a fresh one, and its checkpoint loads into a fresh model."""
    def make():
        return StackedModel(functools.partial(SSMLayer, N=2, L=8), 5, 4, 1, rngs=nnx.Rngs(0),
                            vocab_size=5, classification=False)

    m = make()
    m.init_cache(3)
    m.step(jnp.zeros((3,), jnp.int32))
    checkpoint.save_checkpoint(tmp_path, m)
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as f:
        assert not any("cache" in str(p) or "/Ab" in str(p) for p in f["paths"])
    checkpoint.load_checkpoint(tmp_path, make())


def test_checkpoint_roundtrip_and_mismatch(tmp_path):
    def make(h):
        m = StackedModel(functools.partial(SSMLayer, N=2, L=8), 3, h, 1, rngs=nnx.Rngs(h))
        return m, train.make_optimizer(m)

    m1, o1 = make(4)
    checkpoint.save_checkpoint(tmp_path, m1, o1, 7, {"note": "x"})
    m2, o2 = make(4)
    m2.decoder.bias[...] = m2.decoder.bias[...] + 1.0
    step, extra = checkpoint.load_checkpoint(tmp_path, m2, o2)
    assert step == 7 and extra == {"note": "x"}
    np.testing.assert_array_equal(m1.decoder.bias[...], m2.decoder.bias[...])
    m3, o3 = make(6)
    with pytest.raises(ValueError, match="shape|does not match"):
        checkpoint.load_checkpoint(tmp_path, m3, o3)
    with pytest.raises(FileNotFoundError):
        checkpoint.load_checkpoint(tmp_path / "nowhere", m1, o1)


def test_a_checkpoint_with_renamed_parameters_loads_under_their_new_names(tmp_path):
    """A checkpoint written before a rename (`checkpoint.RENAMED`: the step size
    was `log_step`, now `log_dt`) names the old parameter in its model's and its
    optimizer's paths; it loads into the current model and optimizer with
    every value as saved, whatever the order of its arrays."""
    def make(seed):
        m = StackedModel(functools.partial(SSMLayer, N=2, L=8), 3, 4, 2, rngs=nnx.Rngs(seed))
        return m, train.make_optimizer(m)

    m1, o1 = make(0)
    checkpoint.save_checkpoint(tmp_path, m1, o1, 5)
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as f:
        arrays = dict(f)
    paths = [str(p) for p in arrays["paths"]]
    assert sum("/log_dt/" in p for p in paths) > 2            # the model's and Adam's states
    old = [p.replace("/log_dt/", "/log_step/") for p in paths]
    order = np.random.default_rng(0).permutation(len(paths))  # another order as well
    leaves = {f"leaf_{j:05d}": arrays[f"leaf_{i:05d}"] for j, i in enumerate(order)}
    np.savez(tmp_path / "checkpoint.npz", **leaves, paths=np.array([old[i] for i in order]),
             step=arrays["step"], extra=arrays["extra"])
    m2, o2 = make(1)
    assert checkpoint.load_checkpoint(tmp_path, m2, o2)[0] == 5
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state((m1, o1))),
                    jax.tree_util.tree_leaves(nnx.state((m2, o2)))):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(m1.layers[0].seq.log_dt[...], make(1)[0].layers[0].seq.log_dt[...])


def test_a_checkpoint_stored_at_half_precision_loads_as_the_rounded_model(tmp_path):
    """dtype="float16" stores the real floating-point arrays rounded (integer
    state, such as dropout streams' counters, as it is); loading casts them back
    to the model's float32, giving exactly `round_weights`' model."""
    def make(seed):
        return StackedModel(functools.partial(SSMLayer, N=2, L=8), 3, 4, 1,
                            rngs=nnx.Rngs(seed), dropout=0.1)

    m = make(0)
    checkpoint.save_checkpoint(tmp_path, m, dtype="float16")
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as f:
        dtypes = {str(f[k].dtype) for k in f.files if k.startswith("leaf_")}
    assert "float16" in dtypes and "float32" not in dtypes and "uint32" in dtypes
    loaded = make(1)
    checkpoint.load_checkpoint(tmp_path, loaded)
    rounded = checkpoint.round_weights(m, "float16")
    a, b = nnx.state(rounded, nnx.Param), nnx.state(loaded, nnx.Param)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.dtype == y.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert any(np.any(np.asarray(x) != np.asarray(y)) for x, y in zip(
        jax.tree_util.tree_leaves(nnx.state(make(0), nnx.Param)),
        jax.tree_util.tree_leaves(a)))
    with pytest.raises(ValueError, match="dtype"):
        checkpoint.save_checkpoint(tmp_path, m, dtype="int8")


def test_history_is_written_compactly_and_reads_back_at_float32(tmp_path):
    rng = np.random.default_rng(0)
    losses = rng.random(500).astype(np.float32)
    history = {"step": list(range(1, 501)), "train_loss": [float(x) for x in losses],
               "seconds": list(rng.random(500) * 0.3),
               "eval": [{"step": 500, "loss": 0.25, "accuracy": 0.9}]}
    write_history(tmp_path, history)
    text = (tmp_path / "history.json").read_text()
    back = json.loads(text)
    assert len(text.splitlines()) == 6                     # braces and one line a key
    assert back["step"] == history["step"] and back["eval"] == history["eval"]
    np.testing.assert_array_equal(np.float32(back["train_loss"]), losses)   # exact in float32
    np.testing.assert_allclose(back["seconds"], history["seconds"], rtol=5e-4)
    assert len(text) < 0.6 * len(json.dumps(history, indent=1))
