"""The README's two first commands are the ones CI runs: its test command is `.ci/run`'s last line, and
the transformers legs (4.46.3, 5.0.0) generate from the README's prompt. A README that drifts from CI would tell a
newcomer to run something nobody checks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The command lines of the README's first code block (comments dropped)."""
    block = re.search(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    assert block, "the README has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_starts_with_set_up_and_generate_then_the_tests() -> None:
    setup_and_generate, tests = readme_commands()
    assert setup_and_generate.startswith("./setup.sh && .venv/bin/neuron-ssp generate ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == tests


def test_the_transformers_legs_generate_from_the_readme_prompt() -> None:
    prompt = re.search(r'generate "([^"]+)"', readme_commands()[0])
    assert prompt
    assert f'prompt="{prompt.group(1)}"' in (ROOT / ".ci" / "transformers-leg.sh").read_text()
    for leg in ("transformers-4.46.sh", "transformers-5.0.sh"):  # both run the shared leg
        assert '/transformers-leg.sh" ' in (ROOT / ".ci" / leg).read_text()
