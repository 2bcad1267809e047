"""`neuron.library: vllm-neuron`: the release this package deploys and what of a config `vllm serve` can run.

vllm-neuron is vLLM's Neuron plugin of SDK 2.31+ (no NxD Inference, trn2/trn3). neuron-ssp does not load models
through it: the config is rendered to `vllm serve` flags (deploy/vllm_neuron.py) and vLLM runs its own scheduler,
continuous batching and rejection sampler. Sources (aws-neuron-sdk 81ce03ae, vllm-neuron/docs/...; the DLAMI and
DLC pages named on each field): the plugin's speculation is EAGLE-3 only (design/speculation/
speculative_decoding_design.md:77), "Vanilla draft-model speculative decoding is not supported"
(getting-started/migration-nxdi-to-vllm-neuron.md:47), the draft "Applies the same TP group sharding as the target
model" (speculative_decoding_design.md:222). The plugin's own source (vllm-project/vllm-neuron, branch
release-0.24.0.1.1.0) is not among the sources read here: the stored mirror ends at 0.2.0 (a5ef7c8, the old NxDI
plugin), so its flags are checked against vLLM's own definitions and the plugin's docs.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.config import BUILTIN_ACCEPTORS, Config, ModelConfig
from neuron_ssp.errors import Problem
from neuron_ssp.topology.report import ValidationReport


@dataclass(frozen=True)
class VllmNeuronRelease:
    sdk: str
    plugin: str  # vllm-neuron
    vllm: str
    venv: str  # of the multi-framework DLAMI of that SDK
    dlc: str  # the pytorch-inference-vllm-neuronx DLC (SageMaker image base)
    platforms: str


# SDK 2.32: what AWS's EAGLE-3 tutorial requires ("trn2.48xlarge instance with Neuron SDK 2.32 or later",
# tutorial-eagle3-speculative-decoding-llama-3-1.md:67). Its DLAMI venv: deploy/environments/dlami.rst:89-90; its
# DLC: aws-neuron/deep-learning-containers 2be9ed1 README.md:92 (trn2, trn3); its vLLM: dlamis.rst:25.
VLLM_NEURON = VllmNeuronRelease(
    sdk="2.32",
    plugin="0.24.0.1.1.0",
    vllm="0.24.0",
    venv="/opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0",
    dlc="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04",
    platforms="trn2, trn3",
)
VLLM_ACCEPTORS = ("probabilistic", "greedy")  # vLLM's rejection sampler; at temperature 0 it accepts greedily
SAME_AS_TARGET = ("tp_degree", "n_positions", "first_core")  # batch_size: topology/batch_rules.py


def check_vllm_neuron(config: Config, models: dict[str, ModelConfig], report: ValidationReport) -> None:
    """Every field `vllm serve` cannot honour, each with the flag or source that decides it."""
    if config.platform.backend != "neuron" or config.neuron.library != "vllm-neuron":
        return
    spec, problems = config.speculation, []
    if spec.drafter not in ("eagle3", "eagle", "none"):  # eagle: topology/head_rules.py says no
        problems.append(
            Problem(
                "speculation.drafter",
                spec.drafter,
                "vllm-neuron speculates with EAGLE-3 heads only (speculative_decoding_design.md:77; "
                "migration-nxdi-to-vllm-neuron.md:47: 'Vanilla draft-model speculative decoding is not supported')",
                "use drafter: eagle3 with an EAGLE-3 head in draft.path, drafter: none for the baseline, or "
                "neuron.library: nxdi",
            )
        )
    if spec.drafter == "none" and spec.engine != "native":
        problems.append(
            Problem(
                "speculation.engine",
                spec.engine,
                "vllm-neuron runs its own loop; engines library and fused are transformers-neuronx's and NxDI's",
                "set speculation.engine: native",
            )
        )
    if spec.policy != "fixed":
        problems.append(
            Problem(
                "speculation.policy",
                spec.policy,
                "`vllm serve` proposes num_speculative_tokens (k-1) every step; its window is not ours to change",
                "use policy: fixed",
            )
        )
    if spec.acceptor not in VLLM_ACCEPTORS:
        kind = "a plug-in acceptor" if spec.acceptor not in BUILTIN_ACCEPTORS else f"acceptor '{spec.acceptor}'"
        problems.append(
            Problem(
                "speculation.acceptor",
                spec.acceptor,
                f"vLLM accepts with its own rejection sampler (lossless; greedy at temperature 0); {kind} "
                "cannot run there",
                "use acceptor: probabilistic or greedy",
            )
        )
    draft, target = models.get("draft"), models["target"]
    for name in SAME_AS_TARGET if draft is not None else ():
        if getattr(draft, name) != getattr(target, name):
            problems.append(
                Problem(
                    f"draft.{name}",
                    getattr(draft, name),
                    f"vllm-neuron runs the head in the target's engine: its TP group (speculative_decoding_design"
                    f".md:222) and max-model-len are the target's ({getattr(target, name)})",
                    f"set draft.{name}: {getattr(target, name)}, like the target",
                )
            )
    for field in ("compiled_dir", "compile_cache_url"):
        if getattr(config.neuron, field):
            problems.append(
                Problem(
                    f"neuron.{field}",
                    getattr(config.neuron, field),
                    "vllm-neuron compiles at startup into its own cache (VLLM_CACHE_ROOT, "
                    "setup-guide.md:227); neuron-ssp's compiled artifacts are not what it loads",
                    f"remove neuron.{field}",
                )
            )
    report.errors.extend(problems)


def refuse_loading(config: Config, what: str) -> None:
    """neuron-ssp never loads a vllm-neuron config's models (vLLM does, in `vllm serve`): `what` is refused."""
    if config.platform.backend == "neuron" and config.neuron.library == "vllm-neuron":
        from neuron_ssp.errors import UsageError

        raise UsageError(
            Problem(
                "neuron.library",
                "vllm-neuron",
                f"{what} loads the models through neuron-ssp; a vllm-neuron config's models are loaded and "
                "compiled by vLLM itself, at `vllm serve`",
                "run `neuron-ssp serve --config CONFIG` (it runs vllm serve) and send it requests "
                "(neuron-ssp bench-serve, vllm bench serve), or use neuron.library: nxdi",
            )
        )
