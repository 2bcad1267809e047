"""Speculative setups AWS measured, each with the config fields that define it, so `plan --engine` can quote the
published figures for a config that is that setup, and say where a config of the same pair differs.

AWS's NxD Inference tutorial "Using Speculative Decoding to improve Llama-3.3-70B inference performance on Trn2
instances" (aws-neuron/aws-neuron-sdk 81ce03ae, libraries/nxd-inference/tutorials/trn2-llama3.3-70b-tutorial.rst
lines 347-394; figures in llama70b_perf_comparison.csv): its inference_demo flags map one to one onto
configs/nxdi-llama33-70b-trn2-tutorial.yaml. Batch 1, LLMPerf with 10,000-token prompts and 1,500 new
tokens, P50: time per output token 19.6 ms without speculation (scenario 1: the same flags without the draft),
5.3 ms with it; 36 -> 144 output tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_ssp.config import Config

TUTORIAL_SOURCE = (
    "AWS Neuron docs, NxD Inference tutorial 'Using Speculative Decoding to improve Llama-3.3-70B "
    "inference performance on Trn2 instances' (llama70b_perf_comparison.csv): batch 1, 10,000-token "
    "prompts, 1,500 new tokens, P50"
)


@dataclass(frozen=True)
class PublishedRun:
    instance: str
    target: str  # architecture names (topology/models.py)
    draft: str
    setup: dict[str, Any]  # dotted config field -> the value AWS ran with
    ms_per_token: float  # time per output token with speculation
    plain_ms_per_token: float  # the same setup without speculation
    source: str
    throughput: tuple[float, float, float] | None = None  # output tokens/s without and with speculation, the speedup
    tokens_per_call: float | None = None  # mean tokens per target call (vLLM's "acceptance length"), where published

    def differences(self, config: Config) -> list[str]:
        """'field value (published: value)' for every field of the setup this config does not share."""
        data = config.model_dump()
        return [
            f"{field} {got!r} (published: {want!r})"
            for field, want in self.setup.items()
            if (got := _pick(data, field)) != want
        ]


TRN2_LLAMA_33_70B = PublishedRun(
    instance="trn2.48xlarge",
    target="llama-3.3-70b",
    draft="llama-3.2-1b",
    setup={
        "neuron.library": "nxdi",
        "speculation.engine": "fused",
        "speculation.k": 7,
        "target.batch_size": 1,  # --batch-size 1 (trn2-llama3.3-70b-tutorial.rst:376)
        "speculation.drafter": "model",
        "sampling.temperature": 0.0,
        "target.dtype": "bf16",
        "draft.dtype": "bf16",
        "target.tp_degree": 64,
        "draft.tp_degree": 64,
        "target.n_positions": 12800,
        "draft.n_positions": 12800,
        "generation.max_prompt_tokens": 12288,
        "neuron.nxdi.context_encoding_buckets": [2048, 4096, 8192, 12288],
        "neuron.nxdi.token_generation_buckets": [2048, 4096, 8192, 12800],
        "neuron.nxdi.fused_qkv": True,
        "neuron.nxdi.sequence_parallel_enabled": True,
        "neuron.nxdi.qkv_kernel_enabled": True,
        "neuron.nxdi.attn_kernel_enabled": True,
        "neuron.nxdi.mlp_kernel_enabled": True,
        "neuron.nxdi.cc_pipeline_tiling_factor": 1,
    },
    ms_per_token=5.3,
    plain_ms_per_token=19.6,
    source=TUTORIAL_SOURCE,
)
EAGLE3_TUTORIAL_SOURCE = (
    "AWS vllm-neuron tutorial 'Deploy EAGLE3 speculative decoding with vLLM Neuron using Llama 3.1 8B Instruct' "
    "(aws-neuron-sdk 81ce03ae vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md:236-336): "
    "vllm bench serve, sonnet 512-token prompts, 128 new tokens, 50 prompts, concurrency 2, medians"
)
# Its setup (tutorial :50-55, :176-188): trn2.48xlarge, --tensor-parallel-size 8, --max-num-seqs 2, --max-model-len
# 2048, num_speculative_tokens 3 (our k 4), draft RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3; figures :276-282
# and :325-331; its baseline is the same server without --speculative-config (:121-128).
VLLM_NEURON_LLAMA_31_8B_EAGLE3 = PublishedRun(
    instance="trn2.48xlarge",
    target="llama-3.1-8b",
    draft="eagle-head-llama-3.1-8b",
    setup={
        "neuron.library": "vllm-neuron",
        "speculation.drafter": "eagle3",
        "speculation.k": 4,
        "target.tp_degree": 8,
        "target.batch_size": 2,
        "target.n_positions": 2048,
        "draft.path": "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
    },
    ms_per_token=6.41,
    plain_ms_per_token=10.52,
    source=EAGLE3_TUTORIAL_SOURCE,
    throughput=(184.4, 288.6, 1.57),  # as the tutorial states them (:327, :335)
    tokens_per_call=3.22,
)
PUBLISHED_RUNS = (TRN2_LLAMA_33_70B, VLLM_NEURON_LLAMA_31_8B_EAGLE3)


def published_run(instance: str, target: str, draft: str | None) -> PublishedRun | None:
    """The run AWS published for this model pair on this instance, if any."""
    return next(
        (run for run in PUBLISHED_RUNS if (run.instance, run.target, run.draft) == (instance, target, draft)), None
    )


def _pick(data: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        data = data.get(key) if isinstance(data, dict) else None
    return data
