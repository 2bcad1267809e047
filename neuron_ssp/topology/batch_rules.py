"""Batch > 1 on Neuron: which library, engine and library generation can run speculation on many sequences at once,
let rows join and leave a running batch (continuous batching), and sample (or only decode greedily).

One table, each cell with the source it was read from; `validate` and the loader refuse what a row says no to, naming
that source, and docs/neuron.md prints the same table (tests/test_batch_rules.py holds the two together). A
transformers-neuronx generation is a public commit whose source was read: 7a30b42 (0.10), 0623de2 (0.10 with
`enable_speculative_decoder(batch_sizes=)`), c8d6bdc (0.11; 0.12 has no public source and is taken to behave as 0.11,
which 0.13 still does where our loop is concerned) and 1ade6d7 (0.13). `validate` knows a build by its version
(`generation_for_version`); the loader by what it does (`generation_for_build`, from the behaviours
backends/neuron/probe.py detects), so a 0.10 build with `batch_sizes=` is told from 7a30b42 and from 0.11 by what its
preprocessing does to a window. NxD Inference is pinned per instance family (nxdi_releases.py: 0.8 on trn1/inf2, 0.10
on trn2) and was read at 0.9.0 (4bcdc54b, ../shared/vendor); the pinned releases are taken to behave alike, which
only hardware can confirm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from neuron_ssp.config import Config, ModelConfig, ServeConfig
from neuron_ssp.errors import Problem
from neuron_ssp.topology.report import ValidationReport

TNX, NXDI, VLLM = "transformers-neuronx", "nxdi", "vllm-neuron"
TNX_0_10 = "tnx-7a30b42"
TNX_0_10_BATCH_SIZES = "tnx-0623de2"
TNX_0_11 = "tnx-c8d6bdc"
TNX_0_13 = "tnx-1ade6d7"
TNX_DEFAULT = TNX_0_13  # what validate plans for without a version: the SDK 2.25 DLAMI installs 0.13
NXDI_PINNED = "nxdi_0_8_to_0_10"
VLLM_PINNED = "vllm_neuron_0_24"
GENERATIONS = {  # oldest first
    TNX_0_10: "0.10 (SDK 2.18; 7a30b42)",
    TNX_0_10_BATCH_SIZES: "0.10 with batch_sizes= (SDK 2.18; 0623de2)",
    TNX_0_11: "0.11-0.12 (SDK 2.19-2.20; c8d6bdc)",
    TNX_0_13: "0.13 (SDK 2.21-2.25; 1ade6d7)",
    NXDI_PINNED: "0.8-0.10 (SDK 2.28-2.31)",
    VLLM_PINNED: "0.24.0.1.1.0 (SDK 2.32)",
}
TNX_INSTALL = "pip install 'transformers-neuronx>=0.13,<0.14' (Neuron SDK 2.21-2.25; the SDK 2.25 DLAMI has it)"

_HOST_ACCEPTOR = "our acceptor on the host, per row (engines/continuous_batch.py)"
_LIBRARY_ACCEPTOR = "our acceptor, plugged into SpeculativeGenerator and called one row at a time (engines/library.py)"
_TNX_BATCH_RAISES = (
    "SpeculativeGenerator raises for batch > 1 (speculation.py:346-347, the same file at 7a30b42, 0623de2 and c8d6bdc)"
)
_TNX_LAST_TOKENS_GREEDY = "the last <= k tokens greedy (target.sample(top_k=1), speculation.py:436 at 7a30b42)"
NXDI_FUSED_SAMPLING = (
    "with do_sample the target's on-device sampler takes only logits[:, -1, :], the window's last position, "
    "whether or not continuous batching is on (model_base.py:1162-1183 at 4bcdc54b, a FIXME there)"
)
_TNX_SPEC_BATCHED = (
    "2-D cache_ids, start_ids as sequence ids, attention_mask required (speculation.py:718-730 at "
    "1ade6d7); a speculation network per (k, batch size) (base.py:129-132)"
)
_OUR_LOOP_BATCHED = (
    "continuous batching's window branch keeps each row's cache ids (padded to the speculation bucket with "
    "max(context_buckets) - 1: base.py:355-378, :285-288, :310-312 at c8d6bdc, base.py:539-562, :369-373, :467-471 at "
    "1ade6d7), a speculation network per (k, batch size) (enable_speculative_decoder(batch_sizes=), base.py:77-87 at "
    "c8d6bdc), prompts encoded at batch 1 (llama/model.py:65), speculative_forward preprocessed under continuous "
    "batching (:180-182)"
)


@dataclass(frozen=True)
class BatchRule:
    """What one engine on one library generation can do with many sequences; each flag with its source."""

    library: str
    engine: str  # speculation.engine: native (our loop), library (SpeculativeGenerator), fused
    generation: str  # a key of GENERATIONS
    batch: bool  # batch_size > 1
    batch_source: str
    continuous: bool  # rows join and leave a running batch
    continuous_source: str
    sampling: bool  # temperature > 0; False: greedy only
    sampling_source: str

    def cells(self) -> list[str]:
        """The row as docs/neuron.md prints it."""
        return [
            self.library,
            self.engine,
            GENERATIONS[self.generation],
            *(
                f"{'yes' if flag else 'no'}: {source}"
                for flag, source in (
                    (self.batch, self.batch_source),
                    (self.continuous, self.continuous_source),
                    (self.sampling, self.sampling_source),
                )
            ),
        ]


def _unbatched_library_loop(generation: str) -> BatchRule:
    """engine library where SpeculativeGenerator is still the 0.10 file (7a30b42, 0623de2, c8d6bdc)."""
    return BatchRule(
        TNX,
        "library",
        generation,
        False,
        _TNX_BATCH_RAISES,
        False,
        "batch 1",
        True,
        f"{_LIBRARY_ACCEPTOR}; {_TNX_LAST_TOKENS_GREEDY}",
    )


BATCH_RULES: tuple[BatchRule, ...] = (
    BatchRule(
        TNX,
        "native",
        TNX_0_10,
        False,
        "enable_speculative_decoder compiles each k for one batch size (no batch_sizes=, base.py:76 at 7a30b42) and "
        "continuous batching has no window branch (base.py:278-307: a window is padded as one token and fails)",
        False,
        "batch 1",
        True,
        _HOST_ACCEPTOR,
    ),
    _unbatched_library_loop(TNX_0_10),
    BatchRule(
        TNX,
        "native",
        TNX_0_10_BATCH_SIZES,
        False,
        "its preprocessing rewrites a 2-D window's cache ids to arange(context bucket) (_pad_cache_ids, "
        "base.py:291-295 at 0623de2): every row's window is written over positions 0..k-1 of its cache, with no error",
        False,
        "batch 1",
        True,
        _HOST_ACCEPTOR,
    ),
    _unbatched_library_loop(TNX_0_10_BATCH_SIZES),
    BatchRule(
        TNX,
        "native",
        TNX_0_11,
        True,
        f"one speculative_forward for all rows: {_OUR_LOOP_BATCHED}",
        True,
        "rows padded to the compiled batch by sequence id; the window branch takes only a compiled batch size "
        "(base.py:364-366 at c8d6bdc)",
        True,
        _HOST_ACCEPTOR,
    ),
    _unbatched_library_loop(TNX_0_11),
    BatchRule(
        TNX,
        "native",
        TNX_0_13,
        True,
        f"one speculative_forward for all rows: {_OUR_LOOP_BATCHED}",
        True,
        "rows padded to the compiled batch by sequence id; the speculative branch of continuous batching "
        "takes only a compiled batch size (base.py:539-562 at 1ade6d7)",
        True,
        _HOST_ACCEPTOR,
    ),
    BatchRule(
        TNX,
        "library",
        TNX_0_13,
        True,
        f"SpeculativeGenerator.sample: {_TNX_SPEC_BATCHED}",
        False,
        "sample takes its batch at the start; rows only leave (done_flags, speculation.py:778-786)",
        True,
        f"{_LIBRARY_ACCEPTOR}, never the library's DefaultTokenAcceptor, which at batch > 1 reads the draft ids "
        "through a (1, k-1, bs) reshape (speculation.py:247 at 1ade6d7) and row 0's probabilities (:248-249); the "
        "first token is the argmax (select_tokens, top_k=1, :744)",
    ),
    BatchRule(
        TNX,
        "fused",
        TNX_0_13,
        True,
        "FusedSpeculativeDecoder's graph advances every row from its own cache id (fused_speculation.py:173-202 at "
        "1ade6d7); a graph per (batch size, bucket) (:464-470)",
        True,
        "speculative_iteration (fused_speculation.py:746-867): a prompt is context-encoded into its own cache line "
        "(:776-811), an iteration runs the rows given, padded to the compiled batch by sequence id (:813-860), as "
        "vLLM's transformers-neuronx worker drives it (NeuronSpeculationCausalLM.forward, vllm 9f77d7f7 "
        "model_executor/model_loader/neuron.py)",
        True,
        "on device, GenerationConfig(do_sample=True) (config.py:106-118)",
    ),
    BatchRule(
        NXDI,
        "native",
        NXDI_PINNED,
        False,
        "'Speculative decoding with a draft model currently supports only batch sizes of 1' "
        "(feature-guide.rst:516, aws-neuron-sdk 81ce03ae)",
        False,
        "batch 1",
        True,
        _HOST_ACCEPTOR,
    ),
    BatchRule(
        NXDI,
        "fused",
        NXDI_PINNED,
        True,
        "the fused graph is traced at tkg_batch_size for draft and target (model_base.py:3078-3084 at "
        "4bcdc54b); one batch size: batch bucketing is refused with speculation (config.py:645-689)",
        True,
        "is_continuous_batching with ctx_batch_size 1: a prefill writes one seq_id "
        "(kv_cache_manager.py:483-484), as vLLM's NxDI loader sets it (neuronx_distributed.py "
        "_get_default_speculation_config at vllm 02f0c7b2)",
        False,
        NXDI_FUSED_SAMPLING,
    ),
)


_VLLM_DOCS = "aws-neuron-sdk 81ce03ae vllm-neuron/docs"
BATCH_RULES += (
    BatchRule(
        VLLM,
        "native",
        VLLM_PINNED,
        True,
        "`vllm serve --max-num-seqs` (target.batch_size); AWS's EAGLE-3 tutorial runs 2 "
        f"(tutorial-eagle3-speculative-decoding-llama-3-1.md:52-60, {_VLLM_DOCS})",
        True,
        "vLLM's scheduler: 'Continuous batching: Enabled by default' (migration-nxdi-to-vllm-neuron.md:45)",
        True,
        "vLLM's rejection sampler honours temperature, top-k and top-p; the head drafts greedily "
        "(speculative_decoding_design.md:87, :91)",
    ),
)


def rule_for(library: str, engine: str, generation: str) -> BatchRule | None:
    """The row of this combination; None where the engine does not exist in that generation."""
    return next((r for r in BATCH_RULES if (r.library, r.engine, r.generation) == (library, engine, generation)), None)


def generation_of(library: str, neuronx_generation: str = TNX_DEFAULT) -> str:
    """The generation whose rules apply: NxD Inference and vllm-neuron have one (pinned), transformers-neuronx four."""
    return {NXDI: NXDI_PINNED, VLLM: VLLM_PINNED}.get(library, neuronx_generation)


def generation_for_version(version: str) -> str:
    """What `validate` plans for, given a version alone: '0.13.322' -> 1ade6d7's rules; 0.11 and 0.12 -> c8d6bdc's;
    0.10 and anything unreadable -> 7a30b42's (a 0.10 build with batch_sizes= is refused batch > 1 all the same)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    minor = (int(match[1]), int(match[2])) if match else (0, 0)
    if minor >= (0, 13):
        return TNX_0_13
    return TNX_0_11 if minor >= (0, 11) else TNX_0_10


@dataclass(frozen=True)
class NeuronxBehaviour:
    """What an installed transformers-neuronx does, as the loader detects it (backends/neuron/api.py, probe.py)."""

    version: str
    batch_sizes: bool  # enable_speculative_decoder(k, batch_sizes=): a speculation network per (k, batch)
    continuous_batching: bool  # config.ContinuousBatchingConfig
    window_kept: str | None  # None: a 2-D window and a one-token step keep their cache ids; else what came back
    loop_takes_attention_mask: bool  # SpeculativeGenerator.sample(attention_mask=): its batched loop

    @property
    def generation(self) -> str:
        """The public commit this build behaves as, for everything the table decides."""
        if not (self.batch_sizes and self.continuous_batching):
            return TNX_0_10
        if self.window_kept is not None:
            return TNX_0_10_BATCH_SIZES
        return TNX_0_13 if self.loop_takes_attention_mask else TNX_0_11

    def describe(self) -> str:
        """The installed build in the words of a refusal."""
        seen = f"; its window came back as {self.window_kept}" if self.window_kept and self.batch_sizes else ""
        behaves = GENERATIONS[self.generation]
        return f"the installed transformers-neuronx {self.version}, which behaves as {behaves}{seen}"


def check_batch(
    config: Config,
    models: dict[str, ModelConfig],
    report: ValidationReport,
    neuronx_generation: str = TNX_DEFAULT,
    installed: str | None = None,
) -> None:
    """Every batch, continuous-batching and sampling problem of a Neuron config against its row of the table.
    `installed`: the loader's words for the build it found (NeuronxBehaviour.describe), which its refusals name."""
    library, engine = config.neuron.library, config.speculation.engine
    generation = generation_of(library, neuronx_generation)
    rule = rule_for(library, engine, generation)
    if rule is None:
        if library == TNX and engine == "fused":
            report.errors.append(
                Problem(
                    "speculation.engine",
                    engine,
                    f"{installed or 'transformers-neuronx ' + GENERATIONS[generation]} has no FusedSpeculativeDecoder "
                    "(fused_speculation.py first ships at 1ade6d7, 0.13)",
                    f"{TNX_INSTALL}, or use speculation.engine: native",
                )
            )
        return  # engine library on NxDI is refused by engine_rules
    batch = models["target"].batch_size
    report.errors.extend(_batch_problems(rule, models, installed))
    draft = models.get("draft")
    if rule.batch and draft is not None and draft.batch_size != batch:
        report.errors.append(
            Problem(
                "draft.batch_size",
                draft.batch_size,
                f"the draft proposes for every row of the target's batch ({batch}): {_same_batch_reason(rule)}",
                f"set draft.batch_size: {batch}, like the target",
            )
        )
    if config.sampling.temperature > 0 and not rule.sampling:
        report.errors.append(
            Problem(
                "sampling.temperature",
                config.sampling.temperature,
                f"{_named(rule, installed)} decodes greedily only: {rule.sampling_source}",
                f"set sampling.temperature: 0{_alternatives(rule, 'sampling')}",
            )
        )
    _check_serve_batch(config, rule, batch, report)


def _batch_problems(rule: BatchRule, models: dict[str, ModelConfig], installed: str | None) -> list[Problem]:
    if rule.batch:
        return []
    return [
        Problem(
            f"{role}.batch_size",
            model.batch_size,
            f"{_named(rule, installed)} runs one sequence at a time: {rule.batch_source}",
            f"set {role}.batch_size: 1{_alternatives(rule, 'batch')}",
        )
        for role, model in models.items()
        if model.batch_size > 1
    ]


def _check_serve_batch(config: Config, rule: BatchRule, batch: int, report: ValidationReport) -> None:
    """serve.max_batch where it differs from its default (8, the torch backend's, which a config written back by a
    tool carries too): a Neuron model runs the batch it was compiled for, and rows join a running batch only where
    the engine allows it."""
    wanted = config.serve.max_batch
    if wanted == ServeConfig.model_fields["max_batch"].default:
        return
    if wanted > batch:
        report.errors.append(
            Problem(
                "serve.max_batch",
                wanted,
                f"the target is compiled for batch {batch} (target.batch_size); a Neuron model runs only the "
                "batch sizes it was compiled for",
                f"lower serve.max_batch to {batch}"
                + (
                    ", or compile a larger batch (target.batch_size and draft.batch_size)"
                    if rule.batch
                    else _alternatives(rule, "batch")
                ),
            )
        )
    elif wanted > 1 and rule.batch and not rule.continuous:  # batch 1 engines: the batch_size errors say it
        report.warnings.append(
            Problem(
                "serve.max_batch",
                wanted,
                f"{_named(rule)} cannot add a request to a running batch ({rule.continuous_source}): requests that "
                "arrive while it runs wait for the whole batch",
                f"set serve.max_batch: 1{_alternatives(rule, 'continuous')}",
            )
        )


def _named(rule: BatchRule, installed: str | None = None) -> str:
    library = {NXDI: "NxD Inference", VLLM: "vllm-neuron"}.get(rule.library, "transformers-neuronx")
    return f"engine {rule.engine} on {installed or library + ' ' + GENERATIONS[rule.generation]}"


def _alternatives(rule: BatchRule, flag: str) -> str:
    """', or ...': the other engines of this generation that have `flag`, or the first newer generation that has it."""
    engines = [
        r.engine
        for r in BATCH_RULES
        if (r.library, r.generation) == (rule.library, rule.generation) and r.engine != rule.engine and getattr(r, flag)
    ]
    greedy = {r.engine for r in BATCH_RULES if not r.sampling and r.library == rule.library}
    options = [
        f"speculation.engine: {e}" + (" (greedy only)" if e in greedy and flag != "sampling" else "") for e in engines
    ]
    order = list(GENERATIONS)
    newer = [
        r.generation
        for r in BATCH_RULES
        if (r.library, r.engine) == (rule.library, rule.engine)
        and order.index(r.generation) > order.index(rule.generation)
        and getattr(r, flag)
    ]
    if newer and rule.library == TNX:
        first = GENERATIONS[min(newer, key=order.index)]
        options.append(f"install transformers-neuronx {first} or later: {TNX_INSTALL}")
    return "".join(f", or {option}" for option in options)


def _same_batch_reason(rule: BatchRule) -> str:
    if rule.library == VLLM:
        return "vllm-neuron runs the head in the target's engine, at its --max-num-seqs"
    if rule.library == NXDI:
        return "NxDI traces draft and target of the fused graph at one tkg_batch_size (model_base.py:3078-3084)"
    if rule.engine == "fused":
        return "FusedSpeculativeDecoder compiles both into one graph per batch size (fused_speculation.py:464-470)"
    if rule.engine == "library":
        return "SpeculativeGenerator calls draft and target with the same rows (speculation.py:733-734 at 1ade6d7)"
    return "our loop drafts for every row it scores, and a Neuron model runs only the batch it was compiled for"
