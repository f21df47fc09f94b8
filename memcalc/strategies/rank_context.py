"""Context parallelism in the plan: when not one sample fits a GPU on the GPUs given, the
sequence split over a group of them, traced as ranks of the job.

Context parallelism only helps where a single sample is too large: for a given global batch,
a group of ``cp`` GPUs holding ``cp`` samples between them keeps about what one GPU holding
one sample keeps, and accumulation reaches the same batch more simply. So it is searched only
where no candidate on the GPUs given fits one sample, and only for a model whose traced step
ran ``scaled_dot_product_attention`` (torch's ring attention splits that). Each trial is FSDP
over data × context parallel ranks on the leanest base variant (mixed precision first, then
fewest bytes per sample), ``cp`` = 2, 4, … up to the GPUs of a node, dividing the sequence
into 2·cp chunks, traced as the first and last rank of a group
(``memcalc.trace.context_parallel``), until one fits.

Known limitations: no closed form screens it (each trial is a traced rank: two ranks, each
with its batch plan); tensor parallelism is not combined with it here (``estimate --tp --cp``
traces that); a base other than the leanest is not tried, nor one offloading activations
(offloaded DTensors come back as plain tensors in its trace's backward).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import MemcalcError
from memcalc.strategies.candidates import rank_report
from memcalc.strategies.rank_candidates import RANK_METHOD, rank_candidate, rank_spec
from memcalc.strategies.rules import MIXED_PRECISIONS
from memcalc.strategies.specs import Strategy

if TYPE_CHECKING:
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.rank_candidates import Screened
    from memcalc.strategies.report import Candidate

NOT_SEARCHED = "context parallelism not searched"


def context_parallel_rows(screened: list[Screened], others: list[Candidate],
                          context: PlanContext, sequence: int | None
                          ) -> tuple[list[Candidate], list[str]]:
    """The context-parallel rows traced (the last one the first that fits, where one does)
    and what the plan's assumptions say of the search; nothing where a candidate on the
    GPUs given fits a sample. ``others``: every candidate built so far; ``sequence``: the
    length of the input's axis 1 (batch first), None where it has none."""
    cluster = context.cluster
    if (cluster.gpus < 2 or not cluster.rank_traces
            or any(c.fits and c.gpus <= cluster.gpus for c in others)):
        return [], []
    bases = [s for s in screened if s.candidate.strategy is Strategy.FSDP
             and s.base.report.device.method == "traced"
             and not s.base.spec.offload_activations]
    if not bases:
        return [], []
    # FSDP runs a mixed-precision base with half-precision parameters (its policy): what a
    # sample keeps is then about half its single-GPU figure, so those go first
    leanest = min(bases, key=lambda s: (s.base.spec.precision not in MIXED_PRECISIONS,
                                        s.base.report.device.plan.per_sample_bytes,
                                        s.base.report.device.plan.model_bytes))
    if not leanest.base.report.device.attention_backends:
        return [], [f"{NOT_SEARCHED}: the model ran no scaled_dot_product_attention, which "
                    "it splits"]
    sizes = group_sizes(cluster.gpus_per_node_for(cluster.gpus), cluster.gpus, sequence)
    if not sizes:
        return [], [f"{NOT_SEARCHED}: the input's sequence ({sequence or 'none'}) does not "
                    f"split into 2·cp chunks for any cp dividing {cluster.gpus} GPUs"]
    rows: list[Candidate] = []
    job = rank_spec(leanest, context)
    for cp in sizes:
        spec = job.with_changes(parallel=ParallelSpec.model_validate(
            {**job.parallel.model_dump(), "cp": cp}))
        method = (f"{RANK_METHOD} ({cluster.gpus} ranks, fake process group, context parallel "
                  f"{cp}) of {leanest.base.label}")
        try:
            row = rank_candidate(leanest, rank_report(context, spec), context, method)
        except MemcalcError as error:
            return rows, [f"context parallelism {cp} on {leanest.base.label} not traced "
                          f"({error}); larger groups not tried"]
        rows.append(row)
        if row.fits:
            break
    tried = ", ".join(str(cp) for cp in sizes[:len(rows)])
    return rows, [f"context parallelism searched (no sample fits a GPU without it): FSDP over "
                  f"data × context-parallel ranks on {leanest.base.label} (the leanest per "
                  f"sample, mixed precision first), groups of {tried} GPUs traced as ranks "
                  "until one fits; a batch of theirs is per group"]


def group_sizes(per_node: int, gpus: int, sequence: int | None) -> list[int]:
    """Context-parallel group sizes to try, smallest first: dividing the GPUs of a node (the
    ring's exchanges stay on its links) and the job's GPUs, the sequence into 2·cp chunks."""
    if not sequence:
        return []
    return [cp for cp in range(2, per_node + 1)
            if per_node % cp == 0 and gpus % cp == 0 and sequence % (2 * cp) == 0]
