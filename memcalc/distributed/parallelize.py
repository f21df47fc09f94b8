"""One function per parallelism, applied to the model in torchtitan's order (pipeline
split — ``memcalc.distributed.pipeline_split``, applied by the tracer, which then wraps each
stage —, tensor parallel, then data parallel), each with the real torch wrapper.

Context parallelism is not a wrapper of the model: the traced step runs under torch's
``context_parallel`` (``memcalc.trace.context_parallel``), and FSDP2 shards over the
data- and context-parallel ranks together (torchtitan's ``dp_shard_cp`` mesh).

Known limitations: tensor parallelism shards the ``nn.Linear`` layers of the repeated blocks
by name (``memcalc.distributed.tensor_plan``); DDP with tensor or context parallelism, and
context parallelism with a pipeline, are not traced.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from memcalc.distributed.specs import SHARDED, DataParallel, ParallelSpec, Reshard
from memcalc.distributed.tensor_plan import TensorLayout, tensor_layout
from memcalc.dtypes import DTYPES


def fsdp_units(model: nn.Module, blocks: list[str]) -> list[nn.Module]:
    """The modules ``fully_shard`` wraps, innermost first: each repeated block, then the root."""
    modules = dict(model.named_modules())
    return [modules[name] for name in blocks] + [model]


def parallelize_fsdp(model: nn.Module, spec: ParallelSpec, mesh, blocks: list[str]) -> nn.Module:
    """FSDP2 as torchtitan applies it: ``fully_shard`` per repeated block, then the root,
    with the mixed-precision policy and ``reshard_after_forward`` policy of the spec."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=_dtype(spec.param_dtype),
                                  reduce_dtype=_dtype(spec.reduce_dtype))
    # pinned host memory needs an accelerator; the pinning changes no byte on the device
    offload = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if spec.cpu_offload else {}
    units = fsdp_units(model, blocks)
    for index, unit in enumerate(units[:-1]):
        fully_shard(unit, mesh=mesh, mp_policy=policy, **offload,
                    reshard_after_forward=_reshards(spec, index, len(units) - 1))
    fully_shard(model, mesh=mesh, mp_policy=policy, **offload,
                reshard_after_forward=spec.strategy is DataParallel.FSDP
                and spec.reshard_after_forward is not Reshard.NEVER)
    return model


def _reshards(spec: ParallelSpec, index: int, blocks: int) -> bool:
    if spec.strategy is DataParallel.ZERO2 or spec.reshard_after_forward is Reshard.NEVER:
        return False
    if spec.reshard_after_forward is Reshard.ALWAYS:
        return True
    return index < blocks - 1       # the last block's backward runs right after forward


def parallelize_ddp(model: nn.Module, spec: ParallelSpec, mesh, blocks: list[str]) -> nn.Module:
    """``DistributedDataParallel`` over the data-parallel group, with the spec's buckets.
    Its start-up check and broadcast of the parameters (``init_sync``) are skipped: they read
    the parameters' values, which a fake tensor has none of, and end before the first step."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    skip_sync = ({"init_sync": False} if "init_sync" in inspect.signature(
        DistributedDataParallel.__init__).parameters else {})
    ddp = DistributedDataParallel(model, process_group=mesh.get_group(),
                                  bucket_cap_mb=spec.bucket_cap_mb,
                                  gradient_as_bucket_view=spec.gradient_as_bucket_view,
                                  static_graph=spec.static_graph, **skip_sync)
    ddp.register_comm_hook(mesh.get_group(), _all_reduce_in_place)
    ddp.reducer = _KeepBuckets(ddp.reducer)
    return ddp


class _KeepBuckets:
    """DDP's reducer with its one rebuild of the buckets (at the second forward, in the
    order the gradients became ready) left out: the rebuild reads bucket indices from a
    tensor, which a fake one has no values for. The rebuilt buckets hold the same gradients,
    so only their transient overlap at the start of the second step is missed; the step's
    later peak, holding the gradients and the activations, is above it."""

    def __init__(self, reducer) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str):
        return getattr(self._reducer, name)


def _all_reduce_in_place(group, bucket):
    """DDP's built-in hook as written in Python: all-reduce the bucket in place and average
    it. The built-in one hands on the collective's future, whose value the fake backend
    leaves empty; this one hands on the bucket itself (no tensor more or less)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    buffer.div_(group.size())
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


DATA_PARALLEL: dict[DataParallel, Callable] = {
    DataParallel.DDP: parallelize_ddp,
    DataParallel.ZERO1: parallelize_ddp,
    DataParallel.ZERO2: parallelize_fsdp,
    DataParallel.FSDP: parallelize_fsdp,
}
"""The data-parallel wrapper of each strategy."""

SHARDS_PARAMETERS = SHARDED
"""Strategies whose wrapper replaces the parameters by their shards when it is applied (so
it runs before the trace counts them); DDP allocates its buckets at construction, counted."""


@dataclass(frozen=True)
class JobMesh:
    """This rank's device meshes: data parallel (with context parallelism, the data- and
    context-parallel ranks FSDP2 shards over), context, tensor and pipeline parallel."""

    dp: object
    tp: object
    pp: object
    cp: object


def job_mesh(spec: ParallelSpec) -> JobMesh:
    """This rank's device mesh, pipeline outermost, then data, context and tensor parallel
    inner (torchtitan's order), and its dimensions. CPU, as the trace runs on fake CPU
    tensors; made outside the fake mode (slicing a mesh computes with its rank table, which a
    fake tensor lacks)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (spec.pp, spec.dp, spec.cp, spec.tp),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))
    shards = mesh["dp", "cp"]._flatten("dp_cp") if spec.cp > 1 else mesh["dp"]
    return JobMesh(shards, mesh["tp"], mesh["pp"], mesh["cp"])


def stage_rank(spec: ParallelSpec, stage: int) -> int:
    """The global rank of the first rank of pipeline stage group ``stage`` (pp outermost)."""
    return stage * spec.dp * spec.cp * spec.tp


def parallelize_tp(model: nn.Module, spec: ParallelSpec, mesh, blocks: list[str],
                   loss_parallel: bool = False) -> nn.Module:
    """Tensor parallelism over the mesh's ``tp`` dimension, with sequence parallelism and
    ``loss_parallel`` as ``spec`` asks and the model allows
    (``memcalc.distributed.tensor_plan.tensor_layout``). ``loss_parallel``: the loss is a
    cross-entropy over the head's logits (the step then runs it under ``loss_parallel()``)."""
    from torch.distributed.tensor.parallel import parallelize_module

    layout = job_tensor_layout(model, spec, blocks, loss_parallel)
    styles = _tensor_styles()
    parallelize_module(model, mesh.tp, {name: styles[style]()
                                        for name, style in layout.styles.items()
                                        if style != "gather-input"})
    modules = dict(model.named_modules())
    for name, style in layout.styles.items():
        if style == "gather-input":
            modules[name].register_forward_pre_hook(_sequence_gathered(mesh.tp, modules[name]),
                                                    with_kwargs=True)
    return model


def _sequence_gathered(mesh, module: nn.Module) -> Callable:
    """A pre-hook that gathers the sequence-sharded stream a projection container is called
    with (torchtitan's ``PrepareModuleInput(Shard(1) → Replicate)``), whether it comes as
    the first positional argument or by the name of ``forward``'s first parameter
    (Hugging Face blocks call ``self_attn(hidden_states=…)``)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    parameters = list(inspect.signature(module.forward).parameters)
    name = parameters[0] if parameters else None

    def gathered(value):     # as PrepareModuleInput does it: a DTensor goes on as one
        if not isinstance(value, torch.Tensor):
            return value
        if not isinstance(value, DTensor):
            value = DTensor.from_local(value, mesh, [Shard(1)], run_check=False)
        return value.redistribute(mesh, [Replicate()])

    def hook(_module, args, kwargs):
        if args:
            return (gathered(args[0]), *args[1:]), kwargs
        if name in kwargs:
            return args, {**kwargs, name: gathered(kwargs[name])}
        return None

    return hook


def job_tensor_layout(model: nn.Module, spec: ParallelSpec, blocks: list[str],
                      cross_entropy: bool) -> TensorLayout:
    """The tensor layout ``spec`` asks for on ``model``: sequence and loss parallelism where
    the model allows them, not inside pipeline stages (whose shapes the schedule fixes), loss
    parallelism only for a cross-entropy loss."""
    staged = spec.pp > 1
    layout = tensor_layout(model, blocks, spec.sequence_parallel and not staged,
                           spec.loss_parallel and cross_entropy and not staged)
    if staged and (spec.sequence_parallel or spec.loss_parallel):
        return replace(layout, not_sequence_parallel="pipeline stages are traced without it")
    if spec.loss_parallel and not cross_entropy:
        return replace(layout, not_loss_parallel="the loss is not a cross-entropy")
    return layout


def _tensor_styles() -> dict[str, Callable]:
    """``tensor_layout``'s style names → torch's parallel styles (torchtitan's ``apply_tp``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel)

    return {
        "colwise": ColwiseParallel, "rowwise": RowwiseParallel,
        "embedding-rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "head-colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
        "sequence": SequenceParallel,
        "rowwise-sequence": lambda: RowwiseParallel(output_layouts=Shard(1)),
        "embedding-sequence": lambda: RowwiseParallel(input_layouts=Replicate(),
                                                      output_layouts=Shard(1)),
        "head-sequence": lambda: ColwiseParallel(input_layouts=Shard(1),
                                                 output_layouts=Replicate()),
        "head-loss-parallel": lambda: ColwiseParallel(output_layouts=Shard(-1),
                                                      use_local_output=False),
        "head-sequence-loss-parallel": lambda: ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }


def parallelize(model: nn.Module, spec: ParallelSpec, mesh, blocks: list[str],
                sharding: bool, loss_parallel: bool = False) -> nn.Module:
    """The job's parallelisms in torchtitan's order: tensor parallel, then data parallel.
    ``sharding``: the wrappers that replace the parameters (tensor parallel, FSDP2), applied
    before the trace counts the states; else DDP, whose buckets are counted as it makes them.
    A dimension of size 1 gets no wrapper. ``loss_parallel``: the job's loss is a
    cross-entropy (tensor parallel may then keep the logits sharded)."""
    if sharding and spec.tp > 1:
        model = parallelize_tp(model, spec, mesh, blocks, loss_parallel)
    shards = spec.strategy in SHARDS_PARAMETERS
    if (spec.shard_ranks if shards else spec.dp) > 1 and shards == sharding:
        model = DATA_PARALLEL[spec.strategy](model, spec, mesh.dp, blocks)
    return model


def _dtype(name: str | None) -> torch.dtype | None:
    return DTYPES[name] if name else None


def job_optimizer(spec: ParallelSpec | None, mesh: JobMesh | None,
                  build: Callable[[list], torch.optim.Optimizer],
                  params: list) -> torch.optim.Optimizer:
    """The job's optimizer over ``params`` (``build`` makes the plain one): ZeRO-1 wraps it in
    ``ZeroRedundancyOptimizer``, which builds it over this rank's share of the parameters."""
    if spec is None or spec.strategy is not DataParallel.ZERO1 or spec.dp == 1:
        return build(params)
    import warnings

    with warnings.catch_warnings():    # its package imports deprecated torch.jit helpers
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=_Built(build),
                                   process_group=mesh.dp.get_group())


class _Built:
    """``ZeroRedundancyOptimizer``'s ``optimizer_class``: called with the rank's parameters."""

    def __init__(self, build: Callable[[list], torch.optim.Optimizer]) -> None:
        self.build = build

    def __call__(self, params, **defaults) -> torch.optim.Optimizer:
        return self.build(list(params))


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds the state (ZeRO-1's inner one)."""
    return getattr(optimizer, "optim", optimizer)
