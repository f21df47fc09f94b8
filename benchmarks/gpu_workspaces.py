"""cuDNN's per-call transients of the 3D ResNet at large batches, measured on a real GPU:
the data that checks the built-in workspace rules (fitted at batch 4) 8-60× further out,
and one capped step's allocator history.

    python -m benchmarks.gpu_workspaces --out DIR          (on a GPU: one process per case)
    python -m benchmarks.gpu_workspaces --store DIR        (DIR's cases into gpu_data/)

Each case is memcalc's step (``tests.fixtures.gpu_step``): two iterations measured, then two
recorded with every cuDNN call's transient (``ConvRecorder``) and the allocator's history.
A capped case first limits the caching allocator to what an emulated card leaves it
(``benchmarks.gpu_largest.cap_allocator``).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from tests.fixtures.gpu_data import DATA

MODEL, SHAPE = "resnet3d", (3, 16, 112, 112)
CASES = ([{"name": f"fp32-b{b}", "batch": b, "precision": "fp32"} for b in (16, 48, 96, 127)]
         + [{"name": f"bf16-b{b}", "batch": b, "precision": "bf16-mixed"} for b in (32, 128, 253)]
         + [{"name": "fp32-b115-24GB", "batch": 115, "precision": "fp32", "card": "24GB"}])
CASE_TIMEOUT_S = 120


def _warm(precision: str) -> None:
    """One step at batch 1, its memory given back: the libraries loaded, the cache empty."""
    import torch

    from tests.fixtures.gpu_cases import GpuCase
    from tests.fixtures.gpu_step import CudaStep

    step = CudaStep(GpuCase(MODEL, SHAPE, 1, precision))
    step()
    torch.cuda.synchronize()
    del step
    gc.collect()
    torch.cuda.empty_cache()


def _run_case(spec: dict, out: Path) -> None:
    """In a fresh process: one case, written to ``out/ws-NAME.json.gz``."""
    import torch

    from benchmarks.gpu_largest import bytes_outside_allocator, cap_allocator
    from tests.fixtures.gpu_cases import EMULATED_CARDS, GpuCase
    from tests.fixtures.gpu_step import measure_step, record_step
    from memcalc.calibration import environment, nvml

    before_context = nvml.device_used_bytes()   # before this process makes a CUDA context
    row = {"spec": spec, "versions": environment.versions()}
    if spec.get("card"):
        outside = bytes_outside_allocator(partial(_warm, spec["precision"]), before_context)
        row["allowed_reserved_bytes"] = cap_allocator(EMULATED_CARDS[spec["card"]], outside)
    case = GpuCase(MODEL, SHAPE, spec["batch"], spec["precision"])
    started = time.time()
    try:
        row["measured"] = measure_step(case)
        row["recorded"] = record_step(case)
    except (torch.OutOfMemoryError, RuntimeError) as error:
        row["error"] = str(error).splitlines()[0][:200]
    row["seconds"] = time.time() - started
    with gzip.open(out / f"ws-{spec['name']}.json.gz", "wt") as file:
        json.dump(row, file)
    print(spec["name"], "error" not in row, f"{row['seconds']:.1f} s", row.get("error", ""),
          flush=True)


def store(folder: Path, environment: dict | None = None, machine: str = "h200") -> Path:
    """The measured cases as ``gpu_data/<machine>-workspaces.json.gz``: each case's step
    peaks and cuDNN calls (the recording's second iteration); the allocator history only
    for capped cases. ``environment``: the GPU and versions, where the cases lack them."""
    cases, paths = {}, sorted(folder.glob("ws-*.json.gz"))
    for path in paths:
        row = json.loads(gzip.open(path, "rt").read())
        if "recorded" not in row:
            continue
        recorded = row["recorded"]
        cases[row["spec"]["name"]] = {
            "spec": row["spec"], "versions": row.get("versions", environment),
            "allowed_reserved_bytes": row.get("allowed_reserved_bytes"),
            "measured": {key: value for key, value in row["measured"].items()
                         if key.endswith("_bytes") or key == "alloc_retries"},
            "convs": [conv for conv in recorded["convs"] if conv["iteration"] == 2],
            "trace": recorded["trace"] if row["spec"].get("card") else None}
    target = DATA / f"{machine}-workspaces.json.gz"
    with gzip.open(target, "wt") as file:
        measured = max((path.stat().st_mtime for path in paths), default=time.time())
        json.dump({"command": "python -m benchmarks.gpu_workspaces --out DIR",
                   "measured": time.strftime("%Y-%m-%d", time.gmtime(measured)),
                   "cases": cases}, file)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--environment", type=json.loads, default=None,
                        help="JSON: the GPU and versions, for cases measured without them")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        _run_case(json.loads(args.case), args.out)
    elif args.store:
        print(store(args.store, args.environment))
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        for spec in CASES:
            try:
                subprocess.run([sys.executable, "-m", "benchmarks.gpu_workspaces", "--out",
                                str(args.out), "--case", json.dumps(spec)],
                               timeout=CASE_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                print(spec["name"], "timed out", flush=True)


if __name__ == "__main__":
    main()
