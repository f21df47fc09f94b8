import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    # CPU truth runs allocate the same on 1 or 2 threads; one keeps the timings stable.
    torch.set_num_threads(1)
