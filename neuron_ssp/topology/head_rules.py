"""EAGLE heads on Neuron: which library runs which head, from which Neuron SDK, through which engine; and what each
library asks of the head and the target. One table (HEAD_RULES), each row with the source it was read from;
`validate` refuses what a row says no to, all problems at once, and docs/neuron.md prints the same table.

Sources, at the commits named:
- NxD Inference 0.9.0 (4bcdc54b, ../shared/vendor) and the aws-neuron-sdk docs (81ce03ae):
  EAGLE v1 "with a flat draft structure" (libraries/nxd-inference/developer_guides/feature-guide.rst:500-503,
  :638, :717-718) since SDK 2.21 (release-notes/prev/rn.rst:483); `enable_eagle_speculation` switches fused speculation
  on (models/config.py:255-256), so EAGLE never runs unfused; EAGLE-3 since SDK 2.28 ("NxD Inference supports
  Eagle3 speculative decoding on Llama 3.1 8B", release-notes/components/nxd-inference.rst:118); from SDK 2.29 its
  models run on Trn2 and newer only (:61), which topology/nxdi_releases.py pins per family.
- vllm-neuron (the plugin of SDK 2.31+, its docs vendored in aws-neuron-sdk 81ce03ae under vllm-neuron/docs):
  `method` "Must be "eagle3". Currently the only supported speculation method on Neuron"
  (design/speculation/speculative_decoding_design.md:77); "Vanilla draft-model speculative decoding is not
  supported; migrate to an EAGLE3 draft" (getting-started/migration-nxdi-to-vllm-neuron.md:47); Neuron 2.31 or
  later (getting-started/setup-guide.md:30) on trn2 or trn3 (:290).
- transformers-neuronx 0.13 (1ade6d7): EAGLE-1 only, inside FusedSpeculativeDecoder: `is_eagle` needs the draft's
  `is_eagle_draft` and the target's `is_eagle_target` (fused_speculation.py:353), the fused graph
  `_fused_hlo_with_eagle_draft` (:54-148) and `sample`'s EAGLE branches (:573-592, :607-610, :648-664), the draft
  an `EagleLlamaModel` whose fc reads 2H (llama/modules.py:87-95) chosen by `is_eagle` in the head's config.json
  (llama/config.py:49). No EAGLE-3 anywhere in the source (no three taps, no hidden_norm, no draft vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem
from neuron_ssp.topology.head_config import default_taps, parse_config
from neuron_ssp.topology.models import _head_json
from neuron_ssp.topology.report import ValidationReport

TNX, NXDI, VLLM = "transformers-neuronx", "nxdi", "vllm-neuron"
HEADS = ("eagle", "eagle3")
_NXDI_FUSED = "`enable_eagle_speculation` turns fused speculation on (models/config.py:255-256 at 4bcdc54b)"


@dataclass(frozen=True)
class HeadRule:
    """Whether `library` runs `drafter` heads and how; `since_sdk` None: never."""

    library: str
    drafter: str
    since_sdk: str | None
    engine: str  # the speculation.engine it runs through
    source: str
    fix: str = ""  # where it does not run: what to use instead

    def cells(self) -> list[str]:
        """The row as docs/neuron.md prints it."""
        runs = f"from SDK {self.since_sdk}, engine {self.engine}" if self.since_sdk else "no"
        return [self.library, self.drafter, runs, self.source]


HEAD_RULES: tuple[HeadRule, ...] = (
    HeadRule(
        NXDI,
        "eagle",
        "2.21",
        "fused",
        f"EAGLE v1, flat draft (feature-guide.rst:500-503, :638, :717-718; SDK 2.21: rn.rst:483); {_NXDI_FUSED}",
    ),
    HeadRule(
        NXDI,
        "eagle3",
        "2.28",
        "fused",
        f"`is_eagle3` (models/config.py:248); SDK 2.28 (nxd-inference.rst:118); {_NXDI_FUSED}",
    ),
    HeadRule(
        VLLM,
        "eagle3",
        "2.31",
        "native",
        "`--speculative-config` with method eagle3 (speculative_decoding_design.md:77; tutorial "
        "tutorial-eagle3-speculative-decoding-llama-3-1.md:177-188); vllm-neuron runs its own loop",
    ),
    HeadRule(
        VLLM,
        "eagle",
        None,
        "native",
        "method must be eagle3, the only one on Neuron (speculative_decoding_design.md:77)",
        "use an EAGLE-3 head (drafter: eagle3), or neuron.library: nxdi for EAGLE-1 heads",
    ),
    HeadRule(
        TNX,
        "eagle3",
        None,
        "fused",
        "0.13 (1ade6d7) has EAGLE-1 only: its draft's fc reads 2H (llama/modules.py:87-95), no three taps",
        "use neuron.library: nxdi (EAGLE-3 from SDK 2.28) or vllm-neuron (trn2)",
    ),
    HeadRule(
        TNX,
        "eagle",
        None,
        "fused",
        "0.13 runs EAGLE-1 inside FusedSpeculativeDecoder (fused_speculation.py:353, :54-148, :573-664) with "
        "NeuronConfig(is_eagle_target / is_eagle_draft) and `is_eagle: true` in the head's config.json "
        "(llama/config.py:49); neuron-ssp's transformers-neuronx loader does not build those models",
        "use neuron.library: nxdi with speculation.engine: fused (EAGLE-1 since SDK 2.21)",
    ),
)


def rule_for(library: str, drafter: str) -> HeadRule:
    return next(r for r in HEAD_RULES if (r.library, r.drafter) == (library, drafter))


def sdk_at_least(sdk: str, minimum: str) -> bool:
    return tuple(map(int, sdk.split("."))) >= tuple(map(int, minimum.split(".")))


def head_problems(config: Config, sdk: str | None) -> list[Problem]:
    """Whether this library runs this head, at the Neuron SDK `sdk` it installs (None: not known here), through
    the engine it needs."""
    drafter, library = config.speculation.drafter, config.neuron.library
    if drafter not in HEADS:
        return []
    rule = rule_for(library, drafter)
    if rule.since_sdk is None:
        return [
            Problem("speculation.drafter", drafter, f"{library} does not run {drafter} heads: {rule.source}", rule.fix)
        ]
    problems = []
    if sdk is not None and not sdk_at_least(sdk, rule.since_sdk):
        problems.append(
            Problem(
                "neuron.library",
                library,
                f"{drafter} heads need Neuron SDK {rule.since_sdk} or later ({rule.source}); this install is SDK {sdk}",
                f"install {library} of SDK {rule.since_sdk} or later",
            )
        )
    if config.speculation.engine != rule.engine:
        problems.append(
            Problem(
                "speculation.engine",
                config.speculation.engine,
                f"{library} runs {drafter} heads through engine {rule.engine}: {rule.source}",
                f"set speculation.engine: {rule.engine}",
            )
        )
    return problems


def check_heads(config: Config, report: ValidationReport, sdk: str | None) -> None:
    report.errors.extend(head_problems(config, sdk))


def installed_sdk(library: str, family: str | None) -> str | None:
    """The Neuron SDK neuron-ssp installs `library` from on `family` (its DLAMI and DLC pins); None: unknown."""
    from neuron_ssp.topology.nxdi_releases import NXDI_BY_FAMILY
    from neuron_ssp.topology.vllm_neuron import VLLM_NEURON

    if library == VLLM:
        return VLLM_NEURON.sdk
    if library == NXDI and family in NXDI_BY_FAMILY:
        return NXDI_BY_FAMILY[family].sdk
    return None


def nxdi_head_problems(config: Config) -> list[Problem]:
    """What NxD Inference 0.9.0 (4bcdc54b) asks of an EAGLE config beyond fused speculation."""
    if config.neuron.library != NXDI or config.speculation.drafter not in HEADS:
        return []
    problems, k = [], config.speculation.k
    if config.speculation.drafter == "eagle3" and not config.neuron.nxdi.sequence_parallel_enabled:
        problems.append(
            Problem(
                "neuron.nxdi.sequence_parallel_enabled",
                False,
                "an EAGLE-3 target hands the head its three taps and final state (4H wide, model_base.py:1428-1430); "
                "context encoding keeps them only with sequence parallelism (seq_parallel_slice_last_token at 4H, "
                ":1439-1463): without it the last position is gathered at H wide (:964-976) and the lm_head gets "
                "no columns",
                "set neuron.nxdi.sequence_parallel_enabled: true (the head runs with it too, as NxDI's demo builds "
                "it, inference_demo.py:504-518: backends/nxdi/api.py eagle_head)",
            )
        )
    from neuron_ssp.topology.nxdi_graphs import nxdi_context_buckets  # the buckets NxDI compiles (defaults included)

    wrong = [b for b in nxdi_context_buckets(config, config.target) if b in (1, k)]
    if wrong:
        problems.append(
            Problem(
                "neuron.nxdi.context_encoding_buckets",
                wrong,
                f"NxDI's EAGLE model takes a call {k} or 1 token wide for decoding, not a prompt (model_base.py:2878-"
                "2882): a prompt padded to such a bucket would decode instead",
                f"leave buckets of 1 and {k} (speculation.k) out of neuron.nxdi.context_encoding_buckets",
            )
        )
    return problems


def head_checkpoint_problems(config: Config, target_layers: int | None) -> list[Problem]:
    """The head's config.json, where the directory is here, against what NxDI loads: the target's width and
    vocabulary over the whole vocabulary (aws-neuron-sdk 81ce03ae trn3-gpt-oss-120b-tutorial.rst:91-93: "EAGLE3
    heads with the same hidden size and vocabulary size as the target ... must contain ... lm_head and
    embed_tokens"; feature-guide.rst:644-645, :660-662 for EAGLE-1's lm_head), and the taps NxDI reads, fixed in
    its graph: the outputs of layers 1, N/2-1 and N-4 (model_base.py:1402-1405), i.e. the inputs of 2, N//2, N-3."""
    draft = config.draft
    if config.neuron.library != NXDI or config.speculation.drafter != "eagle3" or draft is None:
        return []
    data = _head_json(draft.path)
    if not data:
        return []  # not here: `neuron-ssp prepare-draft` checks it where it is
    head, problems = parse_config(data, str(Path(draft.path) / "config.json"))
    if head is None:
        return problems
    prepare = (
        f"run `neuron-ssp prepare-draft {draft.path} --target {config.target.path} --out <dir>` and point "
        "draft.path at <dir>"
    )
    if head.draft_vocab_size != head.vocab_size:
        problems.append(
            Problem(
                "draft.path",
                draft.path,
                f"the head drafts over {head.draft_vocab_size} of the target's {head.vocab_size} tokens (d2t/t2d); "
                "NxD Inference has no draft vocabulary: its head's lm_head covers the whole vocabulary",
                prepare,
            )
        )
    if head.target_hidden_size != head.hidden_size:
        problems.append(
            Problem(
                "draft.path",
                draft.path,
                f"the head is {head.hidden_size} wide over a {head.target_hidden_size}-wide target; NxD Inference "
                "runs heads of the target's width only",
                "use a head of the target's hidden size",
            )
        )
    if target_layers is not None and head.taps is not None and head.taps != default_taps(target_layers):
        problems.append(
            Problem(
                "draft.path",
                list(head.taps),
                f"the head was trained on the target's layers {list(head.taps)}; NxD Inference hands every head "
                f"the layers {list(default_taps(target_layers))} of a {target_layers}-layer target "
                "(model_base.py:1402-1405)",
                "use a head trained on those layers (SafeAILab's and vLLM's default), or neuron.library: "
                "vllm-neuron, which reads the head's own taps",
            )
        )
    return problems
