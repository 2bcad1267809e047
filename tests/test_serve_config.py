"""`serve:` config section and flags: SageMaker's address, explicit overrides, the API key variable."""

from __future__ import annotations

from click.testing import CliRunner

from neuron_ssp.cli import main
from neuron_ssp.config import ServeConfig, load_config
from neuron_ssp.serve.server import listen_address, served_model_name


def test_sagemaker_means_all_interfaces_on_8080_unless_host_or_port_are_given():
    assert (listen_address(ServeConfig()).host, listen_address(ServeConfig()).port) == ("127.0.0.1", 8000)
    sagemaker = listen_address(ServeConfig(sagemaker=True))
    assert (sagemaker.host, sagemaker.port) == ("0.0.0.0", 8080)
    local = listen_address(ServeConfig(sagemaker=True, host="127.0.0.1", port=9123))
    assert local.url == "http://127.0.0.1:9123"


def test_flags_override_the_serve_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("serve:\n  max_queue: 3\n  port: 9000\n  served_model_name: mine\n")
    config = load_config(path, {"serve.port": 9100, "serve.max_queue": None})
    assert (config.serve.port, config.serve.max_queue) == (9100, 3)
    assert served_model_name(config) == "mine"
    assert served_model_name(load_config(None)) == "smollm2-135m-instruct"


def test_bad_serve_fields_are_all_reported_with_a_fix(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("serve:\n  max_queue: 0\n  request_timout: 5\n  port: 70000\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    for text in ("serve.max_queue", "serve.port", "did you mean 'request_timeout'"):
        assert text in result.output


def test_an_unset_api_key_variable_is_refused_before_the_models_load(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    result = CliRunner().invoke(main, ["serve", "--api-key-env", "NO_SUCH_KEY_VAR"])
    assert result.exit_code == 2 and "NO_SUCH_KEY_VAR" in result.output and "export" in result.output


def test_serve_takes_threads_like_every_timing_command(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    result = CliRunner().invoke(main, ["serve", "--threads", "1", "--api-key-env", "NO_SUCH_KEY_VAR"])
    assert "No such option" not in result.output and "NO_SUCH_KEY_VAR" in result.output


def test_allowed_origins_is_a_json_list_as_vllm_takes_it(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    bad = CliRunner().invoke(main, ["serve", "--allowed-origins", "https://a.example"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert "--allowed-origins" in bad.output and "JSON list" in bad.output
    good = CliRunner().invoke(
        main, ["serve", "--allowed-origins", '["https://a.example"]', "--api-key-env", "NO_SUCH_KEY_VAR"]
    )
    assert "NO_SUCH_KEY_VAR" in good.output  # past the flag, stopped before loading by the missing key
    assert load_config(None, {"serve.allowed_origins": ["https://a.example"]}).serve.allowed_origins == [
        "https://a.example"
    ]
    assert load_config(None).serve.allowed_origins == ["*"]
