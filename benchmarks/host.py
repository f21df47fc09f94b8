"""Host RAM accuracy against real DataLoaders as a memory cgroup charges them (and by PSS),
and the cost of measuring.
Prints the table and writes benchmarks/results-host.md.

    python -m benchmarks.host
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from tests.fixtures.host_datasets import HOST_CASES
from tests.fixtures.host_truth import host_truth
from benchmarks.results import publish
from memcalc.host.measure import measure_worker, measured_host_estimate
from memcalc.host.report import env_text
from memcalc.host.workers import host_estimate
from memcalc.host.specs import HostSpec, LoaderSpec, MachineSpec

RESULTS = Path(__file__).with_name("results-host.md")
WORKER_COUNTS = (0, 1, 2)
TRUTH_RUNS = 3
"""Runs of each real DataLoader; its truth is the run with the median cgroup peak (a single
run's peak moved by up to 30 MiB between runs, a tenth of one worker's cost)."""
MACHINE = MachineSpec(cpus=2, ram_bytes=24 << 30)
MIB = 2**20


def glibc_rows() -> list[str]:
    """A worker building 16 MiB samples (inside glibc's dynamic mmap threshold), as found and
    as fixed by ``MALLOC_MMAP_THRESHOLD_``."""
    spec = HostSpec(batch_size=4, cuda=False, machine=MachineSpec(cpus=32, ram_bytes=16 << 30),
                    loader=LoaderSpec(dataset="tests.fixtures.host_datasets:small_volumes",
                                      probe_seconds=20))
    report = measured_host_estimate(spec)
    rows = ["| 16 MiB samples, batch 4 | worker peak | per worker | max workers (32 CPUs, 16 GiB) |",
            "|---|---:|---:|---:|",
            f"| as launched | {report.measurement.worker_peak_bytes / MIB:,.0f} MiB "
            f"({report.measurement.batches} batches, {report.measurement.stopped_by}) | "
            f"{report.per_worker_bytes / MIB:,.0f} MiB | {report.max_num_workers} |"]
    if report.fix is not None:
        rows.append(f"| {env_text(report.fix.env)} | {report.fix.measurement.worker_peak_bytes / MIB:,.0f} MiB | "
                    f"{report.fix.per_worker_bytes / MIB:,.0f} MiB | {report.fix.max_num_workers} |")
    return rows


def _error(predicted: int, truth: int) -> str:
    return f"{100 * (predicted / truth - 1):+.1f} %"


def main() -> None:
    lines = ["| dataset | workers | memory cgroup | PSS + /dev/shm | shape-based | error | "
             "measured worker | error |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    slopes = ["| dataset | memory cgroup | PSS + /dev/shm | shape-based | error | "
              "measured worker | error |", "|---|---:|---:|---:|---:|---:|---:|"]
    probe_seconds = {}
    for name, case in HOST_CASES.items():
        reference = f"tests.fixtures.host_datasets:{name}"
        start = time.perf_counter()
        measurement = measure_worker(LoaderSpec(dataset=reference, probe_seconds=30),
                                     case.batch_size)
        probe_seconds[name] = (time.perf_counter() - start, measurement.batches)
        truths, reports = {}, {}
        for workers in WORKER_COUNTS:
            spec = HostSpec(sample_shape=case.sample_shape, batch_size=case.batch_size,
                            cuda=False, machine=MACHINE,
                            loader=LoaderSpec(num_workers=workers, **case.loader_options))
            shape_based = host_estimate(spec)
            measured = host_estimate(spec.model_copy(update={"loader": spec.loader.model_copy(
                update={"dataset": reference})}), measurement)
            truth = truths[workers] = _median_truth(name, workers)
            reports[workers] = (shape_based, measured)
            charged = truth.cgroup_bytes or truth.pss_bytes
            lines.append(f"| {name} | {workers} | {_mib(truth.cgroup_bytes)} | "
                         f"{_mib(truth.pss_bytes)} | {_mib(shape_based.peak_bytes)} | "
                         f"{_error(shape_based.peak_bytes, charged)} | "
                         f"{_mib(measured.peak_bytes)} | {_error(measured.peak_bytes, charged)} |")
        charged = (truths[2].cgroup_bytes or 0) - (truths[1].cgroup_bytes or 0)
        pss = truths[2].pss_bytes - truths[1].pss_bytes
        shape_based, measured = (report.per_worker_bytes for report in reports[2])
        slopes.append(f"| {name} | {_mib(charged)} | {_mib(pss)} | {_mib(shape_based)} | "
                      f"{_error(shape_based, charged or pss)} | {_mib(measured)} | "
                      f"{_error(measured, charged or pss)} |")
    lines += ["", "One more worker (peak at 2 workers less peak at 1; the reports' per_worker_bytes):",
              "", *slopes]
    lines += ["", "| dataset | worker measurement | batches |", "|---|---:|---:|"]
    lines += [f"| {name} | {seconds:.1f} s | {batches} |"
              for name, (seconds, batches) in probe_seconds.items()]
    lines += ["", *glibc_rows()]
    lines += ["", f"Linux {platform.release()}, Python {platform.python_version()}, torch "
              f"{torch.__version__}, glibc {platform.libc_ver()[1]}; 2 CPUs. Truth: "
              f"tests/fixtures/host_truth.py, a real DataLoader in a fresh {truths[0].cgroup} "
              "(its peak: anonymous memory, shared memory, page cache it read first), the "
              f"median of {TRUTH_RUNS} runs; errors "
              "are against it. Beside it, the same run's peak of private PSS of main + workers "
              "plus /dev/shm in use, sampled every 2 ms."]
    publish(RESULTS, "Host RAM: memcalc vs real DataLoaders", lines)


def _median_truth(name: str, workers: int):
    runs = sorted((host_truth(name, workers) for _ in range(TRUTH_RUNS)),
                  key=lambda truth: truth.cgroup_bytes or truth.pss_bytes)
    return runs[len(runs) // 2]


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MIB:,.0f} MiB"


if __name__ == "__main__":
    main()
