"""`./setup.sh system` (also run by `./setup.sh dev`): the system packages the tests need, installed with
apt-get where it can, against stub `apt-get`, `id` and `sudo` on a PATH that holds nothing else.

The script runs with only the stub folder on PATH, so it cannot reach the real apt-get, sudo, pip or
python3: each stub appends its arguments to a log, and the stub apt-get "installs" a package by creating
the executable the script looks for (chromium, chromedriver, cc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash") or "/bin/bash"

STUBS = {
    "id": '[ "$1" = -u ] && echo "$STUB_UID"',
    # sudo -n: succeeds only where the test says sudo asks no password
    "sudo": 'echo "sudo $*" >>"$STUB_LOG"\n[ "$1" = -n ] && shift\n'
    '[ "$STUB_SUDO" = nopasswd ] || { echo "sudo: a password is required" >&2; exit 1; }\n"$@"',
    "apt-get": 'echo "apt-get $*" >>"$STUB_LOG"\n'
    '[ "$STUB_APT" != fails ] || exit 100\n[ "$STUB_APT" != installs-nothing ] || exit 0\n'
    'for pkg in "$@"; do case "$pkg" in\n'
    "  chromium) make_tool chromium ;; chromium-driver) make_tool chromedriver ;; gcc) make_tool cc ;;\n"
    "esac; done",
}
PRELUDE = '#!{bash}\nmake_tool() {{ printf "#!{bash}\\n" >"$STUB_BIN/$1"; {chmod} +x "$STUB_BIN/$1"; }}\n'


def stub_bin(tmp_path: Path, *, apt: bool = True, have: tuple[str, ...] = ()) -> Path:
    """A folder of stubs (apt-get only with `apt`) and of tools already "installed" (`have`)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, body in STUBS.items():
        if name != "apt-get" or apt:
            (folder / name).write_text(PRELUDE.format(bash=BASH, chmod=shutil.which("chmod")) + body + "\n")
    for name in have:
        (folder / name).write_text(f"#!{BASH}\n")
    (folder / "dirname").symlink_to(shutil.which("dirname"))  # setup.sh's `cd "$(dirname "$0")"`
    for path in folder.iterdir():
        path.chmod(0o755)
    return folder


def run_setup(tmp_path: Path, folder: Path, *, uid: int = 0, sudo: str = "", apt: str = "works"):
    log = tmp_path / "calls.log"
    log.touch()
    env = {
        "PATH": str(folder),
        "STUB_BIN": str(folder),
        "STUB_LOG": str(log),
        "STUB_UID": str(uid),
        "STUB_SUDO": sudo,
        "STUB_APT": apt,
    }
    result = subprocess.run(
        [BASH, str(ROOT / "setup.sh"), "system"], env=env, capture_output=True, text=True, timeout=60
    )
    return result, log.read_text().splitlines()


def test_root_installs_what_is_missing_with_apt_get(tmp_path: Path) -> None:
    folder = stub_bin(tmp_path)
    result, calls = run_setup(tmp_path, folder)
    assert result.returncode == 0, result.stderr
    assert calls[0] == "apt-get update -qq"
    assert calls[1].startswith("apt-get install -y") and calls[1].split()[-3:] == ["chromium", "chromium-driver", "gcc"]
    assert all((folder / tool).exists() for tool in ("chromium", "chromedriver", "cc"))


def test_only_the_missing_packages_are_asked_for(tmp_path: Path) -> None:
    result, calls = run_setup(tmp_path, stub_bin(tmp_path, have=("chromium", "cc")))
    assert result.returncode == 0, result.stderr
    assert calls[-1].split()[-1] == "chromium-driver" and "gcc" not in calls[-1] and " chromium " not in calls[-1]


def test_nothing_is_run_when_everything_is_there(tmp_path: Path) -> None:
    result, calls = run_setup(tmp_path, stub_bin(tmp_path, have=("chromium", "chromedriver", "cc")))
    assert result.returncode == 0 and calls == [] and result.stderr == ""


def test_a_user_with_password_less_sudo_installs_through_sudo(tmp_path: Path) -> None:
    result, calls = run_setup(tmp_path, stub_bin(tmp_path), uid=1000, sudo="nopasswd")
    assert result.returncode == 0, result.stderr
    installs = [call for call in calls if call.startswith("sudo -n apt-get")]
    assert [call.split()[2] for call in installs] == ["apt-get", "apt-get"]
    assert installs[1].split()[-3:] == ["chromium", "chromium-driver", "gcc"]


def test_a_user_without_sudo_is_told_the_command_and_nothing_runs(tmp_path: Path) -> None:
    result, calls = run_setup(tmp_path, stub_bin(tmp_path), uid=1000, sudo="password")
    assert result.returncode == 0
    assert not any(call.startswith("apt-get") or "apt-get install" in call for call in calls)
    assert "sudo apt-get install -y chromium chromium-driver gcc" in result.stderr
    assert "password-less sudo" in result.stderr and "skipped" in result.stderr


def test_without_apt_get_nothing_runs_and_the_script_succeeds(tmp_path: Path) -> None:
    folder = stub_bin(tmp_path, apt=False)
    result, calls = run_setup(tmp_path, folder)
    assert result.returncode == 0
    assert calls == []  # no sudo, no package manager guessed at
    assert not (folder / "chromium").exists()
    assert "no apt-get" in result.stderr and "chromium" in result.stderr and "skipped" in result.stderr


def test_a_failing_apt_get_stops_the_set_up_with_the_command(tmp_path: Path) -> None:
    result, _ = run_setup(tmp_path, stub_bin(tmp_path), apt="fails")
    assert result.returncode != 0
    assert "apt-get install -y chromium chromium-driver gcc" in result.stderr


def test_packages_that_install_no_tool_stop_the_set_up(tmp_path: Path) -> None:
    """Ubuntu's chromium packages are snap stubs: apt-get succeeds, and there is still no `chromium`."""
    result, _ = run_setup(tmp_path, stub_bin(tmp_path, have=("cc",)), apt="installs-nothing")
    assert result.returncode != 0
    assert "still not on PATH" in result.stderr and "chromium chromium-driver" in result.stderr


@pytest.mark.parametrize("argument", ["dev", "system"])
def test_the_header_documents_the_argument(argument: str) -> None:
    header = [line for line in (ROOT / "setup.sh").read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith(f"#   ./setup.sh {argument}") for line in header)


def test_the_stubs_are_all_the_script_can_reach(tmp_path: Path) -> None:
    """The guard the other tests rely on: with the stub folder as PATH, no real tool resolves."""
    folder = stub_bin(tmp_path)
    env = {**os.environ, "PATH": str(folder)}
    found = subprocess.run(
        [BASH, "-c", "command -v apt-get sudo id pip python3 chromium || true"], env=env, capture_output=True, text=True
    ).stdout.split()
    assert found == [str(folder / name) for name in ("apt-get", "sudo", "id")]
