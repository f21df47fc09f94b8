"""How plan candidates are ranked: fitting first, fastest first, a tie to the simpler."""

import itertools
import random

from memcalc.strategies.ranking import (rank_key, simplicity, speed_rung,
                                        standing_in_the_way)
from memcalc.strategies.report import Candidate
from memcalc.strategies.specs import ClusterSpec, Strategy

EIGHT = ClusterSpec(gpus_per_node=8)


def candidate(strategy: Strategy, label: str, samples_per_s: float, *, gpus: int = 8,
              fits: bool = True) -> Candidate:
    return Candidate(strategy=strategy, label=label, gpus=gpus, method="traced rank",
                     per_gpu_peak_bytes=70 << 30, max_batch_size=1700, accumulation_steps=1,
                     global_batch_size=1700 * gpus, flops_per_step=1e15, compute_s=0.3,
                     communication_s=0.01, step_time_s=0.31, samples_per_s=samples_per_s,
                     fits=fits, notes=[])


def ranked(candidates: list[Candidate]) -> list[str]:
    return [c.label for c in sorted(candidates, key=lambda c: rank_key(c, EIGHT))]


def test_a_tie_goes_to_the_simpler_strategy():
    """ResNet-50 on 8 A100s: ZeRO-2, DDP and ZeRO-1 with mixed precision at the same 41,017
    samples/s (their steps differ by a few ms of optimizer work) ranked ZeRO-2 first."""
    zero2 = candidate(Strategy.ZERO2, "zero2 + mixed-precision", 41_017.4)
    ddp = candidate(Strategy.DDP, "ddp + mixed-precision", 41_017.1)
    zero1 = candidate(Strategy.ZERO1, "zero1 + mixed-precision", 41_017.3)
    legacy = candidate(Strategy.DATA_PARALLEL, "dataparallel + mixed-precision", 41_011.0)
    assert ranked([zero2, zero1, legacy, ddp])[:3] == [ddp.label, zero1.label, zero2.label]
    # 2 % faster is not a tie: speed first
    faster = candidate(Strategy.FSDP, "fsdp + mixed-precision", 41_017.1 * 1.02)
    assert ranked([ddp, faster]) == [faster.label, ddp.label]
    # fewer levers are simpler too; fitting still comes before anything else
    plain = candidate(Strategy.DDP, "ddp", 41_017.0)
    assert simplicity(plain) < simplicity(ddp) < simplicity(zero1)
    assert ranked([ddp, plain]) == [plain.label, ddp.label]
    assert ranked([candidate(Strategy.DDP, "ddp", 9e9, fits=False), zero2])[0] == zero2.label


def test_speed_rungs_are_one_percent_apart():
    assert speed_rung(1000.0) == speed_rung(1000.0 * 1.0001)
    assert speed_rung(1000.0 * 1.0101) > speed_rung(1000.0)
    assert speed_rung(0.0) < speed_rung(1e-9)


def test_a_candidate_that_cannot_change_the_plan_is_still_recognised_with_ties():
    """The spatial search skips a candidate when the leader ranks above the best key any
    candidate of at most ``ceiling`` samples/s could have: with the simplicity tie-break that
    bound must still be below every such candidate (here checked on random candidates)."""
    rng = random.Random(0)
    layouts = [(Strategy.DDP, "ddp"), (Strategy.ZERO1, "zero1 + mixed-precision"),
               (Strategy.SPATIAL, "spatial"), (Strategy.FSDP, "fsdp + checkpointing")]
    for _ in range(200):
        fitting = [candidate(*rng.choice(layouts), rng.uniform(900, 1100),
                             gpus=rng.choice([2, 4, 8])) for _ in range(3)]
        gpus, ceiling = rng.choice([2, 4, 8]), rng.uniform(900, 1100)
        leader = standing_in_the_way(gpus, ceiling, fitting, EIGHT)
        if leader is None:
            continue
        for (strategy, label), samples in itertools.product(layouts, [ceiling, ceiling * 0.999,
                                                                      ceiling * 0.5]):
            newcomer = candidate(strategy, label, samples, gpus=gpus)
            assert rank_key(leader, EIGHT) < rank_key(newcomer, EIGHT)
