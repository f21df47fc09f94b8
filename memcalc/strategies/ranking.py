"""How candidates are ranked, and whether one not yet built could change the plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.specs import ClusterSpec


def rank_key(candidate: Candidate, cluster: ClusterSpec) -> tuple:
    """Fitting first; on the GPUs given, fastest first; beyond them, fewest GPUs first."""
    return _key(candidate.fits, candidate.gpus, candidate.samples_per_s, cluster)


def _key(fits: bool, gpus: int, samples_per_s: float, cluster: ClusterSpec) -> tuple:
    beyond = gpus > cluster.gpus
    return (not fits, beyond, gpus if beyond else 0, -samples_per_s)


def samples_per_gpu(candidate: Candidate) -> float:
    """Samples/s per GPU (what a GPU-hour buys)."""
    return candidate.samples_per_s / candidate.gpus


def standing_in_the_way(gpus: int, samples_ceiling: float, fitting: list[Candidate],
                        cluster: ClusterSpec) -> Candidate | None:
    """A candidate that fits and that one on at least ``gpus`` GPUs at most ``samples_ceiling``
    samples/s can never change the plan past: it ranks strictly above the best such a
    candidate could be, and some fitting candidate buys strictly more samples per GPU, so the
    newcomer is neither recommended nor the cheaper-per-GPU-hour hint. None when there is none.
    A candidate on more GPUs ranks no higher (more GPUs: no better key) and per GPU no faster
    (the ceiling grows with the GPUs)."""
    if not fitting:
        return None
    leader = min(fitting, key=lambda c: rank_key(c, cluster))
    thriftiest = max(fitting, key=samples_per_gpu)
    if (rank_key(leader, cluster) < _key(True, gpus, samples_ceiling, cluster)
            and samples_per_gpu(thriftiest) > samples_ceiling / gpus):
        return leader
    return None
