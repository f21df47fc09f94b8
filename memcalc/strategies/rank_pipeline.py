"""A pipeline row traced as one rank: its microbatch size, not its local batch, is searched.

Under 1F1B a rank holds the activations of at most as many microbatches as there are stages,
so its memory hardly grows with the microbatches of a step and a batch plan over the local
batch would find no ceiling. The lever is the microbatch size: the rank is traced at the
closed form's microbatch with one microbatch per stage, halving the microbatch while it does
not fit (``PIPELINE_TRIES`` traces at most); the step is timed with the closed form's
microbatch count (2 × stages, or what the global batch needs).

The row's peak at the job's batch is the rank's with microbatches of that batch per GPU, where
a trial had them (else none is shown).

Known limitations: a microbatch that fits is not grown past the closed form's; GPipe (which
holds every microbatch) is traced with two; the traces run
without the card's own settings (the crop search's way: the total against the usable bytes,
not the allocator replayed at capacity); activation transfers between stages are not modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.strategies.candidates import Batching, scheduled_candidate
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.rank_candidates import Screened
    from memcalc.strategies.report import Candidate

PIPELINE_TRIES = 3


def pipeline_trial(spec: TrainingSpec, screened: Screened, micro: int) -> TrainingSpec:
    """One rank of the pipeline at microbatch ``micro``, with as few microbatches as its
    schedule runs: a 1F1B rank holds no more microbatches in flight than there are stages,
    so the closed form's count (timed) adds steps to the trace, not bytes to its peak."""
    parallel = spec.parallel.model_copy(update={"microbatch_size": micro})
    return spec.with_changes(parallel=parallel, batch_size=micro * _traced_microbatches(spec),
                             gpu=None, gpu_memory_bytes=None)


def _traced_microbatches(spec: TrainingSpec) -> int:
    """Microbatches a pipeline rank is traced with: one per stage (1F1B's fewest, its most in
    flight), two for GPipe, which holds them all (its peak grows with every one)."""
    return max(2, spec.parallel.min_microbatches)


def first_microbatch(screened: Screened) -> int:
    """The closed form's microbatch (1 where it fits none)."""
    return max(1, screened.candidate.max_batch_size)


def traced_pipeline(screened: Screened, spec: TrainingSpec, context: PlanContext,
                    method: str) -> Candidate:
    """The pipeline row at the largest microbatch, of the closed form's and its halvings,
    whose rank fits (0: not even a microbatch of one)."""
    usable = screened.base.report.device.plan.usable_bytes
    micro = first_microbatch(screened)
    traced: dict[int, Report] = {}
    for _ in range(PIPELINE_TRIES):
        report = traced[micro] = context.estimator.report(pipeline_trial(spec, screened, micro))
        if report.device.total_bytes <= usable or micro == 1:
            break
        micro = max(1, micro // 2)
    fits = report.device.total_bytes <= usable
    at_job = traced.get(context.job_batch)     # None where no batch was given
    return _candidate(screened, report, context, method, micro if fits else 0,
                      at_job.device.total_bytes if at_job else None)


def _candidate(screened: Screened, report: Report, context: PlanContext, method: str,
               micro: int, job_batch_peak: int | None) -> Candidate:
    """The row from the rank traced at ``micro``; ``job_batch_peak``: the rank's total with
    microbatches of the job's batch, where one of the trials had them (a pipeline rank
    takes the job's batch per GPU as its microbatch, as the closed form's row does)."""
    parallel = report.spec.parallel
    traced = report.spec.batch_size // parallel.microbatch_size
    global_batch = context.cluster.global_batch
    microbatches = max(screened.candidate.accumulation_steps, traced,
                       -(-global_batch // (max(micro, 1) * parallel.dp)) if global_batch else 1)
    notes = [f"one rank of {parallel.describe()} traced with the real wrappers in a fake "
             f"process group: {format_bytes(report.device.total_bytes)} with {traced} "
             f"microbatches of {parallel.microbatch_size} (the rank of its largest stage; the "
             "card's settings left out, its total against the usable memory); timed with "
             f"{microbatches} microbatches a step"]
    return scheduled_candidate(
        screened.rule, screened.base, gpus=parallel.world_size, data_ranks=parallel.dp,
        batching=Batching(micro, microbatches, micro * microbatches * parallel.dp),
        peak=report.device.total_bytes, context=(context.cluster, context.gpu, screened.states),
        method=method, notes=notes, job_batch_peak=job_batch_peak)
