#!/usr/bin/env bash
# CI, NxD Inference leg: the real NxDI 0.9.0 and NxD Python (unmodified snapshots in ../shared/vendor) in their
# own venv (.venv-nxdi: NxDI expects transformers 4.57), then our NxDI tests on CPU. The closed-source Neuron
# modules NxDI imports are stubbed by the tests themselves (tests/nxdi_support/); see ../shared/vendor/README.md.
# Without ../shared/vendor (a plain clone) there is nothing to install: the leg says so and passes.
set -euo pipefail
cd "$(dirname "$0")/.."
vendor=../shared/vendor
if [ ! -d "$vendor" ]; then
  echo "NxDI leg skipped: $vendor (the NxDI and NxD source snapshots) is absent"
  exit 0
fi
venv=.venv-nxdi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet torch==2.13.0          # first: a bare `torch` spec would pull CUDA wheels
"$venv/bin/pip" install --quiet "transformers==4.57.*" boto3 tenacity wheel -e ".[test]"
# their setup.py pins torch_neuronx (not on PyPI): no dependencies; SUFFIX avoids a `git rev-parse`
SUFFIX=src "$venv/bin/pip" install --quiet --no-deps --no-build-isolation \
  "$vendor/neuronx-distributed-fbac349b.tar.gz" "$vendor/neuronx-distributed-inference-4bcdc54b.tar.gz"
"$venv/bin/python" -c 'import transformers; print("transformers", transformers.__version__); assert transformers.__version__.startswith("4.57.")'
OMP_NUM_THREADS=1 "$venv/bin/python" -m pytest -q tests/test_nxdi_*.py
