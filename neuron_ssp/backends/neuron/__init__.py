"""The Neuron backend: Llama models on NeuronCores through transformers-neuronx.

One module per job, so the split from the reference backend (backends/torch.py) shows in the tree:
- api: import the installed library, tell its API generation from signatures, call it only as checked;
- load: validate, set up the runtime, build and place the models in the plan's order;
- scoring: `ModelBackend` over a compiled `LlamaForSampling` (context, one token, a k-wide window);
- artifacts / compile: compiled models kept between runs, one artifact set holding every k;
- selftest: the k-wide window against one-token calls at the same cache positions, before serving;
- library: `engine: library`, transformers-neuronx's own `SpeculativeGenerator` loop;
- fused: `engine: fused`, transformers-neuronx's `FusedSpeculativeDecoder` (draft loop on device).

Nothing here is imported unless `platform.backend: neuron` (or a Neuron command) asks for it.
"""
