"""Drafters propose up to k-1 tokens with their draft distributions (as logits)."""

from neuron_ssp.drafters.base import Draft, Drafter
from neuron_ssp.drafters.model import ModelDrafter
from neuron_ssp.drafters.ngram import NgramDrafter
from neuron_ssp.drafters.suffix import SuffixDrafter, SuffixHistory

__all__ = ["Draft", "Drafter", "ModelDrafter", "NgramDrafter", "SuffixDrafter", "SuffixHistory"]
