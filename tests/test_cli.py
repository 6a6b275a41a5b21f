"""Tests for annotated_s4.cli: one command with subcommands, --help on every option."""

import argparse
import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from annotated_s4 import cli, reference, registry, runner
from conftest import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _subparsers(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_option_of_every_subcommand_has_help():
    parsers = _subparsers(cli.build_parser())
    assert set(parsers) == set(cli.COMMANDS) == {"train", "evaluate", "sample", "reference"}
    for name, parser in parsers.items():
        for action in parser._actions:
            assert action.help, (name, action.dest)


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for option in ("--dataset", "--layer", "--n-layers", "--d-model", "--state-size",
                   "--steps", "--batch-size", "--lr", "--seed", "--out", "--resume",
                   "--vocab-size", "--seq-len", "digits-784", "digits-gen"):
        assert option in text
    # each layer's options, under its name
    groups = text.split("\n--layer ")[1:]
    assert [g.split(":")[0] for g in groups] == list(registry.LAYERS)
    for group in groups:
        name = group.split(":")[0]
        for action in registry.layer_parser(name)._actions:
            assert action.option_strings[0] in group, (name, action.option_strings)
    s4d = next(g for g in groups if g.startswith("s4d:"))
    assert "--init {lin,inv}" in s4d and "--b-clip" not in s4d


def test_train_takes_the_layers_options_and_refuses_another_layers(tmp_path):
    out = tmp_path / "s4"
    # TINY's settings (its --state-size 4 now an option of s4): the programs of
    # test_registry's one-step s4 run (the initialisation changes values only)
    cli.main(["train", *TINY, "--layer", "s4", "--init", "gaussian", "--b-clip", "2",
              "--steps", "1", "--out", str(out)])
    options = json.loads((out / "config.json").read_text())["layer_options"]
    assert (options["init"], options["b_clip"], options["state_size"]) == ("gaussian", 2.0, 4)
    with pytest.raises(SystemExit, match="--b-clip is not an option of --layer s4d"):
        cli.main(["train", "--layer", "s4d", "--b-clip", "2", "--steps", "1"])
    with pytest.raises(SystemExit):  # not an option of train at all
        cli.main(["evaluate", str(out), "--state-size", "4"])


def test_cli_writes_metrics_and_checkpoint(tmp_path):
    out = tmp_path / "run"
    # two steps: the TINY programs of other tests (at most two steps, one schedule)
    metrics = cli.main(["train", *TINY, "--steps", "2", "--out", str(out)])
    saved = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= saved["test_accuracy"] <= 1.0 and saved["steps"] == 2
    assert saved["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert {"checkpoint.npz", "config.json", "history.json"} <= set(os.listdir(out))
    with np.load(out / "checkpoint.npz", allow_pickle=False) as f:  # no pickle inside
        assert int(f["step"]) == 2


def test_generation_dataset_reports_nll_and_samples(tmp_path, capsys):
    out = tmp_path / "gen"
    cli.main(["train", *TINY, "--dataset", "digits-gen", "--steps", "3", "--out", str(out)])
    saved = json.loads((out / "metrics.json").read_text())
    assert 0.0 < saved["test_loss"] < 10.0
    assert saved["test_bits_per_pixel"] == pytest.approx(saved["test_loss"] / np.log(2))
    # sample: test sequences completed from their first 10 pixels, one per line
    capsys.readouterr()
    tokens = cli.main(["sample", str(out), "--n", "2", "--prompt", "10", "--seed", "1"])
    x_test = runner.load_run(str(out))[1].x_test
    assert tokens.shape == (2, 64)
    np.testing.assert_array_equal(tokens[:, :10], x_test[:2, :10])
    assert capsys.readouterr().out.splitlines()[0] == " ".join(map(str, tokens[0]))
    for bad, match in [(["--prompt", "65"], "--prompt"), (["--n", "0"], "--n")]:
        with pytest.raises(SystemExit, match=match):
            cli.main(["sample", str(out), *bad])


def test_divergence_is_reported_not_written(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(SystemExit, match="diverged at step"):
        cli.main(["train", *TINY, "--steps", "3", "--lr", "1e30", "--out", str(out)])
    assert not (out / "metrics.json").exists()


def test_evaluate_reproduces_a_run_and_names_what_is_wrong(tmp_path, capsys):
    out = tmp_path / "run"
    cli.main(["train", *TINY, "--steps", "2", "--out", str(out)])
    recomputed = cli.main(["evaluate", str(out)])
    recorded = json.loads((out / "metrics.json").read_text())
    assert recomputed["test_accuracy"] == pytest.approx(recorded["test_accuracy"], abs=1e-6)
    # A recorded metric the code no longer reproduces: exit status 1, naming the run.
    (out / "metrics.json").write_text(json.dumps({**recorded, "test_loss": 99.0}))
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", str(out)])
    assert e.value.code == 1 and "make reference RUN=run" in capsys.readouterr().err
    # A classifier cannot be sampled from.
    with pytest.raises(SystemExit, match="error:"):
        cli.main(["sample", str(out)])
    # A missing file, or a checkpoint that does not fit the config: a clear error.
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "d_model": 12}))
    with pytest.raises(SystemExit, match="checkpoint.*does not|shape"):
        cli.main(["evaluate", str(out)])
    (out / "history.json").unlink()
    with pytest.raises(SystemExit, match="missing history.json"):
        cli.main(["evaluate", str(out)])


def test_reference_list_prints_the_commands_in_the_new_spelling(capsys):
    cli.main(["reference", "list"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [line for name in reference.RUNS
                     for line in (f"# {name}: {reference.PURPOSES[name]}", reference.command(name))]
    assert lines[1].startswith("python -m annotated_s4 train --dataset ")


def _python(*args):
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_command_and_the_console_script():
    assert "{train,evaluate,sample,reference}" in _python("-m", "annotated_s4", "--help")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts == {"annotated-s4": "annotated_s4.cli:main"}
