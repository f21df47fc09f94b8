"""How candidates are ranked, and whether one not yet built could change the plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from memcalc.strategies.specs import Strategy

if TYPE_CHECKING:
    from memcalc.strategies.report import Candidate
    from memcalc.strategies.specs import ClusterSpec

TIE_SHARE = 0.01
"""Throughputs on the same rung of a 1 % geometric ladder are a tie (the step-time model is
not finer than that): the simpler strategy goes first."""
LAYOUT_STEPS = {Strategy.DDP: 1, Strategy.ZERO1: 2, Strategy.ZERO2: 3, Strategy.FSDP: 4,
                Strategy.FSDP_OFFLOAD: 4, Strategy.DATA_PARALLEL: 5, Strategy.PIPELINE: 5,
                Strategy.SPATIAL: 6}
"""How far a layout is from one GPU's plain step (DDP the plainest; ZeRO and FSDP shard
more, and FSDP's CPU offload one more through its "offload" lever; legacy DataParallel,
pipelines and spatial splits ask most of the training script)."""
LEVERS = ("mixed-precision", "checkpointing", "offload", "compile", "accumulation",
          "context-parallel")


def rank_key(candidate: Candidate, cluster: ClusterSpec) -> tuple:
    """Fitting first; on the GPUs given, fastest first (a tie to the simpler); beyond them,
    fewest GPUs first."""
    return _key(candidate.fits, candidate.gpus, candidate.samples_per_s, cluster,
                simplicity(candidate))


def simplicity(candidate: Candidate) -> int:
    """The layout's steps from one GPU plus one per lever in the label (0: one GPU, plain)."""
    return (LAYOUT_STEPS.get(candidate.strategy, 0)
            + sum(lever in candidate.label for lever in LEVERS))


def speed_rung(samples_per_s: float) -> float:
    """The rung of the 1 % ladder ``samples_per_s`` stands on (equal rungs: a tie)."""
    return math.floor(math.log(samples_per_s) / math.log1p(TIE_SHARE)) if samples_per_s > 0 \
        else -math.inf


def _key(fits: bool, gpus: int, samples_per_s: float, cluster: ClusterSpec,
         simplest: int = 0) -> tuple:
    """``simplest`` 0 (the default) makes the best key any candidate of that speed can have."""
    beyond = gpus > cluster.gpus
    return (not fits, beyond, gpus if beyond else 0, -speed_rung(samples_per_s), simplest,
            -samples_per_s)


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
