"""The pipeline row's microbatch search (``memcalc.strategies.rank_pipeline``), against ranks
whose peak grows by a known number of bytes per sample of a microbatch (and ones whose peak
does not): which microbatches it traces, in which order, and the largest that fits; and how
many microbatches a row's rank is traced with."""

from types import SimpleNamespace

import pytest

from memcalc.distributed.specs import ParallelSpec
from memcalc.strategies.rank_pipeline import (PIPELINE_TRIES, TRACED_PER_STAGE,
                                              row_microbatches, searched_microbatch,
                                              traced_microbatches)


USABLE = 1000


def _rank(fixed: int, per_sample: int, failing: tuple[int, ...] = ()):
    """A rank whose peak grows by ``per_sample`` bytes per sample of a microbatch: it fits
    up to ``(USABLE - fixed) // per_sample``; a trace at a ``failing`` microbatch fails."""
    asked: list[int] = []

    def peak_of(micro: int) -> int | None:
        asked.append(micro)
        return None if micro in failing else fixed + per_sample * micro
    return peak_of, asked


@pytest.mark.parametrize(("first", "job", "fixed", "per_sample", "expected", "traced"), [
    (15, 2, 600, 10, 15, [15, 2]),    # the first fits: the job's batch only for its figure
    (37, None, 600, 50, 8, [37, 18, 8]),  # 4x off: half, then the line through both, exact
    (16, 2, 0, 200, 5, [16, 2, 5]),   # the job's fits below: the line through the two
    (8, 32, 600, 10, 32, [8, 32]),    # a larger job's batch that fits is the row's
    (8, 32, 600, 20, 8, [8, 32]),     # a larger job's that does not: not grown past the first
    (8, 8, 0, 300, 3, [8, 4, 3]),     # the job's batch is the first: traced once
])
def test_the_row_takes_the_largest_traced_microbatch_that_fits(first, job, fixed, per_sample,
                                                               expected, traced):
    peak_of, asked = _rank(fixed, per_sample)
    assert searched_microbatch(first, job, peak_of, USABLE) == expected
    assert fixed + per_sample * expected <= USABLE              # the row fits
    assert asked == traced
    assert len(set(asked)) == len(asked)                       # nothing traced twice


def test_where_the_line_leaves_no_microbatch_that_fits_one_of_1_is_traced_last():
    peak_of, asked = _rank(USABLE + 1, 10)                      # not even a microbatch of 1
    assert searched_microbatch(64, None, peak_of, USABLE) == 0
    assert asked == [64, 32, 1]
    peak_of, asked = _rank(USABLE - 15, 10)                     # 1 fits, 2 does not
    assert searched_microbatch(64, None, peak_of, USABLE) == 1
    assert asked == [64, 32, 1]


def test_the_search_stops_after_its_tries_the_last_at_a_microbatch_of_1():
    peak_of, asked = _rank(USABLE + 1, 0)       # flat: no line, halvings only
    assert searched_microbatch(64, None, peak_of, USABLE) == 0
    assert asked == [64 >> step for step in range(PIPELINE_TRIES - 1)] + [1]


def test_a_guess_that_does_not_fit_is_not_the_row():
    calls: list[int] = []

    def peak_of(micro: int) -> int:     # below 10, more than the line through 10 and 20 says
        calls.append(micro)
        return 900 + 20 * micro if micro >= 10 else 1200
    assert searched_microbatch(20, None, peak_of, USABLE) == 0
    assert calls == [20, 10, 5, 1]


def test_a_rank_whose_total_is_not_affine_is_still_found_to_fit():
    # as on LLaMA 7B over 2 GPUs (mixed precision, checkpointing, 4 microbatches): the
    # closed form's microbatch 4x too large, and the allocator's reserve making the totals
    # below 10 higher than the line through the larger ones (7: 79.1 GiB, 4: 73.7, 1: 74.8)
    calls: list[int] = []

    def peak_of(micro: int) -> int:
        calls.append(micro)
        gib = 60 + 2 * micro if micro >= 10 else (79 if micro > 4 else 74.8)
        return int(gib * 2**30)
    assert searched_microbatch(37, None, peak_of, 76 * 2**30) == 1
    assert calls == [37, 18, 8, 1]


def _screened(closed_form_steps: int):
    return SimpleNamespace(candidate=SimpleNamespace(accumulation_steps=closed_form_steps))


@pytest.mark.parametrize(("schedule", "gpus", "steps", "global_batch", "runs", "traced"), [
    ("1f1b", 4, 8, None, 8, 8),              # the closed form's two per stage, all traced
    ("1f1b", 4, 1, None, 4, 4),              # never fewer than one per stage
    ("1f1b", 4, 8, 40, 20, 8),               # 40 samples of 2: 20, traced up to two per stage
    ("gpipe", 2, 1, None, 2, 2),             # GPipe's two
    ("interleaved-1f1b", 2, 4, None, 4, 4),  # two stages per rank: one per stage
])
def test_a_pipeline_rank_is_traced_with_the_microbatches_its_row_runs(
        schedule, gpus, steps, global_batch, runs, traced):
    parallel = ParallelSpec(strategy="pipeline", gpus_per_node=gpus, pp_schedule=schedule,
                            microbatch_size=2)
    count = row_microbatches(parallel, _screened(steps), 2, global_batch)
    assert count == runs
    assert traced_microbatches(parallel, count) == traced
    assert traced <= max(2, TRACED_PER_STAGE * parallel.stages)
