"""The option sets shared by ``estimate``, ``plan`` and ``host``, and how they become specs."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from memcalc.cli.types import (
    FiniteFloatRange,
    FractionType,
    InputType,
    ModelArgType,
    ShapeType,
    SizeType,
    enum_choice,
)
from memcalc.cli.eval_options import EVAL_OPTIONS, sliding_window_from_options
from memcalc.cli.job_options import parallel_from_options
from memcalc.cli.job_file import SPEC_OPTION, explicit_options, merged_spec, read_job_file
from memcalc.cli.option_fields import take_fields
from memcalc.errors import InputError
from memcalc.host.machine import machine_from_options
from memcalc.host.specs import LoaderSpec, MachineSpec, StartMethod
from memcalc.trace.optimizers import optimizer_names
from memcalc.dtypes import DTYPES, INPUT_DTYPES
from memcalc.specs import (
    MAX_BATCH_SIZE,
    DeviceKind,
    FeedSpec,
    Layout,
    LossKind,
    ModuleLoading,
    OptimizerImpl,
    Precision,
    TrainingSpec,
)
from memcalc.units import format_bytes

_DTYPE_NAMES = list(DTYPES)

HOST_OPTIONS = [
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
    click.option("--start-method", type=enum_choice(StartMethod), default="fork", show_default=True),
    click.option("--dataset", help="package.module:callable returning your Dataset: measure a "
                                   "real worker (PSS) instead of the shape arithmetic."),
    click.option("--input-key", help="Field of a tuple/dict sample that is the model input."),
    click.option("--dataset-ram", type=SizeType(), help="RAM of an in-memory dataset object."),
    click.option("--python-objects", is_flag=True,
                 help="The dataset is Python objects (lists, dicts): forked workers copy it."),
    click.option("--probe-seconds", type=FiniteFloatRange(min=1, max=86400), default=60, show_default=True,
                 help="Time budget of the measured worker run."),
    click.option("--host-headroom", type=FractionType(), default="5%", show_default=True,
                 help="Share of the RAM limit kept free."),
    click.option("--cpus", type=click.IntRange(min=1), help="CPUs of the job [default: detected]."),
    click.option("--ram", type=SizeType(), help="RAM of the node, e.g. 188GB [default: detected]."),
    click.option("--mem-per-cpu", type=SizeType(), help="SLURM --mem-per-cpu (needs --cpus)."),
    click.option("--shm", type=SizeType(), help="/dev/shm size [default: detected; unchecked "
                                                "when --ram is given]."),
]


VERIFY_OPTION = click.option(
    "--verify", is_flag=True,
    help="Then run the real DataLoader (--dataset) at that num_workers in a memory cgroup "
         "capped at the usable RAM, for a few batches within --probe-seconds: measured vs "
         "predicted peak, and whether it held.")


def host_options(command):
    for option in reversed(HOST_OPTIONS):
        command = option(command)
    return command


def loader_and_machine(options: dict) -> tuple[LoaderSpec, MachineSpec]:
    """Split the host options into the loader and the machine specs."""
    machine = machine_from_options(options.pop("cpus"), options.pop("ram"),
                                   options.pop("mem_per_cpu"), options.pop("shm"))
    loader = LoaderSpec(**take_fields(options, "loader"))
    return loader, machine


@contextmanager
def _spinner(description: str):
    """A transient spinner with elapsed time on stderr, none when stderr is no terminal
    (rich would still end it with an empty line there); yields ``describe(text)``."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda text: None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(description)
        yield lambda text: progress.update(task, description=text)


VERDICT = "DOES NOT FIT"
"""An announcement that opens so is the command's answer, known before its work ends (a
check's first trace): the spinner keeps it above what is being done next."""


@contextmanager
def command_progress(description: str):
    """A spinner on stderr (a terminal only) for the command's work, told what is being done
    by every ``memcalc.progress.announce`` made meanwhile; a verdict (``VERDICT``) stays
    shown above the later ones."""
    from memcalc.progress import listening

    with _spinner(description) as describe:
        headline = [""]

        def told(text: str) -> None:
            if text.startswith(VERDICT):
                headline[0], text = text.split("; ", 1) if "; " in text else (text, "")
            describe(f"{headline[0]}\n{text}" if headline[0] else text)

        with listening(told):
            yield


def worker_told(phase: str, batches: int, worker_bytes: int) -> None:
    """A real worker's measurement, announced (``measure_worker``'s progress callback)."""
    from memcalc.progress import announce

    if phase == "verify":
        announce(f"verify: real DataLoader, batch {batches}, {format_bytes(worker_bytes)} in use")
    elif phase == "timing":
        announce(f"real DataLoader worker: timing {batches} batches (memory sampler stopped)")
    else:
        announce(f"real DataLoader worker: memory, batch {batches}, worker "
                 f"{format_bytes(worker_bytes)}")


@contextmanager
def variant_progress():
    """A spinner on stderr while ``plan`` estimates its variants; yields ``on_variant``."""
    with _spinner("plan: estimating the job as given") as describe:
        count, lock = 0, threading.Lock()

        def on_variant(spec: TrainingSpec) -> None:   # also told from the pool's thread
            nonlocal count
            with lock:
                count += 1
                describe(f"plan: variant {count}: {variant_label(spec)}")
        yield on_variant


def variant_label(spec: TrainingSpec) -> str:
    """What a variant changes, in a few words."""
    parts = [spec.precision.value]
    checkpointing = spec.activation_checkpointing
    named = "checkpointing" if checkpointing in (None, "full") else f"checkpointing {checkpointing}"
    parts += [name for name, on in ((named, checkpointing),
                                    ("offloading", spec.offload_activations),
                                    ("gradients kept", not spec.zero_grad_to_none)) if on]
    if spec.spatial_parts > 1:
        parts.append(f"{spec.spatial_parts} spatial parts")
    parts.append(f"batch {spec.batch_size}" if spec.batch_size else "largest batch")
    return ", ".join(parts)


FEED_OPTIONS = [
    click.option("--step-time", type=FiniteFloatRange(min=0, min_open=True),
                 help="Seconds of one training step on the GPU [default: from FLOPs with --gpu]."),
    click.option("--sample-time", type=FiniteFloatRange(min=0, min_open=True),
                 help="CPU seconds to load and transform one sample [default: measured with "
                      "--dataset]."),
    click.option("--read-bandwidth", type=SizeType(),
                 help="Storage read rate per second, e.g. 500MB, when only the shape is known."),
    click.option("--mfu", type=FiniteFloatRange(min=0.01, max=1),
                 help="Time the step as its FLOPs at this share of the GPU's peak FLOP/s "
                      "[default: kernel by kernel, the MFU an output]."),
]


def feed_options(command):
    for option in reversed(FEED_OPTIONS):
        command = option(command)
    return command


def _named_gpu(ctx, param, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; name a card from `memcalc gpus` or leave --gpu out")
    return value


MODEL_OPTIONS = [
    click.option("--model", "model_name",
                 help="Zoo name (see `memcalc models`) or package.module:callable returning an "
                      "nn.Module [required unless --spec names it]."),
    click.option("--model-arg", "model_args", type=ModelArgType(), multiple=True,
                 help="Keyword argument for the model builder, e.g. --model-arg depth=50 (repeatable)."),
    click.option("--shape", type=ShapeType(), help="Per-sample shape, comma separated (no batch axis)."),
    click.option("--layout", type=enum_choice(Layout), default="auto", show_default=True,
                 help="Where the channel axis is; auto checks against the first layer."),
    click.option("--input-dtype", type=click.Choice(list(INPUT_DTYPES)),
                 help="dtype of the input batch [default: the zoo model's, else float32]."),
    click.option("--input", "inputs", type=InputType(), multiple=True,
                 help="Named input tensor of forward, per sample: NAME=SHAPE[:DTYPE], e.g. "
                      "attention_mask=512:int64 or labels=512:int64 (repeatable; with named "
                      "inputs --shape may be left out)."),
    click.option("--forward-arg", "forward_args", type=ModelArgType(), multiple=True,
                 help="Plain keyword argument of forward, e.g. return_loss=true (repeatable)."),
    click.option("--boxes-per-image", type=click.IntRange(min=1), default=8, show_default=True,
                 help="Detection models: objects per image in the synthetic training targets."),
    click.option("--batch-size", type=click.IntRange(min=1, max=MAX_BATCH_SIZE),
                 help="Batch to report [default: the planned largest with --gpu/--gpu-memory, else 1]."),
    click.option("--loss", type=enum_choice(LossKind), default="cross-entropy", show_default=True,
                 help="'model': the model computes its own loss (Hugging Face given labels, "
                      "torchvision detection in train mode)."),
    click.option("--optimizer", type=click.Choice(optimizer_names()), default="adam", show_default=True),
    click.option("--optimizer-impl", type=enum_choice(OptimizerImpl), default="default", show_default=True,
                 help="torch.optim implementation; default = foreach on CUDA, for-loop on CPU."),
    click.option("--weight-decay", type=FiniteFloatRange(min=0.0), default=0.0, show_default=True,
                 help="torch.optim weight_decay."),
    click.option("--amsgrad", is_flag=True, help="Adam/AdamW amsgrad (one more state tensor)."),
    click.option("--zero-grad", type=click.Choice(["none", "zeros"]), default="none", show_default=True,
                 help="zero_grad(set_to_none=True) frees gradients; 'zeros' keeps them (torch < 2.0)."),
    click.option("--clip-grad-norm", type=FiniteFloatRange(min=0, min_open=True), metavar="MAX",
                 help="clip_grad_norm_(model.parameters(), MAX) before every optimizer step."),
    click.option("--free-output", is_flag=True,
                 help="The loop deletes the model's output before backward (torchtitan's "
                      "`del pred`); default: it stays alive through the step."),
    *EVAL_OPTIONS,
    click.option("--precision", type=enum_choice(Precision), default="fp32", show_default=True),
    click.option("--checkpointing", is_flag=False, flag_value="full", default=None,
                 metavar="[full|selective|every:N]",
                 help="Activation checkpointing of the model's repeated blocks (traced): "
                      "alone or 'full', every block; 'selective', torchtitan's per-op policy; "
                      "'every:N', every N-th block."),
    click.option("--offload-activations", is_flag=True,
                 help="Saved activations in host memory (torch.autograd.graph.save_on_cpu)."),
    click.option("--compile", "compile_model", is_flag=True,
                 help="The model under torch.compile: the step traced through AOTAutograd's "
                      "partition, as Inductor runs it (a model passed compiled is traced so "
                      "without it)."),
    click.option("--spatial-parts", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Spatial parallelism: split every sample along its longest spatial axis "
                      "over this many GPUs; the estimate is one GPU's."),
    click.option("--device", type=enum_choice(DeviceKind), default="cuda", show_default=True),
    click.option("--gpu", callback=_named_gpu,
                 help="GPU from `memcalc gpus` (case-insensitive), e.g. H100-80GB."),
    click.option("--gpu-memory", type=SizeType(),
                 help="Capacity to plan for, e.g. 24GiB (binary) or 24GB (decimal); overrides --gpu's."),
    click.option("--headroom", type=FractionType(), default="5%", show_default=True,
                 help="Share of capacity kept free for what is not modelled."),
    click.option("--cuda-module-loading", type=enum_choice(ModuleLoading), default="lazy",
                 show_default=True, help="CUDA_MODULE_LOADING (eager before CUDA 11.7)."),
    click.option("--cudnn-benchmark", is_flag=True,
                 help="torch.backends.cudnn.benchmark=True: a plan search at each new shape."),
    click.option("--cudnn-tf32/--no-cudnn-tf32", default=True, show_default=True,
                 help="torch.backends.cudnn.allow_tf32 (fp32 convolutions on tensor cores)."),
    click.option("--allocator-conf", metavar="CONF",
                 help="The job's PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True."),
    click.option("--env-profile", metavar="FILE",
                 help="Environment profile from `memcalc calibrate` (or a built-in name) "
                      "[default: $MEMCALC_ENV_PROFILE, ~/.config/memcalc/env-profile.json, "
                      "else built in]."),
]


def job_spec(ctx: click.Context, options: dict) -> TrainingSpec:
    """The job from the model, feed and host options (popped from ``options``), over the
    ``--spec`` file when one is given (``memcalc.cli.job_file``)."""
    path = options.pop("spec_file")
    fields = read_job_file(path) if path is not None else {}
    if options["model_name"] is None:
        if "model" not in fields:
            raise InputError("--model is missing: give --model NAME, or a --spec file that "
                             "names the model")
        options["model_name"] = fields["model"]
    parallel = parallel_from_options(options)
    loader, machine = loader_and_machine(options)
    spec = training_spec(options, loader, machine)
    if parallel is not None:
        spec = spec.with_changes(parallel=parallel)
    if path is None:
        return spec
    return merged_spec(TrainingSpec, spec, fields, explicit_options(ctx), path)


def training_spec(options: dict, loader: LoaderSpec, machine: MachineSpec) -> TrainingSpec:
    """The model options (popped from ``options``) as a spec."""
    window = sliding_window_from_options(options)
    return TrainingSpec(**take_fields(options), feed=FeedSpec(**take_fields(options, "feed")),
                        loader=loader, machine=machine, sliding_window=window)


def model_options(command):
    for option in reversed([SPEC_OPTION, *MODEL_OPTIONS]):
        command = option(command)
    return command

