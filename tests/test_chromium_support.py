"""The playground browser test's run/skip/fail decision (tests/chromium_support.py), machine by machine.

Issue 33 item 1: the README's test command must pass on a machine that cannot install Chromium (skip,
saying how), must not hide a set-up that did not run (fail where apt-get and root are there), and CI
must never skip the page's only end-to-end test."""

from __future__ import annotations

import chromium_support
import pytest
from chromium_support import INSTALL, Machine, chromium_verdict, require_chromium

FOUND = {"browser": "/usr/bin/chromium", "driver": "/usr/bin/chromedriver"}
NONE = {"browser": None, "driver": None}


@pytest.mark.parametrize(
    ("paths", "ci", "apt", "root", "action"),
    [
        (FOUND, False, False, False, "run"),
        (FOUND, True, True, True, "run"),
        (NONE, False, True, True, "fail"),  # ./setup.sh dev would have installed them: it was not run
        (NONE, False, True, False, "skip"),  # apt-get but no root: nothing here can install them
        (NONE, False, False, True, "skip"),  # root but no apt-get (not Debian)
        (NONE, False, False, False, "skip"),
        (NONE, True, False, False, "fail"),  # CI must run it, whatever the machine
        (NONE, True, True, False, "fail"),
        ({"browser": "/usr/bin/chromium", "driver": None}, False, False, False, "skip"),  # half installed
        ({"browser": "/usr/bin/chromium", "driver": None}, True, True, True, "fail"),
    ],
)
def test_the_decision_per_machine(paths: dict, ci: bool, apt: bool, root: bool, action: str) -> None:
    assert chromium_verdict(Machine(**paths, ci=ci, apt=apt, root=root)).action == action


def test_a_skip_names_the_reason_and_the_install_command() -> None:
    no_apt = chromium_verdict(Machine(**NONE, ci=False, apt=False, root=True)).reason
    no_root = chromium_verdict(Machine(**NONE, ci=False, apt=True, root=False)).reason
    assert "no apt-get" in no_apt and "not root" in no_root
    assert all(INSTALL in reason and "chromium and chromedriver missing" in reason for reason in (no_apt, no_root))


def test_a_failure_names_what_is_missing_and_what_to_run() -> None:
    ci = chromium_verdict(Machine(browser="/usr/bin/chromium", driver=None, ci=True, apt=False, root=False)).reason
    setup_not_run = chromium_verdict(Machine(**NONE, ci=False, apt=True, root=True)).reason
    assert ci.startswith("chromedriver missing under CI (CI=true)") and INSTALL in ci
    assert "./setup.sh dev" in setup_not_run and INSTALL in setup_not_run


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("TRUE", True), ("1", True), ("false", False), ("", False)])
def test_ci_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    monkeypatch.setenv("CI", value)
    assert chromium_support.this_machine().ci is ci


def test_require_chromium_skips_or_fails_the_calling_test(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = Machine(**NONE, ci=False, apt=False, root=False)
    monkeypatch.setattr(chromium_support, "this_machine", lambda: machine)
    with pytest.raises(pytest.skip.Exception, match="no apt-get"):
        require_chromium()
    machine = Machine(**NONE, ci=True, apt=False, root=False)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_chromium()
    machine = Machine(**FOUND, ci=True, apt=False, root=False)
    assert require_chromium() == ("/usr/bin/chromium", "/usr/bin/chromedriver")
