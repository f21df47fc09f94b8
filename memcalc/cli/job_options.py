"""The distributed job's options (``memcalc estimate`` and ``check``): the layout one rank
of the job is traced in (``memcalc.distributed``)."""

from __future__ import annotations

import click
from pydantic import ValidationError

from memcalc.cli.types import enum_choice
from memcalc.distributed.specs import (DDP_BUCKET_CAP_MB, PARAM_DTYPES, DataParallel,
                                      ParallelSpec, PipelineSchedule, Reshard)
from memcalc.errors import InputError

JOB_OPTIONS = [
    click.option("--strategy", type=enum_choice(DataParallel),
                 help="Trace one rank of a distributed job: ddp (DistributedDataParallel), "
                      "zero1 (DDP + ZeroRedundancyOptimizer), "
                      "zero2 (FSDP2 without resharding after forward), fsdp (FSDP2 "
                      "fully_shard per block + root) or pipeline (every GPU a pipeline "
                      "stage); needs --gpus."),
    click.option("--gpus", "job_gpus", type=click.IntRange(min=1),
                 help="GPUs per node of the distributed job (with --strategy)."),
    click.option("--nodes", "job_nodes", type=click.IntRange(min=1), default=1,
                 show_default=True, help="Nodes of the distributed job."),
    click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Tensor-parallel degree inside each data-parallel group (DTensor "
                      "column/row-wise plans for the blocks' attention and MLP)."),
    click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Context-parallel degree (torch's context_parallel: each rank holds "
                      "1/cp of the sequence, causal attention runs as ring attention); "
                      "with --strategy fsdp or zero2, which shard over the data- and "
                      "context-parallel ranks."),
    click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True,
                 help="With --tp: torchtitan's sequence parallelism (norms SequenceParallel, "
                      "activations between the projections sharded on the sequence), where "
                      "the model's layout allows it; the report says when it does not."),
    click.option("--loss-parallel/--no-loss-parallel", default=True, show_default=True,
                 help="With --tp and a cross-entropy loss: the logits stay sharded on the "
                      "vocabulary and the loss runs on the shards (torch's loss_parallel)."),
    click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Pipeline-parallel degree (torch.distributed.pipelining): the model "
                      "split into stages at its repeated blocks; the largest stage's rank "
                      "is reported."),
    click.option("--pp-schedule", type=enum_choice(PipelineSchedule), default="1f1b",
                 show_default=True, help="Pipeline schedule (interleaved-1f1b: two stages "
                                         "per rank)."),
    click.option("--microbatch-size", type=click.IntRange(min=1), default=1,
                 show_default=True, help="Samples per pipeline microbatch."),
    click.option("--param-dtype", type=click.Choice(PARAM_DTYPES),
                 help="FSDP2 MixedPrecisionPolicy.param_dtype: parameters cast once per unit "
                      "at the all-gather, compute in that dtype, fp32 master weights."),
    click.option("--reduce-dtype", type=click.Choice(PARAM_DTYPES),
                 help="FSDP2 MixedPrecisionPolicy.reduce_dtype (gradient reduce-scatter)."),
    click.option("--reshard-after-forward", type=enum_choice(Reshard), default="default",
                 show_default=True,
                 help="FSDP2: default = every block but the last; always; never."),
    click.option("--cpu-offload", is_flag=True,
                 help="FSDP2 CPUOffloadPolicy: sharded parameters, gradients and the "
                      "optimizer step in host RAM."),
    click.option("--bucket-view", is_flag=True,
                 help="DDP gradient_as_bucket_view=True (no second copy of the gradients)."),
    click.option("--static-graph", is_flag=True,
                 help="DDP static_graph=True (the same graph every step)."),
    click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True),
                 default=DDP_BUCKET_CAP_MB,
                 show_default=True, help="DDP bucket_cap_mb: the gradient buckets' size (MiB)."),
]


def job_options(command):
    for option in reversed(JOB_OPTIONS):
        command = option(command)
    return command


def parallel_from_options(options: dict) -> ParallelSpec | None:
    """The layout from the job options (popped from ``options``); None without --strategy."""
    strategy, gpus = options.pop("strategy", None), options.pop("job_gpus", None)
    fields = dict(nodes=options.pop("job_nodes", 1), tp=options.pop("tp", 1),
                  cp=options.pop("cp", 1),
                  pp=options.pop("pp", 1),
                  sequence_parallel=options.pop("sequence_parallel", True),
                  loss_parallel=options.pop("loss_parallel", True),
                  pp_schedule=options.pop("pp_schedule", PipelineSchedule.ONE_F_ONE_B),
                  microbatch_size=options.pop("microbatch_size", 1),
                  param_dtype=options.pop("param_dtype", None),
                  reduce_dtype=options.pop("reduce_dtype", None),
                  reshard_after_forward=options.pop("reshard_after_forward", Reshard.DEFAULT),
                  cpu_offload=options.pop("cpu_offload", False),
                  gradient_as_bucket_view=options.pop("bucket_view", False),
                  static_graph=options.pop("static_graph", False),
                  bucket_cap_mb=options.pop("bucket_cap_mb", DDP_BUCKET_CAP_MB))
    if strategy is None:
        if gpus is not None:
            names = [layout.value for layout in DataParallel]
            raise InputError(f"--gpus needs --strategy ({', '.join(names[:-1])} or "
                             f"{names[-1]}) to say how the job is distributed")
        given = [f"--{name} {fields[name]}" for name in ("tp", "cp", "pp") if fields[name] > 1]
        if given:      # else the job would be traced on one GPU without a word
            verb = "needs" if len(given) == 1 else "need"
            raise InputError(f"{' and '.join(given)} {verb} --strategy and --gpus (e.g. "
                             "--strategy fsdp --gpus 8) to say how the job is laid out")
        return None
    if gpus is None:
        raise InputError(f"--strategy {DataParallel(strategy).value} needs --gpus N (GPUs per "
                         "node)")
    try:
        return ParallelSpec(strategy=strategy, gpus_per_node=gpus, **fields)
    except ValidationError as error:
        raise InputError(error.errors()[0]["msg"].removeprefix("Value error, ")) from None
