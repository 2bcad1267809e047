"""Render the EC2 user data that turns a fresh Neuron DLAMI into a neuron-ssp host.

The template (`neuron_ssp/data/deploy-bootstrap.sh`) is plain bash with `{{NAME}}` slots; every value
is shell-quoted here. No secret is ever written into it (user data is readable by anyone with
ec2:DescribeInstanceAttribute): the Hugging Face token is fetched at boot by the instance role, and
`render` refuses values that look like credentials (a pasted token, a key id, user info in a URL).
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from neuron_ssp.deploy import tags
from neuron_ssp.deploy.ami import TRANSFORMERS_NEURONX_VENV
from neuron_ssp.errors import Problem, UsageError

TEMPLATE = Path(__file__).resolve().parent.parent / "data" / "deploy-bootstrap.sh"
NEURON_PIP_INDEX = "https://pip.repos.neuron.amazonaws.com"
USER_DATA_LIMIT = 16 * 1024  # EC2 rejects larger user data (before base64)

# Where things live on the instance; `deploy run/status/logs` read the same paths.
HOME_DIR = "/opt/neuron-ssp"
CONFIG_FILE = f"{HOME_DIR}/config.yaml"
ENV_FILE = f"{HOME_DIR}/env.sh"
STATUS_FILE = "/var/lib/neuron-ssp/status"
LOG_FILE = "/var/log/neuron-ssp-bootstrap.log"
READY = "ready"
FAILED_PREFIX = "failed"  # the status file reads "failed: <step>" after the bootstrap's ERR trap ran
FAILURE_SHUTDOWN_MINUTES = 15
EXPIRY_FILE = "/var/lib/neuron-ssp/expires-at"  # the launch's expiry, for when instance tags are not readable
EXPIRY_CHECK = "/usr/local/sbin/neuron-ssp-expiry"  # run by neuron-ssp-expiry.timer after every boot
UNIT_DIR = "/etc/systemd/system"
HF_TOKEN_FILE = "/root/.cache/huggingface/token"
_SLOT = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
_CREDENTIALS = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "an AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    # GitHub's token prefixes (classic, OAuth, user-to-server, server-to-server, refresh; fine-grained)
    "a GitHub token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
    "a GitLab token": re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),
    # user info in a URL (`https://user:password@host`, `https://<token>@host`): pip and git send it
    "a user name or password in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s@]+@", re.IGNORECASE),
}


@dataclass(frozen=True)
class HfTokenSource:
    """Where the instance reads the Hugging Face token: a Secrets Manager secret or an SSM SecureString."""

    kind: str  # "secretsmanager" or "ssm"
    name: str

    def fetch_command(self) -> str:
        if self.kind == "secretsmanager":
            read = (
                f"aws secretsmanager get-secret-value --secret-id {shlex.quote(self.name)} "
                "--query SecretString --output text"
            )
        else:
            read = (
                f"aws ssm get-parameter --name {shlex.quote(self.name)} --with-decryption "
                "--query Parameter.Value --output text"
            )
        folder = shlex.quote(str(PurePosixPath(HF_TOKEN_FILE).parent))
        return f"(umask 077; mkdir -p {folder}; {read} > {shlex.quote(HF_TOKEN_FILE)})"


@dataclass(frozen=True)
class BootstrapSpec:
    deployment: str
    region: str
    config_yaml: str
    model_paths: tuple[str, ...]
    expires_at: datetime
    package_spec: str
    weights_s3_uri: str | None = None
    hf_token: HfTokenSource | None = None
    venv: str = TRANSFORMERS_NEURONX_VENV
    serve_on_boot: bool = False  # vllm-neuron: start `neuron-ssp serve` (= vllm serve) as a service at boot


def weight_sources(weights_s3_uri: str, model_paths: tuple[str, ...]) -> list[tuple[str, str]]:
    """Each model directory `.../<dir>` comes from `<weights-s3-uri>/<dir>/`."""
    base = weights_s3_uri.rstrip("/")
    return [(f"{base}/{PurePosixPath(path).name}/", path) for path in model_paths]


def render(spec: BootstrapSpec) -> str:
    _refuse_credentials(spec)
    values = {
        "DEPLOYMENT": spec.deployment,
        "REGION": shlex.quote(spec.region),
        "EXPIRES_AT": tags.expiry_text(spec.expires_at),
        "EXPIRES_KEY": tags.EXPIRES_KEY,
        "EXPIRY_FILE": EXPIRY_FILE,
        "EXPIRY_CHECK": EXPIRY_CHECK,
        "UNIT_DIR": UNIT_DIR,
        "FAILURE_SHUTDOWN_MINUTES": str(FAILURE_SHUTDOWN_MINUTES),
        "VENV": shlex.quote(spec.venv),
        "PACKAGE_SPEC": shlex.quote(spec.package_spec),
        "NEURON_PIP_INDEX": NEURON_PIP_INDEX,
        "CONFIG_B64": base64.b64encode(spec.config_yaml.encode()).decode(),
        "WEIGHTS_COMMANDS": _weights_commands(spec),
        "HF_TOKEN_COMMANDS": spec.hf_token.fetch_command()
        if spec.hf_token
        else 'echo "no Hugging Face token configured"',
        "SERVE_COMMANDS": _serve_commands(spec),
        "HOME_DIR": HOME_DIR,
        "CONFIG_FILE": CONFIG_FILE,
        "ENV_FILE": ENV_FILE,
        "STATUS_FILE": STATUS_FILE,
        "LOG_FILE": LOG_FILE,
    }
    script = _SLOT.sub(lambda m: values[m.group(1)], TEMPLATE.read_text())
    size = len(script.encode())
    if size > USER_DATA_LIMIT:
        raise UsageError(
            Problem(
                "config",
                f"{size} bytes of user data",
                f"EC2 user data is limited to {USER_DATA_LIMIT} bytes",
                "shorten the config (comments, prompts)",
            )
        )
    return script


def _refuse_credentials(spec: BootstrapSpec) -> None:
    """User data is readable by anyone allowed to describe the instance: no credential may go in."""
    fields = {
        "config": spec.config_yaml,
        "--package-spec": spec.package_spec,
        "--weights-s3-uri": spec.weights_s3_uri or "",
    }
    problems = [
        Problem(
            field,
            "<not shown>",
            f"holds what looks like {kind}; EC2 user data is readable by anyone allowed to describe the instance",
            "remove it; a Hugging Face token goes in Secrets Manager or an SSM SecureString "
            "(--hf-token-secret / --hf-token-parameter), read at boot by the instance role",
        )
        for field, text in fields.items()
        for kind, pattern in _CREDENTIALS.items()
        if pattern.search(text)
    ]
    if problems:
        raise UsageError(problems)


SERVER_UNIT = "neuron-ssp-server"


def _serve_commands(spec: BootstrapSpec) -> str:
    """A systemd unit running `neuron-ssp serve` on the config (for vllm-neuron it execs `vllm serve`, which
    compiles for minutes before it listens): restarted on failure, its log in the journal."""
    if not spec.serve_on_boot:
        return 'echo "the server is started by neuron-ssp deploy run"'
    start = f". {ENV_FILE} && exec neuron-ssp serve --config {CONFIG_FILE}"
    return "\n".join(
        (
            f"cat > {UNIT_DIR}/{SERVER_UNIT}.service <<UNIT",
            "[Unit]",
            "Description=neuron-ssp: the config's server",
            "After=network-online.target",
            "[Service]",
            f"ExecStart=/bin/bash -c {shlex.quote(start)}",
            "Restart=on-failure",
            "RestartSec=30",
            "[Install]",
            "WantedBy=multi-user.target",
            "UNIT",
            "systemctl daemon-reload",
            f"systemctl enable --now {SERVER_UNIT}.service",
        )
    )


def _weights_commands(spec: BootstrapSpec) -> str:
    if not spec.weights_s3_uri:
        checks = [
            f'test -d {shlex.quote(p)} || echo "WARNING: {p} is missing and no --weights-s3-uri was given"'
            for p in spec.model_paths
        ]
        return "\n".join(checks) or "true"
    return "\n".join(
        f"aws s3 sync --only-show-errors {shlex.quote(src)} {shlex.quote(dst)}"
        for src, dst in weight_sources(spec.weights_s3_uri, spec.model_paths)
    )
