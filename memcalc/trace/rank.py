"""One rank of a distributed job around the traced step: the fake process group and device
mesh it runs in, and the model wrapped as the job wraps it (``memcalc.distributed``)."""

from __future__ import annotations

import contextlib
import random
import weakref
from dataclasses import dataclass
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn

from memcalc.distributed.parallelize import job_mesh, parallelize, stage_rank
from memcalc.distributed.pipeline_split import pipeline_stages, split_points, stage_signature
from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import TraceError
from memcalc.model.inputs import ModelCall, ModelInputs, make_call
from memcalc.trace._torch_internals import (fake_mode_paused, fake_process_group, is_fake,
                                            pipeline_sends_held, static_pipeline_warmup)
from memcalc.trace.checkpointing import repeated_blocks
from memcalc.trace.pipeline_step import (PipelineIteration, StageShapes, build_schedule,
                                         check_microbatches, microbatch_count, stage_shapes)


def traced_ranks(parallel: ParallelSpec | None, build_meta_model: Callable[[], nn.Module],
                 checkpointed: tuple[str, ...] = (), plain: bool = True) -> list[int]:
    """The ranks whose step is traced: rank 0, and the first rank of every other pipeline
    stage (their stages hold different layers and microbatches in flight), except a middle
    stage made like an earlier middle one (``stage_signature``, the same blocks
    checkpointed): under GPipe it holds as many microbatches in flight, under 1F1B fewer,
    and it receives and sends the same buffers, so its peak is at most that one's. Every stage is
    traced under the interleaved schedule (a rank's two stages), and unless ``plain`` (no
    compiled regions, no spatial split). Under context parallelism, the first and the last
    rank of the context-parallel group: the load-balanced causal ring runs each ring step
    on half the queries where the keys come from a later rank, on half the keys where they
    come from an earlier one, so the first rank runs only the former, the last only the
    latter, and every other rank a mix of the two."""
    if parallel is not None and parallel.cp > 1:
        return [0, (parallel.cp - 1) * parallel.tp]
    if parallel is None or parallel.pp == 1:
        return [0]
    return [stage_rank(parallel, stage)
            for stage in _stages_to_trace(parallel, build_meta_model, checkpointed, plain)]


def _stages_to_trace(parallel: ParallelSpec, build_meta_model: Callable[[], nn.Module],
                     checkpointed: tuple[str, ...], plain: bool) -> list[int]:
    every = list(range(parallel.pp))
    if parallel.stages_per_rank > 1 or parallel.pp < 4 or not plain:
        return every
    try:
        model = build_meta_model()
        blocks = repeated_blocks(model)
        stages = pipeline_stages(model, blocks, parallel.stages)
    except Exception:      # the user's model: its trace says why it does not split
        return every
    marked = set(checkpointed)
    signatures = [(stage_signature(stage), tuple(blocks[index] in marked for index in owned))
                  for stage, owned in zip(stages, split_points(len(blocks), parallel.stages))]
    return [stage for stage in every if stage <= 1 or stage == parallel.pp - 1
            or signatures[stage] not in signatures[1:stage]]


@contextlib.contextmanager
def rank_of(parallel: ParallelSpec | None, rank: int = 0) -> Iterator:
    """``rank`` of the job's fake process group around the trace, and its device mesh (made
    outside the fake mode, which would fake the mesh's rank table); None without a layout."""
    if parallel is None:
        yield None
        return
    python_random, torch_random = random.getstate(), torch.get_rng_state()
    try:
        group = fake_process_group(parallel.world_size, rank,
                                   (parallel.pp, parallel.dp, parallel.cp, parallel.tp))
        group.__enter__()
    except RuntimeError as error:
        raise TraceError(f"cannot trace a {parallel.world_size}-rank job here: {error} "
                         "(call memcalc before init_process_group, or with isolate=True)"
                         ) from None
    try:
        with warnings.catch_warnings(), (pipeline_sends_held() if parallel.pp > 1
                                         else contextlib.nullcontext()):
            # FSDP2's advice on views of the output, and DDP's reducer's on gradient strides
            # (raised from autograd's backward, on fake gradients), are for the real job
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed")
            warnings.filterwarnings("ignore", category=UserWarning,
                                    message="Grad strides do not match bucket view strides")
            yield job_mesh(parallel)
    finally:
        group.__exit__(None, None, None)
        random.setstate(python_random)      # the process group's set-up draws from both
        torch.set_rng_state(torch_random)


def wrapped(parallel: ParallelSpec | None, model: nn.Module, sharding: bool, mesh,
            cross_entropy: bool = False) -> nn.Module:
    """The model as the job wraps it: tensor parallel and FSDP2 before the states are
    counted (``sharding``), DDP after (its buckets are allocated at construction).
    ``cross_entropy``: the job's loss is one (tensor parallel may keep the logits sharded)."""
    if parallel is None:
        return model
    if not sharding:
        return parallelize(model, parallel, mesh, repeated_blocks(model), sharding)
    with fake_mode_paused():   # the wrappers compute with the mesh's (real) rank table
        model = parallelize(model, parallel, mesh, repeated_blocks(model), sharding,
                            cross_entropy)
    if not all(is_fake(tensor) for tensor in (*model.parameters(), *model.buffers())):
        raise TraceError("the distributed wrappers made real parameters (not traceable)")
    return model


@dataclass
class PipelineRank:
    """This rank's pipeline stages, sharded as the job shards them, and how to step them."""

    parallel: ParallelSpec
    mesh: object
    modules: list[nn.Module]
    indices: list[int]
    shapes: list[StageShapes]

    @property
    def first(self) -> bool:
        """This rank holds the first stage (it feeds the batch)."""
        return 0 in self.indices

    @property
    def container(self) -> nn.Module:
        """The rank's stage modules in one module (for their states and names)."""
        return nn.ModuleList(self.modules)

    def iteration(self, setup, job_model: nn.Module, batch: ModelCall, optimizer, observer,
                  step) -> PipelineIteration:
        """The rank's step: DDP (when the job uses it) around each stage, then the schedule."""
        batch_size = setup.batch_shape[0]
        microbatches = microbatch_count(self.parallel, batch_size)
        check_microbatches(self.parallel, microbatches)
        modules = [wrapped(self.parallel, module, False, self.mesh) for module in self.modules]
        iteration: list[PipelineIteration] = []
        schedule = build_schedule(self.parallel, modules, self.indices, self.shapes,
                                  microbatches, self.mesh.pp.get_group(),
                                  lambda output, target: iteration[0].loss(output, target))
        static_pipeline_warmup(schedule)
        last = self.shapes[-1].outputs[0]
        iteration.append(PipelineIteration(
            setup.body, schedule, modules, batch_size, batch if self.first else None,
            optimizer, observer=observer, step=step,
            output_shape=(batch_size, *last.shape[1:])))
        return iteration[0]


def pipeline_rank(parallel: ParallelSpec, model: nn.Module, inputs: ModelInputs,
                  mesh) -> PipelineRank:
    """``model`` (fake, materialised) split into the job's stages; this rank's ones (by its
    place on the mesh's ``pp`` dimension, interleaved stages looping over the ranks as
    torch's schedules place them) sharded by tensor parallelism and FSDP2 as the job does."""
    stages = pipeline_stages(model, repeated_blocks(model), parallel.stages)
    shapes = stage_shapes(stages, model, make_call(model, inputs, parallel.microbatch_size))
    place = mesh.pp.get_local_rank()
    indices = [place + loop * parallel.pp for loop in range(parallel.stages_per_rank)]
    modules = [wrapped(parallel, stages[index], True, mesh) for index in indices]
    return PipelineRank(parallel, mesh, modules, indices, shapes)


_SEQUENCE_PARALLEL_FAILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""A model (its meta builder) whose rank failed with sequence parallelism, and why: its
other batches are traced without it at once."""


def sequence_parallel_failure(builder: Callable) -> str | None:
    """Why the model ``builder`` builds failed with sequence parallelism in this process
    (None: it has not)."""
    try:
        return _SEQUENCE_PARALLEL_FAILED.get(builder)
    except TypeError:      # a builder no weak reference can hold is not remembered
        return None


def remember_sequence_parallel_failure(builder: Callable, why: str) -> None:
    try:
        _SEQUENCE_PARALLEL_FAILED[builder] = why
    except TypeError:
        pass
