"""draft-data on a tiny random target: conversations through the batched loop, shards, resuming, the seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_llama

from neuron_ssp.backends.torch.scoring import TorchBackend
from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.errors import UsageError
from neuron_ssp.tools.draft_data import (
    SEEDS_DIR,
    DataSettings,
    done_indices,
    generate_data,
    load_conversations,
    load_seeds,
    plan_conversation,
)

VOCAB = 97
EOS = 2


class CharTokenizer:
    """Characters as ids 3..96 and a chat template of plain markers: enough for the data loop's calls."""

    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [3 + ord(c) % (VOCAB - 3) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + (i - 3) % 26) for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False) -> str:
        text = "".join(f"[{m['role']}]{m['content']}[end]" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "")


def loop() -> ContinuousBatchLoop:
    return ContinuousBatchLoop(TorchBackend(tiny_llama(0, VOCAB), 512, slots=4), 1)


SETTINGS = DataSettings(seed=3, max_answer_tokens=12, max_user_tokens=10, flush_every=3)


def test_resumed_generation_equals_one_run_and_skips_what_is_stored(tmp_path):
    generate_data(loop(), CharTokenizer(), tmp_path / "a", SETTINGS, 600, max_conversations=7)
    first = load_conversations(tmp_path / "a")
    stored, _, shards = done_indices(tmp_path / "a")
    assert stored == set(range(7)) and shards >= 2  # every index once: stored, or skipped (an unfinished user turn)
    generate_data(loop(), CharTokenizer(), tmp_path / "a", SETTINGS, 600, max_conversations=12)
    assert done_indices(tmp_path / "a")[0] == set(range(12))
    generate_data(loop(), CharTokenizer(), tmp_path / "b", SETTINGS, 600, max_conversations=12)
    resumed, whole = load_conversations(tmp_path / "a"), load_conversations(tmp_path / "b")
    assert resumed.index == whole.index and len(whole.index) >= len(first.index)
    assert all((x == y).all() for x, y in zip(resumed.ids, whole.ids, strict=True))
    assert resumed.answer_start == whole.answer_start and resumed.temperature == whole.temperature


def test_answers_are_prompt_then_the_targets_tokens(tmp_path):
    generate_data(loop(), CharTokenizer(), tmp_path, SETTINGS, 600, max_conversations=8)
    data = load_conversations(tmp_path)
    tokenizer = CharTokenizer()
    for ids, start, index in zip(data.ids, data.answer_start, data.index, strict=True):
        prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "x"}], False, True))
        assert ids[start - len("[assistant]") : start].tolist() == prompt[-len("[assistant]") :]
        assert 1 <= len(ids) - start <= SETTINGS.max_answer_tokens
        assert data.temperature[data.index.index(index)] == pytest.approx(
            0.0 if index % SETTINGS.greedy_every == 0 else 0.7
        )


def test_a_directory_keeps_its_settings(tmp_path):
    generate_data(loop(), CharTokenizer(), tmp_path, SETTINGS, 600, max_conversations=2)
    other = DataSettings(seed=3, temperature=1.0, max_answer_tokens=12, max_user_tokens=10, flush_every=3)
    with pytest.raises(UsageError) as err:
        generate_data(loop(), CharTokenizer(), tmp_path, other, 600, max_conversations=4)
    assert err.value.problems[0].field == "temperature" and "another --out directory" in err.value.problems[0].fix
    assert json.loads((tmp_path / "settings.json").read_text())["temperature"] == 0.7


def test_the_plan_of_a_conversation_is_fixed_by_seed_and_index():
    seeds = load_seeds()
    plans = [plan_conversation(i, SETTINGS, seeds) for i in range(200)]
    again = [plan_conversation(i, SETTINGS, seeds) for i in range(200)]
    assert [(p.kind, p.user, p.topic, p.task) for p in plans] == [(p.kind, p.user, p.topic, p.task) for p in again]
    assert {p.kind for p in plans} == {"topic", "magpie", "passage"}
    assert all(p.user for p in plans if p.kind == "topic") and not any(p.user for p in plans if p.kind != "topic")


def test_seed_files_share_no_line_with_a_benchmark_prompt():
    """The benchmarks stay held out: no seed line appears in a prompt file the benchmarks read."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    prompts = " ".join(
        json.loads(line).get("prompt", "").lower()
        for path in [*root.glob("benchmarks/*.jsonl"), *root.glob("neuron_ssp/data/*.jsonl")]
        for line in path.read_text().splitlines()
        if line.strip()
    )
    assert len(prompts) > 10000
    for name in ("topics.txt", "tasks.txt", "passage_tasks.txt"):
        for line in (SEEDS_DIR / name).read_text().splitlines():
            key = line.replace("{topic}", "").strip().lower().rstrip(".")
            if line.startswith("#") or len(key) < 12:
                continue
            assert key not in prompts, (name, line)


def test_the_committed_data_loads_as_train_draft_reads_it():
    # benchmarks/draft_data/.../README.md states these counts; train-draft --data reads the directory with this loader
    directory = Path(__file__).resolve().parent.parent / "benchmarks" / "draft_data" / "smollm2-135m-instruct"
    data = load_conversations(directory)
    assert len(data.ids) == 1475 and sum(len(ids) for ids in data.ids) == 464_303
    assert sum(len(ids) - start for ids, start in zip(data.ids, data.answer_start, strict=True)) == 369_145
    assert all(
        0 < start < len(ids) and int(ids.max()) < 49152 for ids, start in zip(data.ids, data.answer_start, strict=True)
    )
    assert json.loads((directory / "settings.json").read_text())["seed"] == 0
