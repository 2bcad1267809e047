"""Options shared by every command that generates: each flag overrides one config field."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import torch

from neuron_ssp.config import Config, ResolvedConfig, load_config, resolve_config
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.tools.prompt_set import DEFAULT_PROMPTS

# flag name -> dotted config field it overrides
OVERRIDES = {
    "k": "speculation.k",
    "acceptor": "speculation.acceptor",
    "drafter": "speculation.drafter",
    "policy": "speculation.policy",
    "temperature": "sampling.temperature",
    "top_k": "sampling.top_k",
    "top_p": "sampling.top_p",
    "seed": "sampling.seed",
    "max_new_tokens": "generation.max_new_tokens",
    "device": "platform.device",
}


def generation_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--config plus one override flag per tunable field, and --json."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path),
            help="YAML config (default: the embedded SmolLM2 default, configs/default.yaml).",
        ),
        click.option(
            "--k",
            type=int,
            help="Window: the draft proposes k-1 tokens, the target scores k "
            "positions per call (gamma = k-1). Must be >= 2.",
        ),
        click.option("--acceptor", help="probabilistic (lossless), greedy, typical (lossy) or module:Class."),
        click.option(
            "--drafter",
            help="ngram (prompt lookup), suffix (learns across requests; both model-free), "
            "model (a draft model), eagle3 (an EAGLE-3 head), ngram+eagle3 (prompt lookup or the head, per step) "
            "or eagle (EAGLE-1, NxD Inference fused only); the last four need a draft: section.",
        ),
        click.option("--policy", help="fixed, adaptive, draft-confidence, target-confidence or cost."),
        click.option("--temperature", type=float, help="0 = greedy."),
        click.option("--top-k", type=int, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, help="Nucleus sampling mass in (0, 1]."),
        click.option("--seed", type=int, help="Seed for reproducible sampling."),
        click.option("--max-new-tokens", type=int, help="Tokens to generate."),
        click.option("--device", help="torch backend: auto, cpu or cuda."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def config_from_options(options: dict[str, Any]) -> Config:
    """Pop the config flags from a command's kwargs and build the validated Config."""
    return load_config(*_config_flags(options))


def resolved_from_options(options: dict[str, Any]) -> ResolvedConfig:
    """The same Config with where each value came from (`neuron-ssp config`)."""
    return resolve_config(*_config_flags(options))


def _config_flags(options: dict[str, Any]) -> tuple[Path | None, dict[str, Any]]:
    overrides = {field: options.pop(flag) for flag, field in OVERRIDES.items() if flag in options}
    return options.pop("config_path", None), overrides


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def with_config(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command so it receives `config` instead of the raw flags."""

    @generation_options
    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        config = config_from_options(kwargs)
        return func(config=config, **kwargs)

    return wrapper


def threads_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--threads for every command that prints timings."""
    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        help="torch CPU threads (default: torch's choice). On a shared machine, 1 avoids "
        "threads spinning against other jobs.",
    )(func)


def prompts_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--prompts for the commands that time a prompt set (default: the Spec-Bench dev set)."""
    return click.option(
        "--prompts",
        "prompts_file",
        type=click.Path(exists=True, path_type=Path),
        default=DEFAULT_PROMPTS,
        help="JSONL with a 'prompt' field per line.",
    )(func)


def set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def json_list(value: str | None, flag: str) -> list[str] | None:
    """A flag that takes a JSON list of strings, as vLLM's list flags do (`--allowed-origins '["https://a.b"]'`)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not (isinstance(parsed, list) and parsed and all(isinstance(v, str) for v in parsed)):
        raise UsageError(
            Problem(flag, value, "must be a non-empty JSON list of strings (vLLM's form)", f"""e.g. {flag} '["*"]'""")
        )
    return parsed
