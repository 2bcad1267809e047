"""The Neuron backend: Llama models on NeuronCores through transformers-neuronx.

One module per job, so the split from the reference backend (backends/torch/) shows in the tree:
- env: what this host offers (devices, packages, venv, compile cache), for `doctor` and the load;
- api: import the installed library, tell its API generation from signatures, call it only as checked;
- load: validate, set up the runtime, build and place the models in the plan's order;
- scoring: `ModelBackend` over a compiled `LlamaForSampling` (context, one token, a k-wide window);
- artifacts / compile: compiled models kept between runs, one artifact set holding every k;
- selftest: the k-wide window against one-token calls at the same cache positions, before serving.

The library's own generation loops (`engine: library` and `fused`) are engines: neuron_ssp/engines/.
Nothing here is imported unless `platform.backend: neuron` (or a Neuron command) asks for it.
"""
