"""How a distributed job is laid out: the input of ``memcalc.distributed``."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memcalc.units import counted

MAX_WORLD_SIZE = 1 << 16
"""The most ranks accepted (the largest published jobs run about 16 k GPUs)."""


class DataParallel(str, Enum):
    """How the data-parallel ranks hold the model states (ZeRO stages as torch runs them)."""

    DDP = "ddp"
    """``DistributedDataParallel``: every state replicated, gradients all-reduced in buckets."""
    ZERO1 = "zero1"
    """DDP with ``ZeroRedundancyOptimizer``: each rank keeps the optimizer state of its share
    of the parameters (ZeRO-1) and broadcasts them after its step."""
    ZERO2 = "zero2"
    """FSDP2 ``fully_shard(reshard_after_forward=False)``: parameters gathered from forward
    to backward, gradients and optimizer state sharded (ZeRO-2, FSDP1's SHARD_GRAD_OP)."""
    FSDP = "fsdp"
    """FSDP2 ``fully_shard``: parameters, gradients and optimizer state sharded (ZeRO-3)."""
    PIPELINE = "pipeline"
    """No data-parallel wrapper: every rank a pipeline stage (``--pp`` = the GPUs over
    ``--tp``)."""


class PipelineSchedule(str, Enum):
    """``torch.distributed.pipelining``'s schedules."""

    GPIPE = "gpipe"
    """``ScheduleGPipe``: every microbatch's forward, then every backward."""
    ONE_F_ONE_B = "1f1b"
    """``Schedule1F1B``: after a warm-up, one forward and one backward in turn."""
    INTERLEAVED = "interleaved-1f1b"
    """``ScheduleInterleaved1F1B``: two stages per rank (virtual stages), 1F1B between them."""


REPLICATED = frozenset({DataParallel.DDP, DataParallel.ZERO1})
"""Strategies whose ranks each hold all the parameters (DDP's wrapper)."""
SHARDED = frozenset({DataParallel.ZERO2, DataParallel.FSDP})
"""Strategies whose wrapper is FSDP2's ``fully_shard``."""
CONTEXT_PARALLEL_WITH = SHARDED
"""Strategies traced with context parallelism (FSDP2 over the dp × cp ranks)."""
DDP_BUCKET_CAP_MB = 25.0
"""``DistributedDataParallel``'s default ``bucket_cap_mb``."""


class Reshard(str, Enum):
    """FSDP2's ``reshard_after_forward`` over the blocks (torchtitan's policy names)."""

    DEFAULT = "default"
    """Every block but the last frees its gathered parameters after forward (the last one's
    backward runs next); the root unit frees its own."""
    ALWAYS = "always"
    NEVER = "never"


PARAM_DTYPES = ("float32", "bfloat16", "float16")


class ParallelSpec(BaseModel):
    """One rank's place in the job: ``gpus_per_node × nodes`` ranks, ``tp``-way tensor
    parallel inside ``cp``-way context parallel inside data parallel over the rest
    (torchtitan's mesh: pp outer, then dp, cp, tp inner)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    strategy: DataParallel
    gpus_per_node: int = Field(ge=1, le=MAX_WORLD_SIZE)
    nodes: int = Field(default=1, ge=1, le=MAX_WORLD_SIZE)
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree (DTensor ``parallelize_module``, column/row-wise plans)."""
    sequence_parallel: bool = True
    """With ``tp``: torchtitan's sequence parallelism (norms ``SequenceParallel``, the residual
    stream sharded on the sequence between the projections), where the model's layout allows
    it (``memcalc.distributed.tensor_plan.tensor_layout``; the report says when it does not)."""
    loss_parallel: bool = True
    """With ``tp`` and a cross-entropy loss: the logits stay sharded on the vocabulary and the
    loss runs on the shards (``loss_parallel``), where the head is sharded."""
    param_dtype: str | None = None
    """FSDP2 ``MixedPrecisionPolicy.param_dtype``: parameters cast once per unit at the
    all-gather, compute in that dtype, fp32 master weights; None: the parameters' dtype."""
    reduce_dtype: str | None = None
    """FSDP2 ``MixedPrecisionPolicy.reduce_dtype``: the gradients' reduce-scatter dtype."""
    reshard_after_forward: Reshard = Reshard.DEFAULT
    gradient_as_bucket_view: bool = False
    """DDP: gradients are views into its buckets (no second copy)."""
    bucket_cap_mb: float = Field(default=DDP_BUCKET_CAP_MB, gt=0)
    """DDP's bucket size (its default: 25 MiB)."""
    static_graph: bool = False
    """DDP ``static_graph=True``: the graph is the same every iteration (its reducer reads
    back the flags it set for each parameter used, which the trace follows element by
    element: ``trace.python_values``)."""
    cp: int = Field(default=1, ge=1)
    """Context-parallel degree (torch's ``context_parallel``): each rank holds 1/cp of the
    sequence, attention runs as ring attention over the ``cp`` ranks, and FSDP2 shards the
    states over the data- and context-parallel ranks together (as torchtitan does)."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel degree: the model split into stages by its repeated blocks."""
    pp_schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B
    cpu_offload: bool = False
    """FSDP2 ``CPUOffloadPolicy``: the sharded parameters, their gradients and the optimizer
    step in host RAM; each unit's parameters are copied to the GPU for its all-gather, and each
    reduced gradient shard back to the host."""
    microbatch_size: int = Field(default=1, ge=1)
    """Samples per pipeline microbatch (torchtitan's default: 1); the local batch is split
    into ⌈batch ÷ microbatch size⌉ microbatches."""

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each rank holds (two for the interleaved schedule)."""
        return 2 if self.pp > 1 and self.pp_schedule is PipelineSchedule.INTERLEAVED else 1

    @property
    def stages(self) -> int:
        """Pipeline stages in all (1 without a pipeline)."""
        return self.pp * self.stages_per_rank

    @property
    def min_microbatches(self) -> int:
        """Fewest microbatches the schedule runs: torch's 1F1B-family schedules need one per
        stage (GPipe and jobs without a pipeline: 1)."""
        if self.pp == 1 or self.pp_schedule is PipelineSchedule.GPIPE:
            return 1
        return self.stages

    @property
    def batch_step(self) -> int:
        """Local batches come in multiples of this: a microbatch per stage for 1F1B-family
        schedules, else 1."""
        return 1 if self.min_microbatches == 1 else self.microbatch_size * self.stages

    @property
    def line_batches(self) -> tuple[int, int]:
        """The two batches a pipeline's batch plan traces: 2 and 3 microbatches per stage,
        where every rank's live bytes already grow linearly with the microbatches."""
        unit = self.microbatch_size * self.stages
        return 2 * unit, 3 * unit

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel degree: the ranks left over tensor, context and pipeline
        parallelism (replicas that each take their own samples)."""
        return self.world_size // (self.tp * self.cp * self.pp)

    @property
    def shard_ranks(self) -> int:
        """Ranks FSDP2 shards the states over: the data- and context-parallel ranks."""
        return self.dp * self.cp

    def describe(self) -> str:
        """The layout in a few words: ``fsdp on 16 GPUs (2 nodes × 8), param bfloat16``."""
        nodes = f" ({self.nodes} nodes × {self.gpus_per_node})" if self.nodes > 1 else ""
        extras = [f"{name} {value}" for name, value in (("param", self.param_dtype),
                                                        ("reduce", self.reduce_dtype)) if value]
        if self.strategy in REPLICATED:
            extras += [name for name, on in (("gradient_as_bucket_view",
                                              self.gradient_as_bucket_view),
                                             ("static_graph", self.static_graph)) if on]
            if self.bucket_cap_mb != DDP_BUCKET_CAP_MB:
                extras.append(f"buckets of {self.bucket_cap_mb:g} MiB")
        if self.cpu_offload:
            extras.append("CPU offload")
        if self.strategy is DataParallel.FSDP and self.reshard_after_forward is not Reshard.DEFAULT:
            extras.append(f"reshard after forward: {self.reshard_after_forward.value}")
        if self.pp > 1:
            extras.insert(0, f"pipeline {self.pp} ({self.pp_schedule.value}, "
                             f"microbatch {self.microbatch_size})")
        if self.cp > 1:
            extras.insert(0, f"context parallel {self.cp}")
        if self.tp > 1:
            asked = [name for name, on in (("sequence parallel", self.sequence_parallel),
                                           ("loss parallel", self.loss_parallel)) if on]
            extras.insert(0, f"tensor parallel {self.tp}"
                          + (f" ({' and '.join(asked)} where the model allows)" if asked else ""))
        return (f"{self.strategy.value} on {counted(self.world_size, 'GPU')}{nodes}"
                + "".join(f", {extra}" for extra in extras))

    def per_gpu(self) -> str:
        """What a batch and its bytes are, next to them: `` per GPU (fsdp on 8 GPUs, one rank)``."""
        if self.pp > 1:
            return (f" per pipeline replica ({self.describe()}; the rank of its largest "
                    "stage)")
        if self.cp > 1:
            gpus = f"{self.cp} × {self.tp} GPUs (tensor parallel inside)" if self.tp > 1 else \
                f"{self.cp} GPUs"
            return (f" per context-parallel group of {gpus}, each holding 1/{self.cp} "
                    f"of every sequence ({self.strategy.value} on {self.world_size} GPUs; the "
                    "larger of its first and last rank)")
        return f" per GPU ({self.strategy.value} on {counted(self.world_size, 'GPU')}, one rank)"

    @model_validator(mode="before")
    @classmethod
    def _pipeline_fills_the_job(cls, values):
        """``strategy pipeline`` without ``pp``: every GPU (over ``tp``) is a stage."""
        if isinstance(values, dict) and values.get("strategy") in (DataParallel.PIPELINE,
                                                                   "pipeline"):
            if values.get("pp") in (None, 1):
                world = int(values.get("gpus_per_node", 1)) * int(values.get("nodes", 1))
                values = {**values, "pp": max(1, world // int(values.get("tp", 1)))}
        return values

    @model_validator(mode="after")
    def _consistent(self) -> ParallelSpec:
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(f"{self.world_size} ranks is more than {MAX_WORLD_SIZE:,}")
        if self.world_size % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the {self.world_size} GPUs; "
                             "use a divisor of --gpus × --nodes")
        if self.world_size % (self.tp * self.pp):
            raise ValueError(f"--pp {self.pp} × --tp {self.tp} does not divide the "
                             f"{self.world_size} GPUs; use divisors of --gpus × --nodes")
        if self.world_size % (self.tp * self.pp * self.cp):
            raise ValueError(f"--cp {self.cp} × --tp {self.tp} × --pp {self.pp} does not "
                             f"divide the {self.world_size} GPUs; use divisors of --gpus × "
                             "--nodes")
        if self.cp > 1 and self.strategy not in CONTEXT_PARALLEL_WITH:
            raise ValueError(f"--cp with --strategy {self.strategy.value} is not traced: "
                             "context parallelism runs with FSDP2 over the data- and "
                             "context-parallel ranks, as torchtitan runs it; use --strategy "
                             "fsdp or zero2")
        if self.cp > 1 and self.pp > 1:
            raise ValueError("--cp with --pp is not traced; use one of them")
        if self.strategy is DataParallel.PIPELINE and self.dp > 1:
            raise ValueError(f"--strategy pipeline leaves {self.dp} data-parallel replicas; "
                             "give --pp × --tp = the GPUs, or a data-parallel --strategy "
                             "(ddp, fsdp…) with --pp")
        if self.strategy is DataParallel.PIPELINE and self.pp == 1:
            raise ValueError("--strategy pipeline needs at least 2 stages (--gpus 2 or more)")
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in PARAM_DTYPES:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(PARAM_DTYPES)}")
        if self.tp > 1 and self.strategy in REPLICATED and self.dp > 1:
            raise ValueError("DDP with tensor parallelism is not traced; use --strategy fsdp "
                             "(FSDP2 over the data-parallel ranks, as torchtitan does)")
        ddp_options = [option for option, given in (
            ("--bucket-view", self.gradient_as_bucket_view), ("--static-graph", self.static_graph),
            ("--bucket-cap-mb", self.bucket_cap_mb != DDP_BUCKET_CAP_MB)) if given]
        if ddp_options and self.strategy not in REPLICATED:
            raise ValueError(f"{', '.join(ddp_options)}: options of DDP (--strategy ddp or "
                             f"zero1); --strategy {self.strategy.value} does not wrap the model "
                             "in DDP")
        if self.cpu_offload and self.strategy not in SHARDED:
            raise ValueError(f"--cpu-offload is FSDP2's CPUOffloadPolicy; --strategy "
                             f"{self.strategy.value} does not shard with FSDP2: use --strategy "
                             "fsdp or zero2")
        if self.cpu_offload and self.strategy in SHARDED and self.shard_ranks == 1:
            raise ValueError("--cpu-offload over one shard rank is not traced: there FSDP2 "
                             "skips its all-gather, and the trace cannot yet tell the host's "
                             "tensors from the GPU's (it found the whole step in host RAM); "
                             "give 2 or more data-parallel ranks (--gpus, less --tp)")
        mixed = self.param_dtype is not None or self.reduce_dtype is not None
        if mixed and self.strategy in REPLICATED:
            raise ValueError("--param-dtype/--reduce-dtype are FSDP2's mixed-precision policy; "
                             "for DDP use --precision bf16-mixed (autocast)")
        return self
