"""FSDP2 with ``CPUOffloadPolicy`` as a plan's layout: every state shard in host RAM, the
optimizer step on the CPU.

The closed form takes FSDP's lines and moves the rank's remaining parameter and optimizer
state shards off the GPU (its gradients are kept as traced, as FSDP's closed form keeps
them); a traced rank (``memcalc.strategies.rank_candidates``) replaces it where it matters.
Its time adds, per optimizer step, the parameter shard copied to the GPU for each all-gather
(forward, and backward again after resharding), the reduced gradient shard copied back
(``HOST_LINK_BYTES_PER_S``), and the optimizer stepping the shard on one CPU thread
(``CPU_STEP_BYTES_PER_S``, by the job's optimizer and its implementation on CPU tensors;
torchrun sets ``OMP_NUM_THREADS=1`` for more than one process per node). Its host RAM, the shards of every process on the node, decides whether it
fits at all.

Known limitations: the copies and the CPU step are not overlapped with the GPU's work (an
upper bound, as the collectives are timed); pinned memory's power-of-two rounding is named,
not added; optimizers not measured are timed as AdamW (``MEASURED_AS``); the host's memory
bandwidth shared by the node's processes and its cores' speed are this machine's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.host.workers import host_estimate
from memcalc.strategies.candidates import fewest_fitting_gpus, offloaded_at
from memcalc.specs import OptimizerImpl
from memcalc.strategies.cost import HOST_LINK_BYTES_PER_S
from memcalc.strategies.launch import per_process_host
from memcalc.strategies.lines import Line, PerGpuLines
from memcalc.strategies.sharding import gathered_unit_bytes
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from memcalc.host.report import HostReport
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.candidates import PlanContext, Sized
    from memcalc.strategies.lines import Derivation
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.rules import DerivedRule
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.variants import TracedVariant

CPU_STEP_BYTES_PER_S = {
    ("adamw", "for-loop"): 3.0e9, ("adamw", "foreach"): 3.5e9, ("adamw", "fused"): 22.1e9,
    ("sgd-momentum", "for-loop"): 12.9e9, ("sgd-momentum", "foreach"): 12.1e9,
    ("sgd-momentum", "fused"): 21.9e9,
}
"""Bytes of parameters, gradients and optimizer state one CPU thread steps per second, by
optimizer and torch implementation: measured here on fp32 LLaMA-block shards (``python -m
benchmarks.cpu_optimizer``, benchmarks/results-cpu-optimizer.md: two idle runs of ten steps
each on a 2-core x86_64 VM, their mean; a training node's cores may be faster)."""
CPU_IMPLEMENTATION = {OptimizerImpl.DEFAULT: "for-loop", OptimizerImpl.FOR_LOOP: "for-loop",
                      OptimizerImpl.FOREACH: "foreach", OptimizerImpl.FUSED: "fused"}
"""What runs on CPU tensors: torch's default there is the single-tensor loop (foreach is the
default on CUDA only)."""
MEASURED_AS = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd-momentum",
               "sgd-momentum": "sgd-momentum"}
"""Optimizers timed by a measured one doing the same work or more; others as AdamW."""
GATHERS_PER_STEP = 2
"""All-gathers of every unit per step: forward, and backward again (``reshard_after_forward``
is FSDP2's default)."""


def offloaded_lines(d: Derivation) -> PerGpuLines:
    """FSDP's per-GPU lines without the rank's parameter and optimizer-state shards, which
    live in host RAM; during the CPU's optimizer step the GPU holds the step's residue only."""
    states, gpus = d.states, d.gpus
    gathered = gathered_unit_bytes(states, 3)
    compute = d.compute.shifted(gathered - states.optimizer_state_bytes - states.parameter_bytes)
    step = Line((d.step.fixed - states.total_bytes) / gpus, d.step.per_sample)
    notes = (offload_note(d.base.spec, states, gpus, shard_bytes(states, gpus))
             + "; the closed form keeps the gradients on the GPU as traced",)
    return PerGpuLines(compute, step, gpus, notes)


def shard_bytes(states: ModelStates, gpus: int) -> int:
    """One rank's share of every state, which it keeps in host RAM."""
    return -(-states.total_bytes // gpus)


def _cpu_step(spec: TrainingSpec) -> tuple[float, str]:
    """The CPU's stepping rate for the job's optimizer, and how it was had."""
    implementation = CPU_IMPLEMENTATION[spec.optimizer_impl]
    measured = MEASURED_AS.get(spec.optimizer, "adamw")
    rate = CPU_STEP_BYTES_PER_S[measured, implementation]
    named = f"{measured} {implementation}"
    return rate, named if spec.optimizer == measured else f"{spec.optimizer} timed as {named}"


def _copies_and_step_s(spec: TrainingSpec, states: ModelStates, gpus: int
                       ) -> tuple[float, float]:
    parameters, gradients = states.parameter_bytes / gpus, states.gradient_bytes / gpus
    copies = (GATHERS_PER_STEP * parameters + gradients) / HOST_LINK_BYTES_PER_S
    return copies, states.total_bytes / gpus / _cpu_step(spec)[0]


def host_side_s(base: TracedVariant, states: ModelStates, gpus: int) -> float:
    """One rank's seconds per optimizer step for the copies across and the CPU's step."""
    return sum(_copies_and_step_s(base.spec, states, gpus))


def offload_note(spec: TrainingSpec, states: ModelStates, gpus: int, offloaded: int) -> str:
    """What an offloaded row keeps in host RAM and what its step spends there."""
    copies, step = _copies_and_step_s(spec, states, gpus)
    rate, how = _cpu_step(spec)
    return (f"parameters, gradients and optimizer state sharded in host RAM "
            f"({format_bytes(offloaded)} per GPU process, pinned: CUDA's host allocator "
            f"rounds each block up to a power of two); per step {copies:.3g} s of copies "
            f"across PCIe ({HOST_LINK_BYTES_PER_S / 1e9:g} GB/s) and {step:.3g} s of the "
            f"optimizer on one CPU thread ({rate / 1e9:g} GB/s, {how}; torchrun's "
            "OMP_NUM_THREADS=1), timed with the communication, not overlapped")


def sized_within_host(rule: DerivedRule, base: TracedVariant, states: ModelStates,
                      context: PlanContext) -> Sized:
    """FSDP's sizing, then the node's host RAM: every process keeps its shards there."""
    candidate, failure = fewest_fitting_gpus(rule, base, states, context)
    host = base.report.host
    if candidate is None or host is None:
        return candidate, failure
    # a base that offloads activations too: theirs at the row's micro-batch beside the states
    activations = offloaded_at(base.report.device, max(candidate.max_batch_size, 1))
    host = host.model_copy(update={"spec": host.spec.model_copy(
        update={"offloaded_activation_bytes": activations})})
    return judged(candidate, host_verdict(host, shard_bytes(states, candidate.gpus),
                                          context.cluster.gpus_per_node_for(candidate.gpus))
                  ), failure


def judged(candidate: Candidate, verdict: tuple[bool, str] | None) -> Candidate:
    """``candidate`` with a host verdict applied: its note added, and not fitting where the
    node's RAM does not hold it; as it was without a verdict."""
    if verdict is None:
        return candidate
    fits, note = verdict
    return candidate.model_copy(update={"fits": candidate.fits and fits,
                                        "notes": candidate.notes + [note]})


def host_verdict(host: HostReport, offloaded_bytes: int, processes: int
                 ) -> tuple[bool, str] | None:
    """Whether one of ``processes`` GPU processes' share of the node holds its host plan with
    ``offloaded_bytes`` of states beside it, and what to say; None where it does. A machine
    detected here (often a login node) is no verdict on the training node: it is said, not
    applied."""
    spec = host.spec.model_copy(update={"offloaded_state_bytes": offloaded_bytes})
    share = per_process_host(host_estimate(spec, host.measurement), processes)
    if share.fits:
        return None
    machine = host.spec.machine
    text = (f"host RAM: each GPU process needs {format_bytes(share.peak_bytes)} with its "
            f"{format_bytes(offloaded_bytes)} of offloaded states, its share of the node "
            f"{format_bytes(share.usable_bytes)} usable")
    if machine.detected:
        return True, (f"{text} — sized on this machine ({machine.described()}): give the "
                      "training node's --cpus and --ram")
    return False, f"{text}: DOES NOT FIT"
