"""The optimizer step on the CPU, as FSDP2's CPU offload runs it: bytes of parameters,
gradients and optimizer state one thread steps per second, against the rates the planner
times offloaded rows with (``memcalc.strategies.state_offload.CPU_STEP_BYTES_PER_S``).

torch's optimizers on CPU tensors take their single-tensor loop by default (foreach is the
default on CUDA only); torchrun sets ``OMP_NUM_THREADS=1`` when it starts more than one process
per node, so each rank steps its shard on one thread. The shard here is a transformer block's
worth of matrices, fp32, with gradients set. Median of the timed steps after two that create
the state. Writes benchmarks/results-cpu-optimizer.md.

    python -m benchmarks.cpu_optimizer
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from benchmarks.results import publish
from memcalc.strategies.state_offload import CPU_STEP_BYTES_PER_S

RESULTS = Path(__file__).with_name("results-cpu-optimizer.md")
SHAPES = [(2048, 2048)] * 4 + [(5504, 2048)] * 3          # one LLaMA block of 2048 wide
BLOCKS = 2
WARM, TIMED = 3, 10
IMPLEMENTATIONS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True},
                   "fused": {"fused": True}}
OPTIMIZERS = {
    "adamw": (lambda params, how: torch.optim.AdamW(params, lr=1e-4, **how), 2),
    "sgd-momentum": (lambda params, how: torch.optim.SGD(params, lr=1e-4, momentum=0.9, **how),
                     1),
}
"""name: (factory, optimizer states per parameter)."""


def stepped_bytes_per_s(make, states: int, threads: int) -> tuple[float, int]:
    """Bytes of parameters, gradients and states stepped per second, and those bytes."""
    torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES * BLOCKS]
    for param in params:
        param.grad = torch.randn_like(param)
    optimizer = make(params)
    seconds = []
    for step in range(WARM + TIMED):
        start = time.perf_counter()
        optimizer.step()
        if step >= WARM:
            seconds.append(time.perf_counter() - start)
    nbytes = sum(p.numel() * p.element_size() for p in params) * (2 + states)
    return nbytes / statistics.median(seconds), nbytes


def main() -> None:
    load = os.getloadavg()
    rows = ["| optimizer | implementation | threads | bytes stepped | GB/s (10⁹) | "
            "planner's GB/s (1 thread) |", "|---|---|---:|---:|---:|---:|"]
    for name, (make, states) in OPTIMIZERS.items():
        for implementation, how in IMPLEMENTATIONS.items():
            planned = CPU_STEP_BYTES_PER_S.get((name, implementation))
            for threads in (1, 2):
                try:
                    rate, nbytes = stepped_bytes_per_s(
                        lambda params: make(params, how), states, threads)
                except RuntimeError as error:     # an implementation this torch lacks on CPU
                    rows.append(f"| {name} | {implementation} | {threads} | - | not run: "
                                f"{str(error)[:60]} | - |")
                    continue
                rows.append(f"| {name} | {implementation} | {threads} | "
                            f"{nbytes / 2**30:.2f} GiB | {rate / 1e9:.2f} | "
                            f"{planned / 1e9 if planned else '-'} |")
    publish(RESULTS, "The optimizer step on the CPU (FSDP2 CPU offload)", [
        f"Measured {datetime.date.today()} on {platform.machine()} ({platform.processor() or 'cpu'}), "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, load average {load[0]:.2f} at the "
        f"start. Regenerate with `python -m benchmarks.cpu_optimizer`.", "",
        f"{BLOCKS} LLaMA blocks of 2048 wide ({sum(a * b for a, b in SHAPES) * BLOCKS / 1e6:.0f} M "
        "fp32 parameters, gradients set), median of "
        f"{TIMED} steps after {WARM}; bytes stepped = parameters + gradients + optimizer state. "
        "The planner times offloaded rows at the one-thread rates (torchrun's "
        "OMP_NUM_THREADS=1); torch's default on CPU tensors is the for-loop.", "",
        *rows])


if __name__ == "__main__":
    main()
