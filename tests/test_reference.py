"""The committed reference runs: each is re-evaluated from its checkpoint and
must reproduce its recorded metrics (here, or for the sequential-MNIST runs and
the language models on the pages that report them, which `make test` executes);
one is replayed from its config."""

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from annotated_s4 import SSMLayer, StackedModel, reference, registry, runner, runs, train
from annotated_s4.config import RunConfig


def test_the_runs_are_committed_with_their_files():
    names = reference.available()
    assert "digits64-s4" in names
    for name in names:
        with open(os.path.join(reference.run_dir(name), "config.json")) as f:
            config = json.load(f)
        assert config["dataset"] == reference.RUNS[name][1], name
        with np.load(os.path.join(reference.run_dir(name), "checkpoint.npz"),
                     allow_pickle=False) as ckpt:
            assert "paths" in ckpt.files


# The pages that report the most expensive runs re-evaluate each of them from its
# checkpoint and assert that it reproduces its recorded metrics, and `make test`
# executes the pages; evaluating them here as well would double the most
# expensive evaluations of the suite (784 steps over 1,000 held-out digits for
# each sequential-MNIST run, held-out text for each language model). Here: the
# pages, and which runs they must re-evaluate (named in their code).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RE_EVALUATED_BY_PAGES = {
    ("06a_sequential_mnist.md", "06a2_mnist_ablations.md", "06b_memory.md",
     "06c_generation.md"):
        lambda name: (reference.RUNS[name][1] in ("mnist-small", "mnist-small-permuted",
                                                  "mnist-small-gen")
                      or name.startswith("memory1024-const-")),
    ("07c_language_model.md",):
        lambda name: name.startswith("charlm-") and not name.startswith("charlm-mamba"),
    ("08c_tables.md",):
        lambda name: name in ("tnn-charlm", "sgconv-charlm"),
    ("10_selection.md",):
        lambda name: name.startswith(("selective-copying-", "induction64-", "charlm-mamba")),
    ("11_duality.md",):
        lambda name: name.startswith("mqar-"),
}


def _checked_by_a_page(name):
    return any(runs(name) for runs in RE_EVALUATED_BY_PAGES.values())


def _code(page):
    with open(os.path.join(ROOT, "book", page)) as f:
        return "".join(re.findall(r"^```\{code-cell\}.*?^```$", f.read(), re.S | re.M))


@pytest.mark.parametrize("pages", list(RE_EVALUATED_BY_PAGES), ids=lambda p: p[0])
def test_the_pages_re_evaluate_their_runs(pages):
    code = ""
    for page in pages:
        page_code = _code(page)
        # each page compares what it re-evaluates with what was recorded
        assert any(f"{check}(" in page_code for check in (
            "reference.compare", "reevaluate_classifier", "reevaluate_language_model")), page
        code += page_code
    names = [n for n in reference.available() if RE_EVALUATED_BY_PAGES[pages](n)]
    assert len(names) >= 2
    # a family of seeds is named by its seed-0 run, the others by the family's seeds
    missing = [n for n in names if f'"{re.sub(r"-seed[0-9]+$", "", n)}"' not in code]
    assert not missing, f"add {missing} to the runs that {pages} re-evaluate"


def test_chapter_6_reports_the_sequential_mnist_runs():
    names = reference.available()
    assert "mnist-s4" in names and "mnist-gen-s4" in names
    assert _checked_by_a_page("mnist-s4") and not _checked_by_a_page("digits64-s4")


@pytest.mark.parametrize("name", [n for n in reference.available() if not _checked_by_a_page(n)])
def test_reference_run_reproduces_its_metrics(name):
    failed = reference.check([name], log=lambda *_: None)
    assert not failed, (f"{name}: the code no longer reproduces {failed}; if the change "
                        f"is intended, run `make reference RUN={name}`")


def _replay(name, n_steps):
    """The training losses of the first `n_steps` steps of run `name`, retrained
    from its config.json (same initialisation, batches and schedule), beside
    the losses its history.json recorded: (replayed, recorded)."""
    directory = reference.run_dir(name)
    recorded = runner.read_run(directory)
    config = runner.read_config(recorded["config"], directory)
    data = registry.load_dataset(config)
    model = registry.build_model(config, data)
    # The optimiser's schedule spans the run's steps; fit stops after n_steps.
    optimizer = registry.build_optimizer(config, model)
    with jax.default_matmul_precision("float32"):   # as the CPU that recorded it multiplied
        history = train.fit(model, data, steps=n_steps,
                            batch_size=config.batch_size, seed=config.seed, log=None,
                            optimizer=optimizer)
    return history["train_loss"], recorded["history"]["train_loss"][:n_steps]


def test_a_reference_run_is_replayed_from_its_config():
    """The first 20 steps retrained from config.json give the losses that
    history.json recorded: the checkpoint comes from this code. Retrained at
    float32 matmul precision, as the CPU that recorded them multiplied: with
    every product's operands rounded to TF32 (2^-11) instead, the 20 losses
    move by up to 1.1e-4 (relative), so a device that only sums float32 in
    another order (about 2^-24 per operation) stays far inside 1e-5."""
    replayed, recorded = _replay("digits64-s4", n_steps=20)
    assert len(replayed) == len(recorded) == 20
    np.testing.assert_allclose(replayed, recorded, rtol=1e-5, atol=1e-5)


def test_the_manifest_records_every_committed_run():
    """The package's manifest (what `locate` checks downloads against) holds
    the SHA-256 of every file of every committed run: retraining a run without
    `make reference` (which rewrites it) fails here."""
    with open(reference.MANIFEST) as f:
        assert json.load(f) == reference.manifest()


def test_the_download_url_is_the_books_repository():
    import yaml

    with open(os.path.join(ROOT, "_config.yml")) as f:
        repo = yaml.safe_load(f)["repository"]
    owner_name = repo["url"].removeprefix("https://github.com/")
    assert reference.RAW_URL == (f"https://raw.githubusercontent.com/{owner_name}/"
                                 f"{repo['branch']}/")


def test_locate_downloads_a_missing_run_and_checks_it(tmp_path, monkeypatch):
    """Without the repository's runs (a pip install), a run is fetched from
    the repository URL into the cache; here the "repository" is a local
    directory read through file:// URLs, so the test stays offline."""
    import shutil

    server = tmp_path / "server"
    shutil.copytree(reference.run_dir("digits64-s4"), server / "reference_runs" / "digits64-s4")
    monkeypatch.setenv("ANNOTATED_S4_CACHE", str(tmp_path / "cache"))
    url = server.as_uri() + "/"
    empty = tmp_path / "no-runs"
    found = reference.locate("digits64-s4", root=str(empty), url=url)
    assert found == str(tmp_path / "cache" / "reference_runs" / "digits64-s4")
    with open(os.path.join(found, "metrics.json")) as a, \
            open(os.path.join(reference.run_dir("digits64-s4"), "metrics.json")) as b:
        assert a.read() == b.read()
    # The repository copy is used where it exists.
    assert reference.locate("digits64-s4") == reference.run_dir("digits64-s4")
    # A corrupted download is refused, naming the file.
    shutil.rmtree(tmp_path / "cache")
    (server / "reference_runs" / "digits64-s4" / "history.json").write_text("{}")
    with pytest.raises(RuntimeError, match="history.json: sha256"):
        reference.locate("digits64-s4", root=str(empty), url=url)


def test_unknown_run_names_are_refused():
    with pytest.raises(ValueError, match="no reference run named"):
        reference.check(["no-such-run"])


def test_the_synthetic_seeds_differ_from_seed_0_in_the_seeds_only():
    """Chapter 7's table reports a spread over seeds: each seed's run is its
    seed-0 run with --seed k and --seed-data 2k, nothing else changed; H3
    without its shift is H3's run with --shift-size 1."""
    for task in ("induction-head", "associative-recall"):
        for layer in ("s4d", "h3", "attention"):
            base = reference.RUNS[f"{task}-{layer}"]
            for seed in reference.SYNTHETIC_SEEDS[1:]:
                assert reference.RUNS[f"{task}-{layer}-seed{seed}"] == base + [
                    "--seed", str(seed), "--seed-data", str(2 * seed)]
        # H3 without its shift: H3's runs with --shift-size 1, five seeds alike
        assert reference.RUNS[f"{task}-h3-noshift"] == reference.RUNS[f"{task}-h3"] + [
            "--shift-size", "1"]
        for seed in runs.NOSHIFT_SEEDS[1:]:    # five seeds of each, with and without
            for variant in ("h3", "h3-noshift"):
                assert reference.RUNS[f"{task}-{variant}-seed{seed}"] == reference.RUNS[
                    f"{task}-{variant}"] + ["--seed", str(seed), "--seed-data", str(2 * seed)]


def test_every_seed_of_a_family_is_its_seed_0_run_with_another_seed():
    """The families the pages iterate over are whole in the table, and a seed's
    run differs from the family's seed-0 run only in its seed."""
    families = {
        "optim-{}": (("recipe", "decay", "fullrate"), reference.OPTIM_SEEDS),
        "mnist-{}": (("s4", "s4d", "gru", "s4-gaussian", "ssm-dt01", "s4-dt01"),
                     reference.MNIST_SEEDS),
        "charlm-{}": (("h3", "hybrid", "attention", "s4d", "mamba"), reference.CHARLM_SEEDS),
        "selective-copying-{}": (("mamba", "s4d", "h3", "attention", "v10-s4d", "s4d-w44",
                                  "mamba-lti"),
                                 runs.SELECTIVE_SEEDS),
        "induction64-{}": (("mamba", "s4d", "h3", "attention"), runs.INDUCTION_SEEDS),
        "mqar-{}": (("mamba2", "mamba", "h3", "attention"), runs.MQAR_SEEDS),
        "init-{}": (("mnist-hippo", "mnist-gaussian", "pmnist-hippo", "pmnist-gaussian"),
                    runs.INIT_SEEDS),
        "memory1024-const-{}": (("s4", "s4-random"), runs.CONSTANT_SEEDS),
        "dense-{}": (("mnist-hippo", "mnist-gaussian"), runs.INIT_SEEDS),
    }
    for pattern, (members, seeds) in families.items():
        for member in members:
            base = reference.RUNS[pattern.format(member)]
            for seed in seeds[1:]:
                assert reference.RUNS[pattern.format(member) + f"-seed{seed}"] == base + [
                    "--seed", str(seed)]
    for L in reference.MEMORY_LENGTHS:
        for layer in ("s4", "s4-independent", "s4-random", "s4d", "ssm"):
            assert f"memory{L}-{layer}" in reference.RUNS


def test_the_table_says_what_each_run_is_for():
    assert set(reference.PURPOSES) == set(reference.RUNS)
    for name, purpose in reference.PURPOSES.items():
        assert purpose.strip() and not re.search(r"\b[Cc]hapter\b", purpose), name


@pytest.mark.parametrize("text, match", [
    ('[[run]]\nname = "a"\npurpose = "x"\noptions = "--steps 1"\n' * 2, "listed twice"),
    ('[[run]]\nname = "a"\noptions = "--steps 1"\n', "a name, a purpose and options"),
])
def test_a_bad_table_is_refused(tmp_path, text, match):
    path = tmp_path / "runs.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        runs.read_table(path)


def test_a_table_is_read_in_order_with_its_options_split(tmp_path):
    path = tmp_path / "runs.toml"
    path.write_text('[[run]]\nname = "b"\npurpose = "x"\noptions = "--steps 1 --lr 0.01"\n'
                    '[[run]]\nname = "a"\npurpose = "y"\noptions = "--steps 2"\n')
    table, purposes = runs.read_table(path)
    assert list(table.items()) == [("b", ["--steps", "1", "--lr", "0.01"]), ("a", ["--steps", "2"])]
    assert purposes == {"b": "x", "a": "y"}


def test_completion_accuracy_keeps_the_top_half_and_scores_with_the_classifier():
    from annotated_s4.data import DIGIT_LEVELS, load_digits_sequences

    d = load_digits_sequences(side=8, quantize=True)
    digits, labels = d["x_test"][:6], d["y_test"][:6]
    gen = StackedModel(functools.partial(SSMLayer, N=2, L=64), DIGIT_LEVELS, 4, 1,
                       rngs=nnx.Rngs(0), vocab_size=DIGIT_LEVELS, classification=False)
    completed = reference.complete_digits(gen, digits)
    np.testing.assert_array_equal(completed[:, :32], digits[:, :32])
    assert completed.shape == digits.shape and completed.max() < DIGIT_LEVELS

    class Constant(nnx.Module):  # a "classifier" that answers 3 to pixels in [0, 1]
        def __call__(self, x):  # (traced: completion_accuracy compiles it)
            assert x.shape == (6, 784, 1)
            in_range = (x.min() >= 0.0) & (x.max() <= 1.0)
            return jnp.zeros((len(x), 11)).at[:, jnp.where(in_range, 3, 10)].set(1.0)

    accuracy, _ = reference.completion_accuracy(gen, Constant(), digits, labels)
    assert accuracy == pytest.approx(np.mean(labels == 3))


def test_cross_run_metrics_apply_to_the_digit_generator_only(monkeypatch):
    """Only a digits-gen run is scored by another run (the classifier named in
    COMPLETION_CLASSIFIERS); without that run at hand it gets no such metric."""
    assert runner.cross_run_metrics(RunConfig(dataset="digits"), None, None) == {}

    def missing(name, *args, **kwargs):
        assert name == reference.COMPLETION_CLASSIFIERS["digits-gen"] == "digits784-s4"
        raise FileNotFoundError(name)

    monkeypatch.setattr(runner, "locate", missing)
    assert runner.cross_run_metrics(RunConfig(dataset="digits-gen"), None, None) == {}


def _run_with_a_weight_moved(tmp_path, name, relative):
    """A copy of run `name` under tmp_path whose checkpoint has its first 64 x 64
    weight matrix scaled by 1 + relative: what a code change that moves a
    result does to a re-evaluation."""
    import shutil

    out = tmp_path / name
    shutil.copytree(reference.run_dir(name), out)
    with np.load(out / "checkpoint.npz", allow_pickle=False) as f:
        arrays = dict(f)
    leaf = next(k for k in sorted(arrays) if k.startswith("leaf_")
                and arrays[k].shape == (64, 64))
    arrays[leaf] = (arrays[leaf] * (1 + relative)).astype(arrays[leaf].dtype)
    np.savez(out / "checkpoint.npz", **arrays)
    return tmp_path


def test_a_weight_moved_slightly_fails_the_check_naming_the_run(tmp_path):
    """Scaling one weight matrix by 1.01 moves the test loss beyond what
    float32 rounding explains: `check` names the run, and the command line says
    how to re-make it."""
    from annotated_s4 import cli

    root = _run_with_a_weight_moved(tmp_path, "digits64-s4", 1e-2)
    lines = []
    failed = reference.check(["digits64-s4"], root=str(root), log=lines.append)
    assert list(failed) == ["digits64-s4"] and "test_loss" in failed["digits64-s4"]
    assert lines[0].startswith("digits64-s4: differs")
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", str(root / "digits64-s4")])
    assert e.value.code == 1


def test_the_check_passes_unmoved_and_reports_each_metrics_tolerance():
    """The committed run re-evaluates within its tolerances, which are stated
    per metric: the loss's from float32 rounding, the accuracy's from the test
    items on a float32 boundary (none, for this classifier)."""
    metrics, run = reference.reevaluate(reference.locate("digits64-s4"))
    assert not reference.compare(run["metrics"], metrics)
    tolerance = metrics["tolerance"]
    assert set(tolerance) == {"test_loss", "test_accuracy"}
    assert tolerance["test_accuracy"] < 1 / len(run["data"].y_test)
    assert 0 < tolerance["test_loss"] < 1e-2 * metrics["test_loss"]


def test_the_completion_tolerance_counts_the_digits_another_evaluation_could_change():
    """completion_accuracy is sampled: a digit's completion can change where a
    draw's top two (log p plus the step's Gumbel noise) lie within float32
    rounding, and its reading where the classifier's do. Completing again with
    every log-probability moved by rounding-size noise changes no digit that
    `completions_on_a_boundary` leaves out; a completion that is not the
    model's draw, and a reading on a tie, are counted."""
    import jax

    from annotated_s4 import runner, sample
    from annotated_s4.data import DIGIT_LEVELS, load_digits_sequences
    from annotated_s4.models import eval_mode

    d = load_digits_sequences(side=8, quantize=True)
    digits = d["x_test"][:8]
    gen = StackedModel(functools.partial(SSMLayer, N=2, L=64), DIGIT_LEVELS, 4, 1,
                       rngs=nnx.Rngs(0), vocab_size=DIGIT_LEVELS, classification=False)
    completed = reference.complete_digits(gen, digits)

    class Reader(nnx.Module):   # log-probabilities: 3, unless ties are asked for
        def __init__(self, tie):
            self.tie = tie

        def __call__(self, x):
            logp = jnp.full((len(x), 10), -5.0).at[:, 3].set(-0.1)
            return logp.at[:, 4].set(jnp.where(self.tie, -0.1, -5.0))

    flagged = reference.completions_on_a_boundary(gen, Reader(False), digits, completed)
    assert flagged.dtype == bool and flagged.shape == (8,) and flagged.sum() <= 2

    # Complete again, each step's log-probabilities moved by up to one evaluation's
    # rounding error (as another device would): the unflagged digits are unchanged.
    rng = np.random.default_rng(1)
    key, half = jax.random.PRNGKey(0), 32
    token = jnp.full((8,), gen.start_token, jnp.int32)
    again = np.zeros_like(completed)
    with eval_mode(gen):
        gen.init_cache(8)
        for t in range(64):
            logp = np.asarray(sample._step(gen, token))
            scale = np.maximum(1.0, np.abs(logp).max(-1, keepdims=True))
            logp = logp + rng.uniform(-1, 1, logp.shape) * (
                runner.ROUNDING_UNITS * runner.UNIT_ROUNDOFF * scale)
            noise = jax.random.gumbel(jax.random.fold_in(key, t), logp.shape)
            token = (jnp.asarray(digits[:, t]) if t < half
                     else jnp.argmax(noise + logp, -1).astype(jnp.int32))
            again[:, t] = np.asarray(token)
    np.testing.assert_array_equal(again[~flagged], completed[~flagged])

    tampered = completed.copy()
    tampered[0, 40] = (tampered[0, 40] + 1) % DIGIT_LEVELS   # not what the model drew
    assert reference.completions_on_a_boundary(gen, Reader(False), digits, tampered)[0]
    assert reference.completions_on_a_boundary(gen, Reader(True), digits, completed).all()


def test_the_package_ships_every_data_file_it_reads():
    """A pip install (Colab's) carries only the files pyproject.toml lists
    beside the modules: the runs' table among them."""
    import tomllib

    package = os.path.dirname(reference.__file__)
    with open(os.path.join(os.path.dirname(package), "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["package-data"]["annotated_s4"])
    data = {f for f in os.listdir(package)
            if os.path.isfile(os.path.join(package, f)) and not f.endswith((".py", ".pyc"))}
    assert data == listed and "runs.toml" in listed


def test_the_results_manifest_is_the_committed_benchmark_results():
    """Every benchmark result the repository commits is in the package's
    manifest with its current checksum (re-write it with
    runs.write_results_manifest after re-running a benchmark), and nothing else."""
    import subprocess

    from annotated_s4 import runs

    tracked = subprocess.run(["git", "ls-files", runs.RESULTS_DIR], cwd=ROOT,
                             capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    committed = sorted(os.path.basename(p) for p in tracked.stdout.split())
    with open(runs.RESULTS_MANIFEST) as f:
        recorded = json.load(f)
    assert sorted(recorded) == committed
    assert recorded == runs.results_manifest(committed)


def test_locate_result_downloads_a_missing_result_and_checks_it(tmp_path, monkeypatch):
    """Without the repository (a pip install, as in Colab) a committed benchmark
    result is fetched from the repository URL, here a local directory read
    through file:// URLs, and checked against the manifest."""
    import shutil

    from annotated_s4 import runs

    server = tmp_path / "server"
    (server / runs.RESULTS_DIR).mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, runs.RESULTS_DIR, "selective.json"),
                server / runs.RESULTS_DIR / "selective.json")
    monkeypatch.setenv("ANNOTATED_S4_CACHE", str(tmp_path / "cache"))
    url, empty = server.as_uri() + "/", str(tmp_path / "no-repository")
    found = runs.locate_result("selective.json", root=empty, url=url)
    assert found == str(tmp_path / "cache" / "benchmark_results" / "selective.json")
    with open(found) as a, open(os.path.join(ROOT, runs.RESULTS_DIR, "selective.json")) as b:
        assert a.read() == b.read()
    assert runs.locate_result("selective.json") == os.path.join(ROOT, runs.RESULTS_DIR,
                                                                "selective.json")
    with pytest.raises(FileNotFoundError, match="no-such.json"):
        runs.locate_result("no-such.json", root=empty, url=url)
    os.remove(found)
    (server / runs.RESULTS_DIR / "selective.json").write_text("{}")
    with pytest.raises(RuntimeError, match="selective.json: sha256"):
        runs.locate_result("selective.json", root=empty, url=url)


def test_a_family_names_its_seeds_runs_and_refuses_a_missing_seed():
    assert runs.family("init-mnist-hippo", (0, 2)) == ["init-mnist-hippo", "init-mnist-hippo-seed2"]
    with pytest.raises(ValueError, match="seeds: no reference run named"):
        runs.family("mnist-s4", (0, 9))
