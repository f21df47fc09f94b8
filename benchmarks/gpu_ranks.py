"""Measure one rank of each multi-GPU job in ``tests.fixtures.gpu_rank_cases`` on a real GPU.

    python -m benchmarks.gpu_ranks --out DIR [--only TEXT]
    python -m benchmarks.gpu_ranks --out DIR --tiny --device cpu     (try the runner)

Each case runs in a fresh process (the allocator's figures are per process) as rank 0 of its
job in torch's fake process group (``tests.fixtures.gpu_rank_step``), one at a time. Rows go
to ``DIR/ranks.jsonl`` as they finish, with the environment first;
``benchmarks/gpu_data/h200-ranks.json`` holds the H200 run.

    python -m benchmarks.gpu_ranks --out DIR --record     (the allocator's histories)
    python -m benchmarks.gpu_ranks --store DIR [DIR ...]  (into benchmarks/gpu_data/)
    python -m benchmarks.gpu_ranks --table     (memcalc against the stored rows, markdown)

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


def _child(args: argparse.Namespace) -> None:
    from tests.fixtures.gpu_rank_step import measure_rank, record_rank

    case = tiny(CASES[args.child]) if args.tiny else CASES[args.child]
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
    traces = {}
    for folder in folders:
        for line in (folder / "ranks.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "environment" in row:
                stored["environment"] = row["environment"]
            else:
                rows[row["name"]] = row
        histories = folder / "histories.jsonl.gz"
        if histories.exists():
            for line in gzip.open(histories, "rt"):
                row = json.loads(line)
                traces[row["name"]] = {"trace": row["trace"], "segments": row["segments"]}
    stored["rows"] = list(rows.values())
    target.write_text(json.dumps(stored, indent=1) + "\n")
    if traces:
        with gzip.open(DATA / f"{machine}-rank-traces.json.gz", "wt") as out:
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
        case = CASES[row["name"]]
        if case.cpu_offload:
            lines.append(f"| {row['name']} | not traced / {row['max_allocated_bytes'] / gib:.2f} "
                         f"| not traced / {row['max_reserved_bytes'] / gib:.2f} | — |")
            continue
        device = estimate(case.spec, card_fits=False).device
        errors = [100 * (device.peak_allocated_bytes / row["max_allocated_bytes"] - 1),
                  100 * (device.peak_reserved_bytes / row["max_reserved_bytes"] - 1)]
        lines.append(f"| {row['name']} | {device.peak_allocated_bytes / gib:.2f} / "
                     f"{row['max_allocated_bytes'] / gib:.2f} | "
                     f"{device.peak_reserved_bytes / gib:.2f} / "
                     f"{row['max_reserved_bytes'] / gib:.2f} | "
                     f"{errors[0]:+.1f} % / {errors[1]:+.1f} % |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", help="only cases whose name contains this")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="the allocator's history of each case, to histories.jsonl")
    parser.add_argument("--store", type=Path, nargs="+", help="folders to keep")
    parser.add_argument("--child")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    if args.table:
        print("\n".join(table()))
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
        if (args.only and args.only not in name) or (args.record and CASES[name].cpu_offload):
            continue
        started = time.time()
        command = [sys.executable, "-m", "benchmarks.gpu_ranks", "--child", name,
                   "--out", str(args.out), "--device", args.device] + (["--tiny"] * args.tiny
                                                                      + ["--record"] * args.record)
        try:
            code = subprocess.run(command, timeout=CHILD_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"{time.time() - started:6.1f} s  exit {code}  {name}", flush=True)


if __name__ == "__main__":
    main()
