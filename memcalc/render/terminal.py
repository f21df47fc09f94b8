"""Terminal rendering of reports with rich. Formatting only; no computation."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from memcalc.device.batch_search import UNTRAINABLE
from memcalc.device.least_limit import tolerance_bytes
from memcalc.device.report import PlanPoint
from memcalc.render.feed import throughput_renderable
from memcalc.render.cards import cards_line, cards_table
from memcalc.render.helpers import bullets
from memcalc.render.host import host_renderable
from memcalc.render.validation import validation_renderable, window_plan_text
from memcalc.render.verdict import verdict_warnings
from memcalc.report.models import Report
from memcalc.report.assumptions import step_name
from memcalc.units import counted, format_bytes, format_count


SHORT_TOP_MODULES = 5


def report_renderable(report: Report, show_layers: bool = False, details: bool = False
                      ) -> Group:
    """The estimate below its verdict line (``render.verdict``), one screen by default: head,
    breakdown, batch plan, the top modules, feeding and host RAM, and where the rest is. With
    ``details`` every table: the static count, the host arithmetic, the assumptions and what
    is not modelled (and the torchinfo layer table with ``show_layers``)."""
    device = report.device
    parts = [Panel(_head(report), title="memcalc estimate", expand=False),
             _breakdown_table(report, details)]
    if device.plan is not None and (device.method == "traced" or details):
        parts.append(_plan_panel(report))   # a static line plans no batch: --details only
    if device.card_fits:
        parts.append(cards_table(device) if details else cards_line(device))
    if device.top_modules:
        parts.append(_top_modules_table(report, None if details else SHORT_TOP_MODULES))
    if details:
        parts.append(_static_table(report))
    if show_layers and report.model.layers:
        parts.append(_layers_table(report))
    if details:
        parts.append(bullets("Assumptions", report.assumptions))
        if report.unsupported:
            parts.append(bullets("Not modelled", report.unsupported))
    if report.throughput is not None:
        parts.append(throughput_renderable(report.throughput))
    if report.host is not None:
        parts.append(host_renderable(report.host, details))
    if report.validation is not None:
        parts.append(validation_renderable(report))
    warnings = [line for line in report.assumptions if line.startswith("WARNING")]
    if warnings and not details:      # shown without asking
        parts.append(bullets("Warnings", warnings))
    if not details:
        parts.append(f"{counted(len(report.assumptions), 'assumption')}, "
                     f"{counted(len(report.unsupported), 'thing')} not modelled, the static "
                     "count and the host arithmetic: --details (everything: --json)")
    return Group(*parts)


def _one_rank(parallel) -> str:
    if parallel.pp > 1:
        return (f" per pipeline replica\nthe rank of the largest stage of {parallel.describe()}"
                " (each stage's first rank traced in a fake process group)")
    if parallel.cp > 1:
        return (f" per context-parallel group\n{parallel.describe()}: the larger of a group's "
                "first and last rank (each traced in a fake process group)")
    return f" per GPU\none rank of {parallel.describe()} (traced in a fake process group)"


def _head(report: Report) -> str:
    device, spec = report.device, report.spec
    label = "TRACED" if device.method == "traced" else "STATIC ESTIMATE (trace failed)"
    reserved = ("" if device.peak_reserved_bytes is None else
                ", the least CUDA memory it runs in: reserved + context"
                if device.runs_at_capacity is False else
                ", CUDA reserved + context, what nvidia-smi shows")
    when = (f" — reached in {device.peak_phase} of iteration {device.peak_iteration}"
            if device.peak_phase else "")
    return (
        f"[bold]{report.model.name}[/]  {format_count(report.model.parameter_count)} parameters  "
        f"{step_name(spec)}  {spec.precision.value}"
        + ("  compiled" if report.model.compiled_modules else "")
        + f"  device {device.kind}  batch {device.batch_size}"
        + (_one_rank(spec.parallel) if spec.parallel else "") + "\n"
        f"input: {report.input.layout} ({report.input.layout_explanation}); traced batch "
        f"{tuple(report.input.traced_batch_shape)} {report.input.dtype}"
        + "".join(f"; {name} {shape}" for name, shape in report.input.named_inputs.items())
        + (f"; called as {report.input.family}" if report.input.family != "tensors" else "")
        + "\n"
        f"[bold]peak {format_bytes(device.peak_bytes)}[/] ({label}{reserved}; allocated "
        f"{format_bytes(device.peak_allocated_bytes)}{when})"
    )


def _breakdown_table(report: Report, details: bool) -> Table:
    """Bytes per category at the peak, then what CUDA adds: the allocator's reserve and the
    context (byte counts with ``details``)."""
    breakdown = report.device.breakdown
    table = Table(title="Live tensor bytes at the peak", title_justify="left")
    table.add_column("category")
    table.add_column("size", justify="right")
    if details:
        table.add_column("bytes", justify="right")
    table.add_column("share", justify="right")

    def row(name: str, nbytes: int, share: str = "") -> None:
        table.add_row(name, format_bytes(nbytes), *([f"{nbytes:,}"] if details else []), share)

    total = breakdown.total_bytes or 1
    for category, nbytes in breakdown.by_category().items():
        if nbytes or details:
            row(category.value, nbytes, f"{100 * nbytes / total:.1f} %")
    row("[bold]total live[/]", breakdown.total_bytes, "100.0 %")
    reserved = report.device.peak_reserved_bytes
    if reserved is not None:
        row("+ CUDA allocator reserve (rounding, cached blocks, fragmentation)",
            reserved - breakdown.total_bytes)
        row("predicted reserved peak (max_memory_reserved)" if report.device.runs_at_capacity
            is not False else "least reserved it runs in (the allocator freeing its cache)",
            reserved)
    if report.device.kind == "cuda":
        parallel = report.spec.parallel
        row("+ CUDA context, loaded kernels and NCCL's buffers (outside the allocator)"
            if parallel is not None and parallel.world_size > 1 else
            "+ CUDA context and loaded kernels (outside the allocator)",
            report.device.context_bytes)
        row("[bold]predicted total (nvidia-smi)[/]", report.device.total_bytes)
    return table


def _plan_panel(report: Report) -> Panel:
    device, plan = report.device, report.device.plan
    static = {point.batch_size for point in plan.points if point.method == "static"}
    fit_kind = "batches" if static & set(plan.fit_batches) else "traced batches"
    lines = [
        f"capacity {format_bytes(device.capacity_bytes)} - headroom "
        f"{format_bytes(device.headroom_bytes)}"
        + (f" - driver reserve {format_bytes(device.driver_reserved_bytes)}"
           if device.driver_reserved_bytes else "")
        + f" = usable {format_bytes(plan.usable_bytes)}",
        f"linear model: {format_bytes(plan.model_bytes)} + {format_bytes(plan.per_sample_bytes)} "
        f"per sample (line through {fit_kind} {plan.fit_batches[0]} and {plan.fit_batches[1]})",
    ]
    if plan.max_batch_size == 0:
        levers = ("mixed precision, checkpointing, offloading or splitting each sample over "
                  "GPUs (spatial parallelism)" if plan.per_sample_bytes > plan.model_bytes else
                  "mixed precision, ZeRO / FSDP sharding or a pipeline over GPUs")
        lines.append(f"[bold red]batch 1 does not fit[/]: it needs "
                     f"{format_bytes(plan.points[0].total_bytes)}; lower the input size or use "
                     f"{levers} — `memcalc plan` traces and ranks them")
    else:
        state = "confirmed" if plan.confirmed else "NOT confirmed"
        if plan.max_batch_size in static:
            state = "STATIC lower bound, fit unknown: NOT confirmed"
        traced_there = any(point.batch_size == plan.max_batch_size for point in plan.points)
        next_on_line = any(point.batch_size == plan.max_batch_size + 1
                           and point.method == "line" for point in plan.points)
        lines.append(f"[bold]largest batch that fits: {plan.max_batch_size}[/] ({state} by "
                     + ("tracing it, the next one up on the traces' line" if next_on_line
                        else "tracing it and the next one up")
                     + ("" if traced_there or plan.confirmed else "; on the line") + ")")
    untrainable = {point.batch_size for point in plan.points if point.method == UNTRAINABLE}
    traced = ", ".join(
        f"{point.batch_size}: cannot train at this batch (its trace fails where larger ones "
        "trace: the model's own code refuses it)" if point.batch_size in untrainable else
        f"{point.batch_size}: {format_bytes(point.total_bytes)} {'fits' if point.fits else 'over'}"
        + (" (STATIC: the trace failed)" if point.batch_size in static else "")
        + (" (on the line)" if point.method == "line" else "")
        + _split_otherwise(point, plan.points)
        for point in plan.points)
    lines.append(f"{'estimated' if static else 'traced'} batches: {traced}")
    if device.window_plan is not None:
        lines.append(window_plan_text(device.window_plan))
    return Panel("\n".join(lines), title="Batch plan", title_align="left")


def _split_otherwise(point: PlanPoint, points: list[PlanPoint]) -> str:
    """Why ``point`` needs more than a larger batch that allocates more, where one does: the
    caching allocator's replay splits its blocks otherwise there (fragmentation), so the
    least memory the step runs in is not monotonic in the batch. Differences within the
    least-limit search's tolerance are not remarked on."""
    slack = tolerance_bytes(point.total_bytes)
    larger = [other for other in points if other.batch_size > point.batch_size
              and other.total_bytes + slack < point.total_bytes
              and None not in (other.allocated_bytes, point.allocated_bytes)
              and other.allocated_bytes > point.allocated_bytes]
    if not larger or point.method in ("static", UNTRAINABLE):
        return ""
    return (f" (more than batch {larger[0].batch_size} needs, which allocates more: the caching "
            "allocator's blocks split otherwise at this batch and strand free memory)")


def _top_modules_table(report: Report, rows: int | None) -> Table:
    """Modules by the activation bytes they made themselves: each tensor is counted once, in
    the innermost module running when it was made, so a parent's row holds only its own
    tensors (a residual add, a concatenation), never its children's again."""
    table = Table(title="Top modules at the peak", title_justify="left",
                  caption="own: each tensor once, in the innermost module that made it",
                  caption_justify="left")
    table.add_column("module")
    table.add_column("own activations", justify="right")
    for row in report.device.top_modules[:rows]:
        table.add_row(row.module or "(the model's own forward)", format_bytes(row.activation_bytes))
    return table


def _static_table(report: Report) -> Table:
    static = report.static
    table = Table(title="Static count (no trace)", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    for name, nbytes in (
        ("parameters", static.parameter_bytes), ("buffers", static.buffer_bytes),
        ("gradients", static.gradient_bytes), ("optimizer state", static.optimizer_state_bytes),
        ("optimizer step counters", static.optimizer_step_counter_bytes),
        ("model states total", static.model_state_bytes),
        ("input batch", static.input_batch_bytes),
    ):
        table.add_row(name, format_bytes(nbytes))
    return table


def _layers_table(report: Report) -> Table:
    table = Table(title="Layers (torchinfo, batch of one)", title_justify="left")
    for column in ("layer", "type", "output shape", "params"):
        table.add_column(column, justify="right" if column == "params" else "left")
    for row in report.model.layers:
        table.add_row("  " * (row.depth - 1) + row.name, row.kind,
                      str(row.output_shape or "-"), f"{row.parameter_count:,}")
    return table


def fits_summary(report: Report) -> str:
    """One line for a check that passed: the GPU and host RAM needed and usable."""
    device, host, parallel = report.device, report.host, report.spec.parallel
    rank = parallel.per_gpu() if parallel else ""
    machine = host.spec.machine
    where = (f" (WARNING: this machine's, {machine.described()}, not the training node's: "
             "give --cpus and --ram)" if machine.detected else "")
    return (f"FITS: batch {device.batch_size}{rank} needs {format_bytes(device.total_bytes)} of "
            f"{format_bytes(device.usable_bytes)} usable; {counted(host.num_workers, 'worker')} "
            f"need{'s' if host.num_workers == 1 else ''} {format_bytes(host.peak_bytes)} of host "
            f"RAM{where}" + verdict_warnings(report))
