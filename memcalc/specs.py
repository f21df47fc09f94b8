"""What is being trained: the input of every estimator."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memcalc.eval_specs import GradMode, SlidingWindowSpec, StepPhase
from memcalc.dtypes import INPUT_DTYPES
from memcalc.distributed.specs import ParallelSpec
from memcalc.host.specs import LoaderSpec, MachineSpec, check_workers_within_cpus

MAX_BATCH_SIZE = 2**31 - 1
"""The largest batch accepted: int32 indexing (and a sample count no node holds) above it."""

class ModuleLoading(str, Enum):
    """``CUDA_MODULE_LOADING``: PyTorch ≥ 1.13 sets LAZY when CUDA ≥ 11.7 (pytorch#86509)."""

    LAZY = "lazy"
    EAGER = "eager"


class FeedSpec(BaseModel):
    """How long a step takes and how long a sample takes to load, when known."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    step_time_s: float | None = Field(default=None, gt=0)
    """GPU time of one training step; None: from the traced kernels and the catalog (needs
    --gpu)."""
    mfu: float | None = Field(default=None, gt=0, le=1)
    """Time the step as its FLOPs at this share of the peak instead of kernel by kernel."""
    sample_time_s: float | None = Field(default=None, gt=0)
    """CPU time to load and transform one sample; None: measured with --dataset."""
    read_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    """Storage read rate, when only the sample shape is known (I/O-bound estimate)."""


class Precision(str, Enum):
    """Numeric precision of training (names follow Lightning's)."""

    FP32 = "fp32"
    BF16_MIXED = "bf16-mixed"
    FP16_MIXED = "fp16-mixed"
    BF16 = "bf16"
    FP16 = "fp16"


class LossKind(str, Enum):
    """Loss applied to the model's output in the traced step."""

    CROSS_ENTROPY = "cross-entropy"
    MSE = "mse"
    SUM = "sum"
    MODEL = "model"
    """The model computes its own loss: a scalar tensor, ``output.loss`` / ``output["loss"]``
    (Hugging Face with ``labels``), or a dict of losses that is summed (torchvision detection)."""


class DeviceKind(str, Enum):
    """Where the training step is predicted to run."""

    CUDA = "cuda"
    CPU = "cpu"


class OptimizerImpl(str, Enum):
    """Which torch.optim implementation runs ``step()``."""

    DEFAULT = "default"
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"
    FUSED = "fused"


class Layout(str, Enum):
    """Where the channel axis sits in the per-sample shape."""

    AUTO = "auto"
    CHANNELS_FIRST = "channels-first"
    CHANNELS_LAST = "channels-last"


ModelArgValue = int | float | bool | str | None


class InputSpec(BaseModel):
    """A named input tensor of ``forward`` (attention mask, labels...), per sample."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    shape: tuple[int, ...]
    """One sample's shape, without the batch axis (``()`` for one value per sample)."""
    dtype: str = "float32"

    @model_validator(mode="before")
    @classmethod
    def _from_pair(cls, value: Any) -> Any:
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return {"shape": value[0], "dtype": value[1]}
        return value

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(dim <= 0 for dim in shape):
            raise ValueError(f"input dimensions must be positive: got {shape}")
        return shape

    @field_validator("dtype")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in INPUT_DTYPES:
            raise ValueError(f"unknown input dtype {name!r}; accepted: {', '.join(INPUT_DTYPES)}")
        return name


class TrainingSpec(BaseModel):
    """One training configuration to estimate.

    ``model`` is a zoo name (``memcalc models``) or ``package.module:callable`` returning an
    ``nn.Module``; ``model_args`` are keyword arguments for that builder.
    ``sample_shape`` is one sample without the batch axis, as the Dataset yields it;
    ``sample_shape`` and ``input_dtype`` default to the zoo model's own (float32 otherwise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    model: str = Field(min_length=1)
    model_args: dict[str, ModelArgValue] = Field(default_factory=dict)
    sample_shape: tuple[int, ...] | None = None
    layout: Layout = Layout.AUTO
    input_dtype: str | None = None
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    """Named input tensors passed to ``forward`` as keywords, after the positional sample
    (which ``sample_shape`` describes; with named inputs it may be left out)."""
    forward_args: dict[str, ModelArgValue] = Field(default_factory=dict)
    """Plain keyword arguments of ``forward`` (``return_loss=True``...)."""
    boxes_per_image: int = Field(default=8, ge=1)
    """Detection models: ground-truth objects per image in the synthetic training targets."""
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """None: the planned largest batch when a GPU or memory is given, else 1."""
    phase: StepPhase = StepPhase.TRAIN
    """The step traced: a training step, or the evaluation step of validation or inference
    (``eval_grad_mode``; the optimizer and training options then do not apply)."""
    eval_grad_mode: GradMode = GradMode.NO_GRAD
    sliding_window: SlidingWindowSpec | None = None
    """Evaluate whole volumes window by window (the evaluation step: ``--phase eval`` or the
    job's validation); None: the model runs on the whole sample at once."""
    eval_sample_shape: tuple[int, ...] | None = None
    """The job validates on samples of this shape (whole volumes; ``--eval-shape``): its
    validation step is traced too and the verdict is the larger of the two peaks."""
    eval_batch_size: int = Field(default=1, ge=1, le=MAX_BATCH_SIZE)
    eval_holds_optimizer_state: bool = False
    """The evaluation step runs inside a training job: the optimizer's state (and gradients
    kept by ``zero_grad(set_to_none=False)``) stay resident while it runs."""
    loss: LossKind = LossKind.CROSS_ENTROPY
    optimizer: str = "adam"
    optimizer_impl: OptimizerImpl = OptimizerImpl.DEFAULT
    weight_decay: float = Field(default=0.0, ge=0.0)
    """torch.optim's weight_decay (for-loop and foreach add a gradient-sized temporary)."""
    amsgrad: bool = False
    """Adam/AdamW keep ``max_exp_avg_sq``, a third parameter-sized state tensor."""
    activation_checkpointing: str | None = None
    """Checkpoint the model's repeated blocks (``memcalc.trace.checkpointing``) in the traced
    step: ``full`` (True), ``selective`` (torchtitan's per-op policy inside every block) or
    ``every:N`` (every N-th block in full); None (False): no checkpointing."""
    offload_activations: bool = False
    """Saved activations kept in host memory (``torch.autograd.graph.save_on_cpu``)."""
    compile: bool = False
    """The model runs under ``torch.compile`` (``memcalc.trace.compiled``); a model passed
    already compiled is traced compiled without it."""
    parallel: ParallelSpec | None = None
    """One rank of a distributed job (DDP, ZeRO-1/2, FSDP2, tensor parallel over N GPUs),
    traced in a fake process group with the real wrappers (``memcalc.distributed``); None:
    one GPU."""
    spatial_parts: int = Field(default=1, ge=1)
    """Spatial parallelism: every sample split along its longest spatial axis over this many
    GPUs (``memcalc.trace.halos``); the estimate is one GPU's, running its slab."""
    free_output: bool = False
    """The training loop deletes the model's output before ``backward()`` (torchtitan's
    ``del pred``); False keeps it alive through the step, as most loops do."""
    clip_grad_norm: float | None = Field(default=None, gt=0)
    """``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` before every step."""
    zero_grad_to_none: bool = True
    """``zero_grad(set_to_none=...)``; False keeps zeroed gradients allocated (torch < 2.0)."""
    softmax_saves_input: bool = False
    """softmax/log_softmax keep their input for backward as well as their output (torch < 1.11;
    ``memcalc.trace.legacy_autograd``)."""
    precision: Precision = Precision.FP32
    device: DeviceKind = DeviceKind.CUDA
    gpu: str | None = None
    """Catalog name (``memcalc gpus``); sets capacity, workspace size and kernel support."""
    gpu_memory_bytes: int | None = Field(default=None, gt=0)
    """Capacity to plan for; overrides the catalog's memory."""
    headroom_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Share of capacity kept free for what is not modelled (cuDNN workspaces, other processes)."""
    cuda_module_loading: ModuleLoading = ModuleLoading.LAZY
    cudnn_benchmark: bool = False
    """``torch.backends.cudnn.benchmark``: plan searches at each new convolution shape."""
    cudnn_tf32: bool = True
    """``torch.backends.cudnn.allow_tf32`` (PyTorch's default is True)."""
    allocator_conf: str | None = None
    """``PYTORCH_CUDA_ALLOC_CONF`` of the training job (``expandable_segments:True``...)."""
    env_profile: str | None = None
    """Environment profile file (``memcalc calibrate``); None: ``$MEMCALC_ENV_PROFILE``,
    the default location, else the built-in profile for the card."""
    feed: FeedSpec = Field(default_factory=FeedSpec)
    """Step and sample times for the feeding model (``memcalc.feed.model``)."""
    loader: LoaderSpec = Field(default_factory=LoaderSpec)
    """The DataLoader and Dataset, for the host-RAM estimate."""
    machine: MachineSpec | None = None
    """The node that runs the job; None: this machine, detected."""

    @field_validator("sample_shape")
    @classmethod
    def _positive_dims(cls, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if shape is not None:
            if len(shape) == 0:
                raise ValueError("sample shape must have at least one dimension")
            bad = [dim for dim in shape if dim <= 0]
            if bad:
                raise ValueError(f"sample shape dimensions must be positive: got {shape}")
        return shape

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _checkpointing_policy(cls, value: Any) -> str | None:
        if value is True:
            return "full"
        if value is False or value is None:
            return None
        text = str(value).strip().lower()
        if text in ("full", "selective"):
            return text
        every = text.removeprefix("every:")
        if text.startswith("every:") and every.isdigit() and int(every) >= 1:
            return f"every:{int(every)}"
        raise ValueError(f"checkpointing {value!r}: use full, selective or every:N (N ≥ 1)")

    @field_validator("input_dtype")
    @classmethod
    def _known_dtype(cls, name: str | None) -> str | None:
        if name is not None and name not in INPUT_DTYPES:
            raise ValueError(f"unknown input dtype {name!r}; accepted: {', '.join(INPUT_DTYPES)}")
        return name

    @model_validator(mode="after")
    def _one_kind_of_split(self) -> TrainingSpec:
        if self.parallel is not None and self.spatial_parts > 1:
            raise ValueError("--spatial-parts with --strategy is not traced together; give one "
                             "of them (memcalc plan sizes spatial splits with data parallelism)")
        if self.parallel is not None and self.parallel.cpu_offload and self.device is not \
                DeviceKind.CUDA:
            raise ValueError("--cpu-offload moves FSDP2's states from the GPU to host RAM; "
                             f"with --device {self.device.value} there is no GPU: leave it out")
        return self

    @model_validator(mode="after")
    def _evaluation_without_training_options(self) -> TrainingSpec:
        if self.phase is not StepPhase.EVAL:
            if self.sliding_window is not None and self.eval_sample_shape is None:
                raise ValueError("a sliding window (--roi) evaluates whole volumes: give "
                                 "--phase eval, or the validation volume with --eval-shape")
            if self.eval_sample_shape is not None and self.parallel is not None:
                raise ValueError("--eval-shape with --strategy is not traced together yet: "
                                 "estimate the validation step with --phase eval alone")
            return self
        if self.eval_sample_shape is not None:
            raise ValueError("--eval-shape is the validation of a training job; with --phase "
                             "eval the evaluated sample is --shape")
        training_only = [name for name, given in (
            ("--strategy", self.parallel is not None), ("--spatial-parts", self.spatial_parts > 1),
            ("--checkpointing", self.activation_checkpointing is not None),
            ("--offload-activations", self.offload_activations),
            ("--clip-grad-norm", self.clip_grad_norm is not None)) if given]
        if training_only:
            verb = "apply" if len(training_only) > 1 else "applies"
            raise ValueError(f"{', '.join(training_only)} {verb} to training; --phase eval "
                             "traces one evaluation step on one GPU: leave it out")
        return self

    @property
    def not_traced_with_compile(self) -> list[str]:
        """Options of this spec a compiled step is not traced with yet."""
        return [name for name, given in (
            ("--strategy", self.parallel is not None), ("--spatial-parts", self.spatial_parts > 1),
            ("--checkpointing", self.activation_checkpointing is not None),
            ("--offload-activations", self.offload_activations)) if given]

    @model_validator(mode="after")
    def _compile_alone(self) -> TrainingSpec:
        if self.compile and self.not_traced_with_compile:
            raise ValueError(f"--compile with {', '.join(self.not_traced_with_compile)} is not "
                             "traced together yet: leave one out")
        return self

    @model_validator(mode="after")
    def _workers_within_cpus(self) -> TrainingSpec:
        check_workers_within_cpus(self.loader, self.machine and self.machine_share(self.machine))
        return self

    def machine_share(self, machine: MachineSpec) -> MachineSpec:
        """What one training process of this job has of ``machine``: all of it, or its
        equal share where the job runs one process per GPU of the node (``--gpus``)."""
        return machine.shared_by(self.parallel.gpus_per_node if self.parallel else 1)

    @property
    def evaluated_window(self) -> SlidingWindowSpec | None:
        """The step's sliding window (a training job's is its validation's)."""
        return self.sliding_window if self.phase is StepPhase.EVAL else None

    def validation_spec(self) -> TrainingSpec | None:
        """The validation step of this training job (``eval_sample_shape``), with the
        optimizer's state resident; None when the job has none."""
        if self.eval_sample_shape is None or self.phase is StepPhase.EVAL:
            return None
        return self.with_changes(
            phase=StepPhase.EVAL, sample_shape=self.eval_sample_shape,
            batch_size=self.eval_batch_size, eval_sample_shape=None, free_output=False,
            activation_checkpointing=None, offload_activations=False, clip_grad_norm=None,
            eval_holds_optimizer_state=True,
            loader=self.loader.model_copy(update={"dataset": None}))

    def with_changes(self, **changes: Any) -> TrainingSpec:
        """A copy with some fields replaced, validated again."""
        return TrainingSpec.model_validate({**self.model_dump(), **changes})
