"""memcalc's rank of a multi-GPU job against the same rank run for real on an H200 (no GPU
needed to check).

The truth (``benchmarks/gpu_data/h200-ranks.json``, ``python -m benchmarks.gpu_ranks``):
rank 0 of 8- and 128-GPU jobs on one GPU in torch's fake process group, built as torchtitan
builds them with torch's own API (``tests.fixtures.gpu_rank_step``), the caching allocator's
peaks over two steps. Among them torchtitan's two published jobs, which the measurement
reproduces: torchtitan reports their reserved peaks on H100s.
"""

from __future__ import annotations

import pytest
import torch

from memcalc.pipeline import estimate
from tests.fixtures import gpu_data
from tests.fixtures.gpu_compare import replayed_peaks
from tests.fixtures.gpu_rank_cases import CASES
from tests.fixtures.published_distributed import PUBLISHED_RANKS

ROWS = {row["name"]: row for row in gpu_data.ranks()["rows"]}
SIDE_STREAMS = {name for name, case in CASES.items()
                if case.spec.parallel.strategy.value in ("fsdp", "zero2")
                and case.world > case.spec.parallel.tp}


def test_every_case_was_measured_with_its_hardware_and_versions():
    stored = gpu_data.ranks()
    assert stored["environment"]["versions"]["gpu"] == "NVIDIA H200"
    assert {"torch", "cuda", "driver"} <= set(stored["environment"]["versions"])
    assert set(ROWS) == set(CASES) and not any("error" in row for row in ROWS.values())
    assert all(row["alloc_retries"] == 0 for row in ROWS.values())   # nothing near capacity


@pytest.mark.parametrize("published", PUBLISHED_RANKS, ids=lambda rank: rank.name)
def test_the_measured_ranks_reproduce_torchtitans_published_ones(published):
    # the harness against an independent run: torchtitan's own loop on 8 / 128 H100s
    world = published.spec.parallel.gpus_per_node * published.spec.parallel.nodes
    row = next(ROWS[name] for name in ROWS if "torchtitan" in name and ROWS[name]["world"] == world)
    assert row["max_reserved_bytes"] == pytest.approx(published.reserved_bytes, rel=0.015)


def test_the_allocator_model_replays_real_multi_stream_histories():
    traces = gpu_data.rank_traces()
    assert set(traces) == set(CASES)
    for name, stored in traces.items():
        modelled, real = replayed_peaks(stored["trace"], streams=True)
        assert modelled == pytest.approx(real, rel=0.01), name
        # FSDP2 keeps segments on its all-gather and reduce-scatter streams: one pool for
        # every stream would miss them
        one_pool, _ = replayed_peaks(stored["trace"])
        assert (one_pool < 0.97 * real) == (name in SIDE_STREAMS), name
        assert (len({segment[0] for segment in stored["segments"]}) > 1) == (name in SIDE_STREAMS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_traced_rank_meets_the_rank_measured_on_the_gpu(name):
    row = ROWS[name]
    device = estimate(CASES[name].spec, card_fits=False).device
    assert device.peak_allocated_bytes == pytest.approx(row["max_allocated_bytes"], rel=0.01)
    assert device.peak_reserved_bytes == pytest.approx(row["max_reserved_bytes"], rel=0.015)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_measured_rank_agrees_with_the_traced_one():
    from tests.fixtures.gpu_rank_step import measure_rank

    case = CASES["llama3-1b zero2 bf16 full b4"]
    row = measure_rank(case)
    device = estimate(case.spec, card_fits=False).device
    assert device.peak_allocated_bytes == pytest.approx(row["max_allocated_bytes"], rel=0.02)
    assert device.peak_reserved_bytes == pytest.approx(row["max_reserved_bytes"], rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("row", gpu_data.ranks()["largest"], ids=lambda row: row["name"])
def test_the_largest_local_batch_under_a_cap_is_never_above_the_truth(row):
    # the real rank ran `true` and ran out of memory one above, with the caching allocator
    # capped at `allowed_reserved_bytes`; memcalc, given the same cap, never fits one above,
    # and fits the truth or needs at most 1 % more than the cap for it
    from tests.fixtures.gpu_budget import runs_within_allocator_limit

    assert row["probes"][str(row["true"] + 1)] is False
    spec, budget = CASES[row["name"]].spec, row["allowed_reserved_bytes"]
    verdicts = runs_within_allocator_limit(spec, [row["true"], row["true"] + 1], budget)
    assert not verdicts[row["true"] + 1]
    if not verdicts[row["true"]]:
        assert runs_within_allocator_limit(spec, [row["true"]], int(budget * 1.01))[row["true"]]
