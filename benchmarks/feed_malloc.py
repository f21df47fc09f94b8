"""A worker's time per batch by what its training process allocated before starting it
(glibc's malloc thresholds, ``memcalc.host.malloc_thresholds``), against what the probe reports.

Each history runs in a fresh interpreter that loads the Dataset, does what the history says,
then starts a 1-worker DataLoader and takes batches slower than the worker builds them, so
the worker never waits for a CPU or an index: its CPU time per batch (``/proc/PID/schedstat``)
and the fresh memory it maps per batch. Writes benchmarks/results-malloc.md.

    python -m benchmarks.feed_malloc
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results import publish
from memcalc.host import LoaderSpec, measure_worker
from memcalc.host.malloc_thresholds import churns, reuse_env
from memcalc.host.machine import cpu_run_and_wait_seconds, fault_counts, fresh_bytes
from tests.fixtures.data_kinds import FEED_CASES

RESULTS = Path(__file__).with_name("results-malloc.md")
KINDS = ("numpy_decode", "npy_files", "volume_3d", "jpeg_pillow")
WARM, TIMED = 8, 40
PROBE_SECONDS = 8
HISTORIES = {
    "fresh": ("loaded the Dataset only", None),
    "one sample": ("read dataset[0] first, as the probe does", None),
    "second loader": ("ran a loader before (the 2nd epoch of non-persistent workers)", None),
    "batch built": ("built a batch itself first", None),
    "both set": ("read dataset[0], both thresholds set", "reuse"),
    "trim only": ("read dataset[0], MALLOC_TRIM_THRESHOLD_ alone", "trim"),
}


def worker_time(kind: str, history: str) -> dict[str, float]:
    """Run in the fresh interpreter: the worker's CPU milliseconds and fresh MiB per batch."""
    from torch.utils.data import DataLoader, default_collate

    from memcalc.model.user_code import load_dataset

    case = FEED_CASES[kind]
    dataset = load_dataset(case.reference)
    if history in ("one sample", "both set", "trim only"):
        del_me = dataset[0]
        del del_me
    if history == "batch built":
        batch = default_collate([dataset[i] for i in range(case.batch_size)])
        del batch
    if history == "second loader":
        for _ in zip(range(WARM), DataLoader(dataset, batch_size=case.batch_size, num_workers=1)):
            pass
    batches = iter(DataLoader(dataset, batch_size=case.batch_size, num_workers=1))
    for _ in range(WARM):
        next(batches)
    pid = batches._workers[0].pid
    run, faults = cpu_run_and_wait_seconds(pid)[0], fault_counts(pid)
    for _ in range(TIMED):
        next(batches)
        time.sleep(2 * case.step_s + 0.05)  # slower than the worker: it never waits for a CPU
    run_after = cpu_run_and_wait_seconds(pid)[0]
    return {"ms": (run_after - run) / TIMED * 1e3,
            "fresh_mib": fresh_bytes(faults, fault_counts(pid)) / TIMED / 2**20}


def _in_fresh_interpreter(kind: str, history: str, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.feed_malloc", kind, history],
                          env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    started = time.perf_counter()
    lines = ["| kind | batch | " + " | ".join(HISTORIES) + " | probe | probe, both set | "
             "probe: fresh per batch |",
             "|---|---:|" + "---:|" * (len(HISTORIES) + 3)]
    for kind in KINDS:
        case = FEED_CASES[kind]
        probe = measure_worker(LoaderSpec(dataset=case.reference,
                                          probe_seconds=PROBE_SECONDS), case.batch_size)
        env = reuse_env(probe.worker_peak_bytes)
        envs = {"reuse": env, "trim": {"MALLOC_TRIM_THRESHOLD_": env["MALLOC_TRIM_THRESHOLD_"]}}
        cells = []
        for history, (_, setting) in HISTORIES.items():
            timed = _in_fresh_interpreter(kind, history, envs.get(setting, {}))
            cells.append(f"{timed['ms']:.1f} ms ({timed['fresh_mib']:.0f} MiB)")
        fixed = measure_worker(LoaderSpec(dataset=case.reference, probe_seconds=PROBE_SECONDS),
                               case.batch_size, env=env)
        per_batch = case.batch_size * 1e3
        lines.append(
            f"| {kind} | {probe.batch_bytes / 2**20:.1f} MiB | " + " | ".join(cells)
            + f" | {probe.feeding_seconds_per_sample * per_batch:.1f} ms | "
            f"{fixed.feeding_seconds_per_sample * per_batch:.1f} ms | "
            f"{probe.fault_bytes_per_batch / 2**20:.0f} MiB"
            f"{' (churns)' if churns(probe) else ''} |")
    lines += ["", "Each history cell: one worker's CPU time per batch, and in brackets the fresh "
              "memory it mapped per batch (``memcalc.host.machine.fresh_bytes``, as the probe "
              "counts it), measured in a fresh interpreter whose main process first "
              + "; ".join(f"*{name}*: {text}" for name, (text, _) in HISTORIES.items())
              + ". Both thresholds: `memcalc.host.malloc_thresholds.reuse_env` of the probe's worker "
              "peak. Probe: `memcalc estimate --dataset`'s worker time per batch (its waits "
              "for a CPU taken out), as it runs and again with both thresholds set, which it "
              "does where the worker churns (fresh memory per batch above "
              "`CHURN_FACTOR` × the batch + 1 MiB).",
              "", f"Linux {platform.release()}, glibc {platform.libc_ver()[1]}, Python "
              f"{platform.python_version()}; {os.cpu_count()} CPUs; "
              f"{time.perf_counter() - started:.0f} s in all."]
    publish(RESULTS, "A worker's time per batch by its training process's allocations", lines)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(json.dumps(worker_time(*sys.argv[1:])))
    else:
        main()
