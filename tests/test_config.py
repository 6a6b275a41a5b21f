"""Tests for annotated_s4.config: one dataclass holds every common option's
default and help, each layer's options class holds its own; together they
generate the parser and read and write config.json (old, flat ones too)."""

import dataclasses
import glob
import json
import os

import pytest

from annotated_s4 import config, reference, registry, runner
from annotated_s4.catalog import LAYERS
from annotated_s4.config import RunConfig
from annotated_s4.layers import S4DOptions, S4Options


def test_the_parser_is_generated_from_the_dataclasses():
    defaults = vars(registry.parser().parse_args([]))
    assert defaults == {f.name: f.default for f in dataclasses.fields(RunConfig)
                        if f.name != "layer_options"}
    for action in registry.parser()._actions:
        assert action.help, action.dest
    for name, entry in LAYERS.items():  # every layer's options, with their help and defaults
        parser = registry.layer_parser(name)
        assert all(action.help for action in parser._actions), name
        assert entry.options(**vars(parser.parse_args([]))) == entry.options(), name
    parsed = registry.parse(["--state-size", "8", "--dt-max", "0.01", "--independent",
                             "--init", "random"])
    assert parsed.layer_options == S4Options(state_size=8, dt_max=0.01, independent=True,
                                             init="random")


def _committed():
    paths = sorted(glob.glob(os.path.join(reference.ROOT, "*", "config.json")))
    assert len(paths) >= 89
    for path in paths:
        with open(path) as f:
            yield os.path.basename(os.path.dirname(path)), json.load(f)


def test_every_committed_config_is_the_config_of_its_command():
    """Every reference run's config.json (flat, written before the layers
    declared their options) migrates to the configuration that its command
    parses to today, and is written back unchanged."""
    for name, recorded in _committed():
        migrated = RunConfig.from_recorded(recorded, name)
        assert migrated.recorded() == registry.parse(reference.RUNS[name]).recorded(), name
        again = RunConfig.from_recorded(migrated.recorded(), name)
        assert again.recorded() == migrated.recorded()
        assert "state_size" not in migrated.recorded()  # it lives in layer_options now


def test_a_flat_config_moves_the_layers_options_and_drops_the_unused():
    flat = {"layer": "attention", "state_size": 64, "head_dim": 1, "n_heads": 2,
            "dt_min": 0.001, "init": None, "independent": False}
    assert RunConfig.from_recorded(flat).layer_options == LAYERS["attention"].options(n_heads=2)
    s4d = RunConfig.from_recorded({"layer": "s4d", "state_size": 64, "init": None,
                                   "b_clip": None, "dt_max": 0.01})
    assert s4d.layer_options == S4DOptions(state_size=64, init="lin", dt_max=0.01)
    # read through the runner, a flat run directory shows the present layout
    run = runner.read_run(reference.run_dir("memory1024-s4-bclip"))
    assert run["config"]["layer_options"]["b_clip"] == 2.0 and "b_clip" not in run["config"]


def test_a_config_with_an_unknown_option_is_refused():
    with pytest.raises(ValueError, match="run/config.json has options this code does not "
                                         "know: \\['n_experts'\\]"):
        RunConfig.from_recorded({"layer": "s4", "n_experts": 2}, "run/config.json")
    with pytest.raises(ValueError, match="--layer s4d has no option \\['b_clip'\\]"):
        RunConfig.from_recorded({"layer": "s4d", "layer_options": {"b_clip": 2.0}})
    with pytest.raises(ValueError, match="names a layer this code does not know: 'lstm'"):
        RunConfig.from_recorded({"layer": "lstm", "layer_options": {}})


@pytest.mark.parametrize("changes, error, match", [
    ({"d_model": 0}, ValueError, "--d-model"),
    ({"layer_options": S4Options(state_size=4.0)}, TypeError, "--state-size"),
    ({"layer_options": S4Options(state_size=6, init="lin")}, ValueError, "--init"),
    ({"seed": -1}, ValueError, "--seed"),
    ({"layer_options": S4Options(dt_min=0.1, dt_max=0.01)}, ValueError, "--dt-max"),
    ({"layer_options": S4Options(b_clip=-1.0)}, ValueError, "--b-clip"),
    ({"layer": "s4d", "layer_options": S4Options()}, TypeError, "S4DOptions"),
    ({"out": None, "resume": True}, ValueError, "--resume"),
    ({"warmup": -1}, ValueError, "--warmup"),
    ({"warmup": 500, "steps": 500}, ValueError, "--warmup must be below --steps"),
])
def test_bad_values_name_the_option(changes, error, match):
    with pytest.raises(error, match=match):
        RunConfig(**changes).check()


def test_unknown_names_and_dataset_sizes_are_resolved_by_the_registry():
    with pytest.raises(ValueError, match="--layer must be one of"):
        registry.resolve(RunConfig(layer="lstm"))
    with pytest.raises(ValueError, match="--vocab-size does not apply to charlm"):
        registry.resolve(RunConfig(dataset="charlm", vocab_size=5))
    resolved = registry.resolve(RunConfig(dataset="induction-head"))
    entry = registry.DATASETS["induction-head"]
    assert (resolved.seq_len, resolved.vocab_size) == (entry.seq_len, entry.vocab_size)
    with pytest.raises(ValueError, match="--seq-len does not apply to digits"):
        registry.resolve(RunConfig(dataset="digits", seq_len=100))   # its images fix it


def test_an_option_of_another_layer_is_refused_naming_both():
    assert registry.parse(["--layer", "s4", "--b-clip", "2"]).layer_options.b_clip == 2.0
    with pytest.raises(ValueError, match="--b-clip is not an option of --layer s4d; it is "
                                         "an option of --layer s4"):
        registry.parse(["--layer", "s4d", "--b-clip", "2"])
    with pytest.raises(ValueError, match="--n-experts is not an option of --layer gru"):
        registry.parse(["--layer", "gru", "--n-experts", "2"])
    with pytest.raises(ValueError, match="--b-clip"):
        registry.parse(["--layer", "s4", "--b-clip", "-1"])
    with pytest.raises(ValueError, match="--init"):
        registry.parse(["--layer", "s4", "--init", "inv"])


def test_no_layer_option_shadows_a_common_one():
    """The two parsing stages must not compete for a flag."""
    common = {f.name for f in dataclasses.fields(RunConfig)}
    for name, entry in LAYERS.items():
        assert not common & {f.name for f in dataclasses.fields(entry.options)}, name
