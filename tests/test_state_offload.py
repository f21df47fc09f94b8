"""FSDP2's CPU offload as a plan's layout: its closed form against FSDP's, its time from the
copies and the CPU's step in closed form, the node's host RAM as its verdict, and a plan
that asks for it tracing it as a rank with the offload policy."""

import pytest

from memcalc.api import plan_spec
from memcalc.host import HostSpec, MachineSpec, host_estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec, Strategy
from memcalc.strategies.cost import HOST_LINK_BYTES_PER_S
from memcalc.strategies.lines import Derivation, Line
from memcalc.strategies.rank_candidates import RANK_METHOD
from memcalc.strategies.rules import rule_for
from memcalc.strategies.sharding import ModelStates
from memcalc.strategies.state_offload import (CPU_STEP_BYTES_PER_S, host_side_s, host_verdict,
                                              offloaded_lines)
from tests.fixtures.gpu_rank_cases import TINY_LLAMA3

GIB = 1 << 30
STATES = ModelStates(parameter_bytes=4 * GIB, gradient_bytes=4 * GIB,
                     optimizer_state_bytes=8 * GIB, largest_unit_parameter_bytes=GIB // 4)


class _Base:
    def __init__(self, spec: TrainingSpec) -> None:
        self.spec = spec


def _derivation(gpus: int, spec: TrainingSpec | None = None) -> Derivation:
    compute, step = Line(20 * GIB, GIB), Line(18 * GIB, 0)
    return Derivation(compute, step, _Base(spec or TrainingSpec(model="mlp")), gpus,
                      ClusterSpec(gpus_per_node=gpus), STATES)


@pytest.mark.parametrize("gpus", [2, 8])
def test_the_gpu_keeps_fsdps_lines_without_the_ranks_parameter_and_state_shards(gpus):
    fsdp = rule_for(Strategy.FSDP).memory(_derivation(gpus))
    offloaded = offloaded_lines(_derivation(gpus))
    shard = (STATES.parameter_bytes + STATES.optimizer_state_bytes) / gpus
    assert fsdp.compute.fixed - offloaded.compute.fixed == pytest.approx(shard)
    assert offloaded.compute.per_sample == fsdp.compute.per_sample
    # the optimizer steps on the CPU: the GPU's step line has no state left
    assert fsdp.step.fixed - offloaded.step.fixed == pytest.approx(STATES.total_bytes / gpus)


def test_its_time_is_the_copies_across_and_the_cpus_step_of_the_shard():
    spec = TrainingSpec(model="mlp", optimizer="adamw")
    gpus = 4
    copies = (2 * STATES.parameter_bytes + STATES.gradient_bytes) / gpus / HOST_LINK_BYTES_PER_S
    cpu = STATES.total_bytes / gpus / CPU_STEP_BYTES_PER_S["adamw", "for-loop"]
    assert host_side_s(_Base(spec), STATES, gpus) == pytest.approx(copies + cpu)
    fused = _Base(spec.with_changes(optimizer_impl="fused"))
    assert host_side_s(fused, STATES, gpus) < host_side_s(_Base(spec), STATES, gpus)
    # an optimizer not measured is timed as AdamW and the row says so
    note = offloaded_lines(_derivation(gpus, spec.with_changes(optimizer="rmsprop"))).notes[0]
    assert "rmsprop timed as adamw for-loop" in note


def test_a_node_that_cannot_hold_every_processs_shards_is_a_verdict_unless_detected():
    """Eight processes with 40 GiB of offloaded states each do not fit 256 GiB; a machine
    detected here (a login node) is no verdict on the training node: said, not applied."""
    spec = HostSpec(sample_shape=(2048,), batch_size=2, machine=MachineSpec(
        cpus=64, ram_bytes=256 * GIB))
    fits, note = host_verdict(host_estimate(spec), 40 * GIB, 8)
    assert not fits and note.endswith("DOES NOT FIT")
    assert host_verdict(host_estimate(spec), 10 * GIB, 8) is None
    login = spec.model_copy(update={"machine": MachineSpec(cpus=2, ram_bytes=16 * GIB,
                                                           source="detected")})
    fits, note = host_verdict(host_estimate(login), 40 * GIB, 8)
    assert fits and "give the training node's --cpus and --ram" in note


@pytest.mark.slow
def test_a_plan_asked_for_it_traces_an_offloaded_rank_and_writes_its_policy():
    spec = TrainingSpec(model="llama3_8b", model_args=TINY_LLAMA3, sample_shape=(64,),
                        batch_size=2, optimizer="adamw", gpu="H100-80GB",
                        machine={"cpus": 32, "ram_bytes": 256 * GIB})
    plan = plan_spec(spec, ClusterSpec(gpus_per_node=2, strategy=Strategy.FSDP_OFFLOAD,
                                       launch_only=True), workers=0)
    chosen = next(c for c in plan.candidates if c.label == plan.recommended)
    assert chosen.strategy is Strategy.FSDP_OFFLOAD and chosen.method.startswith(RANK_METHOD)
    assert any("CPU offload traced" in note for note in chosen.notes)
    assert any("of the optimizer on one CPU thread" in note for note in chosen.notes)
    assert "offload_policy=CPUOffloadPolicy()" in plan.train_script
