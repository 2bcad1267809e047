"""What each drafter needs and how it drafts, by its config name: the one table the loop, the pipeline and the tools
read instead of comparing drafter names. config.py (the ground floor, which imports nothing above it) keeps its own
tuples of the names that need `draft.path`; a test holds them to this table."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_ssp.config import DrafterName


@dataclass(frozen=True)
class DrafterKind:
    """`draft_model`: draft.path names a draft language model (its own KV cache, one per row's slot); `head`: it
    names an EAGLE head; `host`: it runs on the host CPU beside the loop (model-free, or a head in torch), not on the
    target's device; `hidden_states`: it drafts from the target's hidden states (the target's calls hand them out,
    and it cannot draft past tokens the target has not scored); `samples`: it draws from a distribution (drafted
    under a row's grammar mask) rather than proposing point masses (cut at the first token a grammar refuses);
    `learns`: it keeps what earlier requests committed (its state is shared by a pipeline's rows)."""

    name: str
    draft_model: bool = False
    head: bool = False
    host: bool = True
    hidden_states: bool = False
    samples: bool = False
    learns: bool = False

    @property
    def drafts(self) -> bool:
        """False for 'none': plain decoding through the same loop."""
        return self.name != "none"

    @property
    def needs_draft_path(self) -> bool:
        return self.draft_model or self.head


DRAFTERS: dict[str, DrafterKind] = {
    kind.name: kind
    for kind in (
        DrafterKind("none"),
        DrafterKind("ngram"),
        DrafterKind("suffix", learns=True),
        DrafterKind("model", draft_model=True, host=False, samples=True),
        DrafterKind("eagle3", head=True, hidden_states=True, samples=True),
        DrafterKind("ngram+eagle3", head=True, hidden_states=True, samples=True),
        # EAGLE-1 heads run only inside NxD Inference's fused speculation, on the device
        DrafterKind("eagle", head=True, host=False, hidden_states=True, samples=True),
    )
}


def drafter_kind(name: DrafterName | str) -> DrafterKind:
    return DRAFTERS[name]
