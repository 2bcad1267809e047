"""Training data for a draft head, written by the target itself (EAGLE-3 trains on the target's own answers).

SafeAILab's EAGLE-3 regenerates ShareGPT/UltraChat answers with the target; SpecForge does the same
(`scripts/regenerate_train_data.py`). We have no chat corpus that is not a benchmark, so the prompts come
from seed files written for this (`neuron_ssp/data/draft_seeds/`) and from the target itself:
- `topic`: an instruction template filled with a topic;
- `magpie`: the target writes the user turn itself from the chat template's user prefix (Magpie,
  arXiv 2406.08464), then answers it;
- `passage`: the target writes a paragraph about a topic, then answers a copy-heavy task over it
  (summarise, rewrite, extract), the turns where drafting from context pays.
Every conversation `i` is fixed by (seed, i): its kind, seeds and sampling, so a resumed run continues
the same sequence. Answers are sampled at `temperature` except every `greedy_every`-th, which is greedy
(the benchmarks decode greedily). All conversations run through our batched loop (engines/continuous_batch.py),
many rows per target call.

Shards: `shard-NNNNN.npz` (uint16 token ids of whole conversations in the chat template, each
conversation's length and answer start, its index, kind and temperature), written atomically every
`flush_every` finished conversations; a resumed run skips the indices already on disk.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from neuron_ssp.engines.continuous_batch import ContinuousBatchLoop
from neuron_ssp.engines.rows import Row, RowRequest, RowSettings
from neuron_ssp.errors import Problem, UsageError
from neuron_ssp.speculation.sampling import SamplingParams

SEEDS_DIR = Path(__file__).resolve().parent.parent / "data" / "draft_seeds"
KINDS = ("topic", "magpie", "passage")
KIND_WEIGHTS = (0.5, 0.3, 0.2)
SHARD_GLOB = "shard-*.npz"
SETTINGS_FILE = "settings.json"
MAX_TOKEN_ID = np.iinfo(np.uint16).max


@dataclass(frozen=True)
class DataSettings:
    seed: int = 0
    temperature: float = 0.7
    greedy_every: int = 4  # every n-th conversation's answer is greedy (0: none)
    max_answer_tokens: int = 384
    max_user_tokens: int = 96  # magpie user turns and passages
    flush_every: int = 64


@dataclass(frozen=True)
class Seeds:
    topics: list[str]
    tasks: list[str]
    passage_tasks: list[str]


def read_seed_lines(path: Path) -> list[str]:
    """Non-empty lines not starting with '#'."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def load_seeds(directory: Path = SEEDS_DIR) -> Seeds:
    return Seeds(
        read_seed_lines(directory / "topics.txt"),
        read_seed_lines(directory / "tasks.txt"),
        read_seed_lines(directory / "passage_tasks.txt"),
    )


@dataclass
class Conversation:
    """One conversation being written: its phases run as rows of the loop, one after the other."""

    index: int
    kind: str
    temperature: float
    rng: random.Random
    user: str = ""  # the user turn, once known
    phase: str = "answer"  # "user" (magpie: the target writes the user turn), "passage", then "answer"
    topic: str = ""
    task: str = ""


@dataclass
class Finished:
    index: int
    kind: str
    temperature: float
    ids: list[int]
    answer_start: int


def plan_conversation(index: int, settings: DataSettings, seeds: Seeds) -> Conversation:
    """Conversation `index`'s kind, topic, task and answer temperature, fixed by (seed, index)."""
    rng = random.Random(settings.seed * 1_000_003 + index)
    kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
    greedy = settings.greedy_every > 0 and index % settings.greedy_every == 0
    conv = Conversation(index, kind, 0.0 if greedy else settings.temperature, rng)
    conv.topic = rng.choice(seeds.topics)
    if kind == "topic":
        conv.user = rng.choice(seeds.tasks).format(topic=conv.topic)
    elif kind == "magpie":
        conv.phase = "user"
    else:
        conv.phase = "passage"
        conv.task = rng.choice(seeds.passage_tasks)
    return conv


class ChatFormat:
    """The target's chat template, as token ids: the prefix of a user turn (magpie) and a full prompt."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        marker = "\x00USER\x00"
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
        self.user_prefix = text[: text.index(marker)]

    def user_prefix_ids(self) -> list[int]:
        return self.tokenizer.encode(self.user_prefix, add_special_tokens=False)

    def prompt_ids(self, user: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        return self.tokenizer.encode(text, add_special_tokens=False)


def phase_request(conv: Conversation, chat: ChatFormat, settings: DataSettings, eos: set[int]) -> RowRequest:
    """The row that runs the conversation's current phase."""
    seed = conv.rng.randrange(2**31)
    if conv.phase == "user":
        prompt, budget, sampling = chat.user_prefix_ids(), settings.max_user_tokens, SamplingParams(1.0, top_p=0.95)
    elif conv.phase == "passage":
        prompt = chat.prompt_ids(f"Write a short paragraph about {conv.topic}.")
        budget, sampling = settings.max_user_tokens * 2, SamplingParams(settings.temperature)
    else:
        prompt, budget, sampling = (
            chat.prompt_ids(conv.user),
            settings.max_answer_tokens,
            SamplingParams(conv.temperature),
        )
    return RowSettings(sampling, seed).request(torch.tensor(prompt), budget, eos)


def advance(conv: Conversation, row: Row, chat: ChatFormat, eos: set[int]) -> Finished | None:
    """A phase ended: move the conversation on (None), or return it finished. A user turn or passage cut
    by its budget (no EOS) is dropped: the conversation moves to an answer-less end (an empty Finished)."""
    seq = row.seq
    out = seq.committed()[seq.prompt_len :].tolist()
    if conv.phase in ("user", "passage"):
        text = chat.tokenizer.decode([t for t in out if t not in eos]).strip()
        if not out or out[-1] not in eos or len(text) < 8:
            return Finished(conv.index, conv.kind, conv.temperature, [], 0)  # unusable: recorded as skipped
        conv.user = text if conv.phase == "user" else f"{conv.task}\n\n{text}"
        conv.phase = "answer"
        return None
    return Finished(conv.index, conv.kind, conv.temperature, seq.committed().tolist(), seq.prompt_len)


@dataclass
class DataProgress:
    conversations: int = 0
    tokens: int = 0  # tokens of stored conversations (prompt + answer)
    answer_tokens: int = 0
    skipped: int = 0
    seconds: float = 0.0
    shards_written: list[Path] = field(default_factory=list)


def done_indices(directory: Path) -> tuple[set[int], int, int]:
    """Indices already on disk (stored or skipped), stored tokens, next shard number."""
    indices: set[int] = set()
    tokens = 0
    shards = sorted(directory.glob(SHARD_GLOB))
    for path in shards:
        with np.load(path) as shard:
            indices.update(int(i) for i in shard["index"])
            tokens += int(shard["lengths"].sum())
    next_number = max((int(p.stem.split("-")[1]) for p in shards), default=-1) + 1
    return indices, tokens, next_number


def check_settings(directory: Path, settings: DataSettings) -> None:
    """A directory holds one sequence of conversations: a resumed run must use the settings it began with."""
    path = directory / SETTINGS_FILE
    wanted = asdict(settings)
    if not path.exists():
        path.write_text(json.dumps(wanted, indent=2) + "\n")
        return
    stored = json.loads(path.read_text())
    changed = {key: (stored.get(key), value) for key, value in wanted.items() if stored.get(key) != value}
    if changed:
        raise UsageError(
            [
                Problem(
                    key,
                    value,
                    f"{directory} was written with {key} = {old}; a resumed run continues the same conversations",
                    f"use {key} = {old}, or write to another --out directory",
                )
                for key, (old, value) in changed.items()
            ]
        )


def write_shard(directory: Path, number: int, finished: list[Finished]) -> Path:
    """Atomically: a crash leaves the previous shards and no partial file."""
    ids = [t for f in finished for t in f.ids]
    if ids and max(ids) > MAX_TOKEN_ID:
        raise ValueError(f"token id {max(ids)} does not fit uint16")
    path = directory / f"shard-{number:05d}.npz"
    tmp = directory / f".{path.name}.tmp.npz"
    np.savez_compressed(
        tmp,
        tokens=np.asarray(ids, dtype=np.uint16),
        lengths=np.asarray([len(f.ids) for f in finished], dtype=np.int32),
        answer_start=np.asarray([f.answer_start for f in finished], dtype=np.int32),
        index=np.asarray([f.index for f in finished], dtype=np.int64),
        kind=np.asarray([KINDS.index(f.kind) for f in finished], dtype=np.uint8),
        temperature=np.asarray([f.temperature for f in finished], dtype=np.float32),
    )
    os.replace(tmp, path)
    return path


def generate_data(
    loop: ContinuousBatchLoop,
    tokenizer,
    directory: Path,
    settings: DataSettings,
    seconds: float,
    max_tokens: int | None = None,
    max_conversations: int | None = None,
    on_progress: Callable[[DataProgress], None] | None = None,
    seeds: Seeds | None = None,
) -> DataProgress:
    """Fill `loop`'s slots with conversations until `seconds` pass or `max_tokens` stored tokens (counting
    earlier runs) or `max_conversations` indices are reached; finished conversations are flushed to shards."""
    directory.mkdir(parents=True, exist_ok=True)
    check_settings(directory, settings)
    seeds = seeds or load_seeds()
    chat = ChatFormat(tokenizer)
    eos = {int(tokenizer.eos_token_id)}
    done, stored_tokens, shard_number = done_indices(directory)
    progress = DataProgress(tokens=stored_tokens)
    begin = time.perf_counter()
    pending: list[Finished] = []
    running: dict[Row, Conversation] = {}
    indices = _indices_to_do(done, max_conversations)

    def flush() -> None:
        nonlocal shard_number
        if pending:
            progress.shards_written.append(write_shard(directory, shard_number, pending))
            shard_number += 1
            pending.clear()

    def finish(item: Finished) -> None:
        pending.append(item)
        if item.ids:
            progress.conversations += 1
            progress.tokens += len(item.ids)
            progress.answer_tokens += len(item.ids) - item.answer_start
        else:
            progress.skipped += 1
        if len(pending) >= settings.flush_every:
            flush()

    def start(conv: Conversation) -> None:
        row = loop.join(phase_request(conv, chat, settings, eos))
        if row.finished:  # ended at its first token
            ended(row, conv)
        else:
            running[row] = conv

    def ended(row: Row, conv: Conversation) -> None:
        result = advance(conv, row, chat, eos) if row.error is None else None
        if row.error is not None:
            raise row.error
        if result is None:
            start(conv)
        else:
            finish(result)

    def out_of_budget() -> bool:
        over_tokens = max_tokens is not None and progress.tokens >= max_tokens
        return over_tokens or time.perf_counter() - begin >= seconds

    try:
        while not out_of_budget():
            while loop.free_slots:
                index = next(indices, None)
                if index is None:
                    break
                start(plan_conversation(index, settings, seeds))
            if not running:
                break
            for row in loop.step():
                ended(row, running.pop(row))
            progress.seconds = time.perf_counter() - begin
            if on_progress is not None:
                on_progress(progress)
        # out of budget: rows in flight are dropped (their indices stay to do for the next run)
    finally:
        flush()
    progress.seconds = time.perf_counter() - begin
    return progress


def _indices_to_do(done: set[int], limit: int | None) -> Iterator[int]:
    index = 0
    while limit is None or index < limit:
        if index not in done:
            yield index
        index += 1


@dataclass(frozen=True)
class Conversations:
    """Stored conversations: token ids (int64) and where each answer starts, ordered by index."""

    ids: list[np.ndarray]
    answer_start: list[int]
    index: list[int]
    temperature: list[float]  # the answer's sampling temperature (0: greedy, the target's argmax)

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)


def load_conversations(directory: Path) -> Conversations:
    shards = sorted(Path(directory).glob(SHARD_GLOB))
    if not shards:
        raise UsageError(
            Problem(
                "--data",
                str(directory),
                f"no {SHARD_GLOB} files there",
                "write data first: neuron-ssp draft-data --out DIR",
            )
        )
    rows: list[tuple[int, np.ndarray, int, float]] = []
    for path in shards:
        with np.load(path) as shard:
            tokens = shard["tokens"].astype(np.int64)
            ends = np.cumsum(shard["lengths"])
            for index, start, end, answer, temperature in zip(
                shard["index"], ends - shard["lengths"], ends, shard["answer_start"], shard["temperature"], strict=True
            ):
                if end > start:
                    rows.append((int(index), tokens[start:end], int(answer), float(temperature)))
    rows.sort(key=lambda row: row[0])
    return Conversations([r[1] for r in rows], [r[2] for r in rows], [r[0] for r in rows], [r[3] for r in rows])
