"""What the strategy planner found (JSON field ``plan``). Bytes are integers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from memcalc.strategies.specs import ClusterSpec, Strategy

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Candidate(BaseModel):
    """One strategy with its per-GPU memory, batch and step time."""

    model_config = _FROZEN

    strategy: Strategy
    label: str
    """The strategy and what it is combined with, e.g. ``fsdp + mixed-precision``."""
    gpus: int
    spatial_parts: int = 1
    """GPUs that share every sample (spatial parallelism); 1: each GPU holds whole samples."""
    context_parallel: int = 1
    """GPUs of a context-parallel group, which share every sample's sequence; 1: none."""
    method: str
    """``traced`` (its own traced steps), ``derived from <label>`` (closed form on a trace) or
    ``traced slab (1/G) of <label>`` (spatial: one GPU's slab traced, buckets added)."""
    per_gpu_peak_bytes: int
    """Predicted per-GPU total (nvidia-smi) at ``max_batch_size``, or at batch 1 when it does
    not fit."""
    max_batch_size: int
    """Largest micro-batch per GPU that fits (0: not even one sample)."""
    accumulation_steps: int
    global_batch_size: int
    flops_per_step: float
    compute_s: float
    communication_s: float
    step_time_s: float
    """Time of one optimizer step at ``global_batch_size``: compute + communication."""
    samples_per_s: float
    fits: bool
    notes: list[str]
    job_batch_peak_bytes: int | None = None
    """Predicted per-GPU total at the job's own batch per GPU (``--batch-size``; a pipeline's:
    per replica): traced there, else on the candidate's batch line; None: no batch given, or
    a pipeline traced as a rank (its microbatch is searched, not its local batch)."""

    @property
    def sample_group(self) -> int:
        """GPUs that share each sample (a spatial or context-parallel group; 1: none): the
        candidate's batch is per group of them."""
        return max(self.spatial_parts, self.context_parallel)

    @property
    def batch_text(self) -> str:
        """The batch per GPU as the plan writes it: ``37`` or ``9×4`` (micro-batch × steps
        accumulated, or a pipeline's microbatches)."""
        batch = max(self.max_batch_size, 0)
        steps = self.accumulation_steps
        return f"{batch}×{steps}" if steps > 1 else str(batch)


class StrategyPlan(BaseModel):
    """Every candidate, the recommendation with its reason, and how to launch it."""

    model_config = _FROZEN

    cluster: ClusterSpec
    usable_bytes: int
    candidates: list[Candidate]
    recommended: str | None
    """The ``label`` of the recommended candidate; None when nothing fits."""
    reason: str
    torchrun: str | None
    slurm: list[str] | None
    train_script: str | None = None
    """A ``train.py`` skeleton with the recommended strategy's wrapping, precision,
    checkpointing and batch sizes (``memcalc.strategies.train_script``)."""
    assumptions: list[str]
    job_batch_size: int | None = None
    """The job's own batch per GPU, at which every candidate gives ``job_batch_peak_bytes``."""
    largest_sample_shape: tuple[int, ...] | None = None
    """When nothing fits: the largest proportionally cropped sample that fits at batch 1."""
    largest_sample_strategy: str | None = None
