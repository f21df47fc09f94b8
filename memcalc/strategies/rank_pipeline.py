"""A pipeline row traced as one rank: its microbatch size, not its local batch, is searched.

Under 1F1B a rank holds the activations of at most as many microbatches as there are stages,
but not the same bytes whatever the microbatches of a step: from the microbatch after the
warm-up on, the first stages run a forward while the gradients of the earlier backwards exist
(on LLaMA 7B over 2 GPUs with checkpointing, 4 microbatches of 9 need 79.4 GiB where 2 need
75.5 GiB), and torch's stages allocate receive buffers for every microbatch of the step. So the
rank is traced with the microbatches its row runs (``row_microbatches``: the closed form's
count, two per stage, or what the global batch needs; at most ``TRACED_PER_STAGE`` per stage),
and the lever searched is the microbatch size: the rank is traced at the closed form's
microbatch and, while it does not fit, where the line through two traced microbatches reaches
the usable bytes (half the microbatch while only one is traced; ``PIPELINE_TRIES`` traces at
most, the last at a microbatch of 1 where none fits yet). The closed form can be 4x off (on
LLaMA 7B over 2 GPUs with mixed precision and checkpointing its microbatch is 37, where 4 fit
and 7 do not): halving from there would find none.

Where the job's batch is given, the rank is also traced with microbatches of that batch per GPU
(asked for beside the first trial, so another process can make it meanwhile): the row's peak at
the job's batch, and a point of the search's line. The row's microbatch is the largest traced
one that fits.

Known limitations: a microbatch that fits is not grown past the closed form's (or the job's
batch, where larger); past ``TRACED_PER_STAGE`` microbatches per stage (a global batch that
needs more) the receive buffers of the rest are not traced, and the row says so; activation
transfers between stages are not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from memcalc.errors import MemcalcError
from memcalc.strategies.candidates import Batching, rank_report, scheduled_candidate
from memcalc.units import format_bytes

if TYPE_CHECKING:
    from memcalc.distributed.specs import ParallelSpec
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.rank_candidates import Screened
    from memcalc.strategies.report import Candidate

PIPELINE_TRIES = 4
CEILING_MICROBATCH = 1 << 20
"""The microbatch a pipeline row's most samples/s is timed at (``pipeline_ceiling``): far
past any that fits, where each kernel's fixed costs no longer count."""
TRACED_PER_STAGE = 2
"""A pipeline rank is traced with at most this many microbatches per stage (the closed
form's count); a step of more adds only receive buffers to a 1F1B rank."""


def pipeline_trial(spec: TrainingSpec, screened: Screened, micro: int,
                   global_batch: int | None) -> TrainingSpec:
    """One rank of the pipeline at microbatch ``micro``, with the microbatches its row runs
    (``row_microbatches``, at most ``TRACED_PER_STAGE`` per stage)."""
    parallel = spec.parallel.model_copy(update={"microbatch_size": micro})
    count = traced_microbatches(parallel, row_microbatches(parallel, screened, micro,
                                                           global_batch))
    return spec.with_changes(parallel=parallel, batch_size=micro * count)


def row_microbatches(parallel: ParallelSpec, screened: Screened, micro: int,
                     global_batch: int | None) -> int:
    """Microbatches a step of the row at ``micro`` runs: the closed form's count (two per
    stage, which keeps the bubble small), at least the fewest the schedule runs (two for
    GPipe), or what ``global_batch`` needs."""
    needed = -(-global_batch // (max(micro, 1) * parallel.dp)) if global_batch else 1
    return max(screened.candidate.accumulation_steps, _fewest(parallel), needed)


def traced_microbatches(parallel: ParallelSpec, count: int) -> int:
    """Of a step's ``count`` microbatches, those the rank is traced with."""
    return min(count, max(_fewest(parallel), TRACED_PER_STAGE * parallel.stages))


def _fewest(parallel: ParallelSpec) -> int:
    return max(2, parallel.min_microbatches)


def first_microbatch(screened: Screened) -> int:
    """The closed form's microbatch (1 where it fits none)."""
    return max(1, screened.candidate.max_batch_size)


def pipeline_trials(spec: TrainingSpec, screened: Screened, job_batch: int | None,
                    global_batch: int | None) -> list[TrainingSpec]:
    """The trials a pipeline row asks for first, in order: the closed form's microbatch, and
    the job's batch as the microbatch where it is given and differs."""
    return [pipeline_trial(spec, screened, micro, global_batch)
            for micro in first_trials(first_microbatch(screened), job_batch)]


def first_trials(first: int, job: int | None) -> list[int]:
    """The microbatches a pipeline row is traced at before any search, in the order asked
    for (and made ahead): the closed form's, then the job's batch where given and other."""
    return [first] + ([job] if job and job != first else [])


def pipeline_ceiling(screened: Screened, spec: TrainingSpec, context: PlanContext) -> float:
    """Most samples/s a traced rank of ``screened``'s pipeline (``spec``) can give its row.
    The row is timed as its closed form times it, at whatever microbatch its trace finds: its
    schedule over the base's FLOPs, kernel by kernel. A larger microbatch spreads each
    kernel's fixed costs over more samples, and more microbatches shrink the bubble; so it is
    timed here at ``CEILING_MICROBATCH`` samples and at the most microbatches a step of the
    row can run (those of a microbatch of 1)."""
    parallel = spec.parallel
    steps = row_microbatches(parallel, screened, 1, context.cluster.global_batch)
    batching = Batching(CEILING_MICROBATCH, steps, CEILING_MICROBATCH * steps * parallel.dp)
    return scheduled_candidate(
        screened.rule, screened.base, gpus=parallel.world_size, data_ranks=parallel.dp,
        batching=batching, peak=0, context=(context.cluster, context.gpu, screened.states),
        method="", notes=[]).samples_per_s


def traced_pipeline(screened: Screened, spec: TrainingSpec, context: PlanContext,
                    method: str) -> Candidate:
    """The pipeline row at the largest traced microbatch whose rank fits: of the closed
    form's, the job's batch and the search's guesses (0: not even a microbatch of one)."""
    usable = screened.base.report.device.plan.usable_bytes
    traced: dict[int, Report] = {}
    notes: list[str] = []

    def peak_of(micro: int) -> int | None:
        if micro not in traced:
            try:
                traced[micro] = rank_report(context, pipeline_trial(
                    spec, screened, micro, context.cluster.global_batch))
            except MemcalcError as error:
                if not traced:          # the first trial: the row cannot be traced
                    raise
                notes.append(f"not traced with microbatches of {micro}: {error}")
                return None
        return traced[micro].device.total_bytes

    best = searched_microbatch(first_microbatch(screened), context.job_batch, peak_of, usable)
    at_job = traced.get(context.job_batch)      # None where no batch was given
    return _candidate(screened, traced[best or min(traced)], context, method, best,
                      at_job.device.total_bytes if at_job else None, notes)


def searched_microbatch(first: int, job: int | None, peak_of: Callable[[int], int | None],
                        usable: int) -> int:
    """The largest microbatch found to fit in ``usable`` bytes (0: none). ``peak_of(micro)``
    traces the rank at ``micro`` (None where that trace failed); it is asked at ``first``,
    then at ``job`` (the job's batch, where given), then, while a traced microbatch does not
    fit and no larger one is known to fit below it, at ``next_microbatch``'s guess
    (``PIPELINE_TRIES`` trials and first in all), at 1 where none fits yet and the guesses
    are spent or the line leaves none: a rank's total is not quite affine in its microbatch,
    as the allocator's reserve varies."""
    peaks = {micro: peak_of(micro) for micro in first_trials(first, job)}
    for trial in range(1, PIPELINE_TRIES):
        micro = next_microbatch(peaks, usable, first)
        if (micro is None or trial == PIPELINE_TRIES - 1) and not _fitting(peaks, usable) \
                and 1 not in peaks:
            micro = 1                   # "none fits" is said of a microbatch of 1 only
        if micro is None:
            break
        peaks[micro] = peak_of(micro)
    return max(_fitting(peaks, usable), default=0)


def _fitting(peaks: dict[int, int | None], usable: int) -> list[int]:
    return [micro for micro, peak in peaks.items() if peak is not None and peak <= usable]


def next_microbatch(peaks: dict[int, int | None], usable: int, most: int) -> int | None:
    """The microbatch to trace next, or None where none is worth it: between the largest
    known to fit and the smallest known not to (up to ``most``), where the line through the
    two traced peaks nearest that bound reaches ``usable`` (a rank's bytes grow by about the
    same per sample of a microbatch), else half of that bound; never one traced already."""
    traced = {micro: peak for micro, peak in peaks.items() if peak is not None}
    over = [micro for micro, peak in traced.items() if peak > usable and micro <= most]
    if not over:
        return None
    ceiling = min(over)
    floor = max((micro for micro, peak in traced.items() if peak <= usable), default=0)
    below = sorted(micro for micro in traced if micro < ceiling)
    guess = ceiling // 2
    if below or len(over) > 1:
        other = below[-1] if below else sorted(over)[1]
        slope = (traced[other] - traced[ceiling]) / (other - ceiling)
        if slope > 0:
            guess = ceiling - math.ceil((traced[ceiling] - usable) / slope)
    if guess <= floor:
        return None                     # the line leaves nothing above the known fit
    untried = [micro for micro in range(min(max(guess, floor + 1), ceiling - 1), floor, -1)
               if micro not in peaks]
    return untried[0] if untried else None


def _candidate(screened: Screened, report: Report, context: PlanContext, method: str,
               micro: int, job_batch_peak: int | None, notes: list[str]) -> Candidate:
    """The row from the rank traced at ``micro``; ``job_batch_peak``: the rank's total with
    microbatches of the job's batch (a pipeline rank takes the job's batch per GPU as its
    microbatch, as the closed form's row does; None without one, or where that trace failed);
    ``notes``: the trials that could not be traced."""
    parallel = report.spec.parallel
    traced = report.spec.batch_size // parallel.microbatch_size
    microbatches = row_microbatches(parallel, screened, micro, context.cluster.global_batch)
    untraced = ([f"a step runs {microbatches} microbatches: the receive buffers torch's stage "
                 f"allocates for the {microbatches - traced} past the traced ones are not "
                 "counted"] if microbatches > traced else [])
    notes = [f"one rank of {parallel.describe()} traced with the real wrappers in a fake "
             f"process group: {format_bytes(report.device.total_bytes)} with {traced} "
             f"microbatches of {parallel.microbatch_size} (the rank of its largest stage)", *untraced,
             *notes]
    return scheduled_candidate(
        screened.rule, screened.base, gpus=parallel.world_size, data_ranks=parallel.dp,
        batching=Batching(micro, microbatches, micro * microbatches * parallel.dp),
        peak=report.device.total_bytes, context=(context.cluster, context.gpu, screened.states),
        method=method, notes=notes, job_batch_peak=job_batch_peak)
