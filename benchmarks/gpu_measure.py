"""Measure the GPU cases on a real CUDA GPU and write what was measured.

    python -m benchmarks.gpu_measure --out DIR [--parts floor,steps,finds,timing] [--jobs 4]

Every group of cases runs in a fresh process (one per model, precision, TF32 and
cudnn.benchmark setting), several at a time: allocator figures are per process, and NVML's
are read for the process's own id. Timings run alone afterwards. Writes ``measured.json``
(environment, floor, one row per step), ``details.jsonl.gz`` (every cuDNN call and the
allocator's history per step) and ``timing.json``.

    python -m benchmarks.gpu_measure --parts largest --largest FILE --out DIR --jobs 4

searches the true largest batch of each row of FILE (``benchmarks.gpu_largest.
predicted_largest()`` as JSON) on its emulated card, one fresh process per row, several side
by side where the device holds their cards together; each search stops after
``MEMCALC_LARGEST_JOB_S`` seconds (150). Rows go to ``DIR/largest.jsonl`` as they finish
(``benchmarks/gpu_data/h200-largest.json`` holds the H200 run).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tests.fixtures.gpu_cases import GpuCase, case_from_dict, step_cases

CHILD_TIMEOUT_S = 300
PROCESS_FLOOR_BYTES = 2 << 30  # a CUDA context with cuBLAS and cuDNN loaded, with room


def _child(args: argparse.Namespace) -> None:
    """Runs inside a fresh process: one job, results as JSON lines."""
    import torch  # noqa: F401  (CUDA is initialised by the first case)

    from tests.fixtures import gpu_step
    from memcalc.calibration import environment

    job = json.loads(Path(args.child).read_text())
    with open(args.child_out, "a") as out:
        def emit(row: dict) -> None:
            out.write(json.dumps(row) + "\n")
            out.flush()

        if job["kind"] == "floor":
            emit({"floor": environment.measure_floor(), "versions": environment.versions()})
            return
        if job["kind"] == "largest":
            from benchmarks.gpu_largest import true_largest
            for row in true_largest(job["rows"]):
                emit({"largest": row})
            return
        for row in job["cases"]:
            case = case_from_dict(row)
            try:
                if job["kind"] == "steps":
                    emit({"step": gpu_step.measure_step(case)})
                    emit({"details": gpu_step.record_step(case)})
                elif job["kind"] == "finds":
                    emit({"finds": gpu_step.record_step(case)})
                elif job["kind"] == "timing":
                    emit({"timing": gpu_step.time_step(case)})
            except Exception as error:  # one failing case must not lose the others
                emit({"error": {"name": case.name, "kind": job["kind"],
                                "message": f"{type(error).__name__}: {error}"[:800]}})


def _jobs(parts: list[str], only: str | None) -> list[dict]:
    cases = [case for case in step_cases() if not only or only in case.name]
    groups: dict[tuple, list[GpuCase]] = defaultdict(list)
    for case in cases:
        groups[case.group].append(case)
    jobs = [{"kind": "floor", "cases": []}] if "floor" in parts else []
    for group in groups.values():
        rows = [case.__dict__ for case in group]
        if "steps" in parts:
            jobs.append({"kind": "steps", "cases": rows})
        if "finds" in parts and group[0].benchmark:
            jobs.append({"kind": "finds", "cases": rows})
    return jobs


def timing_cases(only: str | None) -> list[GpuCase]:
    """First size of each model; fp32 with TF32 on and off and bf16-mixed; no benchmark."""
    picked, seen = [], set()
    for case in step_cases():
        key = (case.model, case.precision, case.tf32)
        if (case.benchmark or case.precision == "fp16-mixed" or key in seen
                or (only and only not in case.name)):
            continue
        seen.add(key)
        picked.append(case)
    return picked


def _largest_jobs(path: str) -> list[dict]:
    """One job per predicted row (model case and card), largest cards first (the slowest
    searches; smaller cards fill the device beside them)."""
    rows = sorted(json.loads(Path(path).read_text()), key=lambda row: -row["capacity_bytes"])
    # "bytes": the emulated card with room for its process's context and libraries
    return [{"kind": "largest", "cases": [], "rows": [row],
             "bytes": row["capacity_bytes"] + PROCESS_FLOOR_BYTES} for row in rows]


def _run_jobs(jobs: list[dict], workdir: Path, parallel: int, deadline: float,
              first_index: int = 0, device_bytes: int | None = None) -> list[Path]:
    """Start jobs ``parallel`` at a time, each in a fresh interpreter; their output files.
    With ``device_bytes``, a job's ``bytes`` (its emulated card) must fit beside the running
    ones: the next job that fits starts, in order."""
    pending = list(enumerate(jobs, start=first_index))
    running, outputs = [], []
    while pending or running:
        while pending and len(running) < parallel and time.time() < deadline:
            held = sum(job.get("bytes", 0) for _, _, job in running)
            fitting = [item for item in pending if device_bytes is None
                       or held + item[1].get("bytes", 0) <= device_bytes]
            if not fitting:
                break
            pending.remove(fitting[0])
            index, job = fitting[0]
            spec = workdir / f"job{index}.json"
            out = Path(job["out"]) if "out" in job else workdir / f"job{index}.jsonl"
            spec.write_text(json.dumps(job))
            process = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_measure",
                                        "--child", str(spec), "--child-out", str(out)])
            running.append((process, time.time(), job))
            if out not in outputs:
                outputs.append(out)
        if time.time() >= deadline:
            pending = []
        for item in list(running):
            process, started, job = item
            limit = job.get("timeout_s", CHILD_TIMEOUT_S)
            if process.poll() is None and time.time() - started > limit:
                process.kill()
                print(f"killed after {limit} s: {job['kind']} "
                      f"{[c['model'] for c in job['cases']][:1]}", flush=True)
            if process.poll() is not None:
                running.remove(item)
        time.sleep(0.2)
    return outputs


def _collect(outputs: list[Path], out_dir: Path, baseline: dict) -> dict:
    rows = [json.loads(line) for path in outputs if path.exists()
            for line in path.read_text().splitlines() if line.strip()]
    measured = {"baseline": baseline, "floor": None, "versions": None, "steps": [],
                "errors": [], "timing": []}
    with gzip.open(out_dir / "details.jsonl.gz", "wt") as details:
        for row in rows:
            if "floor" in row:
                measured["floor"], measured["versions"] = row["floor"], row["versions"]
            elif "step" in row:
                measured["steps"].append(row["step"])
            elif "timing" in row:
                measured["timing"].append(row["timing"])
            elif "largest" in row:
                measured.setdefault("largest", []).append(row["largest"])
            elif "error" in row:
                measured["errors"].append(row["error"])
            else:
                details.write(json.dumps(row) + "\n")
    (out_dir / "measured.json").write_text(json.dumps(measured, indent=1))
    return measured


def _baseline() -> dict:
    """Device memory in use before this run starts a CUDA context (other processes, driver)."""
    from memcalc.calibration import nvml

    return {"device_used_bytes": nvml.device_used_bytes(),
            "device_total_bytes": nvml.device_total_bytes(),
            "driver": nvml.driver_version(), "hostname": os.uname().nodename}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/gpu"))
    parser.add_argument("--parts", default="floor,steps,finds,timing")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--only", help="only cases whose name contains this")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="start no new process after this many seconds")
    parser.add_argument("--largest", help="predicted largest batches (JSON) to check")
    parser.add_argument("--child")
    parser.add_argument("--child-out")
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return
    start = time.time()
    parts = args.parts.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    baseline = _baseline()
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        outputs = _run_jobs(_jobs(parts, args.only), workdir, args.jobs,
                            start + args.budget_s * 0.8)
        if "timing" in parts:
            rows = [case.__dict__ for case in timing_cases(args.only)]
            outputs += _run_jobs([{"kind": "timing", "cases": rows}], workdir, 1,
                                 start + args.budget_s, first_index=len(outputs))
        if "largest" in parts:  # one file, appended job by job: kept if the run is cut off
            limit_s = float(os.environ.get("MEMCALC_LARGEST_JOB_S", 150))
            jobs = [job | {"out": str(args.out / "largest.jsonl"), "timeout_s": limit_s}
                    for job in _largest_jobs(args.largest)]
            # several emulated cards at once where the device holds them all
            room = baseline["device_total_bytes"] - baseline["device_used_bytes"]
            outputs += _run_jobs(jobs, workdir, args.jobs, start + args.budget_s,
                                 first_index=len(outputs), device_bytes=room)
        measured = _collect(outputs, args.out, baseline)
    print(f"{len(measured['steps'])} steps, {len(measured['timing'])} timings, "
          f"{len(measured['errors'])} errors in {time.time() - start:.0f} s", flush=True)
    for error in measured["errors"][:20]:
        print("error:", error, flush=True)


if __name__ == "__main__":
    main()
