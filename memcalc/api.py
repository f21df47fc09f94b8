"""Library entry points with plain arguments, for training scripts and notebooks.

``model`` is a zoo name, ``package.module:callable``, a factory returning an ``nn.Module``,
or an ``nn.Module`` instance (traced as a meta twin: its real weights are never copied or
moved). Other keyword arguments are ``TrainingSpec`` fields (``optimizer``, ``precision``,
``gpu``, ``loader``, ``machine``, ``feed``...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from pydantic import ValidationError
from torch import nn

from memcalc.process_defaults import (
    caller_process_kept, default_start_method_kept, resource_tracker_kept)
from memcalc.api_errors import argument_error
from memcalc.errors import InputError, MemoryBudgetError, UntracedEstimateError
from memcalc.isolation import DEFAULT_TIMEOUT_S, estimate_isolated
from memcalc.model.source import model_reference, resolve_model
from memcalc.pipeline import BatchSearch
from memcalc.pipeline import estimate as estimate_spec
from memcalc.pipeline import planner_estimate
from memcalc.pipeline import training_step_flops
from memcalc.progress import announce
from memcalc.device.report import BatchPlan, DeviceReport
from memcalc.report.models import Report
from memcalc.report_pool import ReportPool, workers_for
from memcalc.specs import StepPhase, TrainingSpec
from memcalc.strategies import ClusterSpec, StrategyPlan, VariantEstimator, plan_strategies
from memcalc.strategies.report_cache import ReportCache
from memcalc.strategies.specs import DEFAULT_RANK_TRACES
from memcalc.strategies.variants import planned_spec
from memcalc.units import counted, format_bytes

ModelLike = str | nn.Module | Callable[..., nn.Module]
FIXES_SHOWN = 3


_OWN_PARAMETERS = ("model", "sample_shape", "batch_size", "isolate", "timeout_s", "gpus",
                   "nodes", "global_batch", "max_gpus", "compile_levers", "num_workers")


def training_spec(name: str, sample_shape: tuple[int, ...] | None = None,
                  **options: Any) -> TrainingSpec:
    """The spec for a model name (see ``model_reference`` for model objects); a bad or
    unknown argument is one ``InputError`` naming it."""
    shape = _shape_tuple(sample_shape)
    try:
        return TrainingSpec(model=name, sample_shape=shape, **options)
    except ValidationError as error:
        raise argument_error(error, (TrainingSpec,), _OWN_PARAMETERS) from None


def estimate(model: ModelLike, sample_shape: tuple[int, ...] | None = None, *,
             batch_size: int | None = None, isolate: bool = False,
             timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any) -> Report:
    """Memory of one training step (and, with ``gpu``/``gpu_memory_bytes``, the largest batch;
    host RAM and DataLoader workers always).

    Args:
        model: a zoo name, ``"package.module:callable"``, a factory returning an
            ``nn.Module``, or an ``nn.Module`` (a meta twin is traced; its weights stay put).
        sample_shape: one sample without the batch axis, e.g. ``(3, 224, 224)``; the zoo
            model's own when left out.
        batch_size: the batch to report; with a capacity and no batch, the largest that fits.
        isolate: trace in a child process, so a crash in the model's code cannot kill a
            notebook kernel (a script then needs an ``if __name__ == "__main__":`` guard).
        timeout_s: the child's limit with ``isolate=True``.
        **options: fields of ``TrainingSpec`` (the JSON report's ``spec``): ``gpu="T4"``,
            ``precision="bf16-mixed"``, ``optimizer="adamw"``, ``checkpointing=True``,
            ``machine={"cpus": 16, "ram_bytes": 128 << 30}``...

    Returns:
        The ``Report``: ``report.device`` (``total_bytes``, ``fits``, ``max_batch_size``,
        the breakdown), ``report.host``, ``report.assumptions``, ``report.unsupported``.

    Raises:
        InputError: a bad or unknown argument, named with what is accepted.
        ModelSourceError: the model cannot be found, imported or built.

    Example:
        >>> report = memcalc.estimate("resnet50", (3, 224, 224), gpu="A100-80GB")
        >>> report.device.max_batch_size
        919
    """
    with caller_process_kept(), model_reference(model) as name:
        spec = training_spec(name, sample_shape, batch_size=batch_size, **options)
        return estimate_isolated(spec, timeout_s) if isolate else estimate_spec(spec)


def plan(model: ModelLike, sample_shape: tuple[int, ...] | None = None, *, gpu: str,
         gpus: int = 1, nodes: int = 1, global_batch: int | None = None, max_gpus: int = 512,
         compile_levers: bool = False, rank_traces: int = DEFAULT_RANK_TRACES,
         **options: Any) -> StrategyPlan:
    """Every strategy (mixed precision, checkpointing, offloading, DDP, FSDP, pipelines,
    spatial parallelism...) with its peak per GPU, batch and speed, ranked.

    Args:
        model: as for ``estimate``.
        sample_shape: as for ``estimate``.
        gpu: the card, a name from ``memcalc gpus``.
        gpus: GPUs per node.
        nodes: nodes of the job.
        global_batch: the global batch the job needs, when it has one.
        max_gpus: the most GPUs one may ask for.
        compile_levers: also trace torch.compile as a lever (a slower plan).
        rank_traces: most distributed rows traced as one rank of the job (0: closed forms).
        **options: ``TrainingSpec`` fields, as for ``estimate``.

    Returns:
        The ``StrategyPlan``: ``candidates`` best first, ``recommended``, ``assumptions``.
    """
    try:
        cluster = ClusterSpec(gpus_per_node=gpus, nodes=nodes, global_batch=global_batch,
                              max_gpus=max_gpus, compile_levers=compile_levers,
                              rank_traces=rank_traces)
    except ValidationError as error:
        raise argument_error(error, (ClusterSpec,)) from None
    with caller_process_kept(), model_reference(model) as name:
        return plan_spec(training_spec(name, sample_shape, gpu=gpu, **options), cluster)


def plan_spec(spec: TrainingSpec, cluster: ClusterSpec,
              on_variant: Callable[[TrainingSpec], None] | None = None, *,
              workers: int | None = None,
              known: Sequence[tuple[TrainingSpec, Report]] = ()) -> StrategyPlan:
    """``plan`` for a spec and a cluster: every variant traced by ``memcalc.pipeline``;
    ``on_variant`` is told of each variant before it is estimated (a progress display).
    ``workers``: processes making independent variants at once (None: one per core that
    nothing else keeps busy, ``memcalc.report_pool.workers_for``; 0: this process only),
    none for user code (``serial_reason``). The plan is the same either way. ``known``:
    reports already made for some of its variants' specs (by ``pipeline_estimator``'s
    rules), not made again."""
    with (resource_tracker_kept(), default_start_method_kept(),
          ReportPool(workers_for(spec, workers)) as pool):
        pool.start()    # the workers start up while this process traces the job as given
        return plan_strategies(spec, cluster, pipeline_estimator(on_variant, pool, known))


def _shape_tuple(sample_shape: Any) -> tuple[int, ...] | None:
    """A per-sample shape as a tuple; a bare number or a string is refused, not unpacked."""
    if sample_shape is None:
        return None
    if isinstance(sample_shape, (str, bytes)) or not hasattr(sample_shape, "__iter__"):
        raise InputError(f"sample_shape={sample_shape!r}: give the per-sample shape as a tuple "
                         f"of ints, e.g. ({sample_shape!s},) or (3, 224, 224)")
    return tuple(sample_shape)


def pipeline_estimator(on_variant: Callable[[TrainingSpec], None] | None = None,
                       pool: ReportPool | None = None,
                       known: Sequence[tuple[TrainingSpec, Report]] = ()) -> VariantEstimator:
    """The strategy planner's estimator for one plan: the pipeline's reports, each spec's
    made once (``ReportCache``; torchinfo's tables shared across the variants) and, with a
    ``pool`` of workers, independent ones made at once; FLOPs; the model on the meta device."""
    report = partial(planner_estimate, layer_tables={})
    if on_variant is not None:
        report = partial(_announced, report, on_variant)
    workers = pool is not None and pool.workers > 0
    cache = ReportCache(report, ahead=pool.take if workers else None)
    for spec, made in known:
        cache.keep(spec, made)
    estimator = VariantEstimator(report=cache.report, flops=training_step_flops,
                                 model=_meta_model)
    if not workers:
        return estimator
    return replace(estimator, prefetch=partial(pool.ahead, cache, on_variant))


def _announced(report: Callable[[TrainingSpec], Report],
               on_variant: Callable[[TrainingSpec], None], spec: TrainingSpec) -> Report:
    on_variant(spec)
    return report(spec)


def _meta_model(spec: TrainingSpec) -> nn.Module:
    return resolve_model(spec.model, spec.model_args).build_meta()


def check(model: ModelLike, sample_shape: tuple[int, ...] | None = None, *, batch_size: int,
          gpu: str | None = None, gpu_memory_bytes: int | None = None,
          num_workers: int | None = None, fixes: bool = False, **options: Any) -> Report:
    """The report when ``batch_size`` (and ``num_workers``) fit the GPU and the host.

    Args:
        model: as for ``estimate``.
        sample_shape: as for ``estimate``.
        batch_size: the batch to check.
        gpu: the card (or give ``gpu_memory_bytes``).
        gpu_memory_bytes: the capacity in bytes, instead of a card.
        num_workers: the DataLoader workers to check on the host.
        fixes: where the batch does not fit, search the largest batch that does (by tracing,
            confirmed) and plan the cheapest fixes (mixed precision, checkpointing, more
            GPUs...): a plan's traces. Without it the answer takes one trace, two where the
            batch does not fit (about the largest batch, on the line through it and batch 1).
        **options: ``TrainingSpec`` fields, as for ``estimate``.

    Raises:
        MemoryBudgetError: it does not fit; the message has the numbers (and with
            ``fixes`` the cheapest fixes that fit), ``error.report`` and ``error.plan`` the
            details.
        UntracedEstimateError: the step could not be traced; a static count never shows
            that a batch fits.
        InputError: a bad argument, or no capacity given.
    """
    if gpu is None and gpu_memory_bytes is None:
        raise InputError("check needs a capacity: give gpu='A100-80GB' (see `memcalc gpus`) or "
                         "gpu_memory_bytes")
    loader = dict(options.pop("loader", {}) or {})
    if num_workers is not None:
        loader["num_workers"] = num_workers
    with caller_process_kept(), model_reference(model) as name:
        spec = training_spec(name, sample_shape, batch_size=batch_size, gpu=gpu,
                             gpu_memory_bytes=gpu_memory_bytes, loader=loader, **options)
        return check_spec(spec, fixes)


def check_spec(spec: TrainingSpec, fixes: bool = False) -> Report:
    """``check`` for a spec with a batch size and a capacity; ``fixes`` as for ``check``."""
    if spec.batch_size is None or (spec.gpu is None and spec.gpu_memory_bytes is None):
        raise InputError("check needs a batch size and a capacity: give --batch-size and "
                         "--gpu NAME or --gpu-memory SIZE")
    # whether the batch fits needs one trace; about the largest batch, one more where it
    # does not; the searched largest batch and the fixes only where asked
    report = estimate_spec(spec, batch_search=BatchSearch.NONE if fixes else BatchSearch.BELOW)
    searched = None
    if report.device.fits is False and fixes:
        announce(f"{_verdict(report)}; searching the largest batch that fits")
        planned = planned_spec(spec)
        searched = (planned, estimate_spec(planned, layer_tables={}, card_fits=False))
        report = report.model_copy(update={"device": report.device.model_copy(
            update={"plan": searched[1].device.plan})})
    problems = _problems(report)
    untraced = [device for device in (report.device, report.validation)
                if device is not None and device.method != "traced"]
    if untraced and not problems:    # nor does a static validation step show that it fits
        raise UntracedEstimateError(_untraced_message(report, untraced[0]), report=report)
    if not problems:
        return report
    # the planner varies a one-GPU job; a distributed layout is checked as given
    plannable = bool(spec.gpu and report.device.fits is False and spec.parallel is None
                     and spec.phase is StepPhase.TRAIN)
    fixes = fixes and plannable
    if fixes:
        announce(f"{_verdict(report)}; planning the cheapest fixes")
    # the plan's job as given is the batch search just made: not made again
    strategies = plan_spec(spec, ClusterSpec(), known=[searched] if searched else []) \
        if fixes else None
    raise MemoryBudgetError(_message(problems, strategies, plannable), report=report,
                            plan=strategies)


def _verdict(report: Report) -> str:
    """What the first trace of a check said, before the search: ``DOES NOT FIT: …``."""
    device = report.device
    return (f"DOES NOT FIT: batch {device.batch_size} needs {format_bytes(device.total_bytes)}, "
            f"{format_bytes(device.usable_bytes)} usable")


def _untraced_message(report: Report, device: DeviceReport) -> str:
    step = "validation" if device is report.validation else "training"
    why = report.trace_failure
    return (f"fit unknown: the {step} step could not be traced ({why or 'see the report'}); "
            f"the static lower bound for batch {device.batch_size} is "
            f"{format_bytes(device.total_bytes)} of {format_bytes(device.usable_bytes)} "
            "usable, which does not show that it fits")


def _problems(report: Report) -> list[str]:
    device, host, problems = report.device, report.host, []
    if device.fits is False:
        largest = device.max_batch_size
        parallel = report.spec.parallel
        rank = parallel.per_gpu() if parallel else ""
        problems.append(
            f"batch {device.batch_size}{rank} needs {format_bytes(device.total_bytes)} on the GPU, "
            f"{format_bytes(device.usable_bytes)} usable"
            + (f" (largest batch that fits: {_largest_text(device.plan)})" if largest
               else f" (not even batch {device.plan.fit_batches[0] if device.plan else 1} fits)"))
    validation = report.validation
    if validation is not None and validation.fits is False:
        problems.append(f"validation batch {validation.batch_size} needs "
                        f"{format_bytes(validation.total_bytes)} on the GPU, "
                        f"{format_bytes(validation.usable_bytes)} "
                        "usable")
    validation_host = report.validation_host
    if validation_host is not None and not validation_host.fits:
        problems.append(f"validation needs {format_bytes(validation_host.peak_bytes)} of host "
                        f"RAM at {counted(validation_host.num_workers, 'DataLoader worker')}, "
                        f"{format_bytes(validation_host.usable_bytes)} usable")
    # a machine detected here is often a login node: its host plan warns, it does not fail
    if host is not None and not host.fits and not host.spec.machine.detected:
        problems.append(f"{counted(host.num_workers, 'DataLoader worker')} need "
                        f"{format_bytes(host.peak_bytes)} of host RAM, "
                        f"{format_bytes(host.usable_bytes)} usable (at most "
                        f"{counted(host.max_num_workers, 'worker')} fit)")
    return problems


def _largest_text(plan: BatchPlan) -> str:
    if plan.confirmed:
        return str(plan.max_batch_size)
    low, high = plan.fit_batches
    return f"about {plan.max_batch_size}, on the line through traced batches {low} and {high}"


def _message(problems: list[str], strategies: StrategyPlan | None, plannable: bool) -> str:
    text = "does not fit: " + "; ".join(problems)
    if strategies is None and plannable:
        text += "; --fixes (fixes=True) confirms the largest batch and plans the cheapest fixes"
    if strategies is not None:
        fitting = [c for c in strategies.candidates if c.fits][:FIXES_SHOWN]
        if fitting:
            text += "; cheapest fixes: " + ", ".join(
                f"{c.label} on {c.gpus} GPU{'s' if c.gpus > 1 else ''} "
                f"(batch {c.max_batch_size}/GPU, {format_bytes(c.per_gpu_peak_bytes)})"
                for c in fitting)
        elif strategies.largest_sample_shape:
            text += (f"; no strategy fits this sample: crops up to "
                     f"{strategies.largest_sample_shape} fit ({strategies.largest_sample_strategy})")
    return text
