"""The spatial search over every base at once, fewest GPUs per sample first.

Each base's slabs are traced on its part counts in turn (``memcalc.strategies.spatial``):
it stops at the first that fits (or that host RAM holds back), else keeps the last. The
bases take turns by their next part count, then by their ceiling on samples/s, so slabs on
few GPUs are traced first. With ``prune``, before a slab is traced the search asks whether
any candidate its base could still give can change the plan: when a fitting candidate ranks
strictly above its best possible one and another fitting one buys strictly more samples per
GPU (``memcalc.strategies.ranking``), the base is not traced further and a note says so. The
recommendation and every candidate that is built are then those of the search without
``prune``; only the skipped bases' rows are missing, named in the notes.

While one slab is traced, the next ones in turn are asked for ahead (``estimator.prefetch``,
made by workers that are free): they may then be skipped after all, which costs a worker's
traces but never changes what is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.strategies.ranking import standing_in_the_way
from memcalc.strategies.spatial import (
    SlabOutcome,
    counts_to_trace,
    gpus_for,
    samples_ceiling,
    slab_outcome,
    slab_spec,
)

if TYPE_CHECKING:
    from memcalc.strategies.candidates import PlanContext, Sized
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.rules import DerivedRule
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.variants import TracedVariant

SKIPPED = "not traced"
"""Opens the note of a base the spatial search skipped."""


@dataclass
class _BaseSearch:
    """One base's walk over its part counts."""

    order: int
    base: TracedVariant
    states: ModelStates
    counts: list[int]
    traced: int = 0
    outcome: SlabOutcome | None = None
    skipped: str | None = None

    @property
    def parts(self) -> int:
        """The next part count to trace."""
        return self.counts[self.traced]

    @property
    def going(self) -> bool:
        return (self.skipped is None and self.traced < len(self.counts)
                and not (self.outcome and self.outcome.final))

    def sized(self) -> Sized:
        if self.skipped is not None or self.outcome is None:
            return None, None
        return self.outcome.candidate, self.outcome.failure


def search_spatial(rule: DerivedRule, bases: list[tuple[TracedVariant, ModelStates]],
                   context: PlanContext, known: list[Candidate],
                   prune: bool = True) -> tuple[list[Sized], list[str]]:
    """``rule``'s candidate (or why none) for every base, in the order given, and a note for
    every base skipped; ``known``: the candidates built so far (the skipping compares with
    those that fit)."""
    searches = [_BaseSearch(order, base, states, counts_to_trace(rule, base, context))
                for order, (base, states) in enumerate(bases)]
    fitting = [c for c in known if c.fits]
    prune = prune and context.cluster.strategy is None
    while going := sorted((s for s in searches if s.going), key=lambda s: _turn(s, context)):
        search = going[0]
        if prune and _skip(search, fitting, rule, context):
            continue
        ahead = [s for s in going if not (prune and _in_the_way(s, fitting, context))]
        context.estimator.prefetch([slab_spec(s.base, s.parts) for s in ahead], sure=False)
        search.outcome = slab_outcome(rule, search.base, search.parts, search.states, context)
        search.traced += 1
        candidate = search.outcome.candidate
        if search.outcome.final and candidate is not None and candidate.fits:
            fitting.append(candidate)
    return [s.sized() for s in searches], [s.skipped for s in searches if s.skipped]


def _turn(search: _BaseSearch, context: PlanContext) -> tuple:
    gpus = gpus_for(search.parts, context.cluster)
    return search.parts, -samples_ceiling(search.base, gpus, context), search.order


def _in_the_way(search: _BaseSearch, fitting: list[Candidate],
                context: PlanContext) -> Candidate | None:
    gpus = gpus_for(search.parts, context.cluster)
    return standing_in_the_way(gpus, samples_ceiling(search.base, gpus, context), fitting,
                               context.cluster)


def _skip(search: _BaseSearch, fitting: list[Candidate], rule: DerivedRule,
          context: PlanContext) -> bool:
    """Skip ``search`` (with its note) when a fitting candidate stands in its way."""
    leader = _in_the_way(search, fitting, context)
    if leader is None:
        return False
    gpus = gpus_for(search.parts, context.cluster)
    ceiling = samples_ceiling(search.base, gpus, context)
    name = rule.name(search.base.spec.with_changes(spatial_parts=search.parts))
    label = name if search.base.rule.as_given else f"{name} + {search.base.label}"
    before = (f" after ×{', ×'.join(str(c) for c in search.counts[:search.traced])} did not "
              "fit" if search.traced else "")
    search.skipped = (
        f"{SKIPPED}: {label} and more GPUs per sample{before}: on {gpus} GPUs it would reach "
        f"at most {ceiling:,.3g} samples/s (its base's FLOPs per sample split evenly at the "
        f"card's peak), so it cannot rank above {leader.label} ({leader.gpus} GPUs, "
        f"{leader.samples_per_s:,.3g} samples/s, fits) nor beat the best samples per GPU")
    return True
