"""Measure one rank of each multi-GPU job in ``tests.fixtures.gpu_rank_cases`` on a real GPU.

    python -m benchmarks.gpu_ranks --out DIR [--only TEXT]
    python -m benchmarks.gpu_ranks --out DIR --tiny --device cpu     (try the runner)

Each case runs in a fresh process (the allocator's figures are per process) as rank 0 of its
job in torch's fake process group (``tests.fixtures.gpu_rank_step``), one at a time. Rows go
to ``DIR/ranks.jsonl`` as they finish, with the environment first;
``benchmarks/gpu_data/h200-ranks.json`` holds the H200 run.

    python -m benchmarks.gpu_ranks --out DIR --record     (the allocator's histories)
    python -m benchmarks.gpu_ranks --store DIR [DIR ...]  (into benchmarks/gpu_data/)
    python -m benchmarks.gpu_ranks --table     (memcalc against the stored rows: prints and
                                                 writes benchmarks/results-gpu-ranks.md)

``--record`` runs every case again with the allocator's history on, to
``DIR/histories.jsonl``: ``[action, size, address, stream]`` per event and the segments
left at the end; ``--store`` keeps the rows (a case measured again replaces the earlier
row) and the histories, gzipped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures.gpu_rank_cases import CASES, tiny

CHILD_TIMEOUT_S = 240
LARGEST_BUDGETS_GIB = {
    "llama3-8b fsdp8 bf16 selective b2 (torchtitan)": 60,
    "llama3-8b fsdp4 tp2 bf16 selective b2": 64,
    "llama3-8b tp8 fp32 selective b1": 40,
    "llama3-1b ddp8 bf16-mixed b2": 64,
    "llama3-1b zero2 bf16 full b4": 30,
    "llama3-1b fsdp8 fp32 b2 clip": 56,
    "llama3-8b fsdp8 bf16 selective b2 cpu-offload": 64,
}
"""``--largest``: the local batch searched for each case with the caching allocator capped at
this many GiB (``torch.cuda.set_per_process_memory_fraction``)."""
MAX_LARGEST_BATCH = 12


def _largest(case, budget_bytes: int, device: str) -> dict:
    """The largest local batch whose two steps run with the allocator capped at
    ``budget_bytes``: batches 1, 2, … until one runs out of memory."""
    import dataclasses
    import gc

    import torch
    import torch.distributed as dist

    from tests.fixtures.gpu_rank_step import measure_rank

    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(budget_bytes / total)
    probes, failure, largest = {}, "", 0
    for batch in range(1, MAX_LARGEST_BATCH + 1):
        spec = case.spec.model_copy(update={"batch_size": batch})
        try:
            measure_rank(dataclasses.replace(case, spec=spec), device)
            probes[str(batch)], largest = True, batch
        except torch.OutOfMemoryError as error:
            probes[str(batch)], failure = False, str(error).splitlines()[0][:160]
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"  b{batch}: {'runs' if probes[str(batch)] else 'out of memory'}", flush=True)
        if not probes[str(batch)]:
            break
    return {"name": case.name, "allowed_reserved_bytes": budget_bytes, "true": largest,
            "probes": probes, "failure": failure}


def _child(args: argparse.Namespace) -> None:
    from tests.fixtures.gpu_rank_step import measure_rank, record_rank

    case = tiny(CASES[args.child]) if args.tiny else CASES[args.child]
    if args.largest:
        budget = LARGEST_BUDGETS_GIB[args.child] << (20 if args.tiny else 30)
        with open(args.out / "largest.jsonl", "a") as out:
            out.write(json.dumps(_largest(case, budget, args.device)) + "\n")
        return
    try:
        row = record_rank(case) if args.record else measure_rank(case, args.device)
    except Exception as error:       # an out-of-memory or a failing wrapper: kept as a row
        row = {"name": case.name, "error": f"{type(error).__name__}: {error}"[:800]}
    with open(args.out / ("histories.jsonl" if args.record else "ranks.jsonl"), "a") as out:
        out.write(json.dumps(row) + "\n")


def _environment(device: str) -> dict:
    import torch

    from memcalc.calibration import environment, nvml

    if device != "cuda":
        return {"torch": torch.__version__, "device": device}
    return {"versions": environment.versions(), "nvml_total_bytes": nvml.device_total_bytes(),
            "nvml_used_before_bytes": nvml.device_used_bytes()}


DATA = Path(__file__).resolve().parent / "gpu_data"


def store(folders: list[Path], machine: str = "h200") -> None:
    """The measured rows and histories of ``folders`` into ``gpu_data/<machine>-ranks.json``
    and ``<machine>-rank-traces.json.gz``."""
    import gzip

    target = DATA / f"{machine}-ranks.json"
    stored = json.loads(target.read_text()) if target.exists() else {
        "what": "rank 0 of each multi-GPU job in tests.fixtures.gpu_rank_cases, run for real "
                "on one GPU in torch's fake process group (collectives are no-ops, every "
                "allocation of the rank is real): the caching allocator's peaks over two "
                "training steps from a fresh process",
        "command": "python -m benchmarks.gpu_ranks --out DIR", "rows": []}
    rows = {row["name"]: row for row in stored["rows"]}
    kept = DATA / f"{machine}-rank-traces.json.gz"
    traces = json.loads(gzip.decompress(kept.read_bytes())) if kept.exists() else {}
    for folder in folders:
        for line in (folder / "ranks.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "environment" in row:
                stored["environment"] = row["environment"]
            else:
                rows[row["name"]] = row
        largest = folder / "largest.jsonl"
        if largest.exists():
            found = {row["name"]: row for row in stored.get("largest", [])}
            found.update({row["name"]: row for row in map(json.loads,
                                                          largest.read_text().splitlines())})
            stored["largest"] = list(found.values())
        histories = folder / "histories.jsonl.gz"
        if histories.exists():
            for line in gzip.open(histories, "rt"):
                row = json.loads(line)
                traces[row["name"]] = {"trace": row["trace"], "segments": row["segments"]}
    stored["rows"] = list(rows.values())
    target.write_text(json.dumps(stored, indent=1) + "\n")
    if any(folder.joinpath("histories.jsonl.gz").exists() for folder in folders):
        with gzip.open(kept, "wt") as out:
            json.dump(traces, out)


def table() -> list[str]:
    """memcalc's traced rank of each stored case against the measured one (no GPU needed)."""
    from memcalc.pipeline import estimate

    stored = json.loads((DATA / "h200-ranks.json").read_text())
    versions = stored["environment"]["versions"]
    gib = 2**30
    lines = [f"Measured: {stored['hardware']}; torch {versions['torch']}, CUDA "
             f"{versions['cuda']}; {stored['measured']}. Rank 0 of each job in torch's fake "
             "process group; memcalc traces the same rank on the CPU. Errors are "
             "(memcalc - measured) / measured.", "",
             "| job (rank 0) | allocated GiB: memcalc / measured | reserved GiB: memcalc / "
             "measured | error allocated / reserved |", "|---|---|---|---|"]
    for row in stored["rows"]:
        device = estimate(CASES[row["name"]].spec, card_fits=False).device
        errors = [100 * (device.peak_allocated_bytes / row["max_allocated_bytes"] - 1),
                  100 * (device.peak_reserved_bytes / row["max_reserved_bytes"] - 1)]
        lines.append(f"| {row['name']} | {device.peak_allocated_bytes / gib:.2f} / "
                     f"{row['max_allocated_bytes'] / gib:.2f} | "
                     f"{device.peak_reserved_bytes / gib:.2f} / "
                     f"{row['max_reserved_bytes'] / gib:.2f} | "
                     f"{errors[0]:+.1f} % / {errors[1]:+.1f} % |")
    return lines + ["", *_largest_table(stored)]


def _largest_table(stored: dict) -> list[str]:
    """memcalc's verdict at the true largest batch under each cap, and one above."""
    from tests.fixtures.gpu_budget import runs_within_allocator_limit

    lines = ["Largest local batch with the caching allocator capped (each batch's two steps "
             "run from a freshly built job until one runs out of memory); memcalc given the "
             "same cap as its allocator's limit:", "",
             "| job (rank 0) | cap | largest that ran | memcalc at it / one above |",
             "|---|---:|---:|---|"]
    for row in stored["largest"]:
        batches = [row["true"], row["true"] + 1]
        verdicts = runs_within_allocator_limit(CASES[row["name"]].spec, batches,
                                               row["allowed_reserved_bytes"])
        shown = " / ".join("fits" if verdicts[batch] else "does not fit" for batch in batches)
        lines.append(f"| {row['name']} | {row['allowed_reserved_bytes'] / 2**30:.0f} GiB | "
                     f"{row['true']} | {shown} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", help="only cases whose name contains this")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="the allocator's history of each case, to histories.jsonl")
    parser.add_argument("--largest", action="store_true",
                        help="the largest local batch under LARGEST_BUDGETS_GIB, to largest.jsonl")
    parser.add_argument("--store", type=Path, nargs="+", help="folders to keep")
    parser.add_argument("--child")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        from benchmarks.results import publish
        publish(Path(__file__).with_name("results-gpu-ranks.md"),
                "Ranks of multi-GPU jobs on a real GPU vs memcalc", table())
        return
    if args.store:
        store(args.store)
        return
    if args.child:
        _child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "ranks.jsonl", "a") as out:
        out.write(json.dumps({"environment": _environment(args.device)}) + "\n")
    for name in CASES:
        if (args.only and args.only not in name) or (args.largest
                                                     and name not in LARGEST_BUDGETS_GIB):
            continue
        started = time.time()
        command = [sys.executable, "-m", "benchmarks.gpu_ranks", "--child", name,
                   "--out", str(args.out), "--device", args.device] + (
                       ["--tiny"] * args.tiny + ["--record"] * args.record
                       + ["--largest"] * args.largest)
        try:
            code = subprocess.run(command, timeout=CHILD_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"{time.time() - started:6.1f} s  exit {code}  {name}", flush=True)


if __name__ == "__main__":
    main()
