"""A plan makes each spec's report once and never traces one (spec, batch) twice."""

from collections import Counter

import pytest

import memcalc.api
import memcalc.pipeline
import memcalc.prepared_step
from memcalc.api import plan_spec
from memcalc.strategies import ClusterSpec, Strategy
from memcalc.strategies.report_cache import ReportCache, spec_key

from tests.fixtures.planner_cases import halo_net_spec

SPEC = halo_net_spec(0.3)   # one sample does not fit one GPU: spatial slabs are traced too
FITTING = halo_net_spec(3.0)    # a few samples fit


def test_a_spec_is_made_once_and_missing_lists_each_unmade_spec_once():
    made = []
    fp32, bf16 = SPEC, SPEC.with_changes(precision="bf16-mixed")
    elsewhere = {spec_key(bf16): "made elsewhere"}
    cache = ReportCache(lambda spec: made.append(spec) or f"report of {spec.precision.value}",
                        ahead=lambda spec: elsewhere.get(spec_key(spec)))
    assert cache.report(fp32) == cache.report(SPEC.with_changes()) == "report of fp32"
    assert made == [fp32]
    assert cache.missing([bf16, fp32, bf16]) == [bf16]
    assert cache.report(bf16) == "made elsewhere" and len(made) == 1 and len(cache) == 2


def test_a_failure_is_not_kept():
    calls = Counter()

    def failing(spec):
        calls["made"] += 1
        raise ValueError(f"no report for {spec.model}")

    cache = ReportCache(failing)
    for _ in range(2):
        with pytest.raises(ValueError, match="no report for tests.fixtures"):
            cache.report(SPEC)
    assert calls["made"] == 2


@pytest.fixture
def traced(monkeypatch):
    """Every (spec, batch shape) the plan traces, and every spec it estimates."""
    record = {"traces": [], "estimates": []}
    estimate, trace = memcalc.pipeline.estimate, memcalc.prepared_step.trace_training_step

    def counted_estimate(spec, *args, **kwargs):
        record["estimates"].append(spec_key(spec))
        return estimate(spec, *args, **kwargs)

    def counted_trace(setup):
        record["traces"].append((record["estimates"][-1], setup.batch_shape))
        return trace(setup)

    monkeypatch.setattr(memcalc.api, "estimate_spec", counted_estimate)
    monkeypatch.setattr(memcalc.pipeline, "estimate", counted_estimate)   # the planner's
    monkeypatch.setattr(memcalc.prepared_step, "trace_training_step", counted_trace)
    return record


def test_a_plan_traces_no_spec_at_a_batch_twice(traced):
    plan = plan_spec(SPEC, ClusterSpec(), workers=0)
    assert any(c.strategy is Strategy.SPATIAL for c in plan.candidates)   # slabs traced too
    assert len(traced["traces"]) == len(set(traced["traces"])) > 0
    assert len(traced["estimates"]) == len(set(traced["estimates"]))


def test_the_accumulation_variant_of_a_job_that_keeps_its_gradients_is_the_job(traced):
    kept = FITTING.with_changes(zero_grad_to_none=False)
    plan = plan_spec(kept, ClusterSpec(global_batch=4), workers=0)
    rows = {c.label: c for c in plan.candidates}
    baseline, accumulation = rows["baseline"], rows["accumulation"]
    assert baseline.fits
    assert accumulation.per_gpu_peak_bytes == baseline.per_gpu_peak_bytes
    # the job's own spec is estimated once, though two rules ask for it
    assert traced["estimates"].count(spec_key(kept)) == 1
    freed = SPEC.with_changes(zero_grad_to_none=True)
    assert spec_key(freed.with_changes(zero_grad_to_none=False)) != spec_key(freed)


def test_accumulation_is_not_traced_when_one_sample_of_the_job_does_not_fit(traced):
    plan = plan_spec(SPEC, ClusterSpec(rank_traces=0, global_batch=4), workers=0)
    kept = spec_key(SPEC.with_changes(zero_grad_to_none=False, batch_size=None))
    assert kept not in traced["estimates"]
    assert "accumulation" not in {c.label for c in plan.candidates}
    baseline = next(c for c in plan.candidates if c.label == "baseline")
    assert not baseline.fits
    note = next(a for a in plan.assumptions if a.startswith("accumulation not traced"))
    assert "one sample of the job as given needs" in note


def test_accumulation_is_traced_only_where_a_row_may_accumulate(traced):
    kept = spec_key(FITTING.with_changes(zero_grad_to_none=False, batch_size=None))
    plan = plan_spec(FITTING, ClusterSpec(rank_traces=0), workers=0)
    assert kept not in traced["estimates"]
    assert "accumulation" not in {c.label for c in plan.candidates}
    # no single-GPU row accumulates, so none points to the row left out (a pipeline's
    # micro-batches are its schedule's, sized with it)
    assert all(c.accumulation_steps == 1 for c in plan.candidates if c.gpus == 1)
    assert not any("'accumulation' candidate" in note for c in plan.candidates for note in c.notes)
    note = next(a for a in plan.assumptions if a.startswith("accumulation not traced"))
    assert "without --global-batch" in note
    for cluster in (ClusterSpec(rank_traces=0, global_batch=64),
                    ClusterSpec(rank_traces=0, strategy=Strategy.ACCUMULATION)):
        traced["estimates"].clear()
        plan = plan_spec(FITTING, cluster, workers=0)
        assert kept in traced["estimates"]
        assert "accumulation" in {c.label for c in plan.candidates}
        if cluster.global_batch:       # rows reach it in steps, pointing to the traced row
            assert any("'accumulation' candidate" in note for c in plan.candidates
                       for note in c.notes)
