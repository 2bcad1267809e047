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
# terminates the instance (InstanceInitiatedShutdownBehavior=terminate) if launch could not. Cancelling
# that shutdown keeps the instance only until its expiry, which the timer below still enforces.
on_error() {
  trap - ERR
  echo "failed: $STEP" > {{STATUS_FILE}}
  echo "[neuron-ssp] bootstrap FAILED at step: $STEP; the instance terminates itself in" \
       "{{FAILURE_SHUTDOWN_MINUTES}} minutes ('sudo shutdown -c' on it keeps it until {{EXPIRES_AT}}, which" \
       "'neuron-ssp deploy extend {{DEPLOYMENT}} --hours N' moves)"
  shutdown -h +{{FAILURE_SHUTDOWN_MINUTES}} "neuron-ssp bootstrap failed at step $STEP" || true
}
trap on_error ERR

# 1. The expiry first, before anything can fail. User data runs once, so a `shutdown -h +N` would be lost
#    on a reboot and cancelled by `shutdown -c`. Instead a systemd timer runs the check one minute after
#    every boot and every 5 minutes: it reads the instance's expires-at tag (instance metadata, so
#    `neuron-ssp deploy extend` moves it; the time written here when tags are not readable) and, once it
#    has passed, shuts down, which terminates the instance (InstanceInitiatedShutdownBehavior=terminate).
step ttl
echo {{EXPIRES_AT}} > {{EXPIRY_FILE}}
cat > {{EXPIRY_CHECK}} <<'EXPIRY'
#!/bin/bash
# neuron-ssp: shut down (= terminate) this instance once its expires-at tag has passed.
set -u
imds=http://169.254.169.254/latest
token=$(curl -sf -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "$imds/api/token" || true)
tagged=$(curl -sf -m 2 -H "X-aws-ec2-metadata-token: $token" "$imds/meta-data/tags/instance/{{EXPIRES_KEY}}" || true)
expires=$(cat {{EXPIRY_FILE}})
if [ -n "$tagged" ] && date -u -d "$tagged" +%s > /dev/null 2>&1; then
  expires=$tagged
fi
if [ "$(date -u +%s)" -ge "$(date -u -d "$expires" +%s)" ]; then
  shutdown -h now "neuron-ssp: expired at $expires"
fi
EXPIRY
chmod 0755 {{EXPIRY_CHECK}}
cat > {{UNIT_DIR}}/neuron-ssp-expiry.service <<UNIT
[Unit]
Description=neuron-ssp: terminate this instance once its expires-at tag has passed
[Service]
Type=oneshot
ExecStart={{EXPIRY_CHECK}}
UNIT
cat > {{UNIT_DIR}}/neuron-ssp-expiry.timer <<UNIT
[Unit]
Description=neuron-ssp: check the expiry after every boot and every 5 minutes
[Timer]
OnBootSec=1min
OnUnitActiveSec=5min
AccuracySec=30s
[Install]
WantedBy=timers.target
UNIT
systemctl daemon-reload
systemctl enable --now neuron-ssp-expiry.timer
export AWS_DEFAULT_REGION={{REGION}}

# 2. The transformers-neuronx venv of the Neuron DLAMI (SDK 2.25).
step venv
if [ ! -f {{VENV}}/bin/activate ]; then
  echo "this AMI has no {{VENV}}, the venv of the config's Neuron library (transformers-neuronx: DLAMIs of" \
       "SDK 2.24-2.25; NxD Inference: up to 2.31; vllm-neuron: 2.32); launch again with --ami pinned"
  false
fi
set +u  # activate scripts may read unset variables
# shellcheck disable=SC1091
source {{VENV}}/bin/activate
set -u

# 3. This package. The venv's Neuron stack stays exactly as the DLAMI ships it (constraints file).
step install
pip list --format=freeze --exclude-editable \
  | { grep -iE '^(torch|torch[-_]neuronx|torch[-_]xla|transformers|transformers[-_]neuronx|neuronx[-_]distributed|neuronx[-_]distributed[-_]inference|neuronx[-_]cc|libneuronxla|numpy|vllm|vllm[-_]neuron|libtorch[-_]neuronx[-_]lite|nki)==' || true; } \
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
# 7. The server, where the config is served by a library's own server (vllm-neuron: `vllm serve`).
step serve
{{SERVE_COMMANDS}}
step ready
