"""NxDI's CPU mode on several ranks: tensor parallelism over gloo, one process per rank, as `torchrun` starts it.

NxDI's `to_cpu()` (application_base.py:556-596 at 4bcdc54b) supports tp > 1 on CPU: with WORLD_SIZE in the
environment it checks it against the config's world size and starts the gloo process group itself (:573-577),
refuses bfloat16 at tp > 1 ("The gloo backend does not natively support bfloat16", :563-566), builds the
model and loads each rank's shard of the checkpoint (`get_sharded_checkpoint(..., rank, tp_degree)`, :606-608).
NxD's collectives then run through torch.distributed in CPU mode (neuronx_distributed/parallel_layers/comm.py,
`cpu_mode()` branches at fbac349b). Here `torch.multiprocessing` starts the ranks; each sets the variables
torchrun would, installs the import stubs and runs the same work (SPMD), and rank 0's result comes back.

A rank that raises fails the run with its traceback; a run past its deadline is stopped, so a collective one
rank never reaches cannot hang the suite.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_on_ranks(work: Callable[..., Any], args: tuple[Any, ...], world: int, deadline_s: float) -> list[Any]:
    """`work(*args)` on `world` ranks (a module-level function: the ranks import it); every rank's result."""
    with tempfile.TemporaryDirectory(prefix="nxdi-ranks-") as out:
        context = mp.start_processes(
            _rank_main,
            args=(world, free_port(), work, args, out),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        stop_at = time.monotonic() + deadline_s
        while not context.join(timeout=max(0.0, stop_at - time.monotonic())):
            if time.monotonic() >= stop_at:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"the {world} ranks did not finish within {deadline_s:.0f} s")
        return [pickle.loads((Path(out) / f"rank{rank}.pkl").read_bytes()) for rank in range(world)]


def _rank_main(rank: int, world: int, port: int, work: Callable[..., Any], args: tuple[Any, ...], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["NXDI_TEST_WORLD_SIZE"] = str(world)  # WORLD_SIZE itself is set for NxDI's first to_cpu only
    torch.set_num_threads(1)
    from nxdi_support import stubs

    stubs.install()
    try:
        result = work(*args)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    (Path(out) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def to_cpu_on_rank(app: Any) -> None:
    """NxDI's CPU mode for `app` on this rank (tests/nxdi_support/patches.py `to_cpu`). The first model of the rank
    starts the process group through NxDI's own WORLD_SIZE path (application_base.py:573-577); later models find
    it initialised (:578) and skip it, since NxDI would otherwise start a second default group."""
    from nxdi_support import patches

    if torch.distributed.is_initialized():
        patches.to_cpu(app)
        return
    os.environ["WORLD_SIZE"] = os.environ["NXDI_TEST_WORLD_SIZE"]
    try:
        patches.to_cpu(app)
    finally:
        del os.environ["WORLD_SIZE"]
