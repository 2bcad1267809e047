"""How a config file is completed (issue 39 item 10): onto the embedded default when it runs that model on
that backend, else onto the schema's defaults with a note for each value the embedded default sets otherwise;
where each value came from; the same rule for the ready-made configs, the flags and SageMaker's container."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from neuron_ssp.cli import main
from neuron_ssp.cli.config_show import effective_yaml
from neuron_ssp.config import (
    DEFAULT_CONFIG,
    FROM_EMBEDDED,
    FROM_FILE,
    FROM_FLAG,
    FROM_SCHEMA,
    ConfigFallback,
    compact_config_data,
    config_from_dict,
    load_config,
    read_yaml,
    resolve_config,
)
from neuron_ssp.deploy.sagemaker.container import container_config

ROOT = Path(__file__).parents[1]
SHIPPED = [*sorted((ROOT / "configs").glob("*.yaml")), DEFAULT_CONFIG]
NEURON = ROOT / "configs" / "llama2-70b-7b-trn1-bf16.yaml"


def write(tmp_path: Path, data: dict | str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def without(path: Path, *fields: str) -> dict:
    """The file's data with the dotted fields removed."""
    data = read_yaml(path)
    for field in fields:
        *sections, key = field.split(".")
        node = data
        for section in sections:
            node = node[section]
        del node[key]
    return data


def loaded_quietly(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigFallback)
        return load_config(path)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_means_what_it_meant_before_and_loads_without_a_note(path: Path) -> None:
    """Before issue 39 item 10 a file was completed by the schema's defaults alone: the same Config here."""
    assert loaded_quietly(path) == config_from_dict(read_yaml(path))


def test_a_neuron_file_that_leaves_k_and_policy_out_says_which_values_fell_back(tmp_path: Path) -> None:
    path = write(tmp_path, without(NEURON, "speculation.k", "speculation.policy"))
    with pytest.warns(ConfigFallback) as caught:
        config = load_config(path)
    assert (config.speculation.k, config.speculation.policy) == (4, "fixed")  # the schema's, as before
    (note,) = [str(w.message) for w in caught]
    assert 'speculation.k 4 (embedded default 16), speculation.policy "fixed" (embedded default "cost")' in note
    assert "ngram_max" not in note  # drafter model never reads it
    resolved = resolve_config(path)
    assert resolved.base == FROM_SCHEMA and resolved.fallbacks == {"speculation.k": 16, "speculation.policy": "cost"}


def test_validate_lists_the_fallbacks_as_warnings_with_their_fix(tmp_path: Path) -> None:
    path = write(tmp_path, without(NEURON, "speculation.k"))
    result = CliRunner().invoke(main, ["validate", "--json", str(path)])
    assert result.exit_code == 0, result.output
    (warning,) = [w for w in json.loads(result.output)["warnings"] if w["field"] == "speculation.k"]
    assert warning["value"] == 4 and "embedded default's 16" in warning["rule"]
    assert "k: 4 keeps this value" in warning["fix"]


def test_another_model_on_torch_takes_the_schema_defaults_and_names_the_ngram_one(tmp_path: Path) -> None:
    resolved = resolve_config(write(tmp_path, {"target": {"path": "/models/tinyllama"}}))
    assert resolved.base == FROM_SCHEMA
    assert resolved.fallbacks == {"speculation.k": 16, "speculation.policy": "cost", "speculation.ngram_max": 4}
    assert resolved.config.speculation.k == 4
    combined = {
        "target": {"path": "/models/tinyllama"},
        "speculation": {"drafter": "ngram+eagle3"},
        "draft": {"path": "/h"},
    }
    assert "speculation.ngram_max" in resolve_config(write(tmp_path, combined)).fallbacks  # it reads the n-grams too


def test_each_value_says_where_it_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, "platform:\n  prefill_chunk: 0\n")
    resolved = resolve_config(path, {"speculation.k": 8, "sampling.seed": None})
    sources = resolved.sources
    assert resolved.base == FROM_EMBEDDED and resolved.fallbacks == {}
    assert sources["platform.prefill_chunk"] == FROM_FILE and sources["speculation.k"] == FROM_FLAG
    assert sources["speculation.policy"] == FROM_EMBEDDED and sources["platform.forward"] == FROM_SCHEMA
    assert sources["sampling.seed"] == FROM_EMBEDDED  # a flag left out (None) is no flag
    assert resolved.config.speculation.k == 8 and resolved.config.speculation.policy == "cost"
    alone = resolve_config()
    assert alone.path is None and alone.sources["name"] == FROM_EMBEDDED and FROM_FILE not in alone.sources.values()


def test_flags_alone_keep_the_embedded_default(tmp_path: Path) -> None:
    assert load_config(None, {"speculation.drafter": "suffix"}).speculation.k == load_config().speculation.k


@pytest.mark.parametrize("path", [DEFAULT_CONFIG, NEURON], ids=lambda p: p.name)
def test_the_effective_yaml_loads_back_as_the_same_config(tmp_path: Path, path: Path) -> None:
    for overrides in ({}, {"speculation.k": 6}):
        resolved = resolve_config(path, overrides)
        text = effective_yaml(resolved)
        again = resolve_config(write(tmp_path, text, "effective.yaml"))
        assert again.config == resolved.config and set(again.sources.values()) == {FROM_FILE}


def test_a_stop_token_with_a_newline_survives_the_display(tmp_path: Path) -> None:
    resolved = resolve_config(write(tmp_path, {"generation": {"stop_tokens": ["\n\n", 7]}}))
    again = resolve_config(write(tmp_path, effective_yaml(resolved), "effective.yaml"))
    assert again.config.generation.stop_tokens == ["\n\n", 7]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_compact_and_saved_forms_load_back_as_the_same_config(tmp_path: Path, path: Path) -> None:
    config = load_config(path)
    for k, policy in ((config.speculation.k, config.speculation.policy), (4, "fixed")):  # (4, fixed): the schema's
        spec = config.speculation.model_copy(update={"k": k, "policy": policy})
        varied = config.model_copy(update={"speculation": spec})
        assert loaded_quietly(write(tmp_path, compact_config_data(varied))) == varied
        # what bench-serve, the server sweep and tune-k --write save: every value but the unset ones
        assert loaded_quietly(write(tmp_path, varied.model_dump(mode="json", exclude_none=True))) == varied


@pytest.mark.parametrize("path", [p for p in SHIPPED if "70b" in p.name], ids=lambda p: p.name)
def test_sagemakers_container_config_loads_without_a_note(tmp_path: Path, path: Path) -> None:
    config = load_config(path)
    served = loaded_quietly(write(tmp_path, json.dumps(container_config(config))))
    assert served.speculation == config.speculation and served.sampling == config.sampling


def test_config_command_prints_sources_and_json(tmp_path: Path) -> None:
    path = write(tmp_path, "platform:\n  prefill_chunk: 0\n")
    text = CliRunner().invoke(main, ["config", "--config", str(path), "--k", "8"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert "completed by the embedded default" in lines[0]
    assert any(line.split("#")[0].strip() == "k: 8" and line.endswith("# flag") for line in lines)
    assert any(line.split("#")[0].strip() == "policy: cost" and line.endswith("# embedded default") for line in lines)
    as_json = json.loads(CliRunner().invoke(main, ["config", "--config", str(path), "--json"]).output)
    assert as_json["sources"]["platform.prefill_chunk"] == FROM_FILE and as_json["config"]["speculation"]["k"] == 16
    assert as_json["base"] == FROM_EMBEDDED and as_json["fallbacks"] == []


def test_validate_show_adds_the_effective_config(tmp_path: Path) -> None:
    path = write(tmp_path, without(NEURON, "speculation.k"))
    text = CliRunner().invoke(main, ["validate", "--show", str(path)])
    assert text.exit_code == 0, text.output
    assert "completed by the schema's defaults" in text.output
    assert "# schema default; the embedded default's is 16" in text.output
    report = json.loads(CliRunner().invoke(main, ["validate", "--show", "--json", str(path)]).output)
    assert report["effective"]["sources"]["speculation.k"] == FROM_SCHEMA
