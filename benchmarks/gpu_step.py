"""One real training step on a CUDA GPU, the step memcalc traces, and what it held.

``measure_step`` runs two iterations from a fresh model and optimizer and reads the
caching allocator's peaks and NVML's bytes for this process; ``record_step`` runs the same
two iterations again with every convolution recorded (``ConvRecorder``) and the allocator's
own history on; ``time_step`` times further iterations with CUDA events.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import threading
import time

import torch

from benchmarks.gpu_cases import GpuCase
from memcalc._torch_internals import start_cuda_allocation_history, stop_cuda_allocation_history
from memcalc.calibration import nvml
from memcalc.calibration.conv_recorder import FRAME_OF_KIND, ConvRecorder
from memcalc.losses import compute_loss, make_target, primary_output
from memcalc.optimizers import optimizer_rule
from memcalc.specs import LossKind
from models_zoo import ZOO

_AUTOCAST = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


class CudaStep:
    """The traced step on real CUDA tensors: autocast when mixed (GradScaler for fp16),
    cross-entropy, backward, Adam (foreach), ``zero_grad(set_to_none=True)``."""

    def __init__(self, case: GpuCase) -> None:
        torch.backends.cudnn.benchmark = case.benchmark
        torch.backends.cudnn.allow_tf32 = case.tf32
        torch.manual_seed(0)
        entry = ZOO[case.model]
        self.token_ids = entry.input_dtype.startswith("int")
        # Built on the CPU, then moved: parameters arrive one by one as the trace has them.
        self.model = entry.build(**case.model_args).to("cuda").train()
        shape = (case.batch_size, *case.sample_shape)
        self.batch = (torch.randint(0, 100, shape, device="cuda") if self.token_ids
                      else torch.randn(shape, device="cuda"))
        self.optimizer = optimizer_rule("adam").build(self.model.parameters(), True)
        self.dtype = _AUTOCAST[case.precision]
        # A scale that does not overflow fp16 gradients: with the default 65536 the first
        # steps are skipped and Adam's state never appears, unlike every later step.
        self.scaler = (torch.amp.GradScaler("cuda", init_scale=1.0)
                       if self.dtype is torch.float16 else None)
        self.target = None
        self.skipped_steps = 0

    def __call__(self) -> None:
        autocast = (torch.autocast("cuda", dtype=self.dtype) if self.dtype
                    else contextlib.nullcontext())
        with autocast:
            output = primary_output(self.model(self.batch))
            if self.target is None:
                with torch.device("cuda"):
                    self.target = make_target(LossKind.CROSS_ENTROPY, output, self.token_ids)
            loss = compute_loss(LossKind.CROSS_ENTROPY, output, self.target, self.token_ids)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.skipped_steps += self.scaler.get_scale() < scale
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _fresh_allocator() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


class _NvmlSampler:
    """Largest NVML process figure seen while the step runs (every ~1 ms)."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, nvml.process_used_bytes() or 0)
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure_step(case: GpuCase) -> dict:
    """Peaks of two iterations from a fresh model, optimizer and allocator cache."""
    _fresh_allocator()
    step = CudaStep(case)
    result = {"case": case.__dict__ | {"sample_shape": list(case.sample_shape)},
              "name": case.name, "iterations": []}
    with _NvmlSampler() as sampler:
        for _ in range(2):
            step()
            torch.cuda.synchronize()
            result["iterations"].append({"max_allocated_bytes": torch.cuda.max_memory_allocated(),
                                         "max_reserved_bytes": torch.cuda.max_memory_reserved()})
    stats = torch.cuda.memory_stats()
    result.update(
        max_allocated_bytes=torch.cuda.max_memory_allocated(),
        max_reserved_bytes=torch.cuda.max_memory_reserved(),
        allocated_after_bytes=torch.cuda.memory_allocated(),
        reserved_after_bytes=torch.cuda.memory_reserved(),
        nvml_process_after_bytes=nvml.process_used_bytes(),
        nvml_device_after_bytes=nvml.device_used_bytes(),
        nvml_sampled_peak_bytes=sampler.peak,
        alloc_retries=stats.get("num_alloc_retries", 0),
        skipped_optimizer_steps=step.skipped_steps,
        segments_allocated=stats.get("segment.all.allocated", 0),
    )
    del step
    return result


def record_step(case: GpuCase) -> dict:
    """The same two iterations with every cuDNN call measured and the allocator's history."""
    _fresh_allocator()
    step = CudaStep(case)
    recorder = ConvRecorder()
    start_cuda_allocation_history()
    try:
        with recorder:
            for iteration in (1, 2):
                recorder.iteration = iteration
                step()
        torch.cuda.synchronize()
    finally:
        trace = stop_cuda_allocation_history()
    del step
    return {"name": case.name, "convs": [record.model_dump(mode="json") for record in recorder.records],
            "trace": compact_trace(trace)}


_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "segment_map", "segment_unmap", "oom")
_KIND_OF_FRAME = {frame: kind.value for kind, frame in FRAME_OF_KIND.items()}


def compact_trace(trace: list[dict]) -> list[list]:
    """[action, size, address, cuDNN call kind or ''] per allocator event."""
    rows = []
    for entry in trace:
        action = entry.get("action")
        if action not in _ACTIONS:
            continue
        kind = next((_KIND_OF_FRAME[frame.get("name")] for frame in entry.get("frames", ())
                     if frame.get("name") in _KIND_OF_FRAME), "")
        rows.append([action, int(entry.get("size", 0)), int(entry.get("addr", 0)), kind])
    return rows


def time_step(case: GpuCase, warmup: int = 3, iterations: int = 10) -> dict:
    """Median and spread of step time (CUDA events) after warm-up."""
    _fresh_allocator()
    step = CudaStep(case)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del step
    return {"name": case.name, "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times)}
