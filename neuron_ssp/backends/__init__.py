"""Model backends: score tokens at cache positions and return logits. They know nothing of acceptance.

- base: the one interface the engines need (`ModelBackend`);
- torch/, neuron/ (transformers-neuronx), nxdi/ (NxD Inference): the backends;
- checkpoint: what a model directory says about ending a generation (EOS ids, the chat's turn end);
- window_check: judges a k-wide window against one-token calls (the Neuron self-tests of both libraries).
"""

from neuron_ssp.backends.base import ModelBackend

__all__ = ["ModelBackend"]
