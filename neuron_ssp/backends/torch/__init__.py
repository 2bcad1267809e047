"""The reference backend: Hugging Face models on CPU or CUDA (what runs without Neuron devices).

- load: build the target (and draft) backends from a config, with the embedded model's known-answer check;
- scoring: `ModelBackend` over a Hugging Face causal LM with a position-addressed KV cache.
"""
