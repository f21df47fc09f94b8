"""The pipeline row's microbatch search (``memcalc.strategies.rank_pipeline``), against a rank
whose microbatches fit up to a known size: which microbatches it traces, in which order, and
the largest that fits."""

from types import SimpleNamespace

import pytest

from memcalc.distributed.specs import ParallelSpec
from memcalc.strategies.rank_pipeline import (PIPELINE_TRIES, TRACED_PER_STAGE,
                                              row_microbatches, searched_microbatch,
                                              traced_microbatches)


def _rank_fitting_up_to(largest: int, failing: tuple[int, ...] = ()):
    asked: list[int] = []

    def fits(micro: int) -> bool | None:
        asked.append(micro)
        return None if micro in failing else micro <= largest
    return fits, asked


@pytest.mark.parametrize(("first", "job", "largest", "expected", "traced"), [
    (15, 2, 40, 15, [15, 2]),        # the first fits: the job's batch only for its figure
    (4, 2, 3, 2, [4, 2]),            # the job's fits below the first: no halving traced again
    (16, 2, 5, 4, [16, 2, 8, 4]),    # halvings above the job's that fits
    (8, 32, 40, 32, [8, 32]),        # a larger job's batch that fits is the row's
    (8, None, 3, 2, [8, 4, 2]),      # no job's batch: the halvings alone
    (8, 8, 3, 2, [8, 4, 2]),         # the job's batch is the first: traced once
])
def test_the_row_takes_the_largest_traced_microbatch_that_fits(first, job, largest, expected,
                                                               traced):
    fits, asked = _rank_fitting_up_to(largest)
    assert searched_microbatch(first, job, fits) == expected
    assert asked == traced
    assert len(set(asked)) == len(asked)                       # nothing traced twice


def test_the_halvings_stop_after_their_tries():
    fits, asked = _rank_fitting_up_to(1)
    assert searched_microbatch(64, None, fits) == 0
    assert asked == [64 >> step for step in range(PIPELINE_TRIES)]


def test_a_job_batch_that_does_not_fit_leaves_the_halvings_to_find_one():
    fits, asked = _rank_fitting_up_to(3)
    assert searched_microbatch(8, 6, fits) == 2
    assert asked == [8, 6, 4, 2]


def test_a_trial_that_fails_to_trace_is_neither_fitting_nor_a_floor():
    fits, asked = _rank_fitting_up_to(40, failing=(2,))
    assert searched_microbatch(16, 2, fits) == 16
    fits, asked = _rank_fitting_up_to(3, failing=(2,))
    # the job's trial failed: no floor; the halvings go on, and the failed one is not traced again
    assert searched_microbatch(8, 2, fits) == 0
    assert asked == [8, 2, 4]


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
