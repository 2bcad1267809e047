"""Where a checkpoint says a generation ends: generation_config.json first, then config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_ssp.backends.checkpoint import checkpoint_eos_ids, stop_id


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {
                "generation_config.json": {"eos_token_id": [128001, 128008, 128009]},
                "config.json": {"eos_token_id": 128001},
            },
            [128001, 128008, 128009],
        ),  # Llama-3.1-Instruct: the list wins over config.json's one id
        ({"generation_config.json": {"bos_token_id": 1}, "config.json": {"eos_token_id": 2}}, [2]),
        ({"config.json": {"eos_token_id": None}}, []),
        ({"generation_config.json": "not json", "config.json": {"eos_token_id": 7}}, [7]),
    ],
)
def test_checkpoint_eos_ids(tmp_path: Path, files: dict, expected: list[int]) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    assert checkpoint_eos_ids(tmp_path) == expected


def test_without_a_tokenizer_the_loop_stops_at_the_checkpoints_first_eos(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert stop_id(tmp_path, chat_template=True) == 5
