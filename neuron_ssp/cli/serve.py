"""serve: the pipeline behind an OpenAI-compatible HTTP server (and SageMaker's container contract)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from neuron_ssp.cli.generate import load_with_status
from neuron_ssp.cli.report import describe
from neuron_ssp.config import load_config
from neuron_ssp.errors import Problem, RuntimeProblem

# flag -> serve.* field it overrides
SERVE_OVERRIDES = ("host", "port", "sagemaker", "max_queue", "request_timeout", "api_key_env", "served_model_name")


@click.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="YAML config (default: the embedded SmolLM2 default); its `serve:` section sets the fields below.")
@click.option("--host", help="Interface to listen on (default 127.0.0.1; 0.0.0.0 with --sagemaker).")
@click.option("--port", type=int, help="Port (default 8000; 8080 with --sagemaker).")
@click.option("--sagemaker", is_flag=True, default=None,
              help="SageMaker's container contract: 0.0.0.0:8080 (an explicit --host/--port still wins).")
@click.option("--max-queue", type=int, help="Requests that may wait behind the running one; more get 503.")
@click.option("--request-timeout", type=float, help="Seconds a request may take, queue wait included.")
@click.option("--api-key-env", help="Name of the environment variable holding the API key clients must send.")
@click.option("--served-model-name", help="The `model` name clients send (default: the target's name).")
def serve(config_path: Path | None, **flags: object) -> None:
    """Serve the model pair over HTTP: OpenAI /v1/chat/completions and /v1/completions, /v1/models,
    /health, /metrics, SageMaker /ping and /invocations, and a playground page at /.

    Loads and validates the models once, before the port opens. SIGTERM drains and exits 0.
    """
    try:
        from neuron_ssp.serve.server import listen_address, read_api_key, run_server
    except ImportError as exc:
        raise RuntimeProblem(Problem("serve", exc.name, "the server's packages are not installed",
                                     "pip install 'neuron-ssp[serve]' (fastapi, uvicorn, prometheus-client)")) from None
    config = load_config(config_path, {f"serve.{name}": flags[name] for name in SERVE_OVERRIDES})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    read_api_key(config.serve)  # a missing key is refused before the models load
    click.echo(f"{describe(config)}", err=True)
    run_server(config, load_with_status(config))
    click.echo(f"neuron-ssp serve on {listen_address(config.serve).url} stopped", err=True)
