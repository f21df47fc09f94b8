"""Per-GPU model states under data parallelism and sharding (DDP, ZeRO-1/2/3 = FSDP),
in closed form on a traced step's states.

ZeRO (Rajbhandari et al., 2020) shards optimizer state (stage 1), gradients (2) and
parameters (3) over N ranks; with fp32 master weights and Adam that is 16 bytes per
parameter unsharded and 16/N bytes at stage 3. FSDP (stage 3) all-gathers one wrapped unit
at a time, the next one prefetched, and reduce-scatters the unit's full gradients.
DDP keeps a flat copy of the gradients in its buckets unless ``gradient_as_bucket_view``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memcalc.trace.checkpointing import repeated_blocks

@dataclass(frozen=True)
class ModelStates:
    """Bytes of the states one unsharded rank holds, and of the largest FSDP unit."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    largest_unit_parameter_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes


def largest_unit_fraction(model: nn.Module) -> float:
    """Share of the parameters in the largest FSDP unit: one repeated block each, the rest
    of the model (embeddings, heads) in the root unit."""
    total = sum(p.numel() for p in model.parameters()) or 1
    modules = dict(model.named_modules())
    blocks = [sum(p.numel() for p in modules[name].parameters())
              for name in repeated_blocks(model)]
    root = total - sum(blocks)
    return max([root, *blocks]) / total


def sharded_state_bytes(states: ModelStates, ranks: int, stage: int) -> int:
    """States one rank holds at ZeRO ``stage`` over ``ranks`` (0: plain data parallel)."""
    def share(nbytes: int, sharded: bool) -> int:
        return -(-nbytes // ranks) if sharded else nbytes
    return (share(states.optimizer_state_bytes, stage >= 1)
            + share(states.gradient_bytes, stage >= 2)
            + share(states.parameter_bytes, stage >= 3))


def gathered_unit_bytes(states: ModelStates, stage: int) -> int:
    """FSDP's unsharded working set: the current and the prefetched unit's parameters, and
    one unit's full gradients before the reduce-scatter."""
    if stage < 3:
        return 0
    unit_gradients = states.largest_unit_parameter_bytes * (
        states.gradient_bytes / states.parameter_bytes if states.parameter_bytes else 1)
    return 2 * states.largest_unit_parameter_bytes + int(unit_gradients)


def ddp_bucket_bytes(states: ModelStates, gradient_as_bucket_view: bool) -> int:
    """DDP's gradient buckets (25 MiB each, covering every gradient once)."""
    return 0 if gradient_as_bucket_view else states.gradient_bytes
