"""Tests for annotated_s4.config: one dataclass holds every option's default and
help, generates the parser and reads and writes config.json."""

import dataclasses
import glob
import json
import os

import pytest

from annotated_s4 import config, registry, reference
from annotated_s4.config import RunConfig


def test_the_parser_is_generated_from_the_dataclass():
    defaults = vars(registry.parser().parse_args([]))
    assert defaults == {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for action in registry.parser()._actions:
        assert action.help, action.dest
    parsed = config.from_namespace(registry.parser().parse_args(
        ["--state-size", "8", "--dt-max", "0.01", "--independent", "--init", "random"]))
    assert (parsed.state_size, parsed.dt_max, parsed.independent, parsed.init) == \
        (8, 0.01, True, "random")


def test_every_committed_config_loads_and_is_written_back_unchanged():
    """config.json of every reference run holds recorded options only (and a
    language model's corpus hash), so that it rebuilds the same run; options
    added after a run was made (dt_min, dt_max, init, independent) read as
    their defaults."""
    paths = glob.glob(os.path.join(reference.ROOT, "*", "config.json"))
    assert paths
    for path in paths:
        with open(path) as f:
            recorded = json.load(f)
        rebuilt = RunConfig.from_recorded(recorded, path).recorded()
        defaults = RunConfig().recorded()
        assert rebuilt == {**defaults, **{k: v for k, v in recorded.items()
                                          if k not in config.EXTRA_KEYS}}


def test_a_config_with_an_unknown_option_is_refused():
    with pytest.raises(ValueError, match="run/config.json has options this code does not "
                                         "know: \\['n_experts'\\]"):
        RunConfig.from_recorded({"layer": "s4", "n_experts": 2}, "run/config.json")


@pytest.mark.parametrize("changes, error, match", [
    ({"d_model": 0}, ValueError, "--d-model"),
    ({"state_size": 4.0}, TypeError, "--state-size"),
    ({"seed": -1}, ValueError, "--seed"),
    ({"dt_min": 0.1, "dt_max": 0.01}, ValueError, "--dt-max"),
    ({"layer": "s4d", "independent": True}, ValueError, "--independent"),
    ({"out": None, "resume": True}, ValueError, "--resume"),
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
    assert (resolved.seq_len, resolved.vocab_size) == registry.RECALL_DEFAULTS["induction-head"]


def test_b_clip_applies_to_s4_only():
    assert RunConfig(layer="s4", b_clip=2.0).check().b_clip == 2.0
    with pytest.raises(ValueError, match="--b-clip"):
        RunConfig(layer="s4d", b_clip=2.0).check()
    with pytest.raises(ValueError, match="--b-clip"):
        RunConfig(layer="s4", b_clip=-1.0).check()
