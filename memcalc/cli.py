"""``memcalc`` command line: parse, call the estimator, render. No logic of its own."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from memcalc.cuda_overheads import ModuleLoading
from memcalc.errors import InputError, MemcalcError
from memcalc.gpus import gpu_catalog
from memcalc.host.machine import machine_from_options
from memcalc.host.specs import LoaderSpec, MachineSpec, StartMethod
from memcalc.optimizers import optimizer_names
from memcalc.plot import NEEDS_CAPACITY, plot_batch_plan
from memcalc.specs import (
    INPUT_DTYPES,
    DeviceKind,
    Layout,
    LossKind,
    OptimizerImpl,
    Precision,
    TrainingSpec,
)
from memcalc.units import format_bytes, format_count, parse_size
from memcalc.zoo_catalog import zoo_rows


class ShapeType(click.ParamType):
    """``834,224,834,3`` → (834, 224, 834, 3); every dimension a positive integer."""

    name = "shape"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",") if part.strip()]
        try:
            dims = tuple(int(part) for part in parts)
        except ValueError:
            self.fail(f"shape must be positive integers separated by commas (e.g. 3,224,224), "
                      f"got {value!r}", param, ctx)
        if not dims or any(dim <= 0 for dim in dims):
            self.fail(f"shape dimensions must be positive integers, got {value!r}", param, ctx)
        return dims


class ModelArgType(click.ParamType):
    """``depth=50`` → ("depth", 50); values parsed as int, float, bool or string."""

    name = "key=value"

    def convert(self, value, param, ctx):
        key, sep, raw = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"model argument must look like key=value, got {value!r}", param, ctx)
        return key.strip(), _parse_scalar(raw.strip())


class SizeType(click.ParamType):
    """``24GiB`` (binary) or ``24GB`` (decimal) → bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


class FractionType(click.ParamType):
    """``0.05`` or ``5%`` → 0.05, in [0, 1)."""

    name = "fraction"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            self.fail(f"headroom must be a fraction like 0.05 or a percentage like 5%, got {value!r}",
                      param, ctx)
        if not 0 <= fraction < 1:
            self.fail(f"headroom must be at least 0 and below 100%, got {value!r}", param, ctx)
        return fraction


def _parse_scalar(raw: str) -> int | float | bool | str:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _choice(enum_type) -> click.Choice:
    return click.Choice([member.value for member in enum_type], case_sensitive=False)


_DTYPE_NAMES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "uint8",
                "int8", "bool"]

_HOST_OPTIONS = [
    click.option("--sample-dtype", type=click.Choice(_DTYPE_NAMES),
                 help="dtype of one loaded sample [default: the input dtype, else float32]."),
    click.option("--raw-dtype", type=click.Choice(_DTYPE_NAMES),
                 help="dtype a sample is decoded to before conversion (e.g. uint8 images)."),
    click.option("--transform-copies", type=click.IntRange(min=0), default=0, show_default=True,
                 help="Full-size intermediate copies a transform makes per sample."),
    click.option("--num-workers", type=click.IntRange(min=0),
                 help="DataLoader workers to report [default: the recommended count]."),
    click.option("--prefetch-factor", type=click.IntRange(min=1), default=2, show_default=True),
    click.option("--pin-memory/--no-pin-memory", default=False, show_default=True),
    click.option("--persistent-workers", is_flag=True),
    click.option("--start-method", type=_choice(StartMethod), default="fork", show_default=True),
    click.option("--dataset", help="package.module:callable returning your Dataset: measure a "
                                   "real worker (PSS) instead of the shape arithmetic."),
    click.option("--input-key", help="Field of a tuple/dict sample that is the model input."),
    click.option("--dataset-ram", type=SizeType(), help="RAM of an in-memory dataset object."),
    click.option("--python-objects", is_flag=True,
                 help="The dataset is Python objects (lists, dicts): forked workers copy it."),
    click.option("--probe-seconds", type=click.FloatRange(min=1), default=60, show_default=True,
                 help="Time budget of the measured worker run."),
    click.option("--host-headroom", type=FractionType(), default="5%", show_default=True,
                 help="Share of the RAM limit kept free."),
    click.option("--cpus", type=click.IntRange(min=1), help="CPUs of the job [default: detected]."),
    click.option("--ram", type=SizeType(), help="RAM of the node, e.g. 188GB [default: detected]."),
    click.option("--mem-per-cpu", type=SizeType(), help="SLURM --mem-per-cpu (needs --cpus)."),
    click.option("--shm", type=SizeType(), help="/dev/shm size [default: detected; unchecked "
                                                "when --ram is given]."),
]


def _host_options(command):
    for option in reversed(_HOST_OPTIONS):
        command = option(command)
    return command


def _loader_and_machine(options: dict) -> tuple[LoaderSpec, MachineSpec]:
    """Split the host options into the loader and the machine specs."""
    machine = machine_from_options(options.pop("cpus"), options.pop("ram"),
                                   options.pop("mem_per_cpu"), options.pop("shm"))
    loader = LoaderSpec(
        num_workers=options.pop("num_workers"), prefetch_factor=options.pop("prefetch_factor"),
        pin_memory=options.pop("pin_memory"), persistent_workers=options.pop("persistent_workers"),
        start_method=options.pop("start_method"), sample_dtype=options.pop("sample_dtype"),
        raw_dtype=options.pop("raw_dtype"), transform_copies=options.pop("transform_copies"),
        dataset_bytes=options.pop("dataset_ram") or 0,
        dataset_python_objects=options.pop("python_objects"), dataset=options.pop("dataset"),
        input_key=options.pop("input_key"), probe_seconds=options.pop("probe_seconds"),
        headroom_fraction=options.pop("host_headroom"))
    return loader, machine


@contextmanager
def _worker_progress(enabled: bool):
    """A spinner on stderr while a real worker is measured; yields the progress callback."""
    if not enabled:
        yield None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("measuring a real DataLoader worker")

        def update(batches: int, worker_bytes: int) -> None:
            progress.update(task, description=f"measuring a real DataLoader worker: batch "
                                              f"{batches}, worker {format_bytes(worker_bytes)}")
        yield update


@click.group()
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """memcalc: memory of a PyTorch training step, predicted before launch without a GPU."""
    ctx.obj = {"debug": debug}


@main.command()
@click.option("--model", "model_name", required=True,
              help="Zoo name (see `memcalc models`) or package.module:callable returning an nn.Module.")
@click.option("--model-arg", "model_args", type=ModelArgType(), multiple=True,
              help="Keyword argument for the model builder, e.g. --model-arg depth=50 (repeatable).")
@click.option("--shape", type=ShapeType(), help="Per-sample shape, comma separated (no batch axis).")
@click.option("--layout", type=_choice(Layout), default="auto", show_default=True,
              help="Where the channel axis is; auto checks against the first layer.")
@click.option("--input-dtype", type=click.Choice(list(INPUT_DTYPES)),
              help="dtype of the input batch [default: the zoo model's, else float32].")
@click.option("--batch-size", type=click.IntRange(min=1),
              help="Batch to report [default: the planned largest with --gpu/--gpu-memory, else 1].")
@click.option("--loss", type=_choice(LossKind), default="cross-entropy", show_default=True)
@click.option("--optimizer", type=click.Choice(optimizer_names()), default="adam", show_default=True)
@click.option("--optimizer-impl", type=_choice(OptimizerImpl), default="default", show_default=True,
              help="torch.optim implementation; default = foreach on CUDA, for-loop on CPU.")
@click.option("--zero-grad", type=click.Choice(["none", "zeros"]), default="none", show_default=True,
              help="zero_grad(set_to_none=True) frees gradients; 'zeros' keeps them (torch < 2.0).")
@click.option("--precision", type=_choice(Precision), default="fp32", show_default=True)
@click.option("--device", type=_choice(DeviceKind), default="cuda", show_default=True)
@click.option("--gpu", help="GPU from `memcalc gpus` (case-insensitive), e.g. H100-80GB.")
@click.option("--gpu-memory", type=SizeType(),
              help="Capacity to plan for, e.g. 24GiB (binary) or 24GB (decimal); overrides --gpu's.")
@click.option("--headroom", type=FractionType(), default="5%", show_default=True,
              help="Share of capacity kept free for what is not modelled.")
@click.option("--cuda-module-loading", type=_choice(ModuleLoading), default="lazy",
              show_default=True, help="CUDA_MODULE_LOADING (eager before CUDA 11.7).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG of predicted memory against batch size (needs a capacity).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@click.option("--layers", "show_layers", is_flag=True, help="Also print the per-layer table.")
@_host_options
@click.pass_context
def estimate(ctx, model_name, model_args, shape, layout, input_dtype, batch_size, loss,
             optimizer, optimizer_impl, zero_grad, precision, device, gpu, gpu_memory, headroom,
             cuda_module_loading, plot_path, as_json, show_layers, **host_options) -> None:
    """Memory of one training step: peak, breakdown, top modules; with a GPU, the largest
    batch; host RAM and the DataLoader workers that fit."""
    from memcalc.pipeline import estimate as run_estimate
    from memcalc.render import print_report

    def work():
        loader, machine = _loader_and_machine(host_options)
        spec = TrainingSpec(model=model_name, model_args=dict(model_args), sample_shape=shape,
                            layout=layout, input_dtype=input_dtype, batch_size=batch_size,
                            loss=loss, optimizer=optimizer, optimizer_impl=optimizer_impl,
                            zero_grad_to_none=zero_grad == "none", precision=precision,
                            device=device, gpu=gpu, gpu_memory_bytes=gpu_memory,
                            headroom_fraction=headroom, cuda_module_loading=cuda_module_loading,
                            loader=loader, machine=machine)
        if plot_path and gpu is None and gpu_memory is None:
            raise InputError(NEEDS_CAPACITY)   # before the traces, not after
        with _worker_progress(loader.dataset is not None and not as_json) as progress:
            report = run_estimate(spec, progress)
        if plot_path:
            plot_batch_plan(report, plot_path)
        if as_json:
            click.echo(report.model_dump_json(indent=2))
        else:
            print_report(report, Console(), show_layers)
            if plot_path:
                click.echo(f"plot written to {plot_path}")

    _run_guarded(ctx, work)


@main.command()
@click.option("--shape", type=ShapeType(), help="Per-sample shape as the Dataset yields it.")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--device", type=_choice(DeviceKind), default="cuda", show_default=True,
              help="Where training runs (cuda adds the CUDA host context and pinning).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@_host_options
@click.pass_context
def host(ctx, shape, batch_size, device, as_json, **host_options) -> None:
    """Host RAM of the training process and the DataLoader workers that fit (no model)."""
    from memcalc.host import HostSpec, host_estimate, measured_host_estimate
    from memcalc.render_host import host_renderable

    def work():
        loader, machine = _loader_and_machine(host_options)
        spec = HostSpec(sample_shape=shape, batch_size=batch_size, loader=loader,
                        machine=machine, cuda=device == DeviceKind.CUDA.value)
        with _worker_progress(loader.dataset is not None and not as_json) as progress:
            report = (measured_host_estimate(spec, progress=progress) if loader.dataset
                      else host_estimate(spec))
        if as_json:
            click.echo(report.model_dump_json(indent=2))
        else:
            Console().print(host_renderable(report))

    _run_guarded(ctx, work)


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
                row.input_dtype, row.description]

    _print_rows(zoo_rows(), as_json, "memcalc model zoo",
                ("name", "parameters", "default shape", "input dtype", "description"), cells)


def _print_rows(rows, as_json: bool, title: str, columns: tuple[str, ...], cells,
                right_aligned: bool = False) -> None:
    """A catalog command's output: a JSON list of the rows, or a table of ``cells(row)``."""
    if as_json:
        click.echo("[" + ",\n".join(row.model_dump_json() for row in rows) + "]")
        return
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, justify="right" if right_aligned and index else "left")
    for row in rows:
        table.add_row(*cells(row))
    Console().print(table)


def _run_guarded(ctx: click.Context, work) -> None:
    """Turn memcalc's errors into one line and an exit code (2 bad input, 1 otherwise)."""
    try:
        work()
    except (MemcalcError, ValidationError) as error:
        if ctx.obj.get("debug"):
            raise
        message = _one_line(error)
        click.echo(f"Error: {message}", err=True)
        sys.exit(2 if isinstance(error, (InputError, ValidationError)) else 1)


def _one_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        return f"{field}: {message}" if field else message
    return str(error).splitlines()[0]
