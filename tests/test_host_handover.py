"""Taking batches from a real one-worker DataLoader: idle worker, then a building one."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from memcalc.host.handover import time_handover

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


def test_both_takes_are_timed_and_neither_waits_for_a_build():
    batches = iter(DataLoader(_Slow(64), batch_size=2, num_workers=1, prefetch_factor=2))
    next(batches)
    timed = time_handover(batches, wait_s=3 * 2 * SAMPLE_S + 0.01, rounds=3,
                          building_s=SAMPLE_S / 2)
    # both batches were ready: taking them costs far less than building one (20 ms)
    assert 0 < timed.receive_s < 2 * SAMPLE_S
    assert 0 < timed.busy_receive_s < 2 * SAMPLE_S
    del batches


def test_the_end_of_the_dataset_stops_the_timing():
    batches = iter(DataLoader(_Slow(4), batch_size=2, num_workers=1))
    next(batches)
    with pytest.raises(StopIteration):
        time_handover(batches, wait_s=0.05, rounds=3, building_s=0.005)
    del batches
