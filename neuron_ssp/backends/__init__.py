"""Model backends: score tokens at cache positions and return logits. They know nothing of acceptance."""

from neuron_ssp.backends.base import ModelBackend

__all__ = ["ModelBackend"]
