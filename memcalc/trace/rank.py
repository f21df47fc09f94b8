"""One rank of a distributed job around the traced step: the fake process group and device
mesh it runs in, and the model wrapped as the job wraps it (``memcalc.distributed``)."""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from memcalc.distributed.parallelize import job_mesh, parallelize
from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import TraceError
from memcalc.trace._torch_internals import fake_mode_paused, fake_process_group, is_fake
from memcalc.trace.checkpointing import repeated_blocks


@contextlib.contextmanager
def rank_of(parallel: ParallelSpec | None) -> Iterator:
    """Rank 0 of the job's fake process group around the trace, and its device mesh (made
    outside the fake mode, which would fake the mesh's rank table); None without a layout."""
    if parallel is None:
        yield None
        return
    python_random, torch_random = random.getstate(), torch.get_rng_state()
    try:
        group = fake_process_group(parallel.world_size)
        group.__enter__()
    except RuntimeError as error:
        raise TraceError(f"cannot trace a {parallel.world_size}-rank job here: {error} "
                         "(call memcalc before init_process_group, or with isolate=True)"
                         ) from None
    try:
        with warnings.catch_warnings():   # FSDP2's advice on views of the output is for users
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed")
            yield job_mesh(parallel)
    finally:
        group.__exit__(None, None, None)
        random.setstate(python_random)      # the process group's set-up draws from both
        torch.set_rng_state(torch_random)


def wrapped(parallel: ParallelSpec | None, model: nn.Module, sharding: bool, mesh) -> nn.Module:
    """The model as the job wraps it: tensor parallel and FSDP2 before the states are
    counted (``sharding``), DDP after (its buckets are allocated at construction)."""
    if parallel is None:
        return model
    if not sharding:
        return parallelize(model, parallel, mesh, repeated_blocks(model), sharding)
    with fake_mode_paused():   # the wrappers compute with the mesh's (real) rank table
        model = parallelize(model, parallel, mesh, repeated_blocks(model), sharding)
    if not all(is_fake(tensor) for tensor in (*model.parameters(), *model.buffers())):
        raise TraceError("the distributed wrappers made real parameters (not traceable)")
    return model
