"""Taking batches from real DataLoaders: from idle workers, back to back, and from a worker
building its next batch."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from memcalc.host.handover import busy_receive_s, idle_receive_s

SAMPLE_S = 0.01


class _Slow(Dataset):
    """Each sample waits SAMPLE_S without the GIL, then is a small tensor."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        time.sleep(SAMPLE_S)
        return torch.full((4,), float(index))


@pytest.mark.parametrize("workers", [1, 2])
def test_idle_takes_wait_for_no_build(workers):
    # a batch takes 20 ms to build; taking a ready one costs far less
    receive = idle_receive_s(_Slow(64), 2, workers, 2 * SAMPLE_S, rounds=4)
    assert 0 < receive < SAMPLE_S


def test_a_dataset_too_small_for_the_idle_takes_is_not_timed():
    assert idle_receive_s(_Slow(11), 2, 1, 2 * SAMPLE_S, rounds=4) is None


def test_a_busy_take_waits_for_no_build():
    batches = iter(DataLoader(_Slow(64), batch_size=2, num_workers=1, prefetch_factor=2))
    next(batches)
    busy = busy_receive_s(batches, wait_s=3 * 2 * SAMPLE_S + 0.01, rounds=3,
                          building_s=SAMPLE_S / 2)
    # the batch was ready: taking it costs far less than building one (20 ms)
    assert 0 < busy < 2 * SAMPLE_S
    del batches


def test_the_end_of_the_dataset_stops_the_timing():
    batches = iter(DataLoader(_Slow(4), batch_size=2, num_workers=1))
    next(batches)
    with pytest.raises(StopIteration):
        busy_receive_s(batches, wait_s=0.05, rounds=3, building_s=0.005)
    del batches
