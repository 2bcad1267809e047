"""A `neuron.library: vllm-neuron` config as the `vllm serve` command that runs it, and the launch of it.

Every flag is vLLM's own (vllm-neuron adds no serving flags of its own; it registers as vLLM's Neuron platform,
aws-neuron-sdk 81ce03ae vllm-neuron/docs/getting-started/migration-nxdi-to-vllm-neuron.md:89-93), as AWS's EAGLE-3
tutorial passes them (vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md:176-188):
- `--tensor-parallel-size` target.tp_degree, `--max-num-seqs` target.batch_size (the decode concurrency,
  tutorial :52-59), `--max-model-len` target.n_positions, `--dtype` target.dtype, `--no-enable-prefix-caching`
  (the tutorial's setting; vllm-neuron enables prefix caching by default, migration-nxdi-to-vllm-neuron.md:46), or
  `--enable-prefix-caching` with platform.prefix_cache true (topology/prefix_rules.py refuses it at one sequence);
- `--speculative-config '{"method": "eagle3", "model": <draft.path>, "num_speculative_tokens": k - 1}'`: vLLM's
  SpeculativeConfig (vllm/config/speculative.py at vllm-project/vllm 002e77c1: `num_speculative_tokens` "The
  number of speculative tokens" (Field gt=0), `model` "The name of the draft model, eagle head", `method` one of
  SpeculativeMethod, "eagle3" among them); vllm-neuron takes method eagle3 only (speculative_decoding_design.md:77).
  Our k is the window: k - 1 drafted tokens (DESIGN "Meaning of k"), so AWS's 3 speculative tokens are k 4;
- above the tutorial's two rows, which "require additional decode batch-bucket coverage" (tutorial :59-60), the
  decode batch buckets (`num_seqs_buckets`, guides/features-guide.md:70) in the current plugin's form,
  `--additional-config '{"neuron_config": {...}}'` (migration-nxdi-to-vllm-neuron.md:93-103; the old NxDI-based
  plugin's `--override-neuron-config` is gone), as AWS's GPT-OSS EAGLE-3 tutorial passes them
  (tutorial-eagle3-speculative-decoding-gpt-oss.md:203-207): powers of two below --max-num-seqs, then
  --max-num-seqs itself, which must be the largest (guides/reference-configuration.md:49);
- `--enable-auto-tool-choice --tool-call-parser llama3_json`: tools as `neuron-ssp serve` takes them. vllm-neuron's
  features guide (guides/features-guide.md, "Structured outputs and tool calling") reads `tool_choice` auto and
  none with vLLM's `Llama3JsonToolParser` and constrains required and a named function through its structured-output
  bitmask; vLLM answers `tool_choice: "auto"` only with both flags set (FrontendArgs.enable_auto_tool_choice and
  tool_call_parser, vllm/entrypoints/openai/cli_args.py). The call format is the one our server uses
  (serve/tool_calls.py: Llama-3.1 JSON calls). Structured output itself needs no flag there: the guide enables it
  by default ("No additional configuration is needed") and names no backend to choose, so none is rendered: vLLM's
  default backend serves `response_format` and `structured_outputs`, and a grammar written for this server
  (llguidance's Lark) may read otherwise there;
- `--host`, `--port`, `--served-model-name` from serve:. SageMaker: 0.0.0.0:8080, where vLLM's server answers
  /ping and /invocations (vllm/entrypoints/sagemaker/api_router.py:49-55, :57-69 at 09cb327f). The API key is never on
  the command line: `VLLM_API_KEY` is set from serve.api_key_env's variable in the server's environment.
Those line numbers of vLLM's files could not all be read here (the vLLM repository is too large to bring onto this
machine); where none is given, the field's name and docstring at that commit are the citation.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from typing import Any

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem, RuntimeProblem
from neuron_ssp.topology.vllm_neuron import VLLM_NEURON

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_TUTORIAL = "tutorial-eagle3-speculative-decoding-llama-3-1.md"
# Every flag rendered, with where it is defined or shown (vllm-neuron's docs at aws-neuron-sdk 81ce03ae; vLLM's
# EngineArgs / frontend arguments at vllm-project/vllm 002e77c1, by field name).
VLLM_FLAGS = {
    "--tensor-parallel-size": f"{_TUTORIAL}:178",
    "--max-num-seqs": f"{_TUTORIAL}:179",
    "--max-model-len": f"{_TUTORIAL}:180",
    "--no-enable-prefix-caching": f"{_TUTORIAL}:181",
    "--enable-prefix-caching": "vLLM EngineArgs.enable_prefix_caching (vllm/engine/arg_utils.py)",
    "--speculative-config": f"{_TUTORIAL}:182-186; vLLM SpeculativeConfig (vllm/config/speculative.py)",
    "--port": f"{_TUTORIAL}:187",
    "--additional-config": "tutorial-eagle3-speculative-decoding-gpt-oss.md:203-207; reference-configuration.md:49",
    "--dtype": "vLLM EngineArgs.dtype (vllm/engine/arg_utils.py)",
    "--host": "vLLM's OpenAI server --host (vllm/entrypoints/openai/cli_args.py)",
    "--served-model-name": "vLLM EngineArgs.served_model_name (vllm/engine/arg_utils.py)",
    "--enable-auto-tool-choice": "guides/features-guide.md 'Tool calling'; vLLM FrontendArgs.enable_auto_tool_choice",
    "--tool-call-parser": "guides/features-guide.md 'Tool calling'; vLLM FrontendArgs.tool_call_parser",
}
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]  # Llama-3.1 JSON calls, as ours
TUTORIAL_MAX_NUM_SEQS = 2  # the decode concurrency AWS's EAGLE-3 tutorial compiles and measured (:52-60)
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000  # ours (serve:), also vLLM's default port
SAGEMAKER_HOST, SAGEMAKER_PORT = "0.0.0.0", 8080  # noqa: S104  (SageMaker's container contract)


def speculative_config(config: Config) -> dict[str, Any] | None:
    """vLLM's --speculative-config for this config; None without a head (drafter none: the baseline)."""
    if config.speculation.drafter != "eagle3" or config.draft is None:
        return None
    return {"method": "eagle3", "model": config.draft.path, "num_speculative_tokens": config.speculation.k - 1}


def additional_config(config: Config) -> dict[str, Any] | None:
    """vllm-neuron's --additional-config: the decode batch buckets once --max-num-seqs passes the tutorial's 2,
    each row count up to it with a compiled decode graph (warmup compiles one per bucket, with speculation one
    verifying (1 + num_speculative_tokens) tokens a row: speculative_decoding_design.md, "Warmup with Speculation
    Enabled"). None at 2 or fewer rows: the tutorial's own command."""
    rows = config.target.batch_size
    if rows <= TUTORIAL_MAX_NUM_SEQS:
        return None
    return {"neuron_config": {"num_seqs_buckets": decode_batch_buckets(rows)}}


def decode_batch_buckets(max_num_seqs: int) -> list[int]:
    """Powers of two below `max_num_seqs`, then `max_num_seqs` (reference-configuration.md:49)."""
    buckets = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return [*buckets, max_num_seqs]


def listen(config: Config) -> tuple[str, int]:
    serve = config.serve
    host = serve.host or (SAGEMAKER_HOST if serve.sagemaker else DEFAULT_HOST)
    port = serve.port or (SAGEMAKER_PORT if serve.sagemaker else DEFAULT_PORT)
    return host, port


def vllm_serve_args(config: Config) -> list[str]:
    """The argv of `vllm serve` for a validated vllm-neuron config."""
    target = config.target
    host, port = listen(config)
    args = [
        "vllm",
        "serve",
        target.path,
        "--tensor-parallel-size",
        str(target.tp_degree),
        "--max-num-seqs",
        str(target.batch_size),
        "--max-model-len",
        str(target.n_positions),
        "--dtype",
        DTYPES[target.dtype],
        "--enable-prefix-caching" if config.platform.prefix_cache else "--no-enable-prefix-caching",
    ]
    extra = additional_config(config)
    if extra is not None:
        args += ["--additional-config", json.dumps(extra)]
    spec = speculative_config(config)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    args += [*TOOL_ARGS, "--host", host, "--port", str(port)]
    if config.serve.served_model_name:
        args += ["--served-model-name", config.serve.served_model_name]
    return args


def command_text(config: Config) -> str:
    return shlex.join(vllm_serve_args(config))


def server_environment(config: Config, environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: this one, with VLLM_API_KEY from serve.api_key_env's variable."""
    env = dict(environ)
    name = config.serve.api_key_env
    if name:
        if not environ.get(name):
            raise RuntimeProblem(
                Problem(
                    "serve.api_key_env",
                    name,
                    f"the environment variable {name} is not set, so the server would run without its API key",
                    f"export {name}=<key> before serving, or remove serve.api_key_env",
                )
            )
        env["VLLM_API_KEY"] = environ[name]
    return env


def exec_vllm_serve(config: Config) -> None:
    """Replace this process by `vllm serve` for the config (validated first): what `neuron-ssp serve` does for
    neuron.library vllm-neuron, on EC2 and in the SageMaker image."""
    from neuron_ssp.topology import validate_config

    validate_config(config).raise_if_invalid()
    args = vllm_serve_args(config)
    env = server_environment(config, dict(os.environ))
    if shutil.which("vllm", path=env.get("PATH")) is None:
        raise RuntimeProblem(
            Problem(
                "neuron.library",
                "vllm-neuron",
                "`vllm` is not on PATH",
                f"activate vllm-neuron's venv ({VLLM_NEURON.venv} on the Neuron DLAMI of SDK {VLLM_NEURON.sdk}), or "
                f"run in its DLC ({VLLM_NEURON.dlc})",
            )
        )
    print(f"[neuron-ssp] exec {shlex.join(args)}", flush=True)
    os.execvpe(args[0], args, env)  # noqa: S606 (the argv is ours, rendered from a validated config)
