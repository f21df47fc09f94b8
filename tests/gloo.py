"""Run a function on a local gloo process group, one spawned process per rank, and collect
what each rank returns (for checks against real distributed runs on CPU)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def run_ranks(rank_main: Callable, world: int, *args) -> list:
    """``rank_main(rank, world, *args)`` on every rank of a fresh gloo group; its return
    values, in the order the ranks finished. ``rank_main`` must be importable (module level)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(rank_main, world, port, args, results), nprocs=world, join=True)
    return [results.get() for _ in range(world)]


def _rank(rank: int, rank_main: Callable, world: int, port: int, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results.put(rank_main(rank, world, *args))
    finally:
        dist.destroy_process_group()
