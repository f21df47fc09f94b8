import signal

import pytest
import torch

# A terminal's Ctrl-C, also when the suite starts where SIGINT is ignored (a shell's background
# job): the tests that interrupt memcalc, here and in the processes they start, need it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _single_thread():
    # CPU truth runs allocate the same on 1 or 2 threads; one keeps the timings stable.
    torch.set_num_threads(1)
