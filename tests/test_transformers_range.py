"""pyproject.toml declares only the transformers versions CI proves: its lowest version, and its lowest
5.x, each have a CI leg that installs exactly that version (the main leg has the newest).

Issue 33 item 2: `transformers>=4.46.3` took in 5.0-5.17, which CI never ran; sliding-window models
failed on all of them (5.0-5.14 could not crop a sliding-window layer, 5.15-5.17 mismatched its mask)."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci"


def declared() -> SpecifierSet:
    """pyproject.toml's transformers specifier (read as text: tomllib needs Python 3.11, we claim 3.10)."""
    line = re.search(r'^\s*"(transformers[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert line, "pyproject.toml declares no transformers"
    return Requirement(line.group(1)).specifier


def leg_versions() -> dict[str, Version]:
    """The transformers each leg that .ci/run starts pins exactly (`transformers==X.Y.Z`, not `==X.Y.*`)."""
    legs = re.findall(r"^timeout \d+ bash (\.ci/\S+)", (CI / "run").read_text(), re.MULTILINE)
    pins = {leg: re.findall(r"transformers==(\d+\.\d+\.\d+)\b(?!\.)", (ROOT / leg).read_text()) for leg in legs}
    return {leg: Version(found[0]) for leg, found in pins.items() if found}


def lowest(spec: SpecifierSet, major: int) -> Version:
    """The lowest X.Y.Z of `major` that the specifier admits (releases only, Y and Z below 100)."""
    candidates = (Version(f"{major}.{minor}.{patch}") for minor in range(100) for patch in range(100))
    return next(version for version in candidates if version in spec)


def test_the_lowest_declared_version_has_a_ci_leg() -> None:
    assert lowest(declared(), 4) in leg_versions().values(), (declared(), leg_versions())


def test_the_lowest_declared_5x_has_a_ci_leg() -> None:
    assert lowest(declared(), 5) in leg_versions().values(), (declared(), leg_versions())


def test_every_leg_runs_a_declared_version() -> None:
    assert all(version in declared() for version in leg_versions().values()), (declared(), leg_versions())
