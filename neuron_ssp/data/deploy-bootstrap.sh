#!/bin/bash
# neuron-ssp bootstrap: EC2 user data rendered by `neuron-ssp deploy launch` for deployment {{DEPLOYMENT}}.
# It holds no secrets: a Hugging Face token, if any, is read at boot from Secrets Manager or an SSM
# SecureString with the instance role. Progress: {{STATUS_FILE}}; log: {{LOG_FILE}}.
set -Eeuo pipefail
mkdir -p "$(dirname {{STATUS_FILE}})" {{HOME_DIR}}
exec > >(tee -a {{LOG_FILE}}) 2>&1
STEP=start
step() { STEP="$1"; echo "$1" > {{STATUS_FILE}}; echo "[neuron-ssp] $(date -u +%FT%TZ) $1"; }
# A failed bootstrap must not bill until the TTL: record the failure (launch polls the status file,
# prints this log's tail and terminates the instance), then shut down in {{FAILURE_SHUTDOWN_MINUTES}} minutes, which
# terminates the instance (InstanceInitiatedShutdownBehavior=terminate) if launch could not.
on_error() {
  trap - ERR
  echo "failed: $STEP" > {{STATUS_FILE}}
  echo "[neuron-ssp] bootstrap FAILED at step: $STEP; the instance terminates itself in" \
       "{{FAILURE_SHUTDOWN_MINUTES}} minutes (run 'sudo shutdown -c' on it to keep it for debugging)"
  shutdown -h +{{FAILURE_SHUTDOWN_MINUTES}} "neuron-ssp bootstrap failed at step $STEP" || true
}
trap on_error ERR

# 1. TTL first, before anything can fail: with InstanceInitiatedShutdownBehavior=terminate a shutdown
#    terminates the instance, so a forgotten deployment stops costing money after the TTL.
step ttl
shutdown -h +{{TTL_MINUTES}} "neuron-ssp TTL reached"
export AWS_DEFAULT_REGION={{REGION}}

# 2. The transformers-neuronx venv of the Neuron DLAMI (SDK 2.25).
step venv
if [ ! -f {{VENV}}/bin/activate ]; then
  echo "this AMI has no {{VENV}}: transformers-neuronx ships only in the Neuron DLAMIs of SDK 2.24-2.25;" \
       "launch again with --ami pinned"
  false
fi
set +u  # activate scripts may read unset variables
# shellcheck disable=SC1091
source {{VENV}}/bin/activate
set -u

# 3. This package. The venv's Neuron stack stays exactly as the DLAMI ships it (constraints file).
step install
pip list --format=freeze --exclude-editable \
  | { grep -iE '^(torch|torch-neuronx|torch-xla|transformers|transformers-neuronx|neuronx-cc|libneuronxla|numpy)==' || true; } \
  > {{HOME_DIR}}/neuron-constraints.txt
PACKAGE={{PACKAGE_SPEC}}
case "$PACKAGE" in
  s3://*) aws s3 cp --only-show-errors "$PACKAGE" {{HOME_DIR}}/ && PACKAGE={{HOME_DIR}}/"$(basename "$PACKAGE")" ;;
esac
pip install --quiet --extra-index-url {{NEURON_PIP_INDEX}} -c {{HOME_DIR}}/neuron-constraints.txt "$PACKAGE"

# 4. The config, and the model weights from S3.
step config
echo {{CONFIG_B64}} | base64 -d > {{CONFIG_FILE}}
step weights
{{WEIGHTS_COMMANDS}}

# 5. The Hugging Face token (optional), readable by root only.
step hf-token
{{HF_TOKEN_COMMANDS}}

# 6. What `neuron-ssp deploy run` sources before each command.
step env
cat > {{ENV_FILE}} <<ENV
. {{VENV}}/bin/activate
export AWS_DEFAULT_REGION={{REGION}}
cd {{HOME_DIR}}
ENV
step ready
