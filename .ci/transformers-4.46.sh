#!/usr/bin/env bash
# CI, second leg: the oldest transformers we claim, the one Neuron DLAMI venvs carry (4.46.3 with its
# tokenizers 0.20.3), in its own venv (.venv-tf446): set-up, the embedded model converted and known-answer
# checked, one greedy generation whose text must be sensible, every fast test (.ci/transformers-leg.sh).
# The main leg (.venv, the newest transformers 5.x) runs every test, slow ones included.
set -euo pipefail
exec bash "$(dirname "$0")/transformers-leg.sh" .venv-tf446 "transformers==4.46.3 tokenizers==0.20.3" -m "not slow"
