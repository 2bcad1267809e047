"""The bootstrap script itself, run by bash on this machine with its paths moved into a temp folder.

`shutdown`, `aws` and `pip` are fakes on PATH that record their arguments, so the test sees what the
instance would do: schedule the TTL first, and after any failure record `failed: <step>` and shut
down (= terminate) within 15 minutes instead of billing until the TTL.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path, PurePosixPath

import yaml
from deploy_fixtures import TRN1_CONFIG

from neuron_ssp.config import load_config
from neuron_ssp.deploy.ami import TRANSFORMERS_NEURONX_VENV
from neuron_ssp.deploy.userdata import (
    HF_TOKEN_FILE,
    HOME_DIR,
    LOG_FILE,
    STATUS_FILE,
    BootstrapSpec,
    HfTokenSource,
    render,
)

FAKE = '#!/bin/sh\necho "$(basename "$0") $*" >> "{calls}"\n{body}\n'


def run_bootstrap(tmp_path: Path, *, venv: bool = True, pip_fails: bool = False) -> tuple[int, str, list[str]]:
    """Render the real user data, move its paths under tmp_path, run it; (exit code, status, fake calls)."""
    spec = BootstrapSpec(
        deployment="trn1-test", region="us-east-1",
        config_yaml=yaml.safe_dump(load_config(TRN1_CONFIG).model_dump(mode="json"), sort_keys=False),
        model_paths=("/opt/models/Llama-2-70b-hf",), ttl_hours=4.0, package_spec="neuron-ssp==0.1.0",
        weights_s3_uri="s3://weights/models", hf_token=HfTokenSource("ssm", "/neuron-ssp/hf"),
    )
    moved = {STATUS_FILE: tmp_path / "state/status", LOG_FILE: tmp_path / "bootstrap.log", HOME_DIR: tmp_path / "home",
             TRANSFORMERS_NEURONX_VENV: tmp_path / "venv", str(PurePosixPath(HF_TOKEN_FILE).parent): tmp_path / "hf"}
    script = render(spec)
    for real, fake in moved.items():
        script = script.replace(real, str(fake))
    assert not any(p in script.replace("/opt/models/", "") for p in ("/opt/", "/var/", "/root/"))  # all in tmp_path

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name, body in {"shutdown": "", "aws": "", "pip": "exit 1" if pip_fails else ""}.items():
        (bin_dir / name).write_text(FAKE.format(calls=calls, body=body))
        (bin_dir / name).chmod(0o755)
    if venv:
        (tmp_path / "venv/bin").mkdir(parents=True)
        (tmp_path / "venv/bin/activate").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    status = (tmp_path / "state/status").read_text().strip()
    return done.returncode, status, calls.read_text().splitlines() if calls.exists() else []


def test_a_complete_bootstrap_keeps_only_the_ttl_shutdown(tmp_path: Path) -> None:
    code, status, calls = run_bootstrap(tmp_path)
    assert (code, status) == (0, "ready")
    shutdowns = [c for c in calls if c.startswith("shutdown")]
    assert shutdowns == ['shutdown -h +240 neuron-ssp TTL reached']
    assert any(c.startswith("pip install") for c in calls) and any("s3 sync" in c for c in calls)


def test_a_missing_venv_records_the_step_and_shuts_down_in_15_minutes(tmp_path: Path) -> None:
    code, status, calls = run_bootstrap(tmp_path, venv=False)
    assert code != 0 and status == "failed: venv"
    shutdowns = [c for c in calls if c.startswith("shutdown")]
    assert shutdowns[0] == "shutdown -h +240 neuron-ssp TTL reached"
    assert shutdowns[-1] == "shutdown -h +15 neuron-ssp bootstrap failed at step venv"
    assert not any(c.startswith("pip install") for c in calls)  # it stopped at the failure


def test_a_failing_install_records_the_step_and_shuts_down_in_15_minutes(tmp_path: Path) -> None:
    code, status, calls = run_bootstrap(tmp_path, pip_fails=True)
    assert code != 0 and status == "failed: install"
    assert calls[-1] == "shutdown -h +15 neuron-ssp bootstrap failed at step install"
