"""Feeding forecasts against real DataLoaders started as a training script starts them, with
no malloc variable set: the truth for the heap state the probe measures its worker in.

For each dataset written for it (``tests/fixtures/unseen_data.py``), three times: memcalc's
forecast (``estimate`` with the dataset and a step time: the probe, and again forked from a
training script's heap where the worker churns), then the truth in a fresh process that
first does what a training script does before its DataLoader starts (builds ResNet-50, runs
one AdamW step on a first batch, frees a CPU copy of its weights as ``model.to("cuda")``
does), then runs the real DataLoader at 0, 1 and 2 workers against a step that spins a core.
Prints the table and writes benchmarks/results-feed-heap.md. Run it on an idle machine.

    python -m benchmarks.feed_heap
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results import publish

RESULTS = Path(__file__).with_name("results-feed-heap.md")
CASES = {
    "uint16 slices (numpy decode + filters)": ("tests.fixtures.unseen_data:uint16_slices", 8, 0.06),
    "Pillow JPEG photos": ("tests.fixtures.unseen_data:pillow_photos", 16, 0.04),
    ".npy patches": ("tests.fixtures.unseen_data:npy_patches", 16, 0.02),
    "word pieces (pure Python)": ("tests.fixtures.unseen_data:word_pieces", 64, 0.03),
}
RUNS, WORKERS, BATCHES, LIMIT_POINTS = 3, (0, 1, 2), 30, 10


def forecast(reference: str, batch: int, step_s: float) -> tuple[dict[int, float], str]:
    """memcalc's GPU-busy share by worker count and the feeding head's busy text."""
    from memcalc.pipeline import estimate
    from memcalc.render.feed import busy_text
    from memcalc.specs import TrainingSpec

    spec = TrainingSpec(model="mlp", model_args={"in_features": 32, "hidden": 16, "depth": 1},
                        sample_shape=(32,), batch_size=batch, device="cpu",
                        loader={"dataset": reference, "probe_seconds": 8},
                        feed={"step_time_s": step_s}, machine={"cpus": 2, "ram_bytes": 16 << 30})
    throughput = estimate(spec).throughput
    rows = {row.num_workers: row.expected_gpu_utilization for row in throughput.by_workers}
    return rows, busy_text(throughput)


def truth(reference: str, batch: int, step_s: float) -> dict[int, float]:
    """The real loader, measured in a training-like process of its own."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.feed_heap", "--truth", reference,
                           str(batch), str(step_s)], capture_output=True, text=True, check=True)
    return {int(key): value for key, value in json.loads(done.stdout.splitlines()[-1]).items()}


def become_training_like():
    """Do in this process what a training script does before its DataLoader starts: build
    ResNet-50, run one AdamW step, free a CPU copy of its weights (as ``model.to("cuda")``
    does). Returns the model and optimizer, which the caller keeps alive as a script does."""
    import torch

    from models_zoo import resnet50

    torch.manual_seed(0)
    model = resnet50(num_classes=100)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 128, 128)).logsumexp(1).mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    moved = [tensor.clone() for tensor in model.state_dict().values()]   # "to the GPU"
    del moved
    return model, optimizer


def _training_like_truth(reference: str, batch: int, step_s: float) -> None:
    from memcalc.feed.check import measured_utilization
    from memcalc.model.user_code import load_dataset

    model, optimizer = become_training_like()  # alive while the loaders run, as in a script
    dataset = load_dataset(reference)
    dataset[0]
    busy = {workers: measured_utilization(dataset, batch, workers, step_s, BATCHES,
                                          consumer="spin").utilization
            for workers in WORKERS}
    print(json.dumps(busy))


def main() -> None:
    if any(key.startswith("MALLOC_") for key in os.environ):
        sys.exit("run it without MALLOC_ variables: the heap state is what it measures")
    lines = ["| dataset | run | head | " + " | ".join(
        f"{w} workers: forecast / real" for w in WORKERS) + " | largest difference |",
        "|---|---:|---|" + "---:|" * len(WORKERS) + "---:|"]
    within, total, started = 0, 0, time.perf_counter()
    for name, (reference, batch, step_s) in CASES.items():
        for run in range(1, RUNS + 1):
            predicted, head = forecast(reference, batch, step_s)
            real = truth(reference, batch, step_s)
            points = [100 * (predicted[w] - real[w]) for w in WORKERS]
            within += sum(abs(p) <= LIMIT_POINTS for p in points)
            total += len(points)
            cells = " | ".join(f"{predicted[w]:.0%} / {real[w]:.0%}" for w in WORKERS)
            lines.append(f"| {name} (batch {batch}, step {step_s * 1e3:g} ms) | {run} | "
                         f"{head} | {cells} | {max(points, key=abs):+.0f} points |")
            print(lines[-1], flush=True)
    lines += ["", f"{within} of {total} forecasts within {LIMIT_POINTS} points of the real "
              f"loader; {time.perf_counter() - started:.0f} s on {os.cpu_count()} cores, no "
              "MALLOC_ variable set. The real loaders ran in a process that had built "
              "ResNet-50, run one AdamW step and freed a CPU copy of its weights."]
    publish(RESULTS, "Feeding forecasts against loaders in a training-like process", lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--truth"]:
        _training_like_truth(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
