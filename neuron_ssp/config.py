"""YAML config -> typed, validated objects; CLI flags override single fields.

All problems of a config are reported at once (pydantic collects them); each one names the field,
the value, the rule and the fix. Cross-model and hardware rules live in `neuron_ssp.topology`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from neuron_ssp.errors import Problem, UsageError

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"
DEFAULT_CONFIG = Path(__file__).parent / "data" / "default.yaml"

Dtype = Literal["fp32", "bf16", "fp16"]
BUILTIN_ACCEPTORS = ("probabilistic", "greedy", "typical")
POLICIES = ("fixed", "adaptive", "draft-confidence", "target-confidence")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PlatformConfig(_Strict):
    """Where the models run."""

    backend: Literal["torch", "neuron"] = "torch"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # torch backend only
    instance_type: str | None = None  # neuron: e.g. trn1.32xlarge; checked by the topology rules


class ModelConfig(_Strict):
    """One model (target or draft). `path` is a local HF directory or `embedded:smollm2-135m-instruct`."""

    path: str = Field(min_length=1)
    dtype: Dtype = "fp32"
    tp_degree: int = Field(1, ge=1)
    n_positions: int = Field(2048, ge=16)
    batch_size: int = Field(1, ge=1)
    first_core: int = Field(0, ge=0)  # Neuron: first NeuronCore of this model's contiguous tp cores
    # names a `neuron_ssp.topology` catalog entry (e.g. llama-2-70b) when the path's name does not tell
    architecture: str | None = None


class SuffixConfig(_Strict):
    """Suffix drafter (SuffixDecoding): a suffix tree over this request and the previous ones."""

    max_depth: int = Field(24, ge=1, le=256)  # longest context (tokens) it matches
    cache_tokens: int = Field(1_000_000, ge=0)  # global history bound; the oldest request goes first
    min_token_prob: float = Field(0.5, ge=0.0, le=1.0)  # stop once the continuation is less likely
    max_spec_factor: float = Field(4.0, gt=0.0, le=64.0)  # draft length <= factor x match length
    min_match: int = Field(2, ge=1, le=256)  # draft only after a context of at least this many tokens matched
    persist_path: str | None = None  # JSONL file that keeps the history across restarts


class SpeculationConfig(_Strict):
    """k is the window: k-1 drafted tokens, k positions scored by the target per call."""

    k: int = Field(4, ge=2, le=64)
    drafter: Literal["ngram", "model", "suffix"] = "ngram"
    acceptor: str = "probabilistic"  # a built-in name or `module:Class`
    policy: Literal["fixed", "adaptive", "draft-confidence", "target-confidence"] = "fixed"
    k_min: int = Field(2, ge=2)  # adaptive: smallest window
    p_min: float = Field(0.4, ge=0.0, le=1.0)  # draft-confidence: stop drafting below this top prob
    confidence_threshold: float = Field(0.6, ge=0.0, le=1.0)  # target-confidence
    ngram_max: int = Field(3, ge=1, le=16)
    ngram_min: int = Field(1, ge=1, le=16)
    engine: Literal["native", "library"] = "native"  # library: transformers-neuronx's own loop
    suffix: SuffixConfig = Field(default_factory=SuffixConfig)

    @model_validator(mode="after")
    def _bounds(self) -> SpeculationConfig:
        if self.k_min > self.k:
            raise ValueError(f"k_min ({self.k_min}) must not exceed k ({self.k}); lower k_min or raise k")
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max}); swap them"
            )
        return self


class SamplingConfig(_Strict):
    """temperature 0 means greedy. The same transform is applied to draft and target."""

    temperature: float = Field(0.0, ge=0.0)
    top_k: int = Field(0, ge=0)  # 0 = off
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0


class GenerationConfig(_Strict):
    max_new_tokens: int = Field(128, ge=1)
    max_prompt_tokens: int | None = Field(None, ge=1)  # longest prompt expected; sizes n_positions checks
    stop_tokens: list[str | int] = Field(default_factory=list)  # added to the model's EOS
    chat_template: bool = True  # wrap the prompt as a user turn when the tokenizer has a template


class NeuronSettings(_Strict):
    """Neuron only: where compiled models are kept (`neuron-ssp compile`) and the compiler's cache."""

    compiled_dir: str | None = None  # local dir or s3://bucket/prefix; None = compile at every load
    compile_cache_url: str | None = None  # sets NEURON_COMPILE_CACHE_URL (else /var/tmp/neuron-compile-cache)


class Config(_Strict):
    name: str = "default"
    platform: PlatformConfig = Field(default_factory=PlatformConfig)
    target: ModelConfig = Field(default_factory=lambda: ModelConfig(path=EMBEDDED_DEFAULT))
    draft: ModelConfig | None = None
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    neuron: NeuronSettings = Field(default_factory=NeuronSettings)

    @model_validator(mode="after")
    def _draft_present(self) -> Config:
        if self.speculation.drafter == "model" and self.draft is None:
            raise ValueError("drafter 'model' needs a `draft:` section with the draft model's path")
        if self.speculation.k > self.target.n_positions:
            raise ValueError(
                f"k ({self.speculation.k}) exceeds target.n_positions ({self.target.n_positions})"
            )
        return self


# ---------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config (the embedded default when `path` is None) and apply dotted overrides."""
    source = Path(path) if path is not None else DEFAULT_CONFIG
    data = read_yaml(source)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    return config_from_dict(data, source=str(source))


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(
            Problem("config", str(path), "the config file does not exist", "pass the path of a YAML config, "
                    "or leave --config out to use the embedded default")
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(
            Problem("config", str(path), f"YAML does not parse: {_describe_yaml_error(exc)}",
                    "fix the YAML syntax there (indentation, a missing ':' or an unclosed quote)")
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(Problem("config", str(path), "the top level must be a mapping of sections",
                                 "start the file with keys such as `target:` and `speculation:`"))
    return data


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    """Where it broke, and where the construct that broke began (an unclosed quote's opening line)."""
    parts = []
    for what, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        text, where = getattr(exc, what, None), getattr(exc, mark, None)
        if where is not None:
            parts.append(f"{text or 'error'} at line {where.line + 1}, column {where.column + 1}")
    return "; ".join(parts) or str(exc)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise UsageError([_problem_from_pydantic(err, data) for err in exc.errors()]) from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value


# ---------------------------------------------------------------- pydantic -> Problem

_SECTION_MODELS: dict[str, type[BaseModel]] = {
    "": Config, "platform": PlatformConfig, "target": ModelConfig, "draft": ModelConfig,
    "speculation": SpeculationConfig, "sampling": SamplingConfig, "generation": GenerationConfig,
    "neuron": NeuronSettings, "suffix": SuffixConfig,
}


def _problem_from_pydantic(err: dict[str, Any], data: dict[str, Any]) -> Problem:
    loc = [str(p) for p in err["loc"]]
    field = ".".join(loc) or "config"
    value = err.get("input")
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        section = loc[-2] if len(loc) > 1 else ""
        valid = list(_SECTION_MODELS.get(section, Config).model_fields)
        near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f"did you mean '{near[0]}'? " if near else ""
        return Problem(field, value, f"unknown key '{loc[-1]}'",
                       f"{hint}valid keys here: {', '.join(valid)}")
    if kind == "literal_error":
        return Problem(field, value, "not an allowed value", f"use one of {ctx.get('expected')}")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return Problem(field, value, f"must be {op} {bound}", f"set {field} to a value {op} {bound}")
    if kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
        rule, _, fix = message.partition("; ")
        return Problem(field, _pick(data, loc) if loc else "(config)", rule, fix or "adjust the values named")
    if kind == "missing":
        return Problem(field, None, "required field is missing", f"add `{loc[-1]}:` to the config")
    return Problem(field, value, err["msg"], f"give {field} a value of the right type")


def _pick(data: Any, loc: list[str]) -> Any:
    for key in loc:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data
