"""Terminal rendering of the host-RAM report: the arithmetic, the worker counts, SLURM lines."""

from __future__ import annotations

import math

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from memcalc.host.report import HostReport, VerifyReport, env_text
from memcalc.host.specs import MachineSpec
from memcalc.render.helpers import bullets
from memcalc.dtypes import dtype_bytes
from memcalc.units import format_bytes


def _share(machine: MachineSpec) -> str:
    """Whose limit: a distributed job's process has its equal share of the node."""
    processes = machine.node_processes
    return (f" (1/{processes} of the node: one training process per GPU, each with its own "
            "workers)" if processes > 1 else "")


def _per_process(machine: MachineSpec) -> str:
    """SLURM's request is one training process's: say how it adds up on the node."""
    processes = machine.node_processes
    return (f" (one GPU process's: {processes} per node, one torchrun task per node asks "
            f"{processes} × the CPUs)" if processes > 1 else "")


def host_renderable(host: HostReport, details: bool = True) -> Group:
    """Host RAM: the worker counts that fit, SLURM lines, a measured fix and warnings; with
    ``details`` also the arithmetic term by term and the assumptions."""
    spec = host.spec
    how = "MEASURED worker" if host.measured else "from the sample shape"
    head = (
        f"[bold]host RAM ({how})[/]: sample {sample_text(host)}, batch "
        f"{spec.batch_size} = {format_bytes(host.batch_bytes)}\n"
        f"at num_workers={host.num_workers}: main {format_bytes(host.main_process_bytes)} + "
        f"{host.num_workers} × {format_bytes(host.per_worker_bytes)} per worker → "
        f"[bold]peak {format_bytes(host.peak_bytes)}[/] (epoch start "
        f"{format_bytes(host.epoch_start_bytes)}, steady {format_bytes(host.steady_bytes)}"
        + (f", loading the model {format_bytes(host.loading_bytes)}" if host.loading_bytes else "")
        + "); "
        f"/dev/shm {format_bytes(host.shm_peak_bytes)}{_shm_size(host)}\n"
        f"limit {format_bytes(host.limit_bytes)}{_share(spec.machine)} → usable "
        f"{format_bytes(host.usable_bytes)}: "
        f"{'fits' if host.fits else '[bold red]DOES NOT FIT[/]'}\n"
        f"[bold]max_num_workers {host.max_num_workers}[/] (limited by {host.limited_by}"
        + (f"; {host.max_num_workers_steady} if workers never collate at once"
           if host.max_num_workers_steady != host.max_num_workers else "") + "); "
        f"recommended num_workers={host.recommended_num_workers}, "
        f"pin_memory={host.recommended_pin_memory}, "
        f"prefetch_factor={host.recommended_prefetch_factor}, "
        f"persistent_workers={host.recommended_persistent_workers}\n"
        + "  ".join(host.sbatch) + _per_process(spec.machine)
    )
    parts = [Panel(head, title="memcalc host", expand=False)]
    if details:
        parts.append(_terms_table(host))
    if host.fix is not None:
        parts.append(Panel(f"{env_text(host.fix.env)}: {format_bytes(host.fix.per_worker_bytes)} per worker, "
                           f"max_num_workers {host.fix.max_num_workers}\ncause: {host.fix.cause}",
                           title="Fix (measured)", title_align="left"))
    if host.warnings:
        parts.append(bullets("Host warnings", host.warnings))
    if details:
        parts.append(bullets("Host assumptions", host.assumptions))
    return Group(*parts)


PAGE_CACHE_SHOWN = 0.05
"""Page cache at least this share of the verify run's peak is named in its line."""


def verify_line(verify: VerifyReport, headline_bytes: int | None = None) -> str:
    """The ``--verify`` run in one line: where it ran, measured vs predicted, held or why not;
    where its prediction is not the plan's peak (``headline_bytes``: the run leaves the model,
    the CPU step and CUDA out), both, and why they differ."""
    workers = f"{verify.num_workers} worker{'' if verify.num_workers == 1 else 's'}"
    where = (f"in a {format_bytes(verify.cap_bytes)} {verify.measured_by}"
             if verify.cgroup_unavailable is None else
             f"under a {format_bytes(verify.cap_bytes)} cap, {verify.measured_by} (no memory "
             f"cgroup: {verify.cgroup_unavailable})")
    outcome = ("held" if verify.held else "NOT HELD") + (f" ({verify.reason})"
                                                         if verify.reason else "")
    change = f"{100 * (verify.ratio - 1):+.0f} %".replace("-", "\u2212")
    cache = verify.page_cache_bytes or 0
    cached = (f" ({format_bytes(cache)} of it page cache)"
              if cache >= PAGE_CACHE_SHOWN * verify.measured_peak_bytes else "")
    predicted = format_bytes(verify.predicted_peak_bytes)
    if headline_bytes is not None and format_bytes(headline_bytes) != predicted:
        predicted += (f" predicted for the loader as run here (the plan's "
                      f"{format_bytes(headline_bytes)} adds the model, the step and CUDA)")
    else:
        predicted += " predicted"
    return (f"verify: {workers}, {verify.batches} batches {where}: peak "
            f"{format_bytes(verify.measured_peak_bytes)}{cached} measured vs "
            f"{predicted} ({change}): {outcome}")


def _terms_table(host: HostReport) -> Table:
    table = Table(title="Host RAM arithmetic (peak of each term)", title_justify="left")
    for column in ("process", "term", "count × each", "total", "note"):
        table.add_column(column, justify="right" if column in ("count × each", "total") else "left")
    rows = [("loading", term) for term in host.loading_terms]
    rows += [("worker" if term.per_worker else "main", term)
             for term in host.main_terms + host.worker_terms]
    for process, term in rows:
        table.add_row(process, term.name,
                      f"{term.count} × {format_bytes(term.bytes_each)}",
                      format_bytes(term.total_bytes), term.note)
    return table


def sample_text(host: HostReport) -> str:
    """The sample's model input (shape, dtype) and its bytes; a measured sample's other
    tensors (labels, masks) are their own term, not folded into the input's size."""
    spec = host.spec
    dtype = spec.loader.sample_dtype or "float32"
    text = f"{_shape(spec.sample_shape)} {dtype}"
    if not spec.sample_shape:
        return f"{text} = {format_bytes(host.sample_bytes)}"
    model_input = math.prod(spec.sample_shape) * dtype_bytes(dtype)
    others = host.sample_bytes - model_input
    if others <= 0:
        return f"{text} = {format_bytes(host.sample_bytes)}"
    return (f"{text} {format_bytes(model_input)} + {format_bytes(others)} of its other "
            f"tensors (labels, masks) = {format_bytes(host.sample_bytes)}")


def _shape(shape: tuple[int, ...] | None) -> str:
    return "×".join(map(str, shape)) if shape else "?"


def _shm_size(host: HostReport) -> str:
    machine = host.spec.machine
    if machine.shm_bytes is None:
        return " (size not known: not checked)"
    return f" of {format_bytes(machine.shm_bytes)}" + (" (assumed)" if machine.shm_assumed else "")
