#!/usr/bin/env bash
# CI, third leg: the lowest transformers 5.x we claim (5.0.0), in its own venv (.venv-tf50): set-up, the
# embedded model converted and known-answer checked, one greedy generation whose text must be sensible
# (.ci/transformers-leg.sh), then the fast tests of what depends on the transformers version: the torch
# backend and Hugging Face's forward with its caches (sliding windows: 5.0-5.17 cannot roll a window-sized
# layer back, hf_forward.SLIDING_LAYERS_ROLL_BACK), the compact forward and row kernel checked against it,
# drafters, the generator and batching over it, the embedded model's conversion and known answer.
set -euo pipefail
exec bash "$(dirname "$0")/transformers-leg.sh" .venv-tf50 "transformers==5.0.0" -m "not slow" \
  tests/test_torch_backend.py tests/test_compact_forward.py tests/test_batched_scoring.py tests/test_row_kernel.py \
  tests/test_model_drafter.py tests/test_generator.py tests/test_batching.py tests/test_pipeline_generate_ids.py \
  tests/test_embedded.py tests/test_embedded_cache.py tests/test_known_answer.py
