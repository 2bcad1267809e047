"""Config loading: all problems at once, each naming field, value, rule and fix."""

from __future__ import annotations

import pytest

from neuron_ssp.config import DEFAULT_CONFIG, load_config
from neuron_ssp.errors import UsageError


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def problems(tmp_path, text: str, **overrides):
    with pytest.raises(UsageError) as err:
        load_config(write(tmp_path, text), overrides)
    return {p.field: p for p in err.value.problems}


def test_default_config_is_the_embedded_default():
    config = load_config()
    assert config.target.path == "embedded:smollm2-135m-instruct"
    assert config.speculation.drafter == "ngram" and config.platform.backend == "torch"
    assert DEFAULT_CONFIG.is_file()


def test_unknown_key_is_named_with_the_nearest_valid_one(tmp_path):
    found = problems(tmp_path, "speculation:\n  windw: 4\n")
    problem = found["speculation.windw"]
    assert "unknown key 'windw'" in problem.rule
    assert "did you mean" not in problem.fix or "'k'" not in problem.fix  # nothing near: list them all
    assert "valid keys here" in problem.fix
    near = problems(tmp_path, "sampling:\n  temprature: 0.5\n")["sampling.temprature"]
    assert "did you mean 'temperature'?" in near.fix


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems(
        tmp_path,
        "speculation:\n  k: 1\n  acceptor: probabilistic\nsampling:\n  temperature: -1\n  top_p: 1.5\n  top_k: -3\n",
    )
    assert set(found) == {"speculation.k", "sampling.temperature", "sampling.top_p", "sampling.top_k"}
    assert found["speculation.k"].rule == "must be >= 2" and found["speculation.k"].value == 1
    assert "<= 1" in found["sampling.top_p"].fix


def test_unknown_policy_lists_the_choices(tmp_path):
    problem = problems(tmp_path, "speculation:\n  policy: greedy-ish\n")["speculation.policy"]
    assert problem.value == "greedy-ish" and "adaptive" in problem.fix


def test_yaml_syntax_error_shows_the_line(tmp_path):
    problem = problems(tmp_path, "speculation:\n  k: 4\n  acceptor: 'open\n")["config"]
    assert "line 3" in problem.rule


def test_cli_overrides_win_and_are_validated(tmp_path):
    config = load_config(write(tmp_path, "speculation:\n  k: 4\n"), {"speculation.k": 6, "sampling.seed": 3})
    assert config.speculation.k == 6 and config.sampling.seed == 3
    found = problems(tmp_path, "speculation:\n  k: 4\n", **{"speculation.k": 1})
    assert "speculation.k" in found


def test_model_drafter_needs_a_draft_section(tmp_path):
    problem = next(iter(problems(tmp_path, "speculation:\n  drafter: model\n").values()))
    assert "draft" in problem.rule


def test_missing_config_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_acceptor_and_policy_come_with_the_other_problems_and_a_hint(tmp_path):
    found = problems(
        tmp_path, "speculation:\n  k: 1\n  acceptor: probabalistic\n  policy: adaptve\nsampling:\n  top_p: 1.5\n"
    )
    assert set(found) == {"speculation.k", "speculation.acceptor", "speculation.policy", "sampling.top_p"}
    assert found["speculation.acceptor"].value == "probabalistic"
    assert "did you mean 'probabilistic'?" in found["speculation.acceptor"].fix
    assert "did you mean 'adaptive'?" in found["speculation.policy"].fix
    assert "module:Class" in found["speculation.acceptor"].fix


def test_a_plugin_acceptor_spec_passes_the_schema(tmp_path):
    config = load_config(write(tmp_path, "speculation:\n  acceptor: my_module:MyAcceptor\n"))
    assert config.speculation.acceptor == "my_module:MyAcceptor"


def test_greedy_acceptor_with_a_temperature_is_a_validation_error(tmp_path):
    from neuron_ssp.topology import validate_config

    config = load_config(write(tmp_path, "speculation:\n  acceptor: greedy\nsampling:\n  temperature: 0.8\n"))
    errors = validate_config(config).errors
    assert [p.field for p in errors] == ["speculation.acceptor"]
    assert "temperature 0.8" in errors[0].rule and "sampling.temperature: 0" in errors[0].fix
    greedy = load_config(write(tmp_path, "speculation:\n  acceptor: greedy\nsampling:\n  temperature: 0\n"))
    assert validate_config(greedy).errors == []


@pytest.mark.parametrize("drafter", ["model", "eagle", "eagle3", "ngram+eagle3"])
def test_every_drafter_that_reads_a_draft_needs_a_draft_section(tmp_path, drafter):
    problem = next(iter(problems(tmp_path, f"speculation:\n  drafter: {drafter}\n").values()))
    assert f"drafter '{drafter}' needs a `draft:` section" in problem.rule
    assert "add `draft:`" in problem.fix


def test_eagle_drafters_are_config_values(tmp_path):
    for drafter in ("eagle", "eagle3", "ngram+eagle3"):
        text = f"speculation:\n  drafter: {drafter}\ndraft:\n  path: embedded:smollm2-135m-instruct-eagle3\n"
        assert load_config(write(tmp_path, text)).speculation.drafter == drafter
    problem = problems(tmp_path, "speculation:\n  drafter: eagle-3\n")["speculation.drafter"]
    assert "did you mean 'eagle3'?" in problem.fix


def test_a_partial_file_keeps_the_embedded_defaults_it_leaves_out(tmp_path):
    """Issue 39 item 10: a file holding only platform.prefill_chunk ran k 4, policy fixed (the schema's)."""
    config = load_config(write(tmp_path, "platform:\n  prefill_chunk: 0\n"))
    assert config.platform.prefill_chunk == 0
    default = load_config()
    assert (config.speculation.k, config.speculation.policy) == (default.speculation.k, default.speculation.policy)
    assert config.model_dump(exclude={"platform": {"prefill_chunk"}}) == default.model_dump(
        exclude={"platform": {"prefill_chunk"}}
    )
