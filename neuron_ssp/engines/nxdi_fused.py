"""`speculation.engine: fused` on NxD Inference: draft loop, target window and acceptance in one NxDI graph, for
one request or for rows that join and leave (continuous batching).

NxDI 0.9.0 (4bcdc54b), `NeuronFusedSpecModel` (models/model_base.py:1598): a call with one input token per row at
position p runs the draft k times from p (`_token_gen_forward`, :1812; the k-th pass only fills its cache),
scores the input token and the k-1 drafts on the target in one k-wide pass, and keeps the drafts while they
equal the target's own tokens (`_tkg_postprocessor`, :2799): 1..k tokens per row, the rest of the row padded
with -1 (`acceptance_padding_token`). NxDI's speculation_length is our window k (unlike transformers-neuronx's
fused k, which counts drafted tokens). We drive it as NxDI's own `_fused_assisted_decoding` does
(utils/hf_adapter.py:495): the prompt through context encoding, then one call per iteration with the last
committed token, position_ids [[p]], attention_mask ones(p) and sampling_params for the call's rows (:518).

Rows are the compiled batch's cache lines (seq_ids). A target compiled for batch B > 1 is built for continuous
batching (backends/nxdi/api.py `continuous_batching`): each row's prompt is its own context-encoding call at
batch 1 (`ctx_batch_size=1`) that writes the cache line `seq_ids` names (kv_cache_manager.py:483-487, "only
supports single seq_id"); each step is ONE fused call over the running rows. NxDI pads a call with fewer rows
than B with the missing seq_ids, sorted, and the first row's inputs (`_forward_with_pad`, model_wrapper.py:574-
621, `_pad_helper` :520-546), and returns the given rows in the given order (index_select, :697); a full
call is not reordered (:1343-1344) and reads cache line i for row i (kv_cache_manager.py:293-301), so we always send
rows sorted by slot, as vLLM's NxDI worker did (`NeuronSpeculationCausalLM.forward`, vllm 02f0c7b2
model_executor/model_loader/neuronx_distributed.py: "sort block ids sequentially"). A padded row writes the
first row's positions into a free line: stale, never read, overwritten by the next prompt there.

In a batch the draft's attention mask opens, for every row, the columns of every row's current position
(`draft_attention_mask.index_fill_(1, positions, 1)`, model_base.py:1883): a row behind the others drafts
against stale slots of its own line. The target's mask is ours, so the output is unchanged (greedy, exact);
only acceptance can drop where rows sit at different positions.

The accepted rows are `fused_outputs[0]` on a device (the KV cache stays there); on CPU NxDI keeps only the
first output, the rows themselves (`_get_constructed_outputs`, model_base.py:3807). Greedy only: with do_sample
the target samples just the window's last position, batch 1 or continuous batching alike (model_base.py:1162-1183,
a FIXME), refused by validate and, per request, at join. Acceptance statistics are exact (every call drafts k-1
and commits n); the draft/target time split is not observable inside one graph and reads zero.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_ssp.engines.base import check_room
from neuron_ssp.engines.fused_rows import FusedRowLoop
from neuron_ssp.engines.rows import Generator, Row, RowRequest, RowSettings
from neuron_ssp.errors import Problem, RuntimeProblem, UsageError
from neuron_ssp.speculation.sampling import SamplingParams
from neuron_ssp.topology.batch_rules import NXDI_FUSED_SAMPLING
from neuron_ssp.topology.positions import NXDI, extra_target_slots

PADDING = -1  # NeuronFusedSpecModel.acceptance_padding_token (model_base.py:1650)
GREEDY = SamplingParams()


class NxdiFusedLoop(FusedRowLoop):
    """Rows of NxDI's fused speculation graph (engines/fused_rows.py); its sampling must be greedy."""

    library = "NxD Inference"

    def __init__(self, target: Any, k: int):
        super().__init__(target, k, compiled_batch(target.model))
        self.app = target.model  # the fused NeuronLlamaForCausalLM

    def check(self, request: RowRequest) -> None:
        refuse_sampled(request.settings.sampling)
        check_room(
            self.target,
            request.prompt_ids.shape[0],
            request.max_new_tokens,
            "target.n_positions",
            extra_target_slots("fused", self.k, NXDI),
        )

    def first_token(self, row: Row) -> int:
        """The prompt into the row's cache line in one context-encoding call."""
        prompt_len = row.request.prompt_ids.shape[0]
        first = self._call(
            row.request.prompt_ids.view(1, -1), [row.slot], torch.arange(prompt_len).view(1, -1), [prompt_len]
        )
        return first[0][0]

    def accepted(self, rows: list[Row]) -> list[list[int]]:
        positions = [row.seq.length - 1 for row in rows]  # each row's last committed token, not yet in a cache
        return self._call(
            torch.tensor([[row.seq.last] for row in rows]),
            [row.slot for row in rows],
            torch.tensor(positions).view(-1, 1),
            positions,
        )

    def _call(
        self, input_ids: torch.Tensor, slots: list[int], position_ids: torch.Tensor, visible: list[int]
    ) -> list[list[int]]:
        """One NxDI call over rows in ascending cache lines; row i sees its cache slots 0..visible[i]-1 (the mask
        NxDI itself infers from position_ids, model_base.py:3485). Returns each row's tokens, padding dropped."""
        from neuronx_distributed_inference.modules.generation.sampling import prepare_sampling_params

        mask = (torch.arange(max(visible)).view(1, -1) < torch.tensor(visible).view(-1, 1)).to(torch.int64)
        out = self.app(
            input_ids=input_ids.to(torch.int64),
            seq_ids=torch.tensor(slots, dtype=torch.int32),
            position_ids=position_ids.to(torch.int64),
            attention_mask=mask,
            sampling_params=prepare_sampling_params(len(slots)),
        )  # greedy: top_k 1
        fused = out.fused_outputs
        accepted = fused[0] if isinstance(fused, (list, tuple)) else fused
        return [[int(t) for t in row if t != PADDING] for row in accepted.view(len(slots), -1)]


class NxdiFusedEngine(Generator):
    """The graph's loop as an engine: `generate` runs one request through it."""

    def __init__(self, target: Any, k: int):
        self.loop = NxdiFusedLoop(target, k)

    def row_loop(self) -> NxdiFusedLoop:
        """The graph's one loop: it owns the cache lines, so every caller shares it."""
        return self.loop

    def row_settings(self) -> RowSettings:
        return RowSettings(GREEDY)  # the graph's own drafts and acceptance, greedy


def compiled_batch(app: Any) -> int:
    """The rows the fused graph was compiled for; above one only with NxDI's continuous batching (a prompt per
    context-encoding call, into the cache line its seq_id names), which is how backends/nxdi builds it."""
    config = app.neuron_config
    batch = int(config.tkg_batch_size)
    if batch > 1 and not (config.is_continuous_batching and config.ctx_batch_size == 1):
        raise RuntimeProblem(
            Problem(
                "target.batch_size",
                batch,
                f"this NxD Inference fused model encodes prompts {config.ctx_batch_size} at a time without continuous "
                "batching, so a request cannot join while others run",
                "compile it through neuron-ssp (is_continuous_batching=True, ctx_batch_size=1), or set "
                "target.batch_size: 1",
            )
        )
    return batch


def refuse_sampled(sampling: SamplingParams) -> None:
    """NxDI's fused speculation with a draft model is greedy only (batch_rules.NXDI_FUSED_SAMPLING)."""
    if not sampling.greedy:
        raise UsageError(
            Problem(
                "temperature",
                sampling.temperature,
                f"NxD Inference's fused speculation decodes greedily: {NXDI_FUSED_SAMPLING}",
                "leave temperature out or send 0, or serve with speculation.engine: native (samples losslessly)",
            )
        )
