"""Python's cyclic garbage collector, run less often while a step is traced (and while an
estimate makes its model and plans its batch, ``memcalc.pipeline``; not while it measures
the host side, whose worker processes would inherit the threshold).

A trace makes and drops tens of thousands of container objects (fake tensors and their
metadata, autograd nodes, pytree specs). At CPython's default thresholds (700, 10, 10) a
ResNet-50 estimate ran about 690 young and 5 full collections, each full one walking every
object of the process (about 340,000 once torch is imported): 0.67 s of a 5.4 s estimate.
While a step is traced the youngest generation's threshold is ``TRACE_THRESHOLD`` (about
seven collections in that estimate, none of them full; its peak RSS the same within 2 %),
and afterwards it is what it was: a caller's own thresholds are kept, and a threshold of 0
(automatic collection off) or one above ours is left alone.

Known limitations: the threshold is the process's; a thread of the caller's that allocates
while a trace runs is collected as rarely.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

TRACE_THRESHOLD = 50_000
"""Allocations (net of deallocations) of container objects between young collections."""


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The young generation's threshold raised to ``TRACE_THRESHOLD`` for the block."""
    before = gc.get_threshold()
    if before[0] == 0 or before[0] >= TRACE_THRESHOLD:
        yield
        return
    gc.set_threshold(TRACE_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
