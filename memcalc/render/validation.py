"""The job's validation step on the terminal and in notebooks: how it runs, what it needs on
the GPU and in host RAM, and whether each fits. Formatting only."""

from __future__ import annotations

from rich.panel import Panel

from memcalc.device.report import DeviceReport, WindowPlan
from memcalc.eval_specs import SlidingWindowSpec
from memcalc.host.report import HostReport
from memcalc.report.models import Report
from memcalc.units import format_bytes

_FITS = {True: "fits", False: "[bold red]DOES NOT FIT[/]", None: "fit unknown (no --gpu)"}


def validation_lines(report: Report) -> list[str]:
    """Plain lines (rich markup aside) for the validation step; empty when there is none."""
    device, host = report.validation, report.validation_host
    if device is None:
        return []
    spec = report.spec
    shape = "×".join(map(str, spec.eval_sample_shape or ()))
    how = (f"batch {device.batch_size} of {shape} under {spec.eval_grad_mode.value}, the "
           "optimizer's state resident" + _window_text(spec.sliding_window))
    method = "TRACED" if device.method == "traced" else "STATIC (not traced)"
    lines = [how, _gpu_line(device, method)]
    if host is not None:
        lines.append(_host_line(host, device))
    return lines


def validation_renderable(report: Report) -> Panel:
    return Panel("\n".join(validation_lines(report)), title="Validation step",
                 title_align="left")


def _window_text(window: SlidingWindowSpec | None) -> str:
    if window is None:
        return "; the model on the whole volume at once"
    roi = "×".join(map(str, window.roi))
    return (f"\nsliding window {roi}, {window.sw_batch_size} per forward, overlap "
            f"{window.overlap:g}, {window.mode.value}; volume on the {window.volume_device.value}, "
            f"output aggregated on the {window.aggregated_on.value}")


def _gpu_line(device: DeviceReport, method: str) -> str:
    parts = [f"GPU: [bold]{format_bytes(device.total_bytes)}[/] ({method}; allocated "
             f"{format_bytes(device.peak_allocated_bytes)}"
             + (f", reached in {device.peak_phase}" if device.peak_phase else "") + ")"]
    if device.capacity_bytes is not None:
        usable = device.usable_bytes
        parts.append(f"of {format_bytes(usable)} usable: {_FITS[device.fits]}")
        if device.max_batch_size is not None:
            parts.append(f"largest validation batch {device.max_batch_size}")
    line = ", ".join(parts)
    return line + (f"\n{window_plan_text(device.window_plan)}" if device.window_plan else "")


def window_plan_text(plan: WindowPlan) -> str:
    """The largest ``sw_batch_size`` that fits, and the window batches traced for it."""
    traced = ", ".join(f"{point.sw_batch_size}: {format_bytes(point.total_bytes)} "
                       f"{'fits' if point.fits else 'over'}" for point in plan.points)
    answer = (f"[bold]largest sw_batch_size that fits: {plan.max_sw_batch_size}[/] of "
              f"{plan.windows} windows" if plan.max_sw_batch_size else
              "[bold red]not even one window per forward fits[/]")
    return f"{answer} (traced: {traced})"


def _host_line(host: HostReport, device: DeviceReport) -> str:
    kept = (f", {format_bytes(device.host_tensor_bytes)} of it the step's tensors on the CPU"
            if device.host_tensor_bytes else "")
    verdict = "fits" if host.fits else "[bold red]DOES NOT FIT[/]"
    return (f"host RAM: [bold]{format_bytes(host.peak_bytes)}[/] at num_workers="
            f"{host.num_workers} (volumes of {format_bytes(host.sample_bytes)}{kept}) of "
            f"{format_bytes(host.usable_bytes)} usable: {verdict}")
