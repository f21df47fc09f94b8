"""``memcalc`` command line: parse, call the estimator, render. No logic of its own."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

import click
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.table import Table

from memcalc.cli.options import (
    VERIFY_OPTION,
    feed_options,
    host_options,
    loader_and_machine,
    model_options,
    job_spec,
    variant_progress,
    command_progress,
    worker_told,
)
from memcalc.cli.calibrate import calibrate
from memcalc.cli.job_options import job_options
from memcalc.cli.job_file import (
    SPEC_OPTION,
    explicit_options,
    host_fields,
    merged_spec,
    read_job_file,
)
from memcalc.cli.deadline import timeout_option
from memcalc.cli.guard import run_guarded as _run_guarded
from memcalc.cli.output import echo, out
from memcalc.cli.types import CountListType, FiniteFloatRange, ShapeType, enum_choice
from memcalc.device.gpus import gpu_catalog
from memcalc.render.plot import check_plot_path, plot_report
from memcalc.specs import MAX_BATCH_SIZE, DeviceKind
from memcalc.strategies.specs import (
    DEFAULT_RANK_TRACES,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_RANK_TRACES_ASKED,
    Interconnect,
    Strategy,
)
from memcalc.units import format_bytes, format_count
from memcalc.model.zoo_catalog import zoo_rows

UNTRACED_EXIT_CODE = 3
"""``check`` and ``plan``: the step could not be traced, so whether it fits is unknown."""


@click.group(invoke_without_command=True)
@click.version_option(package_name="torch-memcalc", prog_name="memcalc")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """memcalc: memory of a PyTorch training step, predicted before launch without a GPU.

    \b
    Exit codes: 0 done/fits, 1 does not fit, 2 bad input, 3 fit unknown (static estimate),
    4 your code (builder, Dataset) failed, 70 memcalc failed, 130 interrupted, 141 pipe closed,
    143 terminated.
    """
    ctx.obj = {"debug": debug}
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_usage(), err=True)
        click.echo("Error: no command given; `memcalc --help` lists them (estimate, check, "
                   "plan, host, feed, …)", err=True)
        ctx.exit(2)


@main.command()
@model_options
@job_options
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG: breakdown, memory vs batch, timeline, top modules.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@click.option("--layers", "show_layers", is_flag=True, help="Also print the per-layer table.")
@click.option("--details", is_flag=True,
              help="Every table: static count, host arithmetic, assumptions, not modelled.")
@feed_options
@host_options
@VERIFY_OPTION
@timeout_option
@click.pass_context
def estimate(ctx, plot_path, as_json, show_layers, details, verify, **options) -> None:
    """Memory of one training step: peak, breakdown, top modules; with a GPU, the largest
    batch; host RAM and the DataLoader workers that fit."""
    from memcalc.host.verify import require_dataset, with_verify
    from memcalc.pipeline import estimate as run_estimate
    from memcalc.render.terminal import report_renderable
    from memcalc.render.verdict import estimate_verdict

    def work():
        plot_target = None if plot_path is None else check_plot_path(plot_path)  # before work
        spec = job_spec(ctx, options)
        if verify:
            require_dataset(spec.loader)
        with command_progress(f"estimate {spec.model}"):
            report = run_estimate(spec, worker_told)
            if verify:
                report = report.model_copy(update={"host": with_verify(report.host,
                                                                       worker_told)})
        _show(report, as_json, partial(report_renderable, show_layers=show_layers,
                                             details=details), estimate_verdict)
        if plot_target:   # after the report is out: a failed write does not lose it
            plot_report(report, plot_target)
            if not as_json:
                echo(f"plot written to {plot_path}")

    _run_guarded(ctx, work)


@main.command()
@model_options
@job_options
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@click.option("--fixes", is_flag=True,
              help="Where the batch does not fit: confirm the largest batch that does and plan "
                   "the cheapest fixes (a plan's traces; without it: one trace, two where it "
                   "does not fit).")
@feed_options
@host_options
@timeout_option
@click.pass_context
def check(ctx, as_json, fixes, **options) -> None:
    """Exit 0 when --batch-size (and --num-workers) fit the GPU and host, 1 when not, 3 when
    the step could not be traced (fit unknown: a static count never says "fits")."""
    from memcalc.api import check_spec
    from memcalc.errors import MemoryBudgetError, UntracedEstimateError
    from memcalc.render.terminal import fits_summary

    def work():
        spec = job_spec(ctx, options)
        try:
            with command_progress(f"check {spec.model} at batch {spec.batch_size}"):
                report = check_spec(spec, fixes)
        except MemoryBudgetError as error:
            if as_json:
                echo(error.report.model_dump_json(indent=2))
            click.echo(f"DOES NOT FIT: {str(error).removeprefix('does not fit: ')}", err=True)
            sys.exit(1)
        except UntracedEstimateError as error:
            if as_json:
                echo(error.report.model_dump_json(indent=2))
            click.echo(f"FIT UNKNOWN (STATIC): {str(error).removeprefix('fit unknown: ')}",
                       err=True)
            sys.exit(UNTRACED_EXIT_CODE)
        _show(report, as_json, fits_summary)

    _run_guarded(ctx, work)


@main.command()
@model_options
@click.option("--gpus", "gpus_per_node", type=click.IntRange(min=1, max=MAX_GPUS_PER_NODE),
              default=1, show_default=True, help="GPUs per node the job may use.")
@click.option("--nodes", type=click.IntRange(min=1, max=MAX_NODES), default=1, show_default=True)
@click.option("--global-batch", type=click.IntRange(min=1),
              help="Samples per optimizer step to reach (gradient accumulation fills the gap).")
@click.option("--interconnect", type=enum_choice(Interconnect), default="nvlink", show_default=True,
              help="Link between the GPUs of a node; InfiniBand between nodes.")
@click.option("--bucket-view", is_flag=True, help="DDP gradient_as_bucket_view=True.")
@click.option("--max-gpus", type=click.IntRange(min=1, max=MAX_GPUS_PER_NODE * MAX_NODES),
              default=512, show_default=True,
              help="With one GPU given: how many GPUs a strategy may ask for (1: this GPU only).")
@click.option("--strategy", "forced", type=enum_choice(Strategy), help="Recommend this strategy.")
@click.option("--compile-levers", is_flag=True,
              help="Also trace torch.compile as a lever (compile, mixed-precision+compile); "
                   "slower: each of their traces captures the graphs again.")
@click.option("--rank-traces", type=click.IntRange(min=0, max=MAX_RANK_TRACES_ASKED),
              default=DEFAULT_RANK_TRACES, show_default=True,
              help="Most distributed rows traced as one rank of the job (0: closed forms "
                   "only, a quicker screen).")
@click.option("--emit", type=click.Choice(["slurm", "torchrun", "train"]),
              help="Print only the launch file for the recommended strategy (train: a "
                   "train.py skeleton with its wrapping, precision and batch sizes).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON plan.")
@click.option("--wide", is_flag=True,
              help="Full strategy names and every candidate (the default fits 80 columns).")
@feed_options
@host_options
@timeout_option
@click.pass_context
def plan(ctx, *, gpus_per_node, nodes, global_batch, interconnect, bucket_view, max_gpus, forced,
         compile_levers, rank_traces, emit, as_json, wide, **options) -> None:
    """Which strategy to use: each traced or derived, ranked, with launch files. Exits 1 when
    nothing fits, 3 when the plan rests on a static count (the step could not be traced)."""
    from memcalc.api import plan_spec
    from memcalc.render.plan import plan_renderable
    from memcalc.render.verdict import plan_verdict
    from memcalc.strategies.plan_text import STATIC_PLAN
    from memcalc.strategies import ClusterSpec

    def work():
        spec = job_spec(ctx, options)
        cluster = ClusterSpec(gpus_per_node=gpus_per_node, nodes=nodes, global_batch=global_batch,
                              interconnect=interconnect, mfu=spec.feed.mfu,
                              gradient_as_bucket_view=bucket_view, strategy=forced,
                              max_gpus=max_gpus, compile_levers=compile_levers,
                              rank_traces=rank_traces, launch_only=bool(emit))
        with variant_progress() as on_variant:
            result = plan_spec(spec, cluster, on_variant)
        static = result.reason.startswith(STATIC_PLAN)
        if static:
            click.echo(f"FIT UNKNOWN (STATIC): {result.reason.split(': ')[0]}: this plan "
                       f"{'and its launch file rest' if emit else 'rests'} on a static count",
                       err=True)
        if emit and result.recommended is None:
            click.echo(f"DOES NOT FIT: no launch file to emit: {result.reason}", err=True)
        elif emit == "torchrun":
            echo(result.torchrun or "")
        elif emit == "train":
            echo(result.train_script or "")
        elif emit == "slurm":
            echo("\n".join(result.slurm or []))
        else:
            _show(result, as_json, partial(plan_renderable, wide=wide), plan_verdict)
        if result.recommended is None:
            sys.exit(1)
        if static:
            sys.exit(UNTRACED_EXIT_CODE)

    _run_guarded(ctx, work)


@main.command()
@click.option("--shape", type=ShapeType(), help="Per-sample shape as the Dataset yields it.")
@click.option("--batch-size", type=click.IntRange(min=1, max=MAX_BATCH_SIZE), default=1,
              show_default=True)
@click.option("--device", type=enum_choice(DeviceKind), default="cuda", show_default=True,
              help="Where training runs (cuda adds the CUDA host context and pinning).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@SPEC_OPTION
@host_options
@VERIFY_OPTION
@timeout_option
@click.pass_context
def host(ctx, shape, batch_size, device, as_json, spec_file, verify, **host_options) -> None:
    """Host RAM of the training process and the DataLoader workers that fit (no model)."""
    from memcalc.host import HostSpec, host_estimate, measured_host_estimate
    from memcalc.host.verify import require_dataset, with_verify
    from memcalc.render.host import host_renderable
    from memcalc.render.verdict import host_verdict

    def work():
        fields = host_fields(read_job_file(spec_file)) if spec_file else {}
        loader, machine = loader_and_machine(host_options)
        spec = HostSpec(sample_shape=shape or fields.get("sample_shape"), batch_size=batch_size,
                        loader=loader, machine=machine, cuda=device == DeviceKind.CUDA.value)
        if spec_file:
            explicit = explicit_options(ctx)
            if "device" in explicit:
                fields["cuda"] = spec.cuda
            spec = merged_spec(HostSpec, spec, fields, explicit, spec_file)
        if verify:
            require_dataset(spec.loader)
        with command_progress("host"):
            report = (measured_host_estimate(spec, progress=worker_told) if spec.loader.dataset
                      else host_estimate(spec))
            if verify:
                report = with_verify(report, worker_told)
        _show(report, as_json, host_renderable, host_verdict)

    _run_guarded(ctx, work)


@main.command()
@click.option("--dataset", required=True, help="package.module:callable returning your Dataset.")
@click.option("--step-time", type=FiniteFloatRange(min=0, min_open=True), required=True,
              help="Seconds the simulated GPU takes per batch.")
@click.option("--batch-size", type=click.IntRange(min=1, max=MAX_BATCH_SIZE), default=1,
              show_default=True)
@click.option("--workers", "counts", type=CountListType(), default="0,1,2", show_default=True,
              help="Worker counts to run, comma separated.")
@click.option("--batches", type=click.IntRange(min=2), default=20, show_default=True,
              help="Batches timed per worker count (after warm-up).")
@click.option("--cpus", type=click.IntRange(min=1), help="CPUs [default: detected].")
@click.option("--consumer", type=click.Choice(["spin", "sleep"]), default="spin",
              show_default=True,
              help="How the simulated step passes its time: spin a core (a training process "
                   "waiting on CUDA) or sleep.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result.")
@timeout_option
@click.pass_context
def feed(ctx, *, dataset, step_time, batch_size, counts, batches, cpus, consumer,
         as_json) -> None:
    """Run the real DataLoader against a simulated GPU: measured vs predicted utilisation."""
    from memcalc.feed.check import check_feed_dataset, feed_check
    from memcalc.host import LoaderSpec, detect_machine, measure_worker
    from memcalc.host.malloc_thresholds import churn_warning
    from memcalc.render.feed import feed_renderable
    from memcalc.render.verdict import feed_verdict

    def work():
        loaded = check_feed_dataset(dataset, batch_size, counts, batches)   # before measuring
        with command_progress(f"feed {dataset}"):
            sample = measure_worker(LoaderSpec(dataset=dataset, probe_seconds=15), batch_size,
                                    progress=worker_told)
            result = feed_check(dataset, batch_size, step_time, counts,
                                seconds_per_sample=sample.feeding_seconds_per_sample,
                                cpus=cpus or detect_machine().cpus, batches=batches,
                                consumer=consumer, dataset=loaded)
            churning = churn_warning(sample)
            if churning:
                result = result.model_copy(update={"warnings": result.warnings + [churning]})
        _show(result, as_json, feed_renderable, feed_verdict)

    _run_guarded(ctx, work)


def _show(report: BaseModel, as_json: bool,
          render: Callable[[BaseModel], RenderableType | str],
          verdict: Callable[[BaseModel], str] | None = None) -> None:
    """A command's result: the indented JSON with ``--json``, else its verdict line first
    (unwrapped) and what ``render`` draws (text is echoed as it is: rich would wrap it and
    read its brackets as markup)."""
    if as_json:
        echo(report.model_dump_json(indent=2))
        return
    if verdict is not None:
        echo(verdict(report))
    shown = render(report)
    if isinstance(shown, str):
        echo(shown)
    else:
        Console(file=out()).print(shown)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def gpus(as_json: bool) -> None:
    """List the GPU catalog: memory, compute capability, peak rates, bandwidth."""
    def cells(row) -> list[str]:
        rates = [row.fp32_tflops, row.tf32_tflops, row.bf16_tflops, row.fp16_tflops]
        return [row.name, format_bytes(row.memory_bytes), row.compute_capability,
                *("-" if rate is None else f"{rate:g}" for rate in rates),
                f"{row.memory_bandwidth_gbps:g}"]

    _print_rows(gpu_catalog(), as_json, "memcalc GPU catalog (dense peak TFLOP/s)",
                ("name", "memory", "cc", "fp32", "tf32", "bf16", "fp16", "GB/s"), cells,
                right_aligned=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the zoo as JSON.")
def models(as_json: bool) -> None:
    """List the model zoo with parameter counts and default sample shapes."""
    def cells(row) -> list[str]:
        return [row.name, format_count(row.parameter_count), ",".join(map(str, row.default_shape)),
                row.input_dtype, row.description, " ".join(row.arguments)]

    _print_rows(zoo_rows(), as_json, "memcalc model zoo",
                ("name", "parameters", "default shape", "input dtype", "description",
                 "--model-arg (default)"), cells)


def _print_rows(rows, as_json: bool, title: str, columns: tuple[str, ...], cells,
                right_aligned: bool = False) -> None:
    """A catalog command's output: a JSON list of the rows, or a table of ``cells(row)``."""
    if as_json:
        echo("[" + ",\n".join(row.model_dump_json() for row in rows) + "]")
        return
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="right" if right_aligned and index else "left")
    for row in rows:
        table.add_row(*cells(row))
    Console(file=out()).print(table)


main.add_command(calibrate)
