"""`deploy endpoint render --engine lmi`: option names from djl-serving's source, and refusals.

Option names as defined at the parent (afece25d) of djl-serving commit 1132e3ab: each name below carries
the file and line it was read from (`DJL_TNX_OPTIONS`).
"""

from __future__ import annotations

from pathlib import Path

import deploy_fixtures
import pytest
import yaml
from click.testing import CliRunner

from neuron_ssp.cli import main
from neuron_ssp.config import load_config
from neuron_ssp.deploy.sagemaker.lmi import lmi_options

aws_sandbox = deploy_fixtures.aws_sandbox  # fake credentials, HTTP to loopback only

ROOT = Path(__file__).resolve().parents[1]
NEURON_CONFIGS = sorted(  # LMI's Neuron engine is transformers-neuronx: the NxD Inference configs are not LMI's
    p
    for p in (ROOT / "configs").glob("*.yaml")
    if (data := yaml.safe_load(p.read_text())).get("platform", {}).get("backend") == "neuron"
    and data.get("neuron", {}).get("library", "transformers-neuronx") == "transformers-neuronx"
)
# Every option name LMI is given, with where it was read in deepjavalibrary/djl-serving at afece25d (the parent
# of 1132e3ab, which removed Neuron support): file and line of its definition or of its use in the template.
PROPERTIES = "engines/python/setup/djl_python/properties_manager/properties.py"
TNX_PROPERTIES = "engines/python/setup/djl_python/properties_manager/tnx_properties.py"
TNX_GUIDE = "serving/docs/lmi/user_guides/tnx_user_guide.md"
DJL_TNX_OPTIONS = {
    "entryPoint": (TNX_GUIDE, 57),  # option.entryPoint=djl_python.transformers_neuronx
    "model_id": (PROPERTIES, 98),  # read as properties.get("model_id") into model_id_or_path
    "tensor_parallel_degree": (PROPERTIES, 50),
    "rolling_batch": (PROPERTIES, 49),
    "max_rolling_batch_size": (PROPERTIES, 55),
    "model_loading_timeout": (TNX_GUIDE, 62),  # option.model_loading_timeout=1600
    "n_positions": (TNX_PROPERTIES, 109),
    "dtype": (TNX_PROPERTIES, 108),
    "compiled_graph_path": (TNX_PROPERTIES, 119),
    "draft_model_compiled_path": (TNX_PROPERTIES, 120),
    "speculative_draft_model": (TNX_PROPERTIES, 121),
    "speculative_length": (TNX_PROPERTIES, 122),
    "draft_model_tp_size": (TNX_PROPERTIES, 123),
}


def render(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["deploy", "endpoint", "render", *args])
    return result.exit_code, result.output


def test_every_shipped_neuron_config_is_rendered() -> None:
    assert len(NEURON_CONFIGS) >= 5


@pytest.mark.parametrize("config_path", NEURON_CONFIGS, ids=lambda p: p.stem)
def test_render_lmi_serving_properties(config_path: Path) -> None:
    config = load_config(config_path)
    code, out = render(str(config_path), "--engine", "lmi")
    assert code == 0, out
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "engine=Python"
    options = dict(line.removeprefix("option.").split("=", 1) for line in lines[1:])
    assert set(options) <= set(DJL_TNX_OPTIONS)
    assert options["speculative_length"] == str(config.speculation.k)  # the tnx window k, not k-1
    assert options["tensor_parallel_degree"] == str(config.target.tp_degree)
    assert options["draft_model_tp_size"] == str(config.draft.tp_degree)
    assert options["n_positions"] == str(config.target.n_positions) and options["dtype"] == config.target.dtype
    assert options["model_id"] == "/opt/ml/model/" + Path(config.target.path).name
    assert options["speculative_draft_model"] == "/opt/ml/model/" + Path(config.draft.path).name
    assert options["entryPoint"] == "djl_python.transformers_neuronx" and options["max_rolling_batch_size"] == "1"
    assert "greedy acceptance only" in out and "no continuous batching" in out


def test_render_env_form_and_model_root() -> None:
    result = CliRunner().invoke(
        main,
        [
            "deploy",
            "endpoint",
            "render",
            str(NEURON_CONFIGS[0]),
            "--engine",
            "lmi",
            "--format",
            "env",
            "--model-root",
            "/models",
        ],
    )
    assert result.exit_code == 0, result.output
    env = dict(line.split("=", 1) for line in result.stdout.splitlines())  # notes go to stderr
    assert env["OPTION_SPECULATIVE_LENGTH"] == "5" and env["OPTION_MODEL_ID"].startswith("/models/")
    assert env["OPTION_ENTRYPOINT"] == "djl_python.transformers_neuronx"


def test_an_s3_compile_cache_becomes_lmis_compiled_graph_paths(tmp_path: Path) -> None:
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["neuron"]["compile_cache_url"] = "s3://my-artifacts/neff-cache"
    path = tmp_path / "cache.yaml"
    path.write_text(yaml.safe_dump(data))
    options = lmi_options(load_config(path)).options
    assert options["compiled_graph_path"] == options["draft_model_compiled_path"] == "s3://my-artifacts/neff-cache"


# djl-serving afece25d, tnx_properties.py compiled_path_validator (lines 227-239): a value that is not
# s3://bucket/key must be an existing directory (else ValueError), and neuron_utils/model_loader.py
# maybe_compile_model (lines 392-397) then calls model.load(dir): a transformers-neuronx save() layout,
# which a NEFF compile cache is not.
@pytest.mark.parametrize("cache", ["/opt/ml/model/neff-cache", "/var/tmp/neuron-compile-cache", "s3://bucket-only"])
def test_a_compile_cache_lmi_cannot_read_is_refused(tmp_path: Path, cache: str) -> None:
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["neuron"]["compile_cache_url"] = cache
    path = tmp_path / "cache.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = render(str(path), "--engine", "lmi")
    assert code == 2 and "neuron.compile_cache_url" in out and "model.load" in out, out
    if not cache.startswith("s3://"):
        assert render(str(path), "--engine", "neuron-ssp")[0] == 0  # our engine uses it as a local cache


def test_a_config_lmi_cannot_express_is_refused_with_every_reason(tmp_path: Path) -> None:
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["speculation"].update(drafter="ngram", policy="adaptive", acceptor="probabilistic")
    data["sampling"] = {"temperature": 0.7}
    path = tmp_path / "sampling.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = render(str(path), "--engine", "lmi")
    assert code == 2, out
    for field, words in (
        ("speculation.drafter", "only with a draft model"),
        ("speculation.acceptor", "accepts greedily"),
        ("speculation.policy", "fixed speculative_length"),
    ):
        assert field in out and words in out
    assert out.count("fix:") >= 3 and "--engine neuron-ssp" in out
    # the same config is fine for our own engine
    assert render(str(path), "--engine", "neuron-ssp")[0] == 0


def test_greedy_acceptor_renders_at_temperature_zero_and_is_refused_with_a_temperature(tmp_path: Path) -> None:
    """LMI accepts greedily; a temperature the greedy acceptor would ignore is refused for every engine."""
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["speculation"]["acceptor"] = "greedy"
    data["sampling"] = {"temperature": 0.0}
    path = tmp_path / "greedy.yaml"
    path.write_text(yaml.safe_dump(data))
    assert render(str(path), "--engine", "lmi")[0] == 0
    data["sampling"] = {"temperature": 0.9}
    path.write_text(yaml.safe_dump(data))
    code, out = render(str(path), "--engine", "lmi")
    assert code == 2 and "speculation.acceptor" in out and "temperature" in out


def test_draft_dtype_other_than_the_targets_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["draft"]["dtype"] = "fp32"
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out = render(str(path), "--engine", "lmi")
    assert code == 2 and "draft.dtype" in out and "target's dtype" in out


# djl-serving at afece25d (and the 0.30.0-dlc branch): with a draft model NeuronRollingBatch always takes
# NaiveRollingBatchNeuronGenerator (rolling_batch/neuron_rolling_batch.py:44), whose speculative step sends the first
# running request's cache position for the whole batch (optimum_neuron_scheduler.py:531, "Workaround until continuous
# batching and batch size > 1 is supported"); its continuous-batching generator raises for speculation (:372, :378).
def test_lmi_stays_at_one_request_at_a_time_and_says_so_for_a_batch_the_config_asks(tmp_path: Path) -> None:
    data = yaml.safe_load(NEURON_CONFIGS[0].read_text())
    data["target"]["batch_size"] = 4
    data["serve"] = {"max_batch": 2}
    path = tmp_path / "batched.yaml"
    path.write_text(yaml.safe_dump(data))
    rendered = lmi_options(load_config(path))
    assert rendered.options["max_rolling_batch_size"] == "1" and rendered.options["rolling_batch"] == "auto"
    notes = [note for note in rendered.notes if "LMI 0.30.0 speculates" in note]
    assert [note.split(" = ")[0] for note in notes] == ["target.batch_size", "serve.max_batch"]
    assert all("max_rolling_batch_size stays 1" in note for note in notes)
    assert all("use --engine neuron-ssp, which serves 2 requests at once" in note for note in notes)  # serving_batch
    # the shipped configs ask for no batch: no note
    assert not any("LMI 0.30.0 speculates" in note for note in lmi_options(load_config(NEURON_CONFIGS[0])).notes)


def test_render_prints_the_batch_note_in_both_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The note reaches the user: a comment in serving.properties, stderr beside the environment."""
    from neuron_ssp.deploy.sagemaker import lmi

    monkeypatch.setattr(lmi, "lmi_batch_notes", lambda config: ["target.batch_size = 4: LMI runs one at a time"])
    code, out = render(str(NEURON_CONFIGS[0]), "--engine", "lmi")
    assert code == 0 and "# note: target.batch_size = 4: LMI runs one at a time" in out, out
    result = CliRunner().invoke(
        main, ["deploy", "endpoint", "render", str(NEURON_CONFIGS[0]), "--engine", "lmi", "--format", "env"]
    )
    assert result.exit_code == 0 and "target.batch_size = 4" in result.stderr and "note" not in result.stdout
