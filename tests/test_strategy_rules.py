"""The strategy registry: one rule per strategy, no double registration, each rule's spec,
memory and communication against closed forms, and a new rule reaching a plan."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from memcalc.api import plan_spec
from memcalc.specs import Precision, TrainingSpec
from memcalc.strategies import ClusterSpec, Strategy, rules
from memcalc.strategies.lines import Derivation, Line, PerGpuLines
from memcalc.strategies.rules import (
    DerivedRule,
    TracedRule,
    VariantContext,
    derived_rules,
    register,
    rule_for,
    traced_rules,
)
from memcalc.strategies.sharding import ModelStates

P, G, O, UNIT = 1000, 1000, 2000, 100          # parameter, gradient, optimizer bytes; FSDP unit
STATES = ModelStates(P, G, O, UNIT)
OTHER, TEMPORARIES = 1000, 2000               # outside the states, in compute and in the step
COMPUTE = Line(P + G + O + OTHER, 300)
STEP = Line(P + G + O + TEMPORARIES, 10)
CONTEXT = VariantContext(mixed_precision=Precision.BF16_MIXED, has_blocks=True)


def derive(strategy, gpus, *, bucket_view=False, spatial_parts=1):
    base = SimpleNamespace(spec=SimpleNamespace(spatial_parts=spatial_parts))
    cluster = ClusterSpec(gradient_as_bucket_view=bucket_view)
    return rule_for(strategy).memory(Derivation(COMPUTE, STEP, base, gpus, cluster, STATES))


def test_every_strategy_has_exactly_one_rule_and_one_is_the_job_as_given():
    registered = [rule.strategy for rule in [*traced_rules(), *derived_rules()]]
    assert sorted(registered) == sorted(Strategy) and len(set(registered)) == len(registered)
    assert all(rule_for(strategy).strategy is strategy for strategy in Strategy)
    assert [rule.strategy for rule in traced_rules() if rule.as_given] == [Strategy.BASELINE]


def test_registering_a_strategy_twice_is_an_error():
    ddp = rule_for(Strategy.DDP)
    with pytest.raises(ValueError, match=r"strategy 'ddp' is registered twice"):
        register(replace(ddp, name_format="ddp again"))
    with pytest.raises(ValueError, match=r"strategy 'baseline' is registered twice"):
        register(TracedRule(Strategy.BASELINE, lambda spec, context: spec))
    assert rule_for(Strategy.DDP) is ddp


def test_a_missing_rule_is_named(monkeypatch):
    monkeypatch.setattr(rules, "_RULES", {})
    with pytest.raises(KeyError, match=r"no rule for strategy 'fsdp'"):
        rule_for(Strategy.FSDP)


def test_traced_rules_change_only_their_lever():
    spec = TrainingSpec(model="mlp")
    variant = {rule.strategy: rule.variant(spec, CONTEXT) for rule in traced_rules()}
    assert variant[Strategy.BASELINE] is spec
    assert variant[Strategy.MIXED_PRECISION] == spec.with_changes(precision="bf16-mixed")
    assert variant[Strategy.CHECKPOINTING] == spec.with_changes(activation_checkpointing=True)
    assert variant[Strategy.MIXED_PRECISION_CHECKPOINTING] == spec.with_changes(
        activation_checkpointing=True, precision="bf16-mixed")
    assert variant[Strategy.MIXED_PRECISION_OFFLOAD] == spec.with_changes(
        offload_activations=True, precision="bf16-mixed")
    assert variant[Strategy.ACCUMULATION] == spec.with_changes(zero_grad_to_none=False)
    accumulation = rule_for(Strategy.ACCUMULATION)
    assert accumulation.keeps_gradients and not accumulation.base


@pytest.mark.parametrize("strategy, spec, context", [
    (Strategy.MIXED_PRECISION, {"precision": "fp16-mixed"}, CONTEXT),
    (Strategy.CHECKPOINTING, {"activation_checkpointing": True}, CONTEXT),
    (Strategy.CHECKPOINTING, {}, replace(CONTEXT, has_blocks=False)),
    (Strategy.MIXED_PRECISION_CHECKPOINTING, {}, replace(CONTEXT, has_blocks=False)),
    (Strategy.MIXED_PRECISION_OFFLOAD, {"offload_activations": True}, CONTEXT),
])
def test_a_lever_already_pulled_or_without_blocks_is_not_traced_again(strategy, spec, context):
    assert rule_for(strategy).variant(TrainingSpec(model="mlp", **spec), context) is None


def test_ddp_buckets_add_the_gradients_to_both_lines_unless_they_are_views():
    copied = derive(Strategy.DDP, 4)
    assert (copied.compute, copied.step) == (Line(COMPUTE.fixed + G, 300), Line(STEP.fixed + G, 10))
    viewed = derive(Strategy.DDP, 4, bucket_view=True)
    assert (viewed.compute, viewed.step, viewed.data_ranks) == (COMPUTE, STEP, 4)


@pytest.mark.parametrize("strategy", [Strategy.ZERO1, Strategy.ZERO2])
def test_zero_on_one_gpu_leaves_the_traced_lines(strategy):
    one = derive(strategy, 1)
    assert (one.compute, one.step, one.data_ranks) == (COMPUTE, STEP, 1)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_zero_stages_shard_what_the_paper_says(gpus):
    n = gpus
    # ZeRO-1: optimizer state sharded; ZeRO-2: and gradients; FSDP (ZeRO-3): and parameters.
    # The optimizer step's temporaries shrink with the shard it steps.
    expected_step = {Strategy.ZERO1: P + G + O / n, Strategy.ZERO2: P + (G + O) / n,
                     Strategy.FSDP: (P + G + O) / n}
    # forward/backward: the sharded states leave (gradients conservatively kept); FSDP
    # gathers two units' parameters and one unit's gradients
    expected_compute = {Strategy.ZERO1: COMPUTE.fixed - (1 - 1 / n) * O,
                        Strategy.ZERO2: COMPUTE.fixed - (1 - 1 / n) * O,
                        Strategy.FSDP: COMPUTE.fixed - (1 - 1 / n) * (O + P) + 2 * UNIT
                        + UNIT * G / P}
    for strategy, states in expected_step.items():
        lines = derive(strategy, n)
        assert lines.step.fixed == pytest.approx(states + TEMPORARIES / n)
        assert lines.compute.fixed == pytest.approx(expected_compute[strategy])
        assert (lines.compute.per_sample, lines.step.per_sample) == (300, 10)


def test_a_pipeline_spreads_the_fixed_bytes_over_its_stages_and_has_one_data_rank():
    lines = derive(Strategy.PIPELINE, 4)
    assert lines.compute == Line(COMPUTE.fixed / 4, 300) and lines.step == Line(STEP.fixed / 4, 10)
    assert lines.data_ranks == 1
    assert rule_for(Strategy.PIPELINE).micro_batches_in_flight(4) == 8


def test_a_spatial_group_keeps_ddp_buckets_and_counts_groups_as_data_ranks():
    lines = derive(Strategy.SPATIAL, 8, spatial_parts=4)
    assert (lines.compute, lines.step) == (Line(COMPUTE.fixed + G, 300), Line(STEP.fixed + G, 10))
    assert lines.data_ranks == 2
    assert any("init_device_mesh('cuda', (2, 4)" in note for note in lines.notes)
    assert rule_for(Strategy.SPATIAL).name(SimpleNamespace(spatial_parts=4)) == "spatial×4"


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_communication_follows_the_ring_collectives(gpus):
    bandwidth = 1e9
    ring = (gpus - 1) / gpus       # share of the bytes each GPU sends in one ring pass
    seconds = {rule.strategy: rule.communication_s(STATES, gpus, bandwidth)
               for rule in derived_rules()}
    for strategy in (Strategy.DDP, Strategy.DATA_PARALLEL, Strategy.ZERO1, Strategy.ZERO2,
                     Strategy.SPATIAL):
        assert seconds[strategy] == pytest.approx(2 * ring * G / bandwidth)    # all-reduce
    # all-gather parameters in forward and backward, reduce-scatter gradients
    assert seconds[Strategy.FSDP] == pytest.approx(ring * (2 * P + G) / bandwidth)
    assert seconds[Strategy.PIPELINE] == 0.0


def test_a_newly_registered_rule_is_planned_without_touching_the_planner(monkeypatch):
    monkeypatch.setattr(rules, "_RULES", {strategy: rule for strategy, rule in rules._RULES.items()
                                          if strategy is not Strategy.PIPELINE})
    # a toy: DDP with gradient views and free communication, under the pipeline's name
    register(DerivedRule(Strategy.PIPELINE, memory=lambda d: PerGpuLines(
        d.compute, d.step, d.gpus, ("toy",)), communication_s=lambda states, gpus, bw: 0.0,
        name_format="toy"))
    spec = TrainingSpec(model="mlp", model_args={"in_features": 64, "hidden": 256, "depth": 2},
                        sample_shape=(64,), gpu="T4", machine={"cpus": 8, "ram_bytes": 64 << 30})
    plan = plan_spec(spec, ClusterSpec(gpus_per_node=4, gradient_as_bucket_view=True))
    labels = {c.label: c for c in plan.candidates}
    assert not any(label.startswith("pipeline") for label in labels)
    toy, ddp = labels["toy"], labels["ddp"]
    assert toy.strategy is Strategy.PIPELINE and toy.notes == ["toy"] and toy.gpus == 4
    assert (toy.max_batch_size, toy.per_gpu_peak_bytes) == (ddp.max_batch_size,
                                                            ddp.per_gpu_peak_bytes)
    assert toy.communication_s == 0.0 < ddp.communication_s
    assert toy.compute_s == pytest.approx(ddp.compute_s)
