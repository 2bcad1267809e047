"""The bootstrap script itself, run by bash on this machine with its paths moved into a temp folder.

`shutdown`, `systemctl`, `aws`, `pip`, `curl` and `date` are fakes on PATH that record their arguments,
so the test sees what the instance would do: install the expiry check and its systemd timer first, and
after any failure record `failed: <step>` and shut down (= terminate) within 15 minutes instead of
billing until the expiry. The expiry check is then run as systemd runs it after every boot, at a
given time, with the expires-at tag that instance metadata would show.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath

import yaml
from deploy_fixtures import TRN1_CONFIG

from neuron_ssp.config import load_config
from neuron_ssp.deploy.ami import TRANSFORMERS_NEURONX_VENV
from neuron_ssp.deploy.userdata import (
    EXPIRY_CHECK,
    EXPIRY_FILE,
    HF_TOKEN_FILE,
    HOME_DIR,
    LOG_FILE,
    STATUS_FILE,
    UNIT_DIR,
    BootstrapSpec,
    HfTokenSource,
    render,
)

FAKE = '#!/bin/sh\necho "$(basename "$0") $*" >> "{calls}"\n{body}\n'
EXPIRES = datetime(2025, 8, 1, 16, 0, tzinfo=timezone.utc)
VLLM_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vllm-neuron-llama31-8b-eagle3.yaml"
# `date -u +%s` (now) answers the test's clock; anything else is the real date (GNU, as on the DLAMI)
FAKE_DATE = 'if [ "$*" = "-u +%s" ]; then cat "{clock}"; else exec /bin/date "$@"; fi'
# instance metadata: the token request answers, the tag request answers the test's tag (or fails: tags off)
FAKE_CURL = 'case "$*" in *tags/instance/*) [ -s "{tag}" ] && cat "{tag}" || exit 22 ;; *) echo token ;; esac'


@dataclass
class Instance:
    root: Path
    code: int
    status: str

    @property
    def calls_file(self) -> Path:
        return self.root / "calls.log"

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []

    def boot_check(self, now: datetime, tag: str = "") -> list[str]:
        """What the expiry check does after a (re)boot at `now`: the shutdown calls it makes."""
        (self.root / "clock").write_text(f"{int(now.timestamp())}\n")
        (self.root / "tag").write_text(tag)
        before = len(self.calls())
        subprocess.run([str(self.root / "sbin/neuron-ssp-expiry")], env=env(self.root), check=True, timeout=30)
        return [c for c in self.calls()[before:] if c.startswith("shutdown")]


def env(root: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}


def run_bootstrap(
    tmp_path: Path, *, venv: bool = True, pip_fails: bool = False, config: Path = TRN1_CONFIG, serve: bool = False
) -> Instance:
    """Render the real user data, move its paths under tmp_path, run it once, as EC2 does."""
    spec = BootstrapSpec(
        deployment="trn1-test",
        region="us-east-1",
        config_yaml=yaml.safe_dump(load_config(config).model_dump(mode="json"), sort_keys=False),
        model_paths=("/opt/models/Llama-2-70b-hf",),
        expires_at=EXPIRES,
        package_spec="neuron-ssp==0.1.0",
        weights_s3_uri="s3://weights/models",
        hf_token=HfTokenSource("ssm", "/neuron-ssp/hf"),
        serve_on_boot=serve,
    )
    (tmp_path / "units").mkdir()
    (tmp_path / "sbin").mkdir()
    moved = {
        STATUS_FILE: tmp_path / "state/status",
        EXPIRY_FILE: tmp_path / "state/expires-at",
        LOG_FILE: tmp_path / "bootstrap.log",
        HOME_DIR: tmp_path / "home",
        UNIT_DIR: tmp_path / "units",
        EXPIRY_CHECK: tmp_path / "sbin/neuron-ssp-expiry",
        TRANSFORMERS_NEURONX_VENV: tmp_path / "venv",
        str(PurePosixPath(HF_TOKEN_FILE).parent): tmp_path / "hf",
    }
    script = render(spec)
    for real, fake in moved.items():
        script = script.replace(real, str(fake))
    assert not any(p in script.replace("/opt/models/", "") for p in ("/opt/", "/var/", "/root/", "/etc/", "/usr/"))

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    bodies = {
        "shutdown": "",
        "systemctl": "",
        "aws": "",
        "pip": "exit 1" if pip_fails else "",
        "date": FAKE_DATE.format(clock=tmp_path / "clock"),
        "curl": FAKE_CURL.format(tag=tmp_path / "tag"),
    }
    for name, body in bodies.items():
        (bin_dir / name).write_text(FAKE.format(calls=calls, body=body))
        (bin_dir / name).chmod(0o755)
    if venv:
        (tmp_path / "venv/bin").mkdir(parents=True)
        (tmp_path / "venv/bin/activate").write_text("")
    done = subprocess.run(["bash", "-c", script], env=env(tmp_path), capture_output=True, text=True, timeout=60)
    return Instance(tmp_path, done.returncode, (tmp_path / "state/status").read_text().strip())


def test_a_complete_bootstrap_arms_the_expiry_timer_and_shuts_nothing_down(tmp_path: Path) -> None:
    instance = run_bootstrap(tmp_path)
    assert (instance.code, instance.status) == (0, "ready")
    calls = instance.calls()
    assert "systemctl enable --now neuron-ssp-expiry.timer" in calls
    assert not [c for c in calls if c.startswith("shutdown")]
    assert any(c.startswith("pip install") for c in calls) and any("s3 sync" in c for c in calls)
    timer = (tmp_path / "units/neuron-ssp-expiry.timer").read_text()
    assert "OnBootSec=1min" in timer and "OnUnitActiveSec=5min" in timer and "WantedBy=timers.target" in timer
    service = (tmp_path / "units/neuron-ssp-expiry.service").read_text()
    assert f"ExecStart={tmp_path / 'sbin/neuron-ssp-expiry'}" in service


def test_the_expiry_holds_after_a_reboot_and_follows_an_extended_tag(tmp_path: Path) -> None:
    """User data runs once; after a reboot only the timer's check stands between the instance and the bill."""
    instance = run_bootstrap(tmp_path)
    assert instance.boot_check(EXPIRES - timedelta(minutes=5), tag="2025-08-01T16:00:00Z") == []
    assert instance.boot_check(EXPIRES + timedelta(minutes=1), tag="2025-08-01T16:00:00Z") == [
        "shutdown -h now neuron-ssp: expired at 2025-08-01T16:00:00Z"
    ]
    # tags not readable from instance metadata: the time written at launch still ends it
    assert instance.boot_check(EXPIRES + timedelta(minutes=1)) == [
        "shutdown -h now neuron-ssp: expired at 2025-08-01T16:00:00Z"
    ]
    # `deploy extend` retagged it: the check follows the tag, not the launch's time
    assert instance.boot_check(EXPIRES + timedelta(hours=1), tag="2025-08-01T18:00:00Z") == []
    assert instance.boot_check(EXPIRES + timedelta(hours=3), tag="2025-08-01T18:00:00Z") == [
        "shutdown -h now neuron-ssp: expired at 2025-08-01T18:00:00Z"
    ]


def test_a_missing_venv_records_the_step_and_shuts_down_in_15_minutes_with_the_expiry_still_armed(
    tmp_path: Path,
) -> None:
    instance = run_bootstrap(tmp_path, venv=False)
    assert instance.code != 0 and instance.status == "failed: venv"
    calls = instance.calls()
    assert "systemctl enable --now neuron-ssp-expiry.timer" in calls  # `shutdown -c` keeps it until the expiry
    shutdowns = [c for c in calls if c.startswith("shutdown")]
    assert shutdowns == ["shutdown -h +15 neuron-ssp bootstrap failed at step venv"]
    assert not any(c.startswith("pip install") for c in calls)  # it stopped at the failure
    log = (tmp_path / "bootstrap.log").read_text()
    assert "neuron-ssp deploy extend trn1-test --hours N" in log and "until 2025-08-01T16:00:00Z" in log


def test_a_failing_install_records_the_step_and_shuts_down_in_15_minutes(tmp_path: Path) -> None:
    instance = run_bootstrap(tmp_path, pip_fails=True)
    assert instance.code != 0 and instance.status == "failed: install"
    assert instance.calls()[-1] == "shutdown -h +15 neuron-ssp bootstrap failed at step install"


def test_a_vllm_neuron_bootstrap_starts_its_server_as_a_service(tmp_path: Path) -> None:
    """vllm-neuron configs are served at boot: a unit running `neuron-ssp serve` (which execs `vllm serve`) in the
    venv, restarted on failure; other configs start nothing."""
    instance = run_bootstrap(tmp_path, config=VLLM_CONFIG, serve=True)
    assert (instance.code, instance.status) == (0, "ready"), (tmp_path / "bootstrap.log").read_text()
    unit = (tmp_path / "units/neuron-ssp-server.service").read_text()
    assert f"neuron-ssp serve --config {tmp_path / 'home'}/config.yaml" in unit and "Restart=on-failure" in unit
    assert "systemctl enable --now neuron-ssp-server.service" in instance.calls()
    (tmp_path / "plain").mkdir()
    plain = run_bootstrap(tmp_path / "plain")
    assert not (tmp_path / "plain/units/neuron-ssp-server.service").exists() and plain.status == "ready"
