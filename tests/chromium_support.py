"""Whether the playground's browser test runs, skips or fails, decided from what the machine has.

`./setup.sh dev` installs Chromium and its driver with apt-get where it can (as root, or with sudo that
asks no password), so on such a machine a missing browser is a set-up that did not run: the test fails
and says what to run. Where nothing can install them (no apt-get, no root), the test skips with the
reason and the command, so the README's test command still passes there. CI (`CI=true`, which `.ci/run`
exports) must prove the page works: a missing browser fails it whatever the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

import pytest

INSTALL = "apt-get install -y chromium chromium-driver"


@dataclass(frozen=True)
class Machine:
    """The facts the decision needs, gathered by `this_machine()` or written out in a test."""

    browser: str | None  # path of `chromium`, or None
    driver: str | None  # path of `chromedriver`, or None
    ci: bool
    apt: bool
    root: bool  # root, or sudo that asks no password


@dataclass(frozen=True)
class Verdict:
    action: Literal["run", "skip", "fail"]
    reason: str = ""


def chromium_verdict(machine: Machine) -> Verdict:
    """Run where both are found; fail under CI or where ./setup.sh dev could have installed them; else skip."""
    if machine.browser and machine.driver:
        return Verdict("run")
    missing = " and ".join(
        name for name, path in (("chromium", machine.browser), ("chromedriver", machine.driver)) if not path
    )
    if machine.ci:
        return Verdict(
            "fail",
            f"{missing} missing under CI (CI=true), where the playground browser test must run: "
            f"./setup.sh dev installs them with `{INSTALL}` (as root or with password-less sudo)",
        )
    if machine.apt and machine.root:
        return Verdict(
            "fail",
            f"{missing} missing, though this machine can install them: run ./setup.sh dev "
            f"(it runs `{INSTALL}`), or that command yourself",
        )
    why = "no apt-get on this machine" if not machine.apt else "not root and no password-less sudo"
    return Verdict(
        "skip",
        f"{missing} missing and ./setup.sh dev could not install them ({why}): "
        f"install them with `sudo {INSTALL}` (Debian) or your system's packages of "
        "Chromium and its chromedriver, then rerun",
    )


def this_machine() -> Machine:
    return Machine(
        browser=shutil.which("chromium"),
        driver=shutil.which("chromedriver"),
        ci=os.environ.get("CI", "").lower() in ("true", "1"),
        apt=shutil.which("apt-get") is not None,
        root=_can_act_as_root(),
    )


def _can_act_as_root() -> bool:
    """Root, or sudo without a password prompt: the same test setup.sh makes before it runs apt-get."""
    if os.geteuid() == 0:
        return True
    if not shutil.which("sudo"):
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=30).returncode == 0


def require_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver, or the test skips or fails with the verdict's reason."""
    machine = this_machine()
    verdict = chromium_verdict(machine)
    if verdict.action == "fail":
        pytest.fail(verdict.reason)
    if verdict.action == "skip":
        pytest.skip(verdict.reason)
    assert machine.browser and machine.driver
    return machine.browser, machine.driver
