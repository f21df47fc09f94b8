"""The spatial search skips bases that cannot change the plan: the pruned plan recommends
what the full one does, with the same numbers for every candidate it shows, and names the
bases it skipped; the ceiling it skips by bounds every spatial candidate's samples/s."""

import re
from dataclasses import replace

import pytest

from memcalc.api import pipeline_estimator
from memcalc.device.gpus import find_gpu
from memcalc.pipeline import estimate
from memcalc.strategies import ClusterSpec, Strategy, plan_strategies
from memcalc.strategies import candidates
from memcalc.strategies.candidates import PlanContext
from memcalc.strategies.ranking import rank_key, samples_per_gpu
from memcalc.strategies.spatial import samples_ceiling
from memcalc.strategies.spatial_search import SKIPPED
from tests.fixtures.planner_cases import halo_net_spec

CLUSTER = ClusterSpec(rank_traces=0)     # the spatial rows' pruning, not the ranks


@pytest.fixture(scope="module", params=[0.3, 0.4, 0.5])
def plans(request):
    """The same job planned with and without pruning, and how many reports each made."""
    spec, plans, made = halo_net_spec(request.param), {}, {}
    # the halo net's card holds under 1 GiB: NCCL's buffers (a constant per process) would
    # swamp every multi-GPU row; the pruning is what is tested here
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(candidates, "nccl_bytes", lambda **_: 0)
        for prune in (True, False):
            estimator = pipeline_estimator()
            made[prune] = []
            counted = replace(estimator, report=lambda s, e=estimator, m=made[prune]:
                              m.append(s) or e.report(s))
            plans[prune] = plan_strategies(spec, CLUSTER, counted, prune=prune)
    return spec, plans[True], plans[False], {k: len(v) for k, v in made.items()}


def split_label(label):
    """``spatial×4 + mixed-precision`` → (4, 'mixed-precision'); the job as given: ''."""
    head, _, base = label.partition(" + ")
    return int(head.removeprefix("spatial×")), base


def skipped(plan):
    """(parts, base) of every base the pruned search skipped, from its notes."""
    return {split_label(re.match(rf"{SKIPPED}: (.+?) and more GPUs", note)[1])
            for note in plan.assumptions if note.startswith(SKIPPED)}


def test_the_pruned_plan_recommends_and_shows_what_the_full_one_does(plans):
    _, pruned, full, _ = plans
    assert pruned.recommended == full.recommended is not None
    rows = {c.label: c for c in full.candidates}
    assert all(rows[c.label] == c for c in pruned.candidates)
    assert pruned.torchrun == full.torchrun and pruned.slurm == full.slurm
    assert pruned.reason.split("; the fastest")[0] == full.reason.split("; the fastest")[0]


def test_every_row_left_out_is_named_and_could_not_change_the_plan(plans):
    _, pruned, full, made = plans
    shown = {c.label for c in pruned.candidates}
    left_out = [c for c in full.candidates if c.label not in shown]
    named = skipped(pruned)
    assert named        # each case has a base to skip, so this test could fail
    chosen = next(c for c in full.candidates if c.label == full.recommended)
    thriftiest = max((c for c in full.candidates if c.fits), key=samples_per_gpu)
    for row in left_out:
        assert row.strategy is Strategy.SPATIAL
        parts, base = split_label(row.label)
        # skipped at a part count at most the one the full search ended on
        assert any(b == base and p <= parts for p, b in named)
        assert rank_key(chosen, CLUSTER) < rank_key(row, CLUSTER)
        assert samples_per_gpu(row) < samples_per_gpu(thriftiest)
    assert made[True] < made[False]
    assert f"{len(named)} spatial candidate" in pruned.reason


def test_the_ceiling_bounds_every_spatial_candidate_and_slab_flops(plans):
    spec, _, full, _ = plans
    estimator = pipeline_estimator()
    context = PlanContext(CLUSTER, find_gpu(spec.gpu), estimator)
    for row in (c for c in full.candidates if c.strategy is Strategy.SPATIAL):
        base = _variant(spec, split_label(row.label)[1] or "baseline", estimator)
        assert row.samples_per_s <= samples_ceiling(base, row.gpus, context)
        slab = estimate(base.spec.with_changes(spatial_parts=row.spatial_parts, batch_size=1,
                                               gpu=None, gpu_memory_bytes=None))
        whole = estimate(base.spec.with_changes(batch_size=1, gpu=None, gpu_memory_bytes=None))
        assert slab.device.flops.total * row.spatial_parts >= whole.device.flops.total


def _variant(spec, label, estimator):
    from memcalc.strategies.plan import _variant_context, traced_variants
    model = estimator.model(spec)
    context = _variant_context(spec, find_gpu(spec.gpu), model, ClusterSpec())
    variants, _ = traced_variants(spec, context, estimator)
    return next(v for v in variants if v.label == label)


def test_a_forced_strategy_is_never_pruned():
    spec = halo_net_spec(0.3)
    forced = ClusterSpec(strategy=Strategy.SPATIAL)
    plan = plan_strategies(spec, forced, pipeline_estimator())
    assert not skipped(plan)
