"""platform.prefix_cache: where a request can start from a prefix an earlier one computed, and where not, and why.

- torch backend: our loop's warm slots and prefix pool (engines/slot_caches.py) on the compact forward's row kernel.
  Hugging Face's forward rebuilds its DynamicCache at each prefill, so `true` with forward hf is refused; the torch
  path without the kernel (CUDA, no C compiler) is known only at load, where `true` is refused then.
- transformers-neuronx: refused. Its context-encoding networks attend within the call's own tokens
  (llama/hlo.py:672-676 flash_attention(query, key, value), :733 score(query, key), at 1ade6d7): a prompt's rest
  cannot be encoded after a cached prefix. Only its chunked-prefill mode, with block tables a caller (vLLM)
  manages, reads the cache there.
- NxD Inference (since Neuron SDK 2.24, NxD Inference 0.4.7422: "Automatic Prefix Caching support (APC) through
  vLLM", release-notes/components/nxd-inference.rst): `is_prefix_caching` with a block KV layout (models/config.py
  :277-282 at 4bcdc54b), but NxDI "does not implement its own cache eviction, memory management, or prefix hashing
  ... it requires external management of the block KV cache and expects active block tables and slot mappings to be
  provided with each generation request" (developer_guides/feature-guide.rst:910-913 at aws-neuron-sdk 81ce03ae).
  neuron-ssp's NxDI engines drive its contiguous cache by sequence id and keep no block tables, so they refuse it;
  vLLM is the caller NxDI is built for. Besides, EAGLE-3 with prefix caching is asserted unsupported
  (model_base.py:1658) and a prefix under 128 tokens is not reused (attention_base.py:1745-1750).
- vllm-neuron: vLLM's own prefix caching, `--enable-prefix-caching` when `true` (deploy/vllm_neuron.py), refused at
  one sequence: "Prefix caching with batch_size=1 generates incorrect outputs" (vllm-project/vllm-neuron a5ef7c8
  README.md:118). Left unset, the command keeps AWS's EAGLE-3 tutorial's `--no-enable-prefix-caching`.
"""

from __future__ import annotations

from neuron_ssp.config import Config
from neuron_ssp.errors import Problem
from neuron_ssp.topology.report import ValidationReport

NXDI_PREFIX_CACHING_SDK = "2.24"  # NxD Inference 0.4.7422, release-notes/components/nxd-inference.rst
NXDI_SMALLEST_PREFIX = 128  # attention_base.py:1745-1750 at 4bcdc54b


def check_prefix_cache(config: Config, report: ValidationReport) -> None:
    """Every reason `platform.prefix_cache: true` cannot run with this config."""
    if config.platform.prefix_cache is not True:
        return
    reason = _refusal(config)
    if reason is not None:
        rule, fix = reason
        report.errors.append(Problem("platform.prefix_cache", True, rule, fix))
    elif (config.platform.backend, config.neuron.library, config.speculation.drafter) == (
        "neuron",
        "vllm-neuron",
        "eagle3",
    ):
        report.warnings.append(
            Problem(
                "platform.prefix_cache",
                True,
                "AWS's EAGLE-3 tutorial serves with --no-enable-prefix-caching "
                "(tutorial-eagle3-speculative-decoding-llama-3-1.md:181): an EAGLE-3 head with prefix caching is "
                "off vllm-neuron's tested path",
                "measure acceptance with and without it before relying on it",
            )
        )


def _refusal(config: Config) -> tuple[str, str] | None:
    platform, library = config.platform, config.neuron.library
    if platform.backend == "torch":
        if platform.forward == "hf":
            return (
                "Hugging Face's forward rebuilds its DynamicCache at every prefill, so nothing of an earlier request "
                "is left to reuse; prefix caching runs on the compact forward (the row kernel)",
                "set platform.forward: auto (or compact), or leave platform.prefix_cache out",
            )
        return None
    if library == "transformers-neuronx":
        return (
            "transformers-neuronx encodes a prompt with context networks that attend within the call's own tokens "
            "(llama/hlo.py:672-676, :733 at 1ade6d7), so the rest of a prompt cannot be encoded after a cached "
            "prefix",
            "leave platform.prefix_cache out (or false) on transformers-neuronx",
        )
    if library == "nxdi":
        return (
            f"NxD Inference's prefix caching (Neuron SDK {NXDI_PREFIX_CACHING_SDK}+) needs its caller to manage block "
            "tables, slot mappings and eviction (feature-guide.rst:910-913), as vLLM does; neuron-ssp's NxDI engines "
            "drive its contiguous cache by sequence id",
            "serve through vLLM (neuron.library: vllm-neuron), or leave platform.prefix_cache out",
        )
    if library == "vllm-neuron" and config.target.batch_size == 1:
        return (
            "vllm-neuron lists prefix caching at one sequence as giving incorrect outputs (vllm-project/vllm-neuron "
            "README.md:118, 'Prefix caching with batch_size=1 generates incorrect outputs')",
            "set target.batch_size (--max-num-seqs) to 2 or more, or platform.prefix_cache: false",
        )
    return None
