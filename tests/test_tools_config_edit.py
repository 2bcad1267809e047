"""`tune-k --write`: the recommended k goes into a YAML config and nothing else in the file changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tools_support import tiny_config

from neuron_ssp.config import load_config
from neuron_ssp.errors import UsageError
from neuron_ssp.tools.config_edit import check_editable, edit_k_text, write_k

CONFIG_TEXT = """# my tuned config
target:
  path: embedded:smollm2-135m-instruct
speculation:
  drafter: ngram   # prompt lookup
  k: 4             # the window
  policy: fixed
sampling:
  temperature: 0.0
"""

# four-space indentation, an indented sequence, quotes, a flow mapping, comments on their own lines
LAYOUT_TEXT = """# tuned on inf2.48xlarge
generation:
    max_new_tokens: 96     # a chat answer
    stop_tokens:
      - "</s>"
      - 'END'
speculation:
    # the window: tune-k writes it
    k: 4
    drafter: "ngram"
    policy: adaptive       # grows on full acceptance
target: {path: embedded:smollm2-135m-instruct, n_positions: 512}
"""


def test_k_is_edited_in_place_and_comments_stay(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG_TEXT)
    assert write_k(path, 7, tiny_config()) == "edited in place (comments kept)"
    assert path.read_text() == CONFIG_TEXT.replace("  k: 4 ", "  k: 7 ")
    assert load_config(path).speculation.k == 7


def test_comments_key_order_quotes_and_indentation_survive() -> None:
    edited = edit_k_text(LAYOUT_TEXT, 9)
    assert edited == LAYOUT_TEXT.replace("    k: 4\n", "    k: 9\n")
    assert list(yaml.safe_load(edited)) == ["generation", "speculation", "target"]
    assert list(yaml.safe_load(edited)["speculation"]) == ["k", "drafter", "policy"]


def test_missing_k_line_or_section_is_added_last() -> None:
    without_k = CONFIG_TEXT.replace("  k: 4             # the window\n", "")
    edited = edit_k_text(without_k, 5)
    assert list(yaml.safe_load(edited)["speculation"].items())[-1] == ("k", 5)
    assert edited.startswith("# my tuned config\n") and "drafter: ngram   # prompt lookup\n" in edited
    assert edit_k_text("target:\n  path: x\n", 5) == "target:\n  path: x\nspeculation:\n  k: 5\n"
    assert edit_k_text("speculation:\ntarget:\n  path: x\n", 5) == "speculation:\n  k: 5\ntarget:\n  path: x\n"


def test_flow_style_is_kept_and_a_missing_file_created(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("speculation: {k: 4, drafter: ngram}  # one line\n")
    assert write_k(flow, 6, tiny_config()) == "edited in place (comments kept)"
    assert flow.read_text() == "speculation: {k: 6, drafter: ngram}  # one line\n"
    new = tmp_path / "new.yaml"
    assert write_k(new, 3, tiny_config()) == "created"
    assert load_config(new).speculation.k == 3


@pytest.mark.parametrize(
    "text, rule",
    [
        ("speculation: 4\n", "speculation is 4, not a section"),
        ("speculation:\n  k: 4\nspeculation:\n  k: 5\n", "the YAML cannot be edited"),  # PyYAML keeps the last
        ("- a list\n", "the top level must be a mapping"),
        ("speculation: [k\n", "YAML does not parse"),
    ],
)
def test_a_file_that_cannot_take_k_is_refused_with_the_reason(tmp_path: Path, text: str, rule: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        check_editable(path)
    assert rule in err.value.problems[0].rule
    with pytest.raises(UsageError):
        write_k(path, 3, tiny_config())
    assert path.read_text() == text
    check_editable(tmp_path / "missing.yaml")  # write_k creates it: nothing to refuse
