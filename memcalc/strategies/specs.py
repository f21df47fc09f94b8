"""How many GPUs, how they are linked, what batch the run needs: inputs of the planner."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class Interconnect(str, Enum):
    """The link gradients and parameters travel over between GPUs."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"


INTERCONNECT_GBPS = {
    Interconnect.NVLINK: 300.0,
    Interconnect.PCIE: 20.0,
    Interconnect.INFINIBAND: 22.0,
    Interconnect.ETHERNET: 2.5,
}
"""Collective bus bandwidth per GPU, GB/s (10⁹), as nccl-tests report it: NVLink 4 (H100
SXM, ~360 measured, rounded down), PCIe 4.0 x16 through the host, 200 Gb/s HDR InfiniBand
(one NIC per GPU), 25 GbE."""


GPUS_PER_NODE_BEYOND_GIVEN = 8
DEFAULT_RANK_TRACES = 8
"""Most distributed rows a plan traces as one rank of the job (each with its batch plan)."""
MAX_RANK_TRACES_ASKED = 64


class Strategy(str, Enum):
    BASELINE = "baseline"
    MIXED_PRECISION = "mixed-precision"
    CHECKPOINTING = "checkpointing"
    MIXED_PRECISION_CHECKPOINTING = "mixed-precision+checkpointing"
    MIXED_PRECISION_OFFLOAD = "mixed-precision+offload"
    COMPILE = "compile"
    MIXED_PRECISION_COMPILE = "mixed-precision+compile"
    ACCUMULATION = "accumulation"
    DDP = "ddp"
    DATA_PARALLEL = "dataparallel"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    FSDP = "fsdp"
    FSDP_OFFLOAD = "fsdp-offload"
    PIPELINE = "pipeline"
    SPATIAL = "spatial"


MAX_GPUS_PER_NODE = 72
"""The most GPUs one node holds (an NVL72 rack's NVLink domain); more is a typing mistake."""
MAX_NODES = 100_000


class ClusterSpec(BaseModel):
    """The GPUs a run may use and the batch it needs."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gpus_per_node: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    global_batch: int | None = Field(default=None, ge=1)
    """Samples per optimizer step; None: whatever each strategy's largest batch gives."""
    interconnect: Interconnect = Interconnect.NVLINK
    """Within a node; across nodes InfiniBand is assumed."""
    mfu: float | None = Field(default=None, gt=0, le=1)
    """Share of the GPU's peak FLOP/s a training step reaches (model FLOPs utilisation);
    None: each step timed kernel by kernel (``memcalc.device.kernel_time``), its MFU an output."""
    gradient_as_bucket_view: bool = False
    strategy: Strategy | None = None
    """Force one strategy to be recommended (it is still evaluated and may not fit)."""
    max_gpus: int = Field(default=512, ge=1, le=MAX_GPUS_PER_NODE * MAX_NODES)
    """How far the planner looks for GPUs when nothing fits on the ones given."""
    rank_traces: int = Field(default=DEFAULT_RANK_TRACES, ge=0, le=MAX_RANK_TRACES_ASKED)
    """Most distributed rows traced as one rank of the job (``memcalc.strategies.
    rank_candidates``); 0: every distributed row is its closed form (a quicker screen)."""
    launch_only: bool = False
    """Only the recommended candidate's launch files are wanted (``plan --emit``): with a
    forced ``strategy``, only what that strategy's rows need is traced (the job as given, and
    the single-GPU variants a distributed strategy is built on); the other rows are absent."""
    compile_levers: bool = False
    """Also trace ``torch.compile`` as a lever (compile, mixed-precision+compile): every trace
    of theirs captures the graphs again, which makes a plan several times slower."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def gpus_per_node_for(self, gpus: int) -> int:
        """GPUs per node when a strategy uses ``gpus``: the nodes given, or, when one GPU was
        given and a strategy needs more, nodes of ``GPUS_PER_NODE_BEYOND_GIVEN``."""
        per_node = self.gpus_per_node if self.gpus > 1 else GPUS_PER_NODE_BEYOND_GIVEN
        return min(gpus, per_node)
