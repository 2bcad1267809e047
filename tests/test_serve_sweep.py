"""bench-serve --sweep's measurement: every concurrency serves the same requests, each server's CPU time per output
token beside the wall-clock figures, every server's exit code in the result and the tables."""

from __future__ import annotations

import os
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from serve_support import FakePipeline, running_server

from neuron_ssp.cli.report import console
from neuron_ssp.cli.serve import sweep_tables
from neuron_ssp.config import load_config
from neuron_ssp.tools import serve_sweep
from neuron_ssp.tools.serve_load import process_cpu_s

PROMPTS = ["alpha", "bravo", "charlie", "delta", "echo"]


class RecordingPipeline(FakePipeline):
    """The fake's answers (its prompt reversed), and every prompt it was asked, pass after pass."""

    def __init__(self) -> None:
        super().__init__(step_s=0.001)
        self.asked: list[str] = []

    def row_request(self, prompt_ids, *args, **kwargs):
        self.asked.append("".join(chr(int(i)) for i in prompt_ids))
        return super().row_request(prompt_ids, *args, **kwargs)


class InThreadServer:
    """What run_sweep needs of a server process, over a fake pipeline served in this process."""

    def __init__(self, url: str, exit_code: int):
        self.url = url
        self.exit_code = exit_code

    def cpu_s(self) -> float | None:
        return process_cpu_s(os.getpid())

    def stop(self) -> int:
        return self.exit_code


def test_every_concurrency_serves_the_same_requests_and_reports_cpu_time_and_exit_codes(monkeypatch, tmp_path: Path):
    pipelines = [RecordingPipeline() for _ in serve_sweep.MODES]
    with ExitStack() as stack:
        urls = [stack.enter_context(running_server(pipeline, max_batch=1)) for pipeline in pipelines]
        servers = iter([InThreadServer(url, code) for url, code in zip(urls, (0, 0, 3), strict=True)])
        monkeypatch.setattr(serve_sweep, "start_server", lambda *args, **kwargs: next(servers))
        result = serve_sweep.run_sweep(
            load_config(None), PROMPTS, (1, 2, 4), 2, 8, 4, 1, 30.0, tmp_path, lambda _: None
        )
    work = serve_sweep.sweep_prompts(PROMPTS, 2 * 4)
    assert result.settings["requests_per_pass"] == len(work) == 8
    assert work == [*PROMPTS, *PROMPTS[:3]]  # file order, cycling
    for pipeline in pipelines:  # three passes each (c = 1, 2, 4), each of exactly the same requests
        assert len(pipeline.asked) == 3 * len(work)
        passes = [pipeline.asked[i * len(work) : (i + 1) * len(work)] for i in range(3)]
        assert all(Counter(one) == Counter(work) for one in passes)
    for mode in serve_sweep.MODES:
        for c in (1, 2, 4):
            figures = result.runs[mode][c]
            assert figures["requests"] == 8 and figures["errors"] == 0 and figures["tokens"] > 0
            assert figures["cpu_s"] is not None and figures["cpu_s"] >= 0
            assert figures["cpu_ms_per_token"] == 1000 * figures["cpu_s"] / figures["tokens"]
    assert result.outputs_differing == 0
    assert result.exit_codes == dict(zip(serve_sweep.MODES, (0, 0, 3), strict=True))
    codes = [row for row in serve_sweep.targets(result) if row[0] == "servers' exit codes"]
    assert codes == [("servers' exit codes", "0, 0, 3", "0", False)]
    with console.capture() as captured:
        console.print(sweep_tables(result))
    text = captured.get()
    assert "CPU/tok" in text and "8 requests a pass" in text
    assert "batching + speculation: 3" in text.replace("\n", " ")


def test_a_server_whose_answers_change_with_concurrency_is_caught(monkeypatch, tmp_path: Path):
    pipeline = FakePipeline()
    with running_server(pipeline, max_batch=1) as url:
        monkeypatch.setattr(serve_sweep, "start_server", lambda *args, **kwargs: InThreadServer(url, 0))
        original = serve_sweep.timed_pass

        def second_pass_differs(server, prompts, c, *args):
            pipeline.reply = "changed" if c == 2 else None
            return original(server, prompts, c, *args)

        monkeypatch.setattr(serve_sweep, "timed_pass", second_pass_differs)
        result = serve_sweep.run_sweep(load_config(None), PROMPTS, (1, 2), 1, 8, 2, 1, 30.0, tmp_path, lambda _: None)
    assert result.outputs_differing == 3 * 2  # both requests, on each of the three servers at c = 2


def test_process_cpu_time_counts_this_process_and_is_none_without_a_process():
    before = process_cpu_s(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    after = process_cpu_s(os.getpid())
    assert before is not None and after is not None and after - before >= 0.15
    assert process_cpu_s(2**22 + 12345) is None  # above Linux's pid_max: no such process


def test_the_sweeps_servers_run_without_prefix_caching_unless_the_config_asks_for_it(tmp_path: Path):
    """Every pass serves the same prompts: with a warm cache the later passes would prefill nearly nothing."""
    import yaml

    for asked, expected in ((None, False), (True, True)):
        overrides = {} if asked is None else {"platform.prefix_cache": asked}
        paths = serve_sweep.mode_configs(load_config(None, overrides), 4, tmp_path)
        assert {yaml.safe_load(p.read_text())["platform"]["prefix_cache"] for p in paths.values()} == {expected}
