"""The stream each allocation of a traced step is made on.

CUDA's caching allocator keeps its cached blocks per stream: a block freed by work on one
stream serves only requests of that stream again, so code that allocates on side streams
holds segments of its own beside the default stream's. FSDP2 does: its all-gather copy-in
buffers and its reduce-scatter outputs (the sharded gradients) are made on streams of its
own (measured on an H200: 6.4 GiB of an 8B Llama rank's 82.6 GiB reserved, in segments of
those two streams; ``benchmarks/gpu_data/h200-ranks.json``).

The trace runs on the CPU, where device-agnostic code enters the same stream contexts
through ``torch.cpu.stream``, which keeps the current stream as CUDA's does; each stream
met is numbered in order (0: the stream current when the trace began).

Known limitations: a tensor used on another stream than its own (``record_stream``) is not
held back until that stream's work ends; torch builds without ``torch.cpu.current_stream``
trace on one stream.
"""

from __future__ import annotations

import torch


class StreamNumbers:
    """A number for the current stream: 0 for the one current at the start, then 1, 2, … in
    the order streams are first met (the streams are held, so their numbers stay theirs)."""

    def __init__(self) -> None:
        self._current = getattr(getattr(torch, "cpu", None), "current_stream", None)
        self._default = self._current() if self._current is not None else None
        self._streams: list = []

    def current(self) -> int:
        if self._current is None:
            return 0
        stream = self._current()
        if stream is self._default:
            return 0
        for number, known in enumerate(self._streams, 1):
            if known is stream:
                return number
        self._streams.append(stream)
        return len(self._streams)
