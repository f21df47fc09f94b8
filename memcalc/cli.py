"""``memcalc`` command line: parse, call the estimator, render. No logic of its own."""

from __future__ import annotations

import sys

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from memcalc.cuda_overheads import ModuleLoading
from memcalc.errors import InputError, MemcalcError
from memcalc.gpus import gpu_catalog
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
@click.pass_context
def estimate(ctx, model_name, model_args, shape, layout, input_dtype, batch_size, loss,
             optimizer, optimizer_impl, zero_grad, precision, device, gpu, gpu_memory, headroom,
             cuda_module_loading, plot_path, as_json, show_layers) -> None:
    """Memory of one training step: peak, breakdown, top modules; with a GPU, the largest batch."""
    from memcalc.estimate import estimate as run_estimate
    from memcalc.render import print_report

    def work():
        spec = TrainingSpec(model=model_name, model_args=dict(model_args), sample_shape=shape,
                            layout=layout, input_dtype=input_dtype, batch_size=batch_size,
                            loss=loss, optimizer=optimizer, optimizer_impl=optimizer_impl,
                            zero_grad_to_none=zero_grad == "none", precision=precision,
                            device=device, gpu=gpu, gpu_memory_bytes=gpu_memory,
                            headroom_fraction=headroom, cuda_module_loading=cuda_module_loading)
        if plot_path and gpu is None and gpu_memory is None:
            raise InputError(NEEDS_CAPACITY)   # before the traces, not after
        report = run_estimate(spec)
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
        return f"{field}: {first['msg'].removeprefix('Value error, ')}"
    return str(error).splitlines()[0]
