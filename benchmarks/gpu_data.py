"""The measured GPU truth kept in ``benchmarks/gpu_data/``, and how to read it.

    python -m benchmarks.gpu_data DIR      (import a ``benchmarks.gpu_measure`` output)

Files: ``<machine>-steps.json`` (environment, floor, one row per training step, timings,
largest batches), ``<machine>-convs.json.gz`` (every distinct cuDNN call with the bytes it
held, plan searches marked), ``<machine>-traces.json.gz`` (the allocator's own history of
each step: allocations, frees and segments).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from benchmarks.gpu_cases import GpuCase, case_from_dict
from memcalc.cudnn_workspace import MeasuredConv
from memcalc.specs import TrainingSpec

DATA = Path(__file__).with_name("gpu_data")
MACHINE = "h100"


def steps(machine: str = MACHINE) -> dict:
    return json.loads((DATA / f"{machine}-steps.json").read_text())


def convs(machine: str = MACHINE) -> dict[str, dict[str, list[MeasuredConv]]]:
    """``plans`` (the recorded pass after each measured step: chosen plans) and ``finds``
    (benchmark runs recorded in fresh processes: plan searches first), per case name."""
    rows = json.loads(gzip.open(DATA / f"{machine}-convs.json.gz", "rt").read())
    return {kind: {name: [MeasuredConv.model_validate(row) for row in records]
                   for name, records in per_case.items()} for kind, per_case in rows.items()}


def traces(machine: str = MACHINE) -> dict[str, list[list]]:
    return json.loads(gzip.open(DATA / f"{machine}-traces.json.gz", "rt").read())


PROFILE = "h100-torch2.11-cu130"


def spec_of(case: GpuCase, **changes) -> TrainingSpec:
    """The spec memcalc estimates for a measured case (Adam, cross-entropy, on CUDA, the
    H100's built-in environment profile)."""
    fields = dict(model=case.model, model_args=case.model_args, sample_shape=case.sample_shape,
                  batch_size=case.batch_size, precision=case.precision, cudnn_tf32=case.tf32,
                  cudnn_benchmark=case.benchmark, env_profile=PROFILE)
    return TrainingSpec(**(fields | changes))


def measured_cases(machine: str = MACHINE) -> list[tuple[GpuCase, dict]]:
    return [(case_from_dict(row["case"]), row) for row in steps(machine)["steps"]]


def _distinct(records: list[dict]) -> list[dict]:
    """One record per (call, first_call): the largest transient seen."""
    kept: dict[str, dict] = {}
    for record in records:
        key = json.dumps([record["call"], record["first_call"]], sort_keys=True)
        if key not in kept or record["transient_peak_bytes"] > kept[key]["transient_peak_bytes"]:
            kept[key] = record
    return list(kept.values())


def import_run(folder: Path, machine: str = MACHINE) -> None:
    """Add a measurement run to the stored truth; a step measured again replaces the old."""
    measured = json.loads((folder / "measured.json").read_text())
    steps_path = DATA / f"{machine}-steps.json"
    stored = json.loads(steps_path.read_text()) if steps_path.exists() else {}
    merged = {key: measured.get(key) or stored.get(key) for key in
              ("baseline", "floor", "versions")}
    for key in ("steps", "timing", "largest"):
        rows = {_row_key(row): row for row in stored.get(key) or []}
        rows.update({_row_key(row): row for row in measured.get(key) or []})
        merged[key] = list(rows.values())
    merged["errors"] = measured.get("errors", [])
    steps_path.write_text(json.dumps(merged, indent=1) + "\n")
    recorded = convs_raw(machine)
    histories = traces(machine) if (DATA / f"{machine}-traces.json.gz").exists() else {}
    for line in gzip.open(folder / "details.jsonl.gz", "rt"):
        row = json.loads(line)
        kind = "plans" if "details" in row else "finds"
        record = row["details"] if "details" in row else row["finds"]
        recorded[kind][record["name"]] = _distinct(record["convs"])
        if kind == "plans":
            histories[record["name"]] = [entry[:3] for entry in record["trace"]]
    with gzip.open(DATA / f"{machine}-convs.json.gz", "wt") as out:
        json.dump(recorded, out)
    with gzip.open(DATA / f"{machine}-traces.json.gz", "wt") as out:
        json.dump(histories, out)


def _row_key(row: dict) -> str:
    return row.get("name") or json.dumps([row.get("model"), row.get("sample_shape"),
                                          row.get("precision"), row.get("card")])


def convs_raw(machine: str = MACHINE) -> dict:
    path = DATA / f"{machine}-convs.json.gz"
    return json.loads(gzip.open(path, "rt").read()) if path.exists() else {"plans": {}, "finds": {}}


if __name__ == "__main__":
    import_run(Path(sys.argv[1]))
