"""The NxD Inference backend (`neuron.library: nxdi`): Llama models on NeuronCores through
neuronx-distributed-inference, the supported successor of transformers-neuronx (trn1/inf2 up to SDK 2.28, trn2).

One module per job, as in backends/neuron/:
- api: import NxDI and build its NeuronConfig / InferenceConfig / application from ours, checked;
- scoring: `ModelBackend` over a NeuronLlamaForCausalLM, with NxDI's position / mask / seq_ids rules;
- load / compile: compile(dir) once per k, load(dir, start_rank_id, local_ranks_size), our manifest;
- env: what the host offers (version, SDK, DLAMI venvs) without importing NxDI.
Its fused speculation is an engine: neuron_ssp/engines/nxdi_fused.py. Nothing here is imported unless a
config names `neuron.library: nxdi` (or doctor probes for it).
"""
