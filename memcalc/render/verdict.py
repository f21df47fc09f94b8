"""The first line of every command: the answer to the question it was asked, with its
numbers (estimate and check: does it fit; plan: what to run; host: do the workers fit in
RAM; feed: how busy the loader keeps the GPU)."""

from __future__ import annotations

from memcalc.eval_specs import StepPhase
from memcalc.device.gpus import find_gpu, gpu_catalog
from memcalc.feed.check import FeedCheck
from memcalc.host.report import HostReport
from memcalc.render.cards import batch_text
from memcalc.report.models import Report
from memcalc.strategies.report import StrategyPlan
from memcalc.units import format_bytes


def verdict_line(report: Report) -> str:
    """The step's verdict (``_step_verdict``); with a validation step in the job, its batch
    and bytes after it, which phase sets the job's peak, and DOES NOT FIT when only the
    validation step does not."""
    line, validation = _step_verdict(report) + verdict_warnings(report), report.validation
    if validation is None:
        return line
    fits = {True: "fits", False: "DOES NOT FIT", None: "fit unknown"}[validation.fits]
    if validation.method != "traced":
        fits = "FIT UNKNOWN (STATIC)"
    if validation.fits is False and line.startswith("FITS"):
        line = "DOES NOT FIT in validation; training" + line.removeprefix("FITS")
    elif validation.fits is None and validation.kind == "cuda" and fits == "fit unknown":
        smallest = _smallest_gpu(_least_total(validation))
        fits = f"smallest card {smallest.name}" if smallest else "more than any GPU"
    host = report.validation_host
    if host is not None and not host.fits:
        fits += f"; DOES NOT FIT in host RAM ({format_bytes(host.peak_bytes)})"
    sets = ("validation" if validation.total_bytes > report.device.total_bytes
            else "training")
    return (f"{line}; validation: batch {validation.batch_size} needs "
            f"{format_bytes(validation.total_bytes)}, {fits}; {sets} sets the job's peak")


def verdict_warnings(report: Report) -> str:
    """The lines under a verdict that say its figures, or the job, may not be what they
    seem: values read from tensors that took a default, a precision the card lacks."""
    return default_reads_warning(report) + precision_warning(report)


def precision_warning(report: Report) -> str:
    """A line when bf16 is asked of a card without bf16 tensor cores (before Ampere): PyTorch
    runs it, emulated in fp32 arithmetic, far slower than fp16-mixed."""
    spec = report.spec
    if spec.gpu is None or "bf16" not in spec.precision.value:
        return ""
    gpu = find_gpu(spec.gpu)
    if gpu.bf16_tflops:
        return ""
    return (f"\nWARNING: {gpu.name} (compute capability {gpu.compute_capability}) has no bf16 "
            f"tensor cores: --precision {spec.precision.value} runs emulated, at its fp32 "
            f"rate; fp16-mixed is its fast half precision (memory as traced here)")


def default_reads_warning(report: Report) -> str:
    """A second line when the traced step read tensor values that no rule covers: the work
    they drive (a loop count, a branch) may be skipped, so the figures can be low."""
    defaults = [use for use in report.device.bounded_sizes if not use.keeps_most_work]
    if not defaults:
        return ""
    reads = sum(use.count for use in defaults)
    values = ", ".join(sorted({use.bound.split(" ")[0] for use in defaults}))
    return (f"\nWARNING: {reads} value{'s' if reads != 1 else ''} read from tensors "
            f"(.item(), bool(), int()) took a default ({values}): a loop or branch they "
            "drive may skip work a real step does, so these figures can be LOW; --details")


def _least_total(device) -> int:
    """The least memory the step runs in (reserved + context) where it was searched, else
    its total."""
    if device.least_reserved_bytes is None:
        return device.total_bytes
    return device.least_reserved_bytes + device.context_bytes


def _smallest_gpu(total_bytes: int):
    """The catalog's smallest card of at least ``total_bytes``; None when none is."""
    fitting = [gpu for gpu in gpu_catalog() if gpu.memory_bytes >= total_bytes]
    return min(fitting, key=lambda gpu: gpu.memory_bytes) if fitting else None


def _step_verdict(report: Report) -> str:
    """FITS / DOES NOT FIT / FIT UNKNOWN (STATIC) with the batch, the bytes and the capacity
    (within 80 columns for the usual sizes); without a GPU, how the step compares with the
    cards in the catalog."""
    device, parallel = report.device, report.spec.parallel
    needs = (f"batch {device.batch_size}{parallel.per_gpu() if parallel else ''} needs "
             f"{format_bytes(device.total_bytes)}")
    if device.method != "traced":
        if parallel is not None:   # the static count is one GPU's, not a rank's share
            return (f"FIT UNKNOWN (STATIC): the rank of {parallel.describe()} could not be "
                    f"traced; one GPU's static count at batch {device.batch_size} is "
                    f"{format_bytes(device.total_bytes)} (not sharded)")
        return (f"FIT UNKNOWN (STATIC): {needs} or more (step not traced"
                + ("; no largest batch without a trace)" if device.capacity_bytes else ")"))
    if device.kind != "cuda":
        step = "evaluation" if report.spec.phase is StepPhase.EVAL else "training"
        return f"CPU {step}: {needs} of host RAM for the step"
    if device.capacity_bytes is None:
        least = _least_total(device)
        if least < device.total_bytes:
            needs += f" with room to spare, at least {format_bytes(least)}"
        return _against_cards(needs, device) or _against_catalog(needs, least)
    usable = format_bytes(device.usable_bytes)
    on = f" on {report.gpu.name}" if report.gpu else ""
    largest = device.max_batch_size
    verdict = "FITS" if device.fits else "DOES NOT FIT"
    if largest:
        lined = device.plan is not None and not device.plan.confirmed and (
            largest > max(device.plan.fit_batches))
        kind = ", on the line through traced batches " + " and ".join(
            map(str, device.plan.fit_batches)) if lined else ""
        return f"{verdict}{on}: {needs} / {usable} usable (max batch {largest}{kind})"
    return f"{verdict}{on}: {needs} / {usable} usable" + ("" if device.fits else "; memcalc plan")


def _against_cards(needs: str, device) -> str | None:
    """The largest batch on the smallest and the largest common card that take batch 1."""
    fitting = [fit for fit in device.card_fits if fit.max_batch_size]
    if not fitting:
        return None
    low, high = fitting[0], fitting[-1]
    span = (f"{batch_text(low.max_batch_size, low.confirmed)} on {low.gpu}"
            + (f" to {batch_text(high.max_batch_size, high.confirmed)} on {high.gpu}"
               if high is not low else ""))
    return f"{needs}; largest batch {span}; --gpu for a verdict"


def _against_catalog(needs: str, total_bytes: int) -> str:
    smallest = _smallest_gpu(total_bytes)
    if smallest is None:
        biggest = max(gpu_catalog(), key=lambda gpu: gpu.memory_bytes)
        return (f"DOES NOT FIT ANY GPU: {needs} ({biggest.name}: "
                f"{format_bytes(biggest.memory_bytes)}); memcalc plan")
    return (f"{needs}; smallest card for it: {smallest.name} "
            f"({format_bytes(smallest.memory_bytes)}); --gpu for a verdict")


def plan_verdict(plan: StrategyPlan) -> str:
    """The recommended strategy with its GPUs, batch and memory, or why nothing fits."""
    from memcalc.render.plan import samples_per_s_text, short_label

    chosen = next((c for c in plan.candidates if c.label == plan.recommended), None)
    if chosen is None:
        return f"NOTHING FITS: {plan.reason}"
    gpus = f"{chosen.gpus} GPU{'s' if chosen.gpus > 1 else ''}"
    at_job = ("" if chosen.job_batch_peak_bytes is None else
              f" (batch {plan.job_batch_size}: {format_bytes(chosen.job_batch_peak_bytes)})")
    per = "/GPU" if chosen.sample_group == 1 else f" per {chosen.sample_group} GPUs"
    return (f"PLAN: {short_label(chosen.label)} on {gpus}: batch {chosen.max_batch_size}{per} "
            f"needs {format_bytes(chosen.per_gpu_peak_bytes)} / "
            f"{format_bytes(plan.usable_bytes)} usable{at_job}, "
            f"{samples_per_s_text(chosen.samples_per_s)} samples/s")


def host_verdict(host: HostReport) -> str:
    """Whether the loader's host RAM fits, at the recommended worker count; with
    ``--verify``, the real run's line below it."""
    verdict = "FITS in host RAM" if host.fits else "DOES NOT FIT in host RAM"
    workers = ("1 worker needs" if host.num_workers == 1 else
               f"{host.num_workers} workers need")
    return (f"{verdict}: {workers} {format_bytes(host.peak_bytes)} / "
            f"{format_bytes(host.usable_bytes)} usable (max_num_workers "
            f"{host.max_num_workers})" + _verified(host))


def estimate_verdict(report: Report) -> str:
    """``verdict_line``, with ``--verify``'s line below it."""
    return verdict_line(report) + (_verified(report.host) if report.host else "")


def _verified(host: HostReport) -> str:
    from memcalc.render.host import verify_line

    return f"\n{verify_line(host.verify, host.peak_bytes)}" if host.verify is not None else ""


def feed_verdict(check: FeedCheck) -> str:
    """How far the feeding model is from the measured loader, and the best worker count."""
    worst = max(check.rows, key=lambda row: abs(row.predicted_gpu_utilization
                                                - row.measured_gpu_utilization))
    best = max(check.rows, key=lambda row: row.measured_gpu_utilization)
    points = 100 * abs(worst.predicted_gpu_utilization - worst.measured_gpu_utilization)
    return (f"MEASURED: GPU busy {best.measured_gpu_utilization:.0%} at best "
            f"({best.num_workers} worker{'' if best.num_workers == 1 else 's'}); the model is "
            f"within {points:.0f} points at every count")
