"""tune-k / eval / bench from the command line: --json shapes, files written, errors before any run."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_llama
from neuron_support import neuron_config
from tools_support import PROMPT_ROWS, CharTokenizer, pipeline_on, write_prompts

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.cli import main
from neuron_ssp.config import Config

pytest_plugins = ["neuron_fixtures"]  # fixtures: neuronx, tiny_model_dirs

ROW_KEYS = {
    "k",
    "alpha",
    "c",
    "mean_accepted_length",
    "speedup_measured",
    "speedup_predicted",
    "speedup_width_model",
    "speedup_leviathan",
}
CATEGORY_KEYS = {
    "prompts",
    "plain_tok_s",
    "ssp_tok_s",
    "speedup",
    "hf_plain_tok_s",
    "ssp_vs_hf_plain",
    "hf_prompt_lookup_speedup",
    "mean_accepted_length",
    "acceptance_rate",
    "outputs_equal",
}


@pytest.fixture
def tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands load a tiny random Llama (with a character tokenizer) instead of the embedded model."""
    target = TorchBackend(tiny_llama(0), 512)
    monkeypatch.setattr("neuron_ssp.cli.tools.load_with_status", lambda config: pipeline_on(target, config))


@pytest.fixture
def prompts(tmp_path: Path) -> str:
    return str(write_prompts(tmp_path / "prompts.jsonl", PROMPT_ROWS))


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def test_tune_k_json_plot_and_write(tiny_model, prompts, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("# keep me\nspeculation:\n  k: 4  # window\n")
    plot = tmp_path / "k.png"
    result = run(
        "tune-k",
        "--k",
        "2..3",
        "--prompts",
        prompts,
        "--nb-prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--json",
        "--plot",
        str(plot),
        "--write",
        str(config),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"recommended_k", "rows", "call_ms_by_width", "prefill_ms_mean"}
    assert data["recommended_k"] in (2, 3)
    assert data["prefill_ms_mean"] > 0
    assert set(data["call_ms_by_width"]) == {"1", "2", "3"}
    assert [row["k"] for row in data["rows"]] == [2, 3] and all(set(row) == ROW_KEYS for row in data["rows"])
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert config.read_text() == f"# keep me\nspeculation:\n  k: {data['recommended_k']}  # window\n"


def test_tune_k_table(tiny_model, prompts):
    result = run("tune-k", "--k", "2,4", "--prompts", prompts, "--nb-prompts", "1", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    assert "recommended k =" in result.output and "width model" in result.output


def test_bench_json_has_the_documented_shape(tiny_model, prompts, tmp_path):
    plot = tmp_path / "bench.png"
    result = run(
        "bench",
        "--prompts",
        prompts,
        "--categories",
        "copy,open",
        "--nb-prompts",
        "1",
        "--max-new-tokens",
        "8",
        "--hf-lookup-tokens",
        "3",
        "--json",
        "--plot",
        str(plot),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"machine", "categories"} and set(data["categories"]) == {"copy", "open"}
    assert all(set(row) == CATEGORY_KEYS for row in data["categories"].values())
    assert all(row["outputs_equal"] for row in data["categories"].values())
    assert {"cpu", "cores", "torch", "transformers"} <= set(data["machine"])
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_bench_table_is_greedy_whatever_the_config(tiny_model, prompts):
    result = run("bench", "--prompts", prompts, "--nb-prompts", "1", "--max-new-tokens", "6", "--temperature", "0.7")
    assert result.exit_code == 0, result.output
    assert "temperature 0.7 -> 0" in result.output and "prompt_lookup_num_tokens=10" in result.output


def test_eval_json(tiny_model):
    result = run("eval", "--nb-prompts", "3", "--answer-tokens", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["problems"] == 3 and set(data["plain"]) == {
        "correct",
        "n",
        "accuracy",
        "wald_95",
        "wilson_95",
        "clopper_pearson_95",
    }
    assert data["z_test"]["differ"] is False and len(data["answers"]) == 3


@pytest.mark.parametrize(
    "interval, header", [(None, "Wilson"), ("clopper-pearson", "Clopper-Pearson"), ("wald", "Wald")]
)
def test_eval_table_shows_the_chosen_interval(tiny_model, interval, header):
    """A tiny random model answers nothing right: 0/3, where Wald collapses to [0.000, 0.000]."""
    args = ["eval", "--nb-prompts", "3", "--answer-tokens", "4"] + (["--interval", interval] if interval else [])
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert f"95% {header} interval" in result.output
    assert ("[0.000, 0.000]" in result.output) == (header == "Wald")


def test_eval_lossless_json(tiny_model):
    result = run("eval", "--lossless", "--samples", "60", "--prompt", "abcabcabc", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["temperature"] == 1.0 and data["samples"] == 60
    assert 0.0 <= data["tv"] <= data["tv_upper_bound"] <= 1.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["tune-k", "--k", "1..3"], "--k"),
        (["tune-k", "--k", "2,80"], "speculation.k"),
        (["tune-k", "--plot", "out.txt"], "--plot"),
        (["tune-k", "--write", "/no/such/dir/c.yaml"], "--write"),
        (["tune-k", "--nb-prompts", "0"], "--nb-prompts"),
        (["bench", "--categories", "poetry"], "--categories"),
        (["bench", "--prompts", "/no/such/prompts.jsonl"], "--prompts"),
        (["eval", "--nb-prompts", "0"], "--nb-prompts"),
        (["eval", "--lossless", "--samples", "1"], "--samples"),
    ],
)
def test_bad_input_is_refused_with_the_field(tiny_model, args, field):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert field in result.output and "fix:" in result.output


def _neuron_config_file(tmp_path: Path, dirs: dict[str, Path], compiled: Path | None) -> Path:
    config: Config = neuron_config(dirs["target"], generation={"max_new_tokens": 6})
    if compiled is not None:
        config = config.model_copy(update={"neuron": config.neuron.model_copy(update={"compiled_dir": str(compiled)})})
    path = tmp_path / "neuron.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def test_tune_k_on_neuron_reuses_compiled_targets(neuronx: ModuleType, tiny_model_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr("neuron_ssp.pipeline.load.AutoTokenizer.from_pretrained", lambda *a, **kw: CharTokenizer(96))
    config = _neuron_config_file(tmp_path, tiny_model_dirs, tmp_path / "compiled")
    prompts = str(write_prompts(tmp_path / "p.jsonl", [("copy", "abcabcabc")]))
    args = ["tune-k", "--config", str(config), "--k", "2,3", "--prompts", prompts, "--nb-prompts", "1"]
    first = run(*args)
    assert first.exit_code == 0, first.output
    flat = " ".join(first.output.split())
    assert "k=2: compiled k=[2, 3] into one target" in flat and "k=3: compiled k=[2, 3] into one target" in flat
    loads = [m for m, c, _ in neuronx.RUNTIME.events if c == "from_pretrained"]
    assert len(loads) == 2  # the target (ngram drafter: no draft model): one compile, one load for both k
    again = " ".join(run(*args).output.split())
    assert "k=2: reused the target compiled for k=[2, 3]" in again


def test_tune_k_on_neuron_without_the_library_says_what_to_install(tiny_model_dirs, tmp_path):
    config = _neuron_config_file(tmp_path, tiny_model_dirs, tmp_path / "compiled")
    result = run("tune-k", "--config", str(config), "--k", "2,3", "--nb-prompts", "1")
    assert result.exit_code == 1
    assert "pip.repos.neuron.amazonaws.com" in " ".join(result.output.split())


def test_bench_compares_drafters_and_runs_the_repeated_workload(tiny_model, prompts, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = run(
        "bench",
        "--prompts",
        prompts,
        "--nb-prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--no-hf",
        "--drafter",
        "ngram,suffix",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["drafters"]) == {"ngram", "suffix"}
    assert all(row["outputs_equal"] for d in data["drafters"].values() for row in d["categories"].values())
    table = run(
        "bench",
        "--prompts",
        prompts,
        "--nb-prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--no-hf",
        "--drafter",
        "ngram",
        "--drafter",
        "suffix",
    )
    assert table.exit_code == 0 and "geomean" in table.output, table.output
    assert "…" not in table.output and "suffix acc len" in table.output  # nothing cut at the runner's width
    repeated = run(
        "bench",
        "--prompts",
        prompts,
        "--nb-prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--drafter",
        "suffix",
        "--repeated-workload",
        "--json",
    )
    assert repeated.exit_code == 0, repeated.output
    assert list(json.loads(repeated.output)["repeated"]) == ["first", "warm", "cold"]
    both = run(
        "bench",
        "--prompts",
        prompts,
        "--nb-prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--drafter",
        "ngram,suffix",
        "--repeated-workload",
    )
    assert both.exit_code == 0 and "drafter suffix" in both.output and "…" not in both.output, both.output
    bad = run("bench", "--prompts", prompts, "--drafter", "ngram,sufix")
    assert bad.exit_code == 2 and "speculation.drafter" in bad.output
