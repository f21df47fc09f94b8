"""What the device side of an estimate found: the breakdown at the peak, the static count,
the timeline. Quantities are integer bytes; totals are computed, not stored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from memcalc.trace.categories import MemoryCategory
from memcalc.trace.flops import StepFlops

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PlanPoint(BaseModel):
    """One batch size the search estimated, and its predicted total."""

    model_config = _FROZEN

    batch_size: int
    total_bytes: int
    fits: bool
    method: Literal["traced", "static", "cannot train", "line"] = "traced"
    """``static`` where the trace failed at this batch; ``cannot train`` where it failed but
    a larger batch traces (the model refuses this batch, e.g. BatchNorm at batch 1);
    ``line`` where the step was not traced at this batch but taken from the line its traces
    lie on, checked by a third trace (``memcalc.trace.step_line``)."""
    allocated_bytes: int | None = None
    """Live tensor bytes + workspaces at the peak (what the allocator reserves for)."""
    compute_peak_bytes: int | None = None
    """Live tensor bytes at the forward/backward peak; the strategy planner's rising line."""
    optimizer_peak_bytes: int | None = None
    """Live tensor bytes at the optimizer-step peak; the flat line."""
    offloaded_bytes: int = 0
    """Pinned host bytes of offloaded activations at this batch (``save_on_cpu``)."""


class BatchPlan(BaseModel):
    """The fitted linear model and the confirmed largest batch (0 when batch 1 does not fit)."""

    model_config = _FROZEN

    usable_bytes: int
    model_bytes: int
    per_sample_bytes: int
    fit_batches: tuple[int, int]
    """The traced batches the line goes through: 1 and 8, or 1 and the planned batch."""
    max_batch_size: int
    confirmed: bool
    """True when the planned batch fits and the next one up does not, both traced."""
    points: list[PlanPoint]


class CardFit(BaseModel):
    """The largest batch on one card of the common list."""

    model_config = _FROZEN

    gpu: str
    memory_bytes: int
    usable_bytes: int
    max_batch_size: int
    """0 when batch 1 does not fit."""
    total_bytes: int
    """nvidia-smi at that batch (at batch 1 when none fits): traced, or from the line."""
    confirmed: bool
    """Traced at the batch and at the next one up (or at batch 1 when none fits); False: the
    card's line through batches 1 and 8 (far from a boundary, or past the trace budget)."""
    upper_batch_size: int | None = None
    """Not confirmed: the most the card could take, where the allocated bytes alone (nothing
    cached, no fragmentation) reach its usable memory; ``max_batch_size`` is the conservative
    end, with the allocator's reserve as traced."""


class Breakdown(BaseModel):
    """Bytes per ``MemoryCategory`` at the peak (field names are the category values)."""

    model_config = _FROZEN

    parameters: int
    buffers: int
    input_batch: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    workspaces: int = 0

    @classmethod
    def from_categories(cls, bytes_by_category: dict[MemoryCategory, int]) -> Breakdown:
        return cls(**{category.value: bytes_by_category.get(category, 0)
                      for category in MemoryCategory})

    def by_category(self) -> dict[MemoryCategory, int]:
        return {category: getattr(self, category.value) for category in MemoryCategory}

    @computed_field
    @property
    def total_bytes(self) -> int:
        return sum(self.by_category().values())


class ModuleActivation(BaseModel):
    """Activation bytes alive at the peak that were made inside one module (innermost)."""

    model_config = _FROZEN

    module: str
    activation_bytes: int


class LayerRow(BaseModel):
    """One row of the torchinfo per-layer table (batch of one)."""

    model_config = _FROZEN

    name: str
    kind: str
    depth: int
    output_shape: list[int] | None
    parameter_count: int


class StaticEstimate(BaseModel):
    """Counted without running the model: model states and the input batch."""

    model_config = _FROZEN

    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    optimizer_step_counter_bytes: int
    input_batch_bytes: int

    @computed_field
    @property
    def model_state_bytes(self) -> int:
        """Parameters, buffers, gradients and optimizer state (what every step holds)."""
        return (self.parameter_bytes + self.buffer_bytes + self.gradient_bytes
                + self.optimizer_state_bytes + self.optimizer_step_counter_bytes)


class TimelinePoint(BaseModel):
    """Live tensor bytes at one moment of the traced step (the largest of a span of events)."""

    model_config = _FROZEN

    event: int
    live_bytes: int
    phase: str
    iteration: int


class BoundedSize(BaseModel):
    """A data-dependent op the trace ran at an upper bound of its size, or a value it handed
    to Python by convention (``memcalc.trace.bounded_ops``)."""

    model_config = _FROZEN

    op: str
    """The op's name (``aten::nonzero``, ``torchvision::nms``, ``aten::_local_scalar_dense``)."""
    bound: str
    """The bound or value used, in words."""
    count: int
    """Calls over the traced iterations."""
    keeps_most_work: bool = True
    """The bound or value keeps at least the work a real step does; False for a default
    value read into Python (a loop count or branch taken from it may skip work)."""


class DeviceReport(BaseModel):
    """Memory of one training step on the target device.

    On CUDA: ``peak_reserved_bytes`` is the predicted ``torch.cuda.max_memory_reserved``
    (traced allocations and the cuBLAS workspaces replayed through the caching-allocator
    model); ``context_bytes`` is the CUDA context and loaded kernels outside the allocator;
    ``total_bytes`` = the two together, what nvidia-smi shows at the peak.
    """

    model_config = _FROZEN

    kind: Literal["cuda", "cpu"]
    batch_size: int
    method: Literal["traced", "static"]
    breakdown: Breakdown
    top_modules: list[ModuleActivation]
    peak_phase: str | None
    peak_iteration: int | None
    timeline: list[TimelinePoint] = []
    """Live bytes over the traced iterations, for the timeline picture."""
    offloaded_bytes: int = 0
    """Pinned host bytes of activations offloaded in one iteration (``save_on_cpu``)."""
    offloaded_state_bytes: int = 0
    """Peak host RAM of an FSDP2 rank's CPU offload (``--cpu-offload``): its parameter and
    gradient shards, the optimizer's state and the step's temporaries; not on the GPU."""
    compile_fallbacks: list[str] = []
    """Compiled modules whose graph could not be captured whole, run eagerly: ``name:
    reason``."""
    sequence_parallel_dropped: str = ""
    """Why the rank was traced without the sequence parallelism it asked for: the model
    failed with it (it mixes positions outside the projections); "" otherwise."""
    window_plan: WindowPlan | None = None
    """A sliding window's evaluation on a GPU: the largest ``sw_batch_size`` that fits."""
    host_tensor_bytes: int = 0
    """Peak host RAM of the tensors the step makes on the CPU (a sliding window's output
    aggregated there, the windows gathered from a volume there), its input batch aside;
    not part of the GPU's figures."""
    halo_exchange_bytes: int = 0
    """Halo rows one GPU receives in one iteration under spatial parallelism."""
    ring_exchange_bytes: int = 0
    """Keys, values and their gradients one rank receives in one iteration under context
    parallelism (torch's ring attention; ``memcalc.trace.context_parallel``)."""
    stage_peak_bytes: list[int] = []
    """A pipeline: each traced stage's rank's peak of live tensor bytes, in stage order (the
    reported figures are the largest stage's). A middle stage made like an earlier middle
    one is not traced (its peak is at most that one's: ``memcalc.trace.rank.traced_ranks``).
    Context parallelism: the first and last rank of the context-parallel group, likewise."""
    compute_peak_bytes: int | None = None
    """Live tensor bytes at the peak of forward + backward (traced only)."""
    optimizer_peak_bytes: int | None = None
    """Live tensor bytes at the peak of the optimizer step (traced only)."""
    peak_reserved_bytes: int | None = None
    least_reserved_bytes: int | None = None
    """Without a capacity: the least the caching allocator runs the step in (it frees its
    cache and retries at a limit), the smallest card's need; ``peak_reserved_bytes`` is what
    a card with room to spare reserves."""
    workspace_bytes: int = 0
    """cuBLAS workspaces, allocated through the caching allocator (inside reserved)."""
    context_bytes: int = 0
    """CUDA context and loaded kernels (outside the allocator; 0 on CPU)."""
    cudnn_calls: int = 0
    """cuDNN calls of the traced iterations given a workspace (forward, dgrad, wgrad)."""
    skipped_workspace_bytes: int = 0
    """cuDNN workspaces the deciding replay could not place, summed over the step (cuDNN
    runs a plan that needs less there): left out of every figure of the report."""
    env_profile: str | None = None
    """Name of the environment profile the CUDA figures come from."""
    runs_at_capacity: bool | None = None
    """Replayed with the usable bytes − context as the allocator's limit (cached blocks
    freed and retried, workspaces given up when short, as PyTorch and cuDNN do): whether the
    step runs. None without a capacity."""
    capacity_bytes: int | None = None
    """Device memory planned for (``--gpu`` or ``--gpu-memory``); None when not given."""
    headroom_bytes: int = 0
    driver_reserved_bytes: int = 0
    """What the CUDA driver keeps of the card's total (nvidia-smi) from every process (the
    environment profile's, measured as NVML's total minus what ``cudaMemGetInfo`` offers):
    out of the usable bytes."""
    flops: StepFlops | None = None
    """FLOPs of one forward, loss and backward at ``batch_size``, counted in the traced step
    (None for a static estimate)."""
    plan: BatchPlan | None = None
    """The batch search that chose ``batch_size`` (None without a capacity)."""
    card_fits: list[CardFit] = []
    """Without a capacity, on CUDA: the largest batch on each of the common cards
    (``memcalc.device.card_fit``); empty otherwise."""
    bounded_sizes: list[BoundedSize] = []
    """Data-dependent ops traced at a bound (empty when none ran, and for a static estimate)."""
    attention_backends: dict[str, int] = {}
    """CUDA scaled-dot-product attention backend (cudnn, flash, efficient, math) -> calls in
    the traced step, chosen as CUDA chooses for the card (empty when none ran)."""
    unmodelled_kernels: list[str] = []
    """CUDA kernels the step uses whose own memory is not modelled (``cuda_kernels.UNMODELLED``)."""

    @computed_field
    @property
    def peak_allocated_bytes(self) -> int:
        """Live tensor bytes at the peak plus workspaces (``max_memory_allocated`` before rounding)."""
        return self.breakdown.total_bytes + self.workspace_bytes

    @computed_field
    @property
    def total_bytes(self) -> int:
        """On CUDA, reserved + context (nvidia-smi at the peak); on CPU, live tensor bytes."""
        if self.peak_reserved_bytes is not None:
            return self.peak_reserved_bytes + self.context_bytes
        return self.peak_allocated_bytes + self.context_bytes

    @computed_field
    @property
    def peak_bytes(self) -> int:
        """The figure to compare with capacity (same as ``total_bytes``)."""
        return self.total_bytes

    @computed_field
    @property
    def fits(self) -> bool | None:
        """Whether the step runs in the usable bytes (``runs_at_capacity`` when the
        allocator was replayed with that limit); None without a capacity, and None for a
        static estimate within it (a lower bound cannot show that a step fits)."""
        if self.capacity_bytes is None:
            return None
        if self.runs_at_capacity is not None:
            return self.runs_at_capacity
        within = self.total_bytes <= self.usable_bytes
        return None if within and self.method != "traced" else within

    @property
    def usable_bytes(self) -> int | None:
        """Capacity minus headroom and what the driver keeps: what the step's total may
        reach; None without a capacity."""
        if self.capacity_bytes is None:
            return None
        return max(0, self.capacity_bytes - self.headroom_bytes - self.driver_reserved_bytes)

    @computed_field
    @property
    def max_batch_size(self) -> int | None:
        """None for a static estimate: a count without a traced step is no evidence for a
        largest batch (``plan`` keeps the static line, its points marked static)."""
        return self.plan.max_batch_size if self.plan and self.method == "traced" else None

    @computed_field
    @property
    def model_bytes(self) -> int | None:
        """Intercept of the fitted ``total(b) = model_bytes + b * per_sample_bytes``."""
        return self.plan.model_bytes if self.plan else None

    @computed_field
    @property
    def per_sample_bytes(self) -> int | None:
        return self.plan.per_sample_bytes if self.plan else None


class WindowPoint(BaseModel):
    """One traced window batch of a sliding window."""

    model_config = _FROZEN
    sw_batch_size: int
    total_bytes: int
    fits: bool


class WindowPlan(BaseModel):
    """The largest ``sw_batch_size`` whose evaluation step fits, searched by tracing (0 when
    one window at a time does not fit)."""

    model_config = _FROZEN
    max_sw_batch_size: int
    windows: int
    """Windows in one batch of volumes: no larger ``sw_batch_size`` changes anything."""
    points: list[WindowPoint]
