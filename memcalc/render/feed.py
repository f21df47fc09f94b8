"""Terminal rendering of the feeding model and of ``memcalc feed``'s check."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from memcalc.feed.check import FeedCheck
from memcalc.feed.model import HEAP_RANGE_POINTS, ThroughputReport
from memcalc.host.report import env_text
from memcalc.render.helpers import bullets
from memcalc.units import counted


def throughput_renderable(throughput: ThroughputReport) -> Group:
    """Whether the loader keeps the GPU busy, by worker count, and what helps."""
    verdict = {"gpu": "GPU-bound (the loader keeps up)", "cpu": "[bold red]CPU-bound[/]",
               "io": "[bold red]I/O-bound[/]",
               "main": "[bold red]bound by taking batches[/]"}[throughput.bound]
    head = (f"[bold]feeding: {verdict}[/] at num_workers={throughput.num_workers}: GPU busy "
            f"{busy_text(throughput)}\n"
            f"step {throughput.step_time_s * 1e3:.3g} ms ({throughput.step_time_source}); "
            f"one worker builds a batch in {throughput.batch_load_time_s * 1e3:.3g} ms "
            f"({throughput.batch_load_source}); {counted(throughput.workers_needed, 'worker')} needed")
    rows = ", ".join(f"{row.num_workers}: {row.expected_gpu_utilization:.0%}"
                     for row in throughput.by_workers[:9])
    parts = [Panel(head + f"\nGPU busy by workers — {rows}", title="memcalc feeding",
                   expand=False)]
    if throughput.advice:
        parts.append(bullets("What helps", throughput.advice))
    return Group(*parts)


def busy_text(throughput: ThroughputReport) -> str:
    """The GPU-busy share at the recommended workers; a range where the heap state the
    workers inherit moves it by more than ``HEAP_RANGE_POINTS``."""
    busy, states = f"{throughput.expected_gpu_utilization:.0%}", throughput.heap_states
    if states is None or states.spread_points <= HEAP_RANGE_POINTS:
        return busy
    fixed = ("" if states.fixed_gpu_utilization is None else
             f"; with `{env_text(throughput.malloc_fix.env)}` it is "
             f"{states.fixed_gpu_utilization:.0%}")
    return (f"{states.range_text} depending on glibc's heap the workers inherit ({busy} "
            f"as a training script leaves it, {states.fresh_gpu_utilization:.0%} from a fresh "
            f"process{fixed})")


def feed_renderable(check: FeedCheck) -> Group:
    """Measured against predicted GPU utilisation for each worker count."""
    table = Table(title=f"{check.dataset}: batch {check.batch_size}, simulated step "
                        f"{check.step_time_s * 1e3:.3g} ms, {check.seconds_per_sample * 1e3:.3g} "
                        f"ms of CPU per sample (measured in a real worker), {check.cpus} CPUs, "
                        f"the step {check.consumer}s" + (
                            f" (and waits {check.wake_wait_s * 1e3:.3g} ms for a core when it "
                            f"wakes to all busy, {check.wake_wait_source})"
                            if check.consumer == "sleep" and check.wake_wait_s else ""),
                  title_justify="left")
    for column in ("num_workers", "other load", "predicted GPU busy", "measured GPU busy",
                   "difference"):
        table.add_column(column, justify="right")
    for row in check.rows:
        table.add_row(str(row.num_workers), f"{row.other_busy_cpus:.1f} CPUs",
                      f"{row.predicted_gpu_utilization:.0%}",
                      f"{row.measured_gpu_utilization:.0%}",
                      f"{100 * (row.predicted_gpu_utilization - row.measured_gpu_utilization):+.0f} pt")
    parts = [table]
    if check.warnings:
        parts.append(bullets("Not in the prediction", check.warnings))
    return Group(*parts)
