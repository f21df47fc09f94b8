"""Distributed candidates traced as one rank of the job as it is launched.

The closed-form candidates (``memcalc.strategies.rules``) screen every layout on every base
variant in milliseconds; the ones that matter are then traced for real: the job's spec with
its ``ParallelSpec`` (``memcalc.distributed``: a fake process group of the job's world size,
the real DDP / ZeroRedundancyOptimizer / FSDP2 / pipelining wrappers) and its own batch plan.
What each traces replaces its closed-form row. Traced are: the best row of every layout that
has a wrapper (where that rank does not fit, the layout's next row that fits by its closed
form, in its turn; a pipeline's only where no traced row that fits outpaces the most its
schedule lets it reach, ``rank_pipeline.pipeline_ceiling``), then the best row overall until
it is a traced one, so the recommendation rests on a traced rank, then closed-form rows shown
above a traced row of their own layout (``ClusterSpec.rank_traces`` in all).

Known limitations: rows not among those keep their closed form and say so in their method;
``nn.DataParallel`` (one process, no rank to trace) and spatial splits (traced on a slab)
are never traced as ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.distributed.specs import REPLICATED, DataParallel, ParallelSpec
from memcalc.errors import MemcalcError
from memcalc.specs import Precision
from memcalc.strategies.candidates import (accumulation, global_batch_note, planned_peak_at,
                                           rank_report, scheduled_candidate)
from memcalc.strategies.cost import bandwidth_bytes_per_s
from memcalc.strategies.rank_pipeline import (first_microbatch, pipeline_ceiling, pipeline_trial,
                                              pipeline_trials, traced_pipeline)
from memcalc.strategies.ranking import rank_key, standing_in_the_way
from memcalc.strategies.specs import Strategy
from memcalc.strategies.state_offload import host_verdict, judged, offload_note
from memcalc.strategies.variants import planned_spec
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.rules import DerivedRule
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.variants import TracedVariant

WRAPPERS = {Strategy.DDP: DataParallel.DDP, Strategy.ZERO1: DataParallel.ZERO1,
            Strategy.ZERO2: DataParallel.ZERO2, Strategy.FSDP: DataParallel.FSDP,
            Strategy.PIPELINE: DataParallel.PIPELINE, Strategy.FSDP_OFFLOAD: DataParallel.FSDP}
"""The planner's layouts that one rank of the job traces, with the wrapper each runs."""
CPU_OFFLOADED = (Strategy.FSDP_OFFLOAD,)
"""Layouts traced with FSDP2's ``CPUOffloadPolicy``: only where one of their rows leads the
plan (a layout for when nothing faster fits) or is the one asked for (``--strategy``), not as
every layout's best row is."""
SHARDED = (DataParallel.ZERO2, DataParallel.FSDP)
SHARDED_POLICY = {Precision.BF16_MIXED: "bfloat16", Precision.FP16_MIXED: "float16"}
"""FSDP2 ranks of a mixed-precision variant run as torchtitan runs them: FSDP2's
``MixedPrecisionPolicy(param_dtype=…, reduce_dtype=float32)`` (parameters cast once per unit
at the all-gather, fp32 sharded master weights), not autocast."""
NEAR_FIT = 1.25
"""A layout's best closed-form row that does not fit is still traced within this factor of
the usable memory at batch 1 (the closed form can be that far off)."""
FAR_OFF = 2
"""A layout whose traced rank fits fewer than 1/FAR_OFF of the samples its closed form said
has its remaining closed-form rows flagged in the plan's assumptions."""
RANK_METHOD = "traced rank"
"""How a traced rank's candidate says it was obtained (``Candidate.method`` starts so)."""


@dataclass(frozen=True)
class Screened:
    """A closed-form candidate with what it was derived from."""

    candidate: Candidate
    rule: DerivedRule
    base: TracedVariant
    states: ModelStates


def rank_spec(screened: Screened, context: PlanContext) -> TrainingSpec | None:
    """The spec of one rank of ``screened``'s job, its batch left to plan; None where its
    layout has no wrapper to trace."""
    wrapper = WRAPPERS.get(screened.candidate.strategy)
    if wrapper is None:
        return None
    gpus, cluster, spec = screened.candidate.gpus, context.cluster, screened.base.spec
    per_node = cluster.gpus_per_node_for(gpus)
    policy = SHARDED_POLICY.get(spec.precision) if wrapper in SHARDED else None
    parallel = ParallelSpec(strategy=wrapper, gpus_per_node=per_node, nodes=gpus // per_node,
                            gradient_as_bucket_view=(cluster.gradient_as_bucket_view
                                                     and wrapper in REPLICATED),
                            cpu_offload=screened.candidate.strategy in CPU_OFFLOADED,
                            **({"param_dtype": policy, "reduce_dtype": "float32"}
                               if policy else {}))
    rank = spec.with_changes(parallel=parallel,
                             **({"precision": Precision.FP32} if policy else {}))
    if wrapper is DataParallel.PIPELINE:
        return pipeline_trial(rank, screened, first_microbatch(screened),
                              context.cluster.global_batch)
    return planned_spec(rank)


def trace_ranks(screened: list[Screened], others: list[Candidate], context: PlanContext
                ) -> tuple[list[Candidate], list[str]]:
    """``screened`` with the rows that matter traced as ranks (in their order), and why a
    row could not be. ``others``: the candidates ranked beside them (single GPU, spatial)."""
    if not context.cluster.rank_traces:
        return [s.candidate for s in screened], []
    rows = {id(s): s.candidate for s in screened}
    tried: set[int] = set()
    outpaced: set[int] = set()          # tried, but not worth a trace: no slot taken
    failures: list[str] = []
    given = context.cluster.gpus
    fits_given = any(c.fits and c.gpus <= given for c in others)
    ahead = [_best_of(screened, strategy, context) for strategy in WRAPPERS
             if strategy not in CPU_OFFLOADED or strategy is context.cluster.strategy]
    ahead = [s for s in ahead if s is not None and _worth_a_rank(s, given, fits_given)
             ][:context.cluster.rank_traces]
    # a pipeline is asked for once the layouts before it are traced: it may not be worth one
    context.estimator.prefetch([trial for s in ahead if not _deferred(s, context)
                                for trial in _first_trials(s, context)])
    while len(tried - outpaced) < context.cluster.rank_traces:
        waiting = [s for s in ahead if id(s) not in tried]
        if not waiting:
            leader = min(others + list(rows.values()), key=lambda c: rank_key(c, context.cluster))
            waiting = [s for s in screened if s.candidate is leader and id(s) not in tried]
        if not waiting:
            waiting = _above_a_traced_row(screened, rows, tried, context, given, fits_given)
        if not waiting:
            break
        chosen = waiting[0]
        tried.add(id(chosen))
        if any(s is chosen for s in ahead) and _deferred(chosen, context):
            failure = _outpaced(chosen, others + list(rows.values()), context)
            if failure:
                failures.append(failure)
                outpaced.add(id(chosen))
                continue
            context.estimator.prefetch(_first_trials(chosen, context))
        traced, failure = _traced(chosen, context)
        if traced is not None:
            rows[id(chosen)] = traced
            if not traced.fits and any(s is chosen for s in ahead):
                ahead += _next_of_layout(screened, chosen, tried, context, given, fits_given)
        if failure:
            failures.append(failure)
    return [rows[id(s)] for s in screened], failures + closed_forms_found_off(screened, rows)


def closed_forms_found_off(screened: list[Screened], rows: dict[int, Candidate]) -> list[str]:
    """A line per layout whose rows, traced as ranks, fit fewer samples than their closed
    form said, where closed-form rows of it are left in the table: those may be as far off."""
    lines = []
    for strategy in WRAPPERS:
        pairs = [(s.candidate, rows[id(s)]) for s in screened
                 if s.candidate.strategy is strategy]
        off = [(closed, traced) for closed, traced in pairs
               if traced.method.startswith(RANK_METHOD) and closed.fits
               and FAR_OFF * _samples(traced) < _samples(closed)]
        if off and any(closed is traced for closed, traced in pairs):
            closed, traced = min(off, key=lambda pair: _samples(pair[1]) / _samples(pair[0]))
            found = (f"fits {traced.batch_text} per GPU" if traced.fits else "does not fit")
            lines.append(f"{strategy.value}'s closed form was optimistic here: traced as a "
                         f"rank, {traced.label} {found} where it said {closed.batch_text}; its "
                         "rows still derived (how 'derive') may be as far off")
    return lines


def _samples(candidate: Candidate) -> int:
    return max(candidate.max_batch_size, 0) * candidate.accumulation_steps


def _next_of_layout(screened: list[Screened], traced: Screened, tried: set[int],
                    context: PlanContext, given: int, fits_given: bool) -> list[Screened]:
    """A layout's best row, traced, does not fit: its next row that fits by its closed form
    (the closed form can be that far off), to be traced in its turn; none where it has none."""
    untried = [s for s in screened if id(s) not in tried and s.candidate.fits]
    after = _best_of(untried, traced.candidate.strategy, context)
    return [after] if after is not None and _worth_a_rank(after, given, fits_given) else []


def _above_a_traced_row(screened: list[Screened], rows: dict[int, Candidate], tried: set[int],
                        context: PlanContext, given: int, fits_given: bool) -> list[Screened]:
    """The best closed-form row that fits and is shown above a traced row of its own layout
    (the closed form can be 4x off, and two rows of one layout must not disagree so), to be
    traced in its turn; none where there is none."""
    def key(candidate: Candidate):
        return rank_key(candidate, context.cluster)

    traced = [rows[id(s)] for s in screened if id(s) in tried
              and rows[id(s)].method.startswith(RANK_METHOD)]
    above = [s for s in screened if id(s) not in tried and s.candidate.fits
             and s.base.report.device.method == "traced"
             and any(t.strategy is s.candidate.strategy and key(s.candidate) < key(t)
                     for t in traced)
             and _worth_a_rank(s, given, fits_given)]
    return sorted(above, key=lambda s: key(s.candidate))[:1]


def _first_trials(screened: Screened, context: PlanContext) -> list[TrainingSpec]:
    """What tracing ``screened``'s rank asks for first: its spec, and a pipeline's trial at
    the job's batch beside it."""
    spec = rank_spec(screened, context)
    if spec is None or spec.parallel.pp == 1:
        return [spec]
    return pipeline_trials(spec, screened, context.job_batch, context.cluster.global_batch)


def _deferred(screened: Screened, context: PlanContext) -> bool:
    """A pipeline's best row, its layout not asked for (``--strategy``): traced only where no
    traced row that fits outpaces it (``_outpaced``), so asked for after the layouts ahead of
    it. (Traced all the same where it leads the plan, or is shown above a traced row of its
    layout.)"""
    return (screened.candidate.strategy is Strategy.PIPELINE
            and context.cluster.strategy is not Strategy.PIPELINE)


def _outpaced(screened: Screened, candidates: list[Candidate], context: PlanContext
              ) -> str | None:
    """Why ``screened``'s pipeline is not traced as a rank: a traced row that fits stands in
    the way of the most samples/s its rank could give (``pipeline_ceiling``), so tracing it
    cannot change the plan; None where none does."""
    spec = rank_spec(screened, context)
    if spec is None:
        return None
    ceiling = pipeline_ceiling(screened, spec, context)
    fitting = [c for c in candidates if c.fits and c.method.startswith("traced")]   # not derived
    leader = standing_in_the_way(screened.candidate.gpus, ceiling, fitting, context.cluster)
    if leader is None:
        return None
    return (f"{screened.candidate.label} on {screened.candidate.gpus} GPUs not traced as a "
            f"rank: with its schedule's bubble it reaches at most {ceiling:,.1f} samples/s, "
            f"below the traced {leader.label} ({leader.samples_per_s:,.1f} samples/s); its row "
            "is the closed form")


def _best_of(screened: list[Screened], strategy: Strategy, context: PlanContext
             ) -> Screened | None:
    """The best closed-form row of ``strategy`` that a rank can trace."""
    rows = [s for s in screened if s.candidate.strategy is strategy
            and s.base.report.device.method == "traced"]
    return min(rows, key=lambda s: rank_key(s.candidate, context.cluster), default=None)


def _worth_a_rank(screened: Screened, given: int, fits_given: bool) -> bool:
    """A layout's best row is traced when it could be what the plan shows first: on the GPUs
    given (or beyond them when nothing traced fits there), fitting or within ``NEAR_FIT`` of
    the usable memory by its closed form."""
    candidate = screened.candidate
    if candidate.gpus > given and fits_given:
        return False
    usable = screened.base.report.device.plan.usable_bytes
    return candidate.fits or candidate.per_gpu_peak_bytes <= NEAR_FIT * usable


def _traced(screened: Screened, context: PlanContext) -> tuple[Candidate | None, str | None]:
    """``screened`` traced as one rank on its GPUs, or (with doubled GPUs, when one GPU was
    given and the layout shards more over more GPUs) on the fewest that fit it."""
    candidate = screened.candidate
    spec = rank_spec(screened, context)
    if spec is None or screened.base.report.device.method != "traced":
        return None, None
    cluster = context.cluster
    gpus = candidate.gpus
    while True:
        method = f"{RANK_METHOD} ({gpus} ranks, fake process group) of {screened.base.label}"
        try:
            if spec.parallel.pp > 1:
                return traced_pipeline(screened, spec, context, method), None
            report = rank_report(context, spec)
        except MemcalcError as error:
            return None, (f"{candidate.label} on {gpus} GPUs not traced as a rank ({error}); "
                          "its row is the closed form")
        traced = rank_candidate(screened, report, context, method)
        more = (cluster.gpus == 1 and not traced.fits and screened.rule.more_gpus_fit
                and gpus * 2 <= cluster.max_gpus)
        if not more:
            return traced, None
        gpus *= 2
        per_node = cluster.gpus_per_node_for(gpus)
        spec = spec.with_changes(parallel=spec.parallel.model_copy(
            update={"gpus_per_node": per_node, "nodes": gpus // per_node}))


def rank_candidate(screened: Screened, report: Report, context: PlanContext,
                   method: str) -> Candidate:
    """The candidate of one traced data-parallel rank: its planned batch and peak; timed as
    the closed form times it (FLOPs of the base, the layout's collectives)."""
    parallel = report.spec.parallel
    device, plan = report.device, report.device.plan
    local = plan.max_batch_size
    cluster = context.cluster
    batching = accumulation(cluster.global_batch, local, parallel.dp)
    notes = [f"one rank of {parallel.describe()} traced with the real wrappers in a fake "
             f"process group: {format_bytes(device.total_bytes)} at batch {local}"
             + parallel.per_gpu()]
    notes += global_batch_note(batching, cluster.global_batch, parallel.dp)
    if parallel.cpu_offload:     # traced: the shards as FSDP2 pads them
        notes.append(offload_note(screened.base.spec, screened.states, parallel.world_size,
                                  device.offloaded_state_bytes))
    peak = (device.total_bytes if batching.micro == local
            else planned_peak_at(plan, max(batching.micro, 1)))
    ring_s = (batching.steps * max(batching.micro, 1) * device.ring_exchange_bytes
              / max(device.batch_size, 1) / bandwidth_bytes_per_s(cluster, parallel.cp)
              if parallel.cp > 1 else 0.0)
    if ring_s:
        notes.append(f"ring attention: {format_bytes(device.ring_exchange_bytes)} of keys, "
                     f"values and their gradients per rank at batch {device.batch_size}, "
                     "timed on the node's links, not overlapped (torch's all-gather rotation)")
    candidate = scheduled_candidate(
        screened.rule, screened.base, gpus=parallel.world_size, data_ranks=parallel.dp,
        batching=batching, peak=peak,
        context=(cluster, context.gpu, screened.states), method=method, notes=notes,
        job_batch_peak=planned_peak_at(plan, context.job_batch), group=parallel.cp,
        exchange_s=ring_s)
    host = screened.base.report.host
    return judged(candidate, host_verdict(host, device.offloaded_state_bytes,
                                          parallel.gpus_per_node)
                  if parallel.cpu_offload and host is not None else None)
