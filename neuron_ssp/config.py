"""YAML config -> typed, validated objects; CLI flags override single fields.

All problems of a config are reported at once (pydantic collects them); each one names the field,
the value, the rule and the fix. Cross-model and hardware rules live in `neuron_ssp.topology`.
"""

from __future__ import annotations

import copy
import difflib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from neuron_ssp.errors import Problem, UsageError

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_DEFAULT = "embedded:smollm2-135m-instruct"
EMBEDDED_EAGLE3 = "embedded:smollm2-135m-instruct-eagle3"  # the EAGLE-3 head shipped for the embedded model
DEFAULT_CONFIG = Path(__file__).parent / "data" / "default.yaml"

Dtype = Literal["fp32", "bf16", "fp16"]
BUILTIN_ACCEPTORS = ("probabilistic", "greedy", "typical")
POLICIES = ("fixed", "adaptive", "draft-confidence", "target-confidence", "cost")
# eagle3: an EAGLE-3 head drafts from the target's hidden states; eagle: an EAGLE-1 head (NxD Inference's fused
# speculation only); ngram+eagle3: prompt lookup where its match is long, the head otherwise (torch backend only)
DrafterName = Literal["ngram", "model", "suffix", "eagle3", "eagle", "ngram+eagle3", "none"]
# drafters that read the `draft:` section: a draft model, or an EAGLE head's checkpoint directory
DRAFTERS_WITH_DRAFT = ("model", "eagle", "eagle3", "ngram+eagle3")
EAGLE_DRAFTERS = ("eagle", "eagle3", "ngram+eagle3")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PlatformConfig(_Strict):
    """Where the models run."""

    backend: Literal["torch", "neuron"] = "torch"
    device: Literal["auto", "cpu", "cuda"] = "auto"  # torch backend only
    instance_type: str | None = None  # neuron: e.g. trn1.32xlarge; checked by the topology rules
    # torch backend only: what scores tokens (backends/torch/scoring.py). compact: our Llama forward with a
    # preallocated KV cache, oneDNN-packed weights on a CPU in fp32; hf: the model's own forward;
    # auto: compact wherever the model is a plain Llama
    forward: Literal["auto", "compact", "hf"] = "auto"
    # torch.compile the compact forward (dynamic shapes, no CUDA graphs): not a fast path, slower than eager on an
    # H100 (39.4 vs 11.8 ms a one-token call, docs/configuration.md); takes minutes to compile on a small CPU
    compile: bool = False
    # torch backend, compact forward: prompt tokens prefilled per step of the batching loop, in the same call as
    # the running requests' windows (chunked prefill: a joining prompt does not stall them for its whole prefill);
    # 0: every prompt whole, in its own call. The same for one request alone, so its output does not depend on
    # the batch (engines/continuous_batch.py)
    prefill_chunk: int = Field(64, ge=0, le=4096)
    # torch backend, compact forward: what its KV cache holds. bfloat16 halves the bytes attention reads per step
    # (a batch reads every sequence's cache each step); attention still computes in fp32 (docs/benchmarks.md,
    # "The KV cache's dtype": agreement with a float32 cache over the dev prompts)
    kv_dtype: Literal["float32", "bfloat16"] = "float32"
    # torch backend, row kernel: the weights a call reads. auto: a model that comes from a GGUF with Q4_0, Q4_1 or Q8_0
    # tensors (the embedded default) keeps them in their blocks, de-quantised in registers (the same numbers from
    # ~0.75 bytes a weight instead of 4); fp32: the de-quantised fp32 copy, as before (for comparison)
    weights: Literal["auto", "fp32"] = "auto"
    # prefix caching across the requests of one loop (the server's): a request starts from the longest prefix of its
    # prompt that a free slot's cache or the prefix pool holds (engines/slot_caches.py). None: on where the backend
    # supports it (the torch backend's compact forward), off elsewhere; true refuses a backend without it
    prefix_cache: bool | None = None
    # host memory for the prefix pool, whole blocks of committed keys and values beyond the slots, least recently
    # used out; None: a quarter of the memory available at start, at most 4096 MB; 0: warm slots only, no pool
    prefix_pool_mb: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _compile_needs_compact(self) -> PlatformConfig:
        if self.compile and self.forward == "hf":
            raise ValueError(
                "compile applies to the compact forward only; set forward: auto (or compact), or compile: false"
            )
        return self


class ModelConfig(_Strict):
    """One model (target or draft). `path` is a local HF directory or `embedded:smollm2-135m-instruct`; for the
    EAGLE drafters the draft is a head: a checkpoint directory in the EAGLE-3 layout (config.json + safetensors) or
    `embedded:smollm2-135m-instruct-eagle3`."""

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
    min_token_prob: float = Field(0.1, ge=0.0, le=1.0)  # stop once the continuation is less likely
    max_spec_factor: float = Field(4.0, gt=0.0, le=64.0)  # draft length <= factor x match length
    min_match: int = Field(2, ge=1, le=256)  # draft only after a context of at least this many tokens matched
    # earlier requests draft only after a longer match: one occurrence of a short context in another
    # request's text predicts little, and a rejected draft still pays for a wide target call
    min_history_match: int = Field(5, ge=1, le=256)
    persist_path: str | None = None  # JSONL file that keeps the history across restarts


class SpeculationConfig(_Strict):
    """k is the window: k-1 drafted tokens, k positions scored by the target per call."""

    k: int = Field(4, ge=2, le=64)
    # none: plain decoding through the same loop (continuous batching without speculation, the baseline)
    drafter: DrafterName = "ngram"
    acceptor: str = "probabilistic"  # a built-in name or `module:Class`
    # cost: keep the part of each proposal that maximises expected tokens per second, from the target's
    # measured cost per window width and the draft's evidence (speculation/cost_policy.py)
    policy: Literal["fixed", "adaptive", "draft-confidence", "target-confidence", "cost"] = "fixed"
    k_min: int = Field(2, ge=2)  # adaptive: smallest window
    p_min: float = Field(0.4, ge=0.0, le=1.0)  # draft-confidence: stop drafting below this top prob
    confidence_threshold: float = Field(0.6, ge=0.0, le=1.0)  # target-confidence
    ngram_max: int = Field(3, ge=1, le=16)
    ngram_min: int = Field(1, ge=1, le=16)
    # library: transformers-neuronx's SpeculativeGenerator loop; fused: its FusedSpeculativeDecoder (on device)
    engine: Literal["native", "library", "fused"] = "native"
    suffix: SuffixConfig = Field(default_factory=SuffixConfig)
    # a request with a grammar: the tokens the grammar forces next go at the front of each proposal (drafts priced as
    # certain, judged by the target); false drafts only what the drafter proposes (the benchmark's comparison)
    grammar_forced_drafts: bool = True

    @field_validator("acceptor")
    @classmethod
    def _known_acceptor(cls, value: str) -> str:
        """Built-in names are checked with the rest of the config; a plug-in is imported at load."""
        if ":" in value or value in BUILTIN_ACCEPTORS:
            return value
        raise ValueError(
            f"unknown acceptor; {did_you_mean(value, BUILTIN_ACCEPTORS)}use one of "
            f"{', '.join(BUILTIN_ACCEPTORS)}, or a plug-in as 'module:Class'"
        )

    @model_validator(mode="after")
    def _bounds(self) -> SpeculationConfig:
        if self.k_min > self.k:
            raise ValueError(f"k_min ({self.k_min}) must not exceed k ({self.k}); lower k_min or raise k")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max}); swap them")
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


class NxdiSettings(_Strict):
    """neuron.library nxdi only: NeuronConfig arguments beyond those derived from the models, under NxDI's own
    names (its `inference_demo` flags: --context-encoding-buckets is context_encoding_buckets), passed as given
    and read back after construction (backends/nxdi/api.py)."""

    # prompt lengths with a context-encoding graph each; a prompt runs the smallest bucket above its length.
    # None: NxDI's default, powers of two from 128 up to the longest prompt (topology/nxdi_graphs.py)
    context_encoding_buckets: list[PositiveInt] | None = None
    # cache lengths with a decoding graph each (the k-wide target, the draft, the fused graph); None: n_positions
    token_generation_buckets: list[PositiveInt] | None = None
    fused_qkv: bool = False
    sequence_parallel_enabled: bool = False
    qkv_kernel_enabled: bool = False  # NKI kernels: trn2 (NKI 0.3 dropped Trn1/Inf2 kernels, NxDI 2.29 notes)
    attn_kernel_enabled: bool = False
    mlp_kernel_enabled: bool = False
    cc_pipeline_tiling_factor: int = Field(2, ge=1)  # NxDI's default 2; its trn2 Llama-3.3-70B tutorial sets 1

    @field_validator("context_encoding_buckets", "token_generation_buckets")
    @classmethod
    def _ascending(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or value != sorted(set(value))):
            raise ValueError(
                "buckets must be a non-empty list of distinct lengths in ascending order; "
                f"write them as {sorted(set(value)) or '[n_positions]'}, or leave the key out"
            )
        return value


class NeuronSettings(_Strict):
    """Neuron only: which AWS library runs the models, where compiled models are kept (`neuron-ssp compile`)
    and the compiler's cache."""

    # transformers-neuronx: Neuron SDK <= 2.25, trn1/inf2; nxdi: NxD Inference (neuronx-distributed-inference),
    # trn1/inf2/trn2; vllm-neuron: vLLM's Neuron plugin (SDK 2.31+, trn2/trn3), served by `vllm serve` with the
    # config rendered to its flags (deploy/vllm_neuron.py), EAGLE-3 heads only (docs/neuron.md, "Which library")
    library: Literal["transformers-neuronx", "nxdi", "vllm-neuron"] = "transformers-neuronx"
    compiled_dir: str | None = None  # local dir or s3://bucket/prefix; None = compile at every load
    compile_cache_url: str | None = None  # sets NEURON_COMPILE_CACHE_URL (else /var/tmp/neuron-compile-cache)
    # after load, before the first request: a k-wide window against k one-token calls (backends/neuron/selftest.py)
    self_test: bool = True
    self_test_min_agreement: float = Field(0.9, ge=0.0, le=1.0)  # argmax agreement below this fails the load
    nxdi: NxdiSettings = Field(default_factory=NxdiSettings)


DEFAULT_REQUEST_TIMEOUT = 300.0
# a real-time InvokeEndpoint gives the container 60 s to answer (SageMaker API reference, InvokeEndpoint):
# the server gives up before the platform does, so the client gets our 504, not SageMaker's ModelError
SAGEMAKER_INVOKE_LIMIT = 60.0
SAGEMAKER_REQUEST_TIMEOUT = 55.0


class ServeConfig(_Strict):
    """`neuron-ssp serve`: every field has a flag of the same name that overrides it."""

    host: str | None = None  # None: 127.0.0.1, or 0.0.0.0 with sagemaker
    port: int | None = Field(None, ge=1, le=65535)  # None: 8000, or 8080 with sagemaker
    sagemaker: bool = False  # SageMaker's container contract: 0.0.0.0:8080 unless host/port are given
    max_queue: int = Field(16, ge=1)  # requests waiting behind the running ones; more get 503 + Retry-After
    # requests generated together (continuous batching): on the torch backend the target's KV cache holds this many
    # sequences, preallocated at start; on Neuron at most the compiled target.batch_size, where the engine batches
    # (serve/capacity.py, topology/batch_rules.py)
    max_batch: int = Field(8, ge=1, le=256)
    # seconds from arrival to the last token, queue wait included; None: 300, or 55 with sagemaker (timeout_s)
    request_timeout: float | None = Field(None, gt=0)
    drain_timeout: float = Field(30.0, ge=0)  # SIGTERM: how long the running request may still take
    api_key_env: str | None = None  # name of the environment variable that holds the API key
    served_model_name: str | None = None  # the `model` clients send; default: the target's name
    # origins a browser page may call the API from (CORS); vLLM's default, any origin, without credentials
    allowed_origins: list[str] = Field(default_factory=lambda: ["*"], min_length=1)

    @property
    def timeout_s(self) -> float:
        """request_timeout, defaulted below SageMaker's 60 s invocation limit under `sagemaker`."""
        if self.request_timeout is not None:
            return self.request_timeout
        return SAGEMAKER_REQUEST_TIMEOUT if self.sagemaker else DEFAULT_REQUEST_TIMEOUT


class Config(_Strict):
    name: str = "default"
    platform: PlatformConfig = Field(default_factory=PlatformConfig)
    target: ModelConfig = Field(default_factory=lambda: ModelConfig(path=EMBEDDED_DEFAULT))
    draft: ModelConfig | None = None
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    neuron: NeuronSettings = Field(default_factory=NeuronSettings)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    @model_validator(mode="after")
    def _draft_present(self) -> Config:
        drafter = self.speculation.drafter
        if drafter in DRAFTERS_WITH_DRAFT and self.draft is None:
            what = "the draft model's path" if drafter == "model" else "the path of the EAGLE head's checkpoint"
            example = "path: <draft model dir>" if drafter == "model" else f"path: <head dir> (or {EMBEDDED_EAGLE3})"
            raise ValueError(
                f"drafter '{drafter}' needs a `draft:` section with {what}; add `draft:` with `{example}`, "
                "or use drafter: ngram"
            )
        if self.speculation.k > self.target.n_positions:
            raise ValueError(f"k ({self.speculation.k}) exceeds target.n_positions ({self.target.n_positions})")
        return self


def greedy_acceptor_problem(acceptor: str, temperature: float) -> Problem | None:
    """Greedy acceptance keeps only the target's argmax: with a temperature it would silently ignore it."""
    if acceptor != "greedy" or temperature == 0:
        return None
    return Problem(
        "speculation.acceptor",
        acceptor,
        f"the greedy acceptor keeps only the target's argmax, so sampling.temperature "
        f"{temperature} would be ignored (and the output be neither greedy nor sampled)",
        "use acceptor: probabilistic to sample (lossless at any temperature), or set "
        "sampling.temperature: 0 for greedy decoding",
    )


def did_you_mean(value: Any, choices: tuple[str, ...] | list[str]) -> str:
    near = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return f"did you mean '{near[0]}'? " if near else ""


# ---------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config (the embedded default when `path` is None) and apply dotted overrides (the flags).

    How a file is completed is `resolve_config`'s rule; the values it leaves out that fall back to other
    defaults than the embedded default's are said once, as a `ConfigFallback` warning."""
    resolved = resolve_config(path, overrides)
    if resolved.fallbacks:
        warnings.warn(fallback_note(resolved), ConfigFallback, stacklevel=2)
    return resolved.config


# where a value of the effective config came from, most specific first
FROM_FLAG, FROM_FILE, FROM_EMBEDDED, FROM_SCHEMA = "flag", "file", "embedded default", "schema default"
# fields only one drafter reads: a fallback there is said only when the config uses that drafter (alone or in a
# combination such as ngram+eagle3)
DRAFTER_FIELDS = {"speculation.ngram_": "ngram", "speculation.suffix.": "suffix"}


class ConfigFallback(UserWarning):
    """A config file left out values whose default is not the embedded default's (`resolve_config`)."""


@dataclass(frozen=True)
class ResolvedConfig:
    """A loaded config and where each of its values came from (`neuron-ssp config`, `validate --show`)."""

    config: Config
    path: Path | None  # the config file; None: the embedded default alone
    base: str  # what the file was merged onto: FROM_EMBEDDED or FROM_SCHEMA
    sources: dict[str, str]  # dotted field -> FROM_FLAG, FROM_FILE, FROM_EMBEDDED or FROM_SCHEMA
    # field -> the embedded default's value, where a value left out took the schema's other default
    fallbacks: dict[str, Any]


def resolve_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ResolvedConfig:
    """The one rule for completing a config file, for every command, the server and SageMaker's container.

    A value the file leaves out takes the embedded default's value (neuron_ssp/data/default.yaml, what runs
    without --config) when the file runs the embedded default's model on its backend: `target.path` and
    `platform.backend` left out or the same. Otherwise the embedded default's values, tuned for that model
    on that backend (k 16, policy cost), mean nothing for this config: a value left out takes the schema's
    default, and where that differs from the embedded default's the value is listed in `fallbacks`.
    Flags (`overrides`, None values skipped) win over both; they count towards the rule like the file.
    """
    source = Path(path) if path is not None else None
    embedded = read_yaml(DEFAULT_CONFIG)
    given = read_yaml(source) if source is not None else {}
    flags = {dotted: value for dotted, value in (overrides or {}).items() if value is not None}
    user = copy.deepcopy(given)
    for dotted, value in flags.items():
        _set_dotted(user, dotted, value)
    embedded_config = config_from_dict(embedded, source=str(DEFAULT_CONFIG))
    base = FROM_EMBEDDED if _runs_embedded_model(user, embedded_config) else FROM_SCHEMA
    config = config_from_dict(_merged(embedded, user) if base == FROM_EMBEDDED else user, str(source or DEFAULT_CONFIG))
    sources = {
        field: _source(field, flags, given, embedded if base == FROM_EMBEDDED else {}) for field in flat_fields(config)
    }
    fallbacks = {} if base == FROM_EMBEDDED else _fallbacks(config, sources)
    return ResolvedConfig(config, source, base, sources, fallbacks)


def fallback_problems(resolved: ResolvedConfig) -> list[Problem]:
    """The fallbacks as `validate` reports them: one warning per field."""
    config, ours = resolved.config, flat_fields(resolved.config)
    return [
        Problem(
            field,
            ours[field],
            f"left out of {resolved.path}, which runs {config.target.path} on {config.platform.backend}: it takes "
            f"the schema's default, not the embedded default's {json.dumps(embedded)} (tuned for {EMBEDDED_DEFAULT} "
            "on torch)",
            f"set {field} in the file: {field.rsplit('.', 1)[-1]}: {json.dumps(ours[field])} keeps this value "
            "without this warning",
        )
        for field, embedded in resolved.fallbacks.items()
    ]


def fallback_note(resolved: ResolvedConfig) -> str:
    """The fallbacks as one line, said at load."""
    ours = flat_fields(resolved.config)
    values = ", ".join(
        f"{field} {json.dumps(ours[field])} (embedded default {json.dumps(embedded)})"
        for field, embedded in resolved.fallbacks.items()
    )
    return (
        f"{resolved.path} runs {resolved.config.target.path} on {resolved.config.platform.backend}, not the "
        f"embedded default's model, so the values it leaves out take the schema's defaults, not the embedded "
        f"default's (tuned for {EMBEDDED_DEFAULT} on torch): {values}. Set them in the file to choose; "
        f"`neuron-ssp config --config {resolved.path}` shows where every value comes from"
    )


def compact_config_data(config: Config) -> dict[str, Any]:
    """The config as few values as load back as itself, without a fallback note: the values away from the
    schema's defaults, and every value the embedded default sets otherwise (a file left without them would
    be completed by one or the other default, by `resolve_config`'s rule)."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    ours = flat_fields(config)
    for field in embedded_tuning():
        _set_dotted(data, field, ours[field])
    return data


def flat_fields(config: Config) -> dict[str, Any]:
    """Every leaf of the config as dotted field -> value (JSON types); an absent section (draft) is one leaf."""
    flat: dict[str, Any] = {}

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(config.model_dump(mode="json"), "")
    return flat


def _runs_embedded_model(user: dict[str, Any], embedded: Config) -> bool:
    target, backend = _pick(user, ["target", "path"]), _pick(user, ["platform", "backend"])
    return target in (None, embedded.target.path) and backend in (None, embedded.platform.backend)


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, section by section; a value that is not a mapping (a list too) replaces."""
    merged = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _source(field: str, flags: dict[str, Any], given: dict[str, Any], base: dict[str, Any]) -> str:
    loc = field.split(".")
    if any(field == dotted or field.startswith(f"{dotted}.") for dotted in flags):
        return FROM_FLAG
    if _present(given, loc):
        return FROM_FILE
    return FROM_EMBEDDED if _present(base, loc) else FROM_SCHEMA


def _present(data: Any, loc: list[str]) -> bool:
    return _pick(data, loc, _ABSENT) is not _ABSENT


def _fallbacks(config: Config, sources: dict[str, str]) -> dict[str, Any]:
    """field -> the embedded default's value, where this config took the schema's other default and reads it."""
    return {
        field: value
        for field, value in embedded_tuning().items()
        if sources.get(field) == FROM_SCHEMA and _read_by(config, field)
    }


def embedded_tuning() -> dict[str, Any]:
    """field -> the embedded default's value, where it differs from the schema's default (k, policy, ngram_max)."""
    embedded, schema = flat_fields(config_from_dict(read_yaml(DEFAULT_CONFIG))), flat_fields(Config())
    return {field: value for field, value in embedded.items() if value != schema.get(field)}


def _read_by(config: Config, field: str) -> bool:
    """False for a field only another drafter reads (ngram_max under drafter model; ngram+eagle3 reads it)."""
    used = config.speculation.drafter.split("+")
    return all(drafter in used for prefix, drafter in DRAFTER_FIELDS.items() if field.startswith(prefix))


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(
            Problem(
                "config",
                str(path),
                "the config file does not exist",
                "pass the path of a YAML config, or leave --config out to use the embedded default",
            )
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(
            Problem(
                "config",
                str(path),
                f"YAML does not parse: {_describe_yaml_error(exc)}",
                "fix the YAML syntax there (indentation, a missing ':' or an unclosed quote)",
            )
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(
            Problem(
                "config",
                str(path),
                "the top level must be a mapping of sections",
                "start the file with keys such as `target:` and `speculation:`",
            )
        )
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
    "": Config,
    "platform": PlatformConfig,
    "target": ModelConfig,
    "draft": ModelConfig,
    "speculation": SpeculationConfig,
    "sampling": SamplingConfig,
    "generation": GenerationConfig,
    "neuron": NeuronSettings,
    "serve": ServeConfig,
    "suffix": SuffixConfig,
    "nxdi": NxdiSettings,
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
        return Problem(
            field,
            value,
            f"unknown key '{loc[-1]}'",
            f"{did_you_mean(loc[-1], valid)}valid keys here: {', '.join(valid)}",
        )
    if kind == "literal_error":
        return Problem(
            field,
            value,
            "not an allowed value",
            f"{did_you_mean(value, _literal_choices(loc))}use one of {ctx.get('expected')}",
        )
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


def _literal_choices(loc: list[str]) -> list[str]:
    """The allowed values of the Literal field at `loc` (section.field), for a nearest-name hint."""
    model = _SECTION_MODELS.get(loc[0] if len(loc) > 1 else "", Config)
    info = model.model_fields.get(loc[-1])
    return [str(choice) for choice in get_args(info.annotation)] if info is not None else []


_ABSENT = object()


def _pick(data: Any, loc: list[str], absent: Any = None) -> Any:
    """The value at `loc` in nested mappings; `absent` where there is none."""
    for key in loc:
        if not isinstance(data, dict) or key not in data:
            return absent
        data = data[key]
    return data
