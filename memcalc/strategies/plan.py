"""The strategy planner: trace the single-GPU variants, derive the distributed ones, rank
them, recommend one with its reason, and write how to launch it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from memcalc.device.gpus import GpuSpec, find_gpu
from memcalc.errors import InputError
from memcalc.specs import DeviceKind, StepPhase, TrainingSpec
from memcalc.strategies.candidates import PlanContext, Sized, single_gpu_candidate
from memcalc.strategies.crop import largest_fitting_sample
from memcalc.strategies.launch import launch_files
from memcalc.strategies.plan_text import plan_assumptions, plan_reason, skipped_text, static_warning
from memcalc.strategies.rank_candidates import Screened, trace_ranks
from memcalc.strategies.rank_context import context_parallel_rows
from memcalc.strategies.ranking import rank_key
from memcalc.strategies.report import Candidate, StrategyPlan
from memcalc.strategies.rules import (
    MIXED_PRECISIONS,
    DerivedRule,
    TracedRule,
    VariantContext,
    derived_rules,
    traced_rules,
)
from memcalc.strategies.sharding import ModelStates, largest_unit_fraction
from memcalc.strategies.specs import ClusterSpec, Strategy
from memcalc.strategies.variants import (
    TracedVariant,
    VariantEstimator,
    mixed_precision_for,
    planned_spec,
    traced_variant,
)
from memcalc.trace.checkpointing import repeated_blocks
from memcalc.trace.halos import not_splittable_reason
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from torch import nn

def plan_strategies(spec: TrainingSpec, cluster: ClusterSpec, estimator: VariantEstimator,
                    prune: bool = True) -> StrategyPlan:
    """Every strategy for ``spec`` on ``cluster``'s GPUs, each variant traced by
    ``estimator``; needs ``spec.gpu``. ``memcalc.api.plan_spec`` passes the pipeline's.
    ``prune``: skip spatial bases that cannot change the plan (named in the assumptions;
    ``memcalc.strategies.spatial_search``); the recommendation and every candidate shown are
    those of the plan without it."""
    if spec.gpu is None or spec.device is not DeviceKind.CUDA:
        raise InputError("the strategy planner needs a GPU for capacity and speed: give --gpu "
                         "(see `memcalc gpus`)")
    if spec.phase is StepPhase.EVAL or spec.eval_sample_shape is not None:
        raise InputError("the strategy planner plans the training step; for an evaluation "
                         "step (--phase eval, --eval-shape) use `memcalc estimate` or "
                         "`memcalc check`")
    gpu = find_gpu(spec.gpu)
    model = estimator.model(spec)
    focus = cluster.strategy if cluster.launch_only else None
    variants, not_traced = traced_variants(spec, _variant_context(spec, gpu, model, cluster),
                                           estimator, focus)
    baseline = next(v for v in variants if v.rule.as_given)
    job_batch = spec.batch_size
    candidates = [single_gpu_candidate(v, cluster, gpu, job_batch) for v in variants]
    leanest = min(variants, key=lambda v: (v.report.device.plan.per_sample_bytes,
                                           v.report.device.plan.model_bytes))
    not_splittable = not_splittable_reason(model, baseline.report.input.traced_batch_shape[1:])
    context = PlanContext(cluster, gpu, estimator, not_splittable, job_batch)
    screened, failures, skipped = _derived_candidates(variants, largest_unit_fraction(model),
                                                      context, candidates, prune, focus)
    spatial = [s.candidate for s in screened if s.candidate.spatial_parts > 1]
    whole = [s for s in screened if s.candidate.spatial_parts == 1]
    derived, not_ranked = trace_ranks(whole, candidates + spatial, context)
    derived += spatial
    ring, ring_notes = context_parallel_rows(whole, candidates + derived, context,
                                             _sequence(baseline))
    derived += ring
    failures += not_ranked + ring_notes
    ranked = sorted(candidates + derived, key=lambda c: rank_key(c, cluster))
    chosen = _choose(ranked, cluster)
    usable = baseline.report.device.plan.usable_bytes
    host = baseline.report.host
    crop = (None if chosen or cluster.strategy
            else largest_fitting_sample(leanest, usable, estimator))
    return StrategyPlan(
        cluster=cluster, usable_bytes=usable, candidates=ranked,
        recommended=chosen.label if chosen else None, job_batch_size=job_batch,
        reason=static_warning(baseline) + plan_reason(chosen, ranked, cluster, usable,
                                                      not_splittable) + skipped_text(skipped),
        **launch_files(chosen, cluster, host, spec, gpu),
        assumptions=(plan_assumptions(cluster, model, not_splittable) + not_traced + failures
                     + skipped + _focused(focus)),
        largest_sample_shape=crop,
        largest_sample_strategy=leanest.label if crop else None,
    )


def traced_variants(spec: TrainingSpec, context: VariantContext, estimator: VariantEstimator,
                    focus: Strategy | None = None) -> tuple[list[TracedVariant], list[str]]:
    """Every traced rule that applies to ``spec``, traced, in registration order, and why a
    rule was not traced. The job as given is traced first, the rules that do not add to it
    asked for ahead meanwhile; a rule that only adds to it is left out when one sample of the
    job does not fit, one that keeps the model states whole when they alone exceed the GPU.
    ``focus``: only the rules its rows need (``_needed``)."""
    applying, clashes = [], []
    for rule in (rule for rule in traced_rules() if _needed(rule, focus)):
        try:
            applying.append((rule, rule.variant(spec, context)))
        except ValidationError as error:   # the job's options and the rule's do not go together
            why = error.errors()[0]["msg"].removeprefix("Value error, ")
            clashes.append(f"{rule.strategy.value} not traced: {why}")
    clashes += [f"{rule.strategy.value} not traced: without --global-batch no row accumulates "
                "micro-batches (each takes one step per batch), so gradients kept between them "
                "would only cost memory; give --global-batch to weigh it"
                for rule, variant_spec in applying if variant_spec is None and rule.keeps_gradients]
    applying = [(rule, variant_spec) for rule, variant_spec in applying if variant_spec]
    given_rule, given_spec = next((rule, v) for rule, v in applying if rule.as_given)
    # asked for whatever the job as given shows: ahead of it, while it is traced here
    estimator.prefetch([planned_spec(given_spec)] + [
        planned_spec(variant_spec) for rule, variant_spec in applying
        if not (rule.as_given or rule.adds_to_the_job or rule.keeps_the_states)])
    given = traced_variant(given_rule, given_spec, estimator)
    plan = given.report.device.plan
    left_out = [rule for rule, _ in applying if rule.adds_to_the_job and plan.max_batch_size == 0]
    states = given.report.static.model_state_bytes
    too_big = [rule for rule, _ in applying if rule.keeps_the_states and states > plan.usable_bytes]
    applying = [(rule, variant_spec) for rule, variant_spec in applying
                if rule not in left_out + too_big]
    estimator.prefetch([planned_spec(variant_spec) for rule, variant_spec in applying
                        if not rule.as_given])
    variants = [given if rule.as_given else traced_variant(rule, variant_spec, estimator)
                for rule, variant_spec in applying]
    needs, usable = given.report.device.total_bytes, plan.usable_bytes
    notes = [f"{rule.strategy.value} not traced: one sample of the job as given needs "
             f"{format_bytes(needs)} ({format_bytes(usable)} usable), and its step holds "
             "all of that and more" for rule in left_out]
    notes += [f"{rule.strategy.value} not traced: the model states alone need "
              f"{format_bytes(states)} ({format_bytes(plan.usable_bytes)} usable) and it keeps "
              "them whole" for rule in too_big]
    return variants, clashes + notes


def _needed(rule: TracedRule | DerivedRule, focus: Strategy | None) -> bool:
    """Whether the rows of ``focus`` (None: every strategy) need ``rule``: its own, the job
    as given, and for a distributed strategy the single-GPU variants it is built on."""
    if focus is None or rule.strategy is focus:
        return True
    distributed = any(derived.strategy is focus for derived in derived_rules())
    return isinstance(rule, TracedRule) and (rule.as_given or (distributed and rule.base))


def _focused(focus: Strategy | None) -> list[str]:
    return [] if focus is None else [
        f"launch file only (--emit with --strategy {focus.value}): the other strategies' rows "
        "were not built"]


def _variant_context(spec: TrainingSpec, gpu: GpuSpec, model: nn.Module,
                     cluster: ClusterSpec) -> VariantContext:
    # a job already in mixed precision keeps its own autocast in every mixed variant
    mixed = spec.precision if spec.precision in MIXED_PRECISIONS else mixed_precision_for(gpu)
    return VariantContext(mixed_precision=mixed, has_blocks=bool(repeated_blocks(model)),
                          compile_levers=cluster.compile_levers,
                          accumulates=(cluster.global_batch is not None
                                       or cluster.strategy is Strategy.ACCUMULATION))


def _derived_candidates(variants: list[TracedVariant], unit_fraction: float,
                        context: PlanContext, single: list[Candidate], prune: bool,
                        focus: Strategy | None = None
                        ) -> tuple[list[Screened], list[str], list[str]]:
    """Every derived rule on every base variant (base by base, rules in registration order),
    why a rule could not build one, and the bases a searching rule skipped. Rules sized in
    closed form go first, so that searching ones can compare with all they built."""
    bases = [(base, _states(base, unit_fraction)) for base in variants if base.rule.base]
    sized: dict[tuple[int, int], Sized] = {}
    rules = [rule for rule in derived_rules() if _needed(rule, focus)]
    for which, rule in enumerate(rules):
        if rule.search is None:
            for index, (base, states) in enumerate(bases):
                sized[index, which] = rule.size(rule, base, states, context)
    skipped: list[str] = []
    for which, rule in enumerate(rules):
        if rule.search is not None:
            built = [c for c, _ in sized.values() if c is not None]
            results, notes = rule.search(rule, bases, context, single + built, prune)
            sized.update(((index, which), result) for index, result in enumerate(results))
            skipped.extend(notes)
    screened = [Screened(sized[index, which][0], rules[which], *bases[index])
                for index in range(len(bases)) for which in range(len(rules))
                if sized[index, which][0] is not None]
    failures = [sized[index, which][1] for index in range(len(bases))
                for which in range(len(rules)) if sized[index, which][1] is not None]
    return screened, failures, skipped


def _states(base: TracedVariant, unit_fraction: float) -> ModelStates:
    static = base.report.static
    return ModelStates(parameter_bytes=static.parameter_bytes,
                       gradient_bytes=static.gradient_bytes,
                       optimizer_state_bytes=static.optimizer_state_bytes,
                       largest_unit_parameter_bytes=int(static.parameter_bytes * unit_fraction))


def _sequence(baseline: TracedVariant) -> int | None:
    """The length of the traced input's axis 1 (batch first), which context parallelism
    splits; None where the input has no such axis."""
    shape = baseline.report.input.traced_batch_shape
    return shape[1] if len(shape) > 1 else None


def _choose(ranked: list[Candidate], cluster: ClusterSpec) -> Candidate | None:
    if cluster.strategy is not None:
        forced = [c for c in ranked if c.strategy is cluster.strategy]
        return forced[0] if forced else None
    return ranked[0] if ranked and ranked[0].fits else None
