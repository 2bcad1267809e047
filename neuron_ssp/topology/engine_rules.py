"""Rules of the transformers-neuronx engines (`speculation.engine: library | fused`), read from its source.

fused (FusedSpeculativeDecoder, fused_speculation.py at 1ade6d74): the draft loop, acceptance and sampling
run on device, so only what its GenerationConfig expresses is possible; its constructor asserts the same
tp degree and vocabulary for both models; `sample` asserts sequence_length <= max_position - k (its k =
our k - 1; the slot rule is in neuron_ssp.topology.positions) and counts committed tokens in a
10-column histogram (our k <= 9); its graph binds the draft's cache at the target's buckets, so the
draft needs the target's n_positions at least.
library (SpeculativeGenerator, speculation.py): from SDK 2.21 it counts accepted tokens with
count_nonzero, so an accepted token id 0 is dropped; where id 0 is an ordinary token (Llama-3: "!")
the engine stops with an error rather than return a wrong text, which a user should learn up front.
"""

from __future__ import annotations

import json
from pathlib import Path

from neuron_ssp.config import BUILTIN_ACCEPTORS, Config, ModelConfig
from neuron_ssp.errors import Problem
from neuron_ssp.topology.models import Architecture
from neuron_ssp.topology.positions import FUSED_DRAFT_RULE
from neuron_ssp.topology.report import ValidationReport

FUSED_MAX_WINDOW = 9  # FusedSpeculativeDecoder.sample: rate = torch.zeros(batch_size, 10), indexed by k + 1
LLAMA_3_VOCAB = 128256  # id 0 is "!" in the Llama-3 tokenizer
FUSED_ACCEPTORS = ("greedy", "probabilistic")  # what the on-device selection does (do_sample False / True)
# layers/generation.py `sample` (1ade6d74) divides the logits, in the model's dtype, by the temperature cast to it
# and only then takes the softmax's max: a logit over temperature x the dtype's max becomes inf, and inf - inf
# is NaN. Logits up to this size must stay finite (Llama's stay well below it).
DEVICE_LOGIT_BOUND = 100.0
DTYPE_MAX = {"fp32": 3.4028234663852886e38, "bf16": 3.3895313892515355e38, "fp16": 65504.0}


def check_engine(
    config: Config, models: dict[str, ModelConfig], architectures: dict[str, Architecture], report: ValidationReport
) -> None:
    if config.platform.backend == "neuron" and config.neuron.library == "vllm-neuron":
        return  # vllm-neuron runs its own loop: topology/vllm_neuron.py
    nxdi = config.platform.backend == "neuron" and config.neuron.library == "nxdi"
    if config.speculation.engine == "library" and nxdi:
        report.errors.append(
            Problem(
                "speculation.engine",
                "library",
                "engine 'library' is transformers-neuronx's SpeculativeGenerator loop",
                "use engine: native (our loop on the NxD Inference models) or fused (NxDI's fused speculation), "
                "or neuron.library: transformers-neuronx",
            )
        )
    if config.speculation.engine == "fused":
        report.errors.extend(nxdi_fused_problems(config, models) if nxdi else fused_problems(config, models))
    if config.speculation.engine == "library" and token_zero_is_ordinary(config.target, architectures.get("target")):
        report.warnings.append(
            Problem(
                "speculation.engine",
                "library",
                "token id 0 is an ordinary token of this vocabulary (Llama-3: '!'); transformers-neuronx 0.13's "
                "SpeculativeGenerator counts accepted tokens with count_nonzero, so a generation that accepts it "
                "stops with an error half-way",
                "use speculation.engine: native (same models, our loop) or fused (on device, SDK 2.21+)",
            )
        )


def fused_problems(config: Config, models: dict[str, ModelConfig]) -> list[Problem]:
    """Everything the fused decoder cannot do with this config, each with field, rule and fix."""
    spec, problems = config.speculation, []
    native = "or use speculation.engine: native"
    if config.platform.backend != "neuron":
        problems.append(
            Problem(
                "speculation.engine",
                "fused",
                "the fused decoder runs on Neuron only",
                "set platform.backend: neuron, or use engine: native",
            )
        )
    if spec.drafter != "model":
        problems.append(
            Problem(
                "speculation.drafter",
                spec.drafter,
                "engine fused drafts with a draft model on device; model-free drafters (ngram, suffix) run on the host",
                f"set drafter: model with a draft section, {native}",
            )
        )
    if spec.policy != "fixed":
        problems.append(
            Problem(
                "speculation.policy",
                spec.policy,
                "engine fused always speculates k-1 tokens (its graph is compiled for one k)",
                f"use policy: fixed, {native}",
            )
        )
    if spec.acceptor not in FUSED_ACCEPTORS:
        kind = "a plug-in acceptor" if spec.acceptor not in BUILTIN_ACCEPTORS else f"acceptor '{spec.acceptor}'"
        problems.append(
            Problem(
                "speculation.acceptor",
                spec.acceptor,
                f"engine fused accepts tokens on device; {kind} cannot run there",
                f"use acceptor: greedy or probabilistic, {native}",
            )
        )
    # greedy with a temperature is refused for every engine (generic_rules.check_acceptor)
    problems.extend(device_temperature_problems(config.sampling.temperature, models))
    if spec.k > FUSED_MAX_WINDOW:
        problems.append(
            Problem(
                "speculation.k",
                spec.k,
                f"engine fused commits at most {FUSED_MAX_WINDOW} tokens per iteration "
                "(FusedSpeculativeDecoder.sample's 10-column histogram)",
                f"use k <= {FUSED_MAX_WINDOW}, {native}",
            )
        )
    draft, target = models.get("draft"), models["target"]
    if draft is not None and draft.tp_degree != target.tp_degree:
        problems.append(
            Problem(
                "draft.tp_degree",
                draft.tp_degree,
                f"engine fused needs the same tp_degree for draft and target ({target.tp_degree}); "
                "FusedSpeculativeDecoder asserts it",
                f"set draft.tp_degree: {target.tp_degree}",
            )
        )
    # the slots a generation writes (P+N+k-1) are checked for every engine by generic_rules.check_positions
    if draft is not None and draft.n_positions < target.n_positions:
        problems.append(
            Problem(
                "draft.n_positions",
                draft.n_positions,
                f"engine fused needs the draft's n_positions >= the target's ({target.n_positions}): "
                f"{FUSED_DRAFT_RULE}",
                f"set draft.n_positions: {target.n_positions}",
            )
        )
    return problems


def device_temperature_problems(temperature: float, models: dict[str, ModelConfig]) -> list[Problem]:
    """A temperature the on-device sampler turns into NaN (DEVICE_LOGIT_BOUND): on the host we subtract each
    row's max first (sampling.logits_to_probs); the device divides first, in the models' dtype."""
    dtype = min({model.dtype for model in models.values()}, key=DTYPE_MAX.__getitem__)  # the narrowest range
    lowest = DEVICE_LOGIT_BOUND / DTYPE_MAX[dtype]
    if not 0 < temperature < lowest:
        return []
    fix = "set sampling.temperature: 0 (greedy: the limit of a vanishing temperature)"
    fix += f" or >= {lowest:.3g}" + (", or use bf16 (fp32's range)" if dtype == "fp16" else "")
    return [
        Problem(
            "sampling.temperature",
            temperature,
            f"engine fused samples on device in {dtype}, dividing the logits by the temperature before the "
            f"softmax: every logit above {temperature * DTYPE_MAX[dtype]:.3g} becomes inf and the sampler "
            f"draws from NaN (logits up to {DEVICE_LOGIT_BOUND:g} must stay finite)",
            fix,
        )
    ]


def nxdi_fused_problems(config: Config, models: dict[str, ModelConfig]) -> list[Problem]:
    """What NxD Inference's fused speculation (NeuronFusedSpecModel, model_base.py:1598 at 4bcdc54b) cannot do.

    Its graph drafts greedily k times and verifies the window with the target's on-device sampling
    (`_token_gen_forward`, model_base.py:1812); a draft token is accepted while it equals the target's own token
    (`_tkg_postprocessor`, model_base.py:2799). With do_sample the target samples only the window's last
    position, with or without continuous batching (`_sample_on_device`, model_base.py:1162-1183, marked FIXME), so
    only greedy decoding is defined; the
    draft's process group must divide the target's tp (`initialize_speculative_draft_group`, NxD
    parallel_state.py:1533 at fbac349b), and its cache is read at the target's positions."""
    spec, problems, native = config.speculation, [], "or use speculation.engine: native"
    if spec.drafter not in ("model", "eagle", "eagle3"):
        problems.append(
            Problem(
                "speculation.drafter",
                spec.drafter,
                "NxDI fused speculation drafts with a draft model or an EAGLE head inside its graph",
                f"set drafter: model, eagle3 or eagle with a draft section, {native}",
            )
        )
    if spec.policy != "fixed":
        problems.append(
            Problem(
                "speculation.policy",
                spec.policy,
                "NxDI fused speculation drafts k-1 tokens every call (speculation_length is compiled)",
                f"use policy: fixed, {native}",
            )
        )
    if spec.acceptor not in FUSED_ACCEPTORS:
        problems.append(
            Problem(
                "speculation.acceptor",
                spec.acceptor,
                "NxDI fused speculation accepts on device (a draft token is kept while it equals the "
                "target's own token)",
                f"use acceptor: greedy, {native}",
            )
        )
    # greedy only (model_base.py:1162-1183): the sampling column of topology/batch_rules.py
    draft, target = models.get("draft"), models["target"]
    if draft is not None and target.tp_degree % draft.tp_degree:
        problems.append(
            Problem(
                "draft.tp_degree",
                draft.tp_degree,
                f"NxDI fused speculation runs the draft on a group of ranks that divides the "
                f"target's tp ({target.tp_degree})",
                f"use a draft tp_degree that divides {target.tp_degree}",
            )
        )
    # its draft starts on the target's first core like every NxDI draft (neuron_rules: NxDI placement)
    if draft is not None and draft.n_positions != target.n_positions:
        problems.append(
            Problem(
                "draft.n_positions",
                draft.n_positions,
                f"NxDI fused speculation sizes the draft's KV cache by the draft's own n_positions "
                f"(kv_cache_manager.py:197) but feeds it the target's bucket and attention mask "
                f"(model_base.py:1832), so the two must be equal (target: {target.n_positions})",
                f"set draft.n_positions: {target.n_positions}",
            )
        )
    return problems


def token_zero_is_ordinary(model: ModelConfig, architecture: Architecture | None) -> bool:
    """Read the tokenizer when it is here; otherwise tell by the vocabulary (Llama-3's 128256)."""
    tokenizer = Path(model.path) / "tokenizer.json"
    try:
        data = json.loads(tokenizer.read_text())
    except (OSError, json.JSONDecodeError):
        return architecture is not None and architecture.vocab == LLAMA_3_VOCAB
    special = {t.get("id") for t in data.get("added_tokens", []) if t.get("special")}
    vocab = (data.get("model") or {}).get("vocab") or {}
    ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
    return 0 not in special and 0 in ids
