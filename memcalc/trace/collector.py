"""Python's cyclic garbage collector, without full collections while a step is traced (and
while an estimate makes its model and plans its batch, ``memcalc.pipeline``; not while it
measures the host side, whose worker processes would inherit the setting).

A trace makes and drops tens of thousands of container objects (fake tensors and their
metadata, autograd nodes, pytree specs). At CPython's default thresholds (700, 10, 10) a
ResNet-50 estimate ran about 690 young, 60 middle and 5 full collections; each full one walks
every object of the process (about 340,000 once torch is imported): 0.55 s of a 5.4 s
estimate, where the young and middle ones took 0.12 s. While a step is traced the full
generation's threshold is ``TRACE_THRESHOLD`` (one full collection in that estimate); the
young and middle generations are collected as often as in a training process, so a tensor
that a reference cycle holds dies when a real step would free it, unless it lived long enough
to reach the oldest generation (a real process frees those rarely too). Afterwards the
thresholds are what they were: a caller's own are kept, and automatic collection off
(threshold 0) or full collections rarer than ours are left alone.

Known limitations: the thresholds are the process's; a thread of the caller's that allocates
while a trace runs is fully collected as rarely.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

TRACE_THRESHOLD = 1_000
"""Middle-generation collections between full ones (CPython's default: 10)."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The oldest generation's threshold raised to ``TRACE_THRESHOLD`` for the block."""
    before = gc.get_threshold()
    if before[0] == 0 or before[2] >= TRACE_THRESHOLD:
        yield
        return
    gc.set_threshold(*before[:2], TRACE_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
