"""``memcalc calibrate``: measure this machine's CUDA environment and build its profile.

Each measurement runs in a fresh Python process, because what one leaves behind changes the
next: loaded libraries (the floor, measured in both orders), and cuDNN's plan cache, which
does not tell ``cudnn.benchmark`` runs from others (the grid is measured once without and
once with it). About two minutes on one H100.

    python -m memcalc.calibration.run JOB OUT      (one job, in a child process)
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from memcalc.calibration.profile_builder import build_profile, floor_from_stages, workspace_model
from memcalc.trace.cudnn_workspace import MeasuredConv
from memcalc.device.env_profile import EnvProfile
from memcalc.errors import CalibrationError

JOB_TIMEOUT_S = 300


def _job(name: str) -> dict:
    import torch

    from memcalc.calibration import conv_grid, environment

    if name == "floor-cublas-first":
        return {"stages": environment.measure_floor(("cublas", "cudnn")),
                "versions": environment.versions()}
    if name == "floor-cudnn-first":
        return {"stages": environment.measure_floor(("cudnn", "cublas"))}
    benchmark = name == "grid-finds"
    modes = conv_grid.MATH_MODES if not benchmark else [(torch.float32, True),
                                                         (torch.bfloat16, True)]
    records = conv_grid.measure_grid(benchmark=benchmark, modes=modes)
    return {"convs": [record.model_dump(mode="json") for record in records]}


JOBS = ("floor-cublas-first", "floor-cudnn-first", "grid-plans", "grid-finds")


def _run_child(name: str, folder: Path, progress) -> dict:
    out = folder / f"{name}.json"
    progress(f"measuring {name}")
    try:
        completed = subprocess.run([sys.executable, "-m", "memcalc.calibration.run", name,
                                    str(out)], capture_output=True, text=True,
                                   timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"calibration step {name} took over {JOB_TIMEOUT_S} s; is the "
                               "GPU busy?") from None
    if completed.returncode != 0 or not out.exists():
        last = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CalibrationError(f"calibration step {name} failed: {last[0][:300]}")
    return json.loads(out.read_text())


def calibrate(name: str | None = None, progress=lambda message: None) -> EnvProfile:
    """Measure this environment in child processes and return its profile."""
    try:
        import torch
    except ImportError:
        raise CalibrationError("calibrate needs torch on the GPU machine") from None
    if not torch.cuda.is_available():
        raise CalibrationError("no CUDA GPU is visible here; run `memcalc calibrate` on the "
                               "machine that trains, then pass --env-profile FILE")
    with tempfile.TemporaryDirectory() as folder:
        results = {job: _run_child(job, Path(folder), progress) for job in JOBS}
    first = results["floor-cublas-first"]
    versions = first["versions"]
    plans = [MeasuredConv.model_validate(row) for row in results["grid-plans"]["convs"]]
    finds = [MeasuredConv.model_validate(row) for row in results["grid-finds"]["convs"]]
    today = datetime.date.today().isoformat()
    return build_profile(
        name=name or f"{versions['gpu']} {today}".replace(" ", "-").lower(),
        source=f"memcalc calibrate on {os.uname().nodename}, {today}: floor in two fresh "
               f"processes, cuDNN workspaces of {len(plans)} grid calls and "
               f"{sum(r.first_call for r in finds)} plan searches",
        versions=versions,
        floor=floor_from_stages(first["stages"], results["floor-cudnn-first"]["stages"]),
        cublas_workspace_total_bytes=first["stages"]["cublas"]["allocated_bytes"],
        cublas_handles=2, cudnn=workspace_model(plans, finds),
        driver_reserved_bytes=(int(versions["nvml_total_memory_bytes"])
                               - int(versions["total_memory_bytes"])))


def main() -> None:
    job, out = sys.argv[1], sys.argv[2]
    Path(out).write_text(json.dumps(_job(job)))


if __name__ == "__main__":
    main()
