"""The largest batch that really trains on a card, against memcalc's planned largest batch.

Cards are emulated on one large GPU with ``torch.cuda.set_per_process_memory_fraction``: the
allocator may reserve the card's nvidia-smi total minus what the driver reserves and what
this process holds outside the allocator (context, libraries, measured after a batch-1 step).
A batch fits when two real iterations run without an out-of-memory error; the search starts
at memcalc's planned batch and walks up or down, then bisects, until a batch fits and the
next one up does not.
"""

from __future__ import annotations

import gc
import time

from tests.fixtures.gpu_cases import EMULATED_CARDS, LARGEST_BATCH_CASES, GpuCase
from tests.fixtures.gpu_data import spec_of

MAX_PROBES = 24


def predicted_largest() -> list[dict]:
    """memcalc's planned largest batch per case and card (no headroom: the bare limit)."""
    from memcalc.pipeline import estimate

    rows = []
    for model, shape, precision in LARGEST_BATCH_CASES:
        case = GpuCase(model, shape, 1, precision)
        for card, capacity in EMULATED_CARDS.items():
            spec = spec_of(case, batch_size=None, gpu_memory_bytes=capacity,
                           headroom_fraction=0.0)
            plan = estimate(spec).device.plan
            rows.append({"model": model, "sample_shape": list(shape), "precision": precision,
                         "card": card, "capacity_bytes": capacity,
                         "predicted": plan.max_batch_size if plan else 0})
    return rows


def _offsets(start: int):
    """Steps away from the planned batch: 1, 2, then 1 % of it doubling (a plan that is right
    costs two probes; one 5 % off about ten)."""
    yield 1
    yield 2
    step = max(2, start // 100)
    while True:
        yield 2 + step
        step *= 2


def largest_that_fits(fits, start: int) -> tuple[int, dict[int, bool]]:
    """Largest b with ``fits(b)`` (monotone), probing outwards from ``start`` and then
    bisecting; and every probe. Exact when b fits and b + 1 was probed and did not."""
    known: dict[int, bool] = {}

    def probe(batch: int) -> bool:
        if batch not in known:
            known[batch] = fits(batch)
        return known[batch]

    start = max(1, start)
    if probe(start):
        low = high = start
        for offset in _offsets(start):
            if len(known) >= MAX_PROBES:
                break
            if not probe(start + offset):
                high = start + offset
                break
            low = start + offset
    else:
        low, high = 0, start
        for offset in _offsets(start):
            if start - offset < 1 or len(known) >= MAX_PROBES:
                break
            if probe(start - offset):
                low = start - offset
                break
            high = start - offset
    while high - low > 1 and len(known) < MAX_PROBES:
        middle = (low + high) // 2
        low, high = (middle, high) if probe(middle) else (low, middle)
    return low, known


def bytes_outside_allocator(warm_step, before_context: int) -> int:
    """On the GPU, after ``warm_step()``: what this process holds outside the caching allocator
    (context, cuBLAS, cuDNN): NVML's bytes for it, or where NVML hides process ids its share
    of the device since ``before_context`` (read before it made a CUDA context), less the
    allocator's reserved bytes."""
    import torch

    from memcalc.calibration import nvml

    warm_step()
    process_bytes = nvml.process_used_bytes()
    if process_bytes is None:
        free, _ = torch.cuda.mem_get_info()
        process_bytes = nvml.device_total_bytes() - free - before_context
    return process_bytes - torch.cuda.memory_reserved()


def cap_allocator(capacity_bytes: int, outside: int) -> int:
    """Limit the caching allocator to what an emulated card (its nvidia-smi total) leaves it:
    less this GPU's driver reservation and ``outside``. Returns the bytes it may reserve."""
    import torch

    from memcalc.calibration import nvml

    total = torch.cuda.get_device_properties(0).total_memory
    allowed = capacity_bytes - (nvml.device_total_bytes() - total) - outside
    torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total))
    return allowed


def true_largest(rows: list[dict]) -> list[dict]:
    """On the GPU: the real largest batch for each predicted row (rows of one model case)."""
    from memcalc.calibration import nvml

    before_context = nvml.device_used_bytes()   # before this process makes a CUDA context
    import torch

    from tests.fixtures.gpu_step import CudaStep, _fresh_allocator

    def runs(case: GpuCase) -> tuple[bool, str]:
        step = None
        try:
            step = CudaStep(case)
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            return True, ""
        except (torch.OutOfMemoryError, RuntimeError) as error:
            return False, str(error).splitlines()[0][:120]
        finally:
            del step
            gc.collect()
            torch.cuda.empty_cache()

    first = rows[0]
    warm = GpuCase(first["model"], tuple(first["sample_shape"]), 1, first["precision"])
    outside = bytes_outside_allocator(lambda: runs(warm), before_context)
    results = []
    for row in rows:
        allowed = cap_allocator(row["capacity_bytes"], outside)
        _fresh_allocator()
        messages = {}

        def fits(batch: int) -> bool:
            started = time.time()
            ok, message = runs(GpuCase(row["model"], tuple(row["sample_shape"]), batch,
                                       row["precision"]))
            messages[batch] = message
            print(f"{row['model']} {row['precision']} {row['card']} b{batch}: "
                  f"{'fits' if ok else 'OOM'} ({time.time() - started:.1f} s)", flush=True)
            return ok

        largest, probes = largest_that_fits(fits, row["predicted"])
        results.append(row | {"true": largest, "exact": probes.get(largest + 1) is False,
                              "probes": {str(k): v for k, v in probes.items()},
                              "outside_bytes": outside, "allowed_reserved_bytes": allowed,
                              "failure": messages.get(largest + 1, "")})
    torch.cuda.set_per_process_memory_fraction(1.0)
    return results
