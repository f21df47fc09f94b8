"""The assumptions and the known gaps every report states, in words."""

from __future__ import annotations

from collections.abc import Sequence

from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.cuda_overheads import (
    EAGER_CONTEXT, NCCL_COMMUNICATOR_BYTES, NCCL_SOURCE, cublas_workspace_bytes, nccl_communicators)
from memcalc.device.env_profile import EnvProfile
from memcalc.device.gpus import GpuSpec
from memcalc.device.report import BoundedSize
from memcalc.trace.cuda_kernels import ASSUMED_CAPABILITY
from memcalc.trace.optimizers import configured_rule
from memcalc.trace.precision import precision_policy
from memcalc.eval_specs import SlidingWindowSpec
from memcalc.report.models import TRACE_FAILED_PREFIX
from memcalc.model.sliding_window import monai_version
from memcalc.specs import (DeviceKind, GradMode, LossKind, ModuleLoading, OptimizerImpl,
                           Precision, StepPhase, TrainingSpec)
from memcalc.units import format_bytes

_LOSS_TEXT = {
    LossKind.CROSS_ENTROPY: (
        "loss: cross-entropy against int64 class targets shaped like the output minus its "
        "class dim (dim 1; the last dim for token-id models, flattened as in LM training)"
    ),
    LossKind.MSE: "loss: MSE against a float target shaped like the output",
    LossKind.SUM: "loss: output.sum() (no target)",
    LossKind.MODEL: ("loss: the model's own (a scalar output, output.loss / output['loss'], or "
                     "the sum of a dict of losses); its labels are the inputs given"),
}


_EVAL_TEXT = {
    GradMode.NO_GRAD: "evaluation step: model.eval() (dropout off, BatchNorm's running "
                      "statistics) under torch.no_grad(); no gradients, no optimizer state",
    GradMode.INFERENCE_MODE: "evaluation step: model.eval() under torch.inference_mode(); "
                             "traced as no_grad without autocast's weight cache, which is "
                             "what inference_mode allocates (measured on real CPU steps)",
    GradMode.ENABLED: "evaluation step: model.eval() with autograd on (no no_grad): the "
                      "graph of forward and loss lives until they are dropped",
}


def _window_text(window: SlidingWindowSpec) -> str:
    return (f"sliding window: MONAI {monai_version()}'s sliding_window_inference traced over "
            f"each whole volume, windows of {'×'.join(map(str, window.roi))}, "
            f"{window.sw_batch_size} per forward, overlap {window.overlap:g}, "
            f"{window.mode.value} weights; its output and count map on the GPU (device and "
            "sw_device the input's); the largest batch on the line through batches 1 and 2")


def step_name(spec: TrainingSpec) -> str:
    """The step in a few words: its optimizer, or ``eval (no_grad)``."""
    if spec.phase is StepPhase.EVAL:
        return f"eval ({spec.eval_grad_mode.value})"
    return spec.optimizer


def assumptions(spec: TrainingSpec, gpu: GpuSpec | None, profile: EnvProfile, *,
                model_has_conv: bool, foreach: bool, traced: bool) -> list[str]:
    rule = configured_rule(spec.optimizer, weight_decay=spec.weight_decay, amsgrad=spec.amsgrad,
                           fused=spec.optimizer_impl is OptimizerImpl.FUSED)
    implementation = ("foreach implementation (CUDA's default; parameter-sized temporaries "
                      "during step())" if foreach else "for-loop implementation (CPU's default; "
                      "one parameter-sized temporary at a time)")
    if spec.optimizer_impl is OptimizerImpl.FUSED:
        implementation = ("fused implementation (parameters and state updated in place, no "
                          "parameter-sized temporaries)")
    lines = [
        precision_policy(spec.precision).assumption,
        f"optimizer {rule.name}: {rule.description}; {rule.state_copies} parameter-sized state "
        f"tensor(s) per parameter" + (", plus a 4-byte step counter per parameter tensor"
                                       if rule.step_counter else "") + f"; {implementation}",
        _LOSS_TEXT[spec.loss],
        "model in train mode; every parameter trainable unless the model sets requires_grad=False",
    ]
    if spec.phase is StepPhase.EVAL:
        lines[1:] = [_LOSS_TEXT[spec.loss], _EVAL_TEXT[spec.eval_grad_mode]]
    if (gpu is not None and gpu.bf16_tflops is None
            and spec.precision in (Precision.BF16_MIXED, Precision.BF16)):
        lines.insert(0, f"WARNING: {gpu.name} has no bf16 tensor cores (they start with "
                        "Ampere): torch emulates bf16 there, many times slower than fp16; "
                        "memory as traced; use --precision fp16-mixed")
    if traced and spec.phase is StepPhase.EVAL:
        lines.append("traced on fake CPU tensors: 2 evaluation steps (forward and loss, both "
                     "released when the step returns); every tensor the step makes counts as "
                     "a temporary (nothing is kept for a backward)")
        if spec.sliding_window is not None:
            lines.append(_window_text(spec.sliding_window))
    elif traced:
        lines += [
            "traced on fake CPU tensors: 2 iterations of forward, loss, backward, optimizer "
            f"step, zero_grad(set_to_none={spec.zero_grad_to_none}); the peak is the maximum over both, so the "
            "optimizer state created lazily at step 1 is included",
            "the step is a function: its output and loss are released when it returns (a "
            "plain for-loop that keeps `output` until the next forward holds it one step longer)",
            "activations = tensors made in forward and loss that are still alive when backward "
            "starts; temporaries = everything else the step makes",
        ]
    if spec.validation_spec() is not None:
        shape = ",".join(map(str, spec.eval_sample_shape))
        lines.append(f"validation: the job's evaluation step traced too, batch "
                     f"{spec.eval_batch_size} of {shape}, under {spec.eval_grad_mode.value}, "
                     "with the optimizer's state resident (one step's worth, made before it) "
                     + (f"; {_window_text(spec.sliding_window)}" if spec.sliding_window
                        else "") + "; its DataLoader's host RAM is not modelled")
    if spec.softmax_saves_input:
        lines.append("softmax and log_softmax keep their input as well as their output for "
                     "backward, as torch < 1.11 did (pytorch #49600; fixed by #66018)")
    if spec.device is DeviceKind.CUDA:
        lines += _cuda_assumptions(spec, gpu, profile, model_has_conv)
    if spec.device is DeviceKind.CUDA and traced:
        lines.append(_allocator_assumption(spec))
    if spec.device is DeviceKind.CPU and model_has_conv:
        lines.append("CPU convolutions: ATen's own slow kernels' im2col columns are traced "
                     "(small batches); oneDNN's scratch is not, so a real CPU run of a conv "
                     "net on oneDNN can peak higher (docs/accuracy.md)")
    return lines


def _cuda_assumptions(spec: TrainingSpec, gpu: GpuSpec | None, profile: EnvProfile,
                      model_has_conv: bool) -> list[str]:
    card = (f"GPU {gpu.name} (compute capability {gpu.compute_capability}, "
            f"{format_bytes(gpu.memory_bytes)})" if gpu else "GPU not named (pre-Hopper assumed)")
    floor = profile.floor
    if spec.cuda_module_loading is ModuleLoading.EAGER:
        context = (f"CUDA context with eager module loading: {format_bytes(EAGER_CONTEXT.context_bytes)} "
                   f"outside the allocator ({EAGER_CONTEXT.source})")
    else:
        context = (f"outside the allocator (lazy module loading): CUDA context "
                   f"{format_bytes(floor.context_bytes)}, + {format_bytes(floor.cublas_bytes)} "
                   f"once cuBLAS runs, + {format_bytes(floor.cudnn_bytes)} once cuDNN runs "
                   f"({format_bytes(floor.cudnn_after_cublas_bytes)} after cuBLAS)")
    workspace = profile.cublas_workspace_bytes or cublas_workspace_bytes(gpu)
    lines = [
        card,
        f"CUDA figures from the {profile.describe()}; `memcalc calibrate` measures yours",
        context,
        f"cuBLAS workspace: {profile.cublas_handles} x {format_bytes(workspace)} (forward and "
        "autograd threads each hold a handle; CublasHandlePool.cpp) when the step multiplies "
        "matrices, allocated through the caching allocator",
        f"headroom: {spec.headroom_fraction:.0%} of capacity kept free",
    ]
    parallel = spec.parallel
    communicators = (nccl_communicators(parallel.dp, parallel.tp, parallel.pp, parallel.cp)
                     if parallel is not None else 0)
    if communicators:
        lines.append(f"NCCL: {communicators} communicator(s) of this rank's mesh × "
                     f"{format_bytes(NCCL_COMMUNICATOR_BYTES)} outside the allocator, counted "
                     f"with the CUDA context ({NCCL_SOURCE})")
    if model_has_conv:
        error, calls = profile.cudnn.error_summary()
        lines.append(
            f"cuDNN convolution workspaces (cudnn.benchmark={spec.cudnn_benchmark}, "
            f"allow_tf32={spec.cudnn_tf32}): allocated and freed around every forward, data-"
            "gradient and weight-gradient call in the trace, sized by the profile's rules "
            f"(bytes from input, output and weight sizes per call class; fitted to {calls} "
            f"measured calls, {error:.0%} mean absolute error); a workspace that does not fit "
            "is given up, as cuDNN then takes a plan that needs less"
            + ("; each new shape's plan search allocates a larger buffer and empties the "
               "allocator's cache (Conv_v8.cpp)" if spec.cudnn_benchmark else ""))
    return lines


def _allocator_assumption(spec: TrainingSpec) -> str:
    settings = AllocatorSettings.from_conf(spec.allocator_conf)
    given = f"PYTORCH_CUDA_ALLOC_CONF={spec.allocator_conf!r}" if spec.allocator_conf else \
        "default allocator settings"
    ignored = (f" (not modelled: {', '.join(settings.not_modelled)})"
               if settings.not_modelled else "")
    return ("CUDA reserved memory: the traced allocations and frees are replayed through a "
            "model of PyTorch's caching allocator (512 B rounding; requests up to 1 MiB packed "
            "in 2 MiB segments, 1-10 MiB in 20 MiB segments, larger rounded to 2 MiB; best fit "
            f"with splitting and merging; {given}{ignored}; a pool per stream, as FSDP2's "
            "all-gather and reduce-scatter streams keep their own); with a capacity, it is "
            "replayed again with capacity - headroom - what the driver reserves - context as "
            "its limit, freeing cached "
            "blocks and retrying before an out-of-memory as PyTorch does: that run decides "
            "what fits")


def unsupported(spec: TrainingSpec) -> list[str]:
    if spec.device is not DeviceKind.CUDA:
        return []
    return [
        "blocks held for other streams, garbage_collection_threshold, CUDA graphs: not "
        "modelled by the allocator replay",
        "CUDA autocast is applied at the Python functions that reach its lists "
        "(memcalc.trace.cuda_autocast); a model calling torch.ops.aten directly keeps CPU "
        "autocast's dtype there",
        "NCCL buffers and DDP gradient buckets: one GPU is assumed",
    ]


def step_assumptions(spec: TrainingSpec, *, checkpoint_blocks: tuple[str, ...],
                     traced_sample_shape: tuple[int, ...], halo_exchange_bytes: int,
                     offloaded_bytes: int, tensor_layout: str = "",
                     ring_exchange_bytes: int = 0, offloaded_state_bytes: int = 0) -> list[str]:
    """What the traced step itself was made to do: checkpointing, spatial split, offloading.
    ``tensor_layout``: what tensor parallelism applied beyond the column/row-wise plan
    (``TensorLayout.describe``)."""
    blocks, lines = checkpoint_blocks, []
    if blocks:
        how = {"selective": "selective per-op (matmul outputs but every second one and "
                            "attention outputs kept, the rest recomputed; torchtitan's op "
                            "policy)"}.get(spec.activation_checkpointing or "", "full")
        lines.append(f"activation checkpointing (non-reentrant, {how}) of {len(blocks)} "
                     f"repeated blocks: {blocks[0]} … {blocks[-1]}")
    if spec.parallel is not None:
        lines.append(
            f"{_traced_rank(spec.parallel)} of {spec.parallel.describe()}: traced in torch's "
            "fake process group with the real wrappers (memcalc.distributed); every "
            "collective finishes at once (a buffer a slow link keeps in flight longer is not "
            "counted); NCCL's own buffers lie outside the caching allocator (on a GPU, counted "
            "with the CUDA context)"
            + (f"; tensor parallel with {tensor_layout}" if tensor_layout else "")
            + (f"; ring attention brings each rank {format_bytes(ring_exchange_bytes)} of "
               "keys, values and their gradients per iteration" if ring_exchange_bytes else ""))
    if spec.parallel is not None and spec.parallel.cpu_offload:
        lines.append(
            "FSDP2 CPU offload traced as CPUOffloadPolicy runs it: parameter shards, their "
            "gradients and the optimizer step in host RAM "
            f"({format_bytes(offloaded_state_bytes)} at most per GPU process; pinned by "
            "default, and CUDA's pinned allocator rounds each block up to a power of two, up "
            "to twice that), each unit's "
            "shards copied to the GPU for its all-gather and each reduced gradient shard "
            "back; the copies' time is not modelled")
    if spec.spatial_parts > 1:
        lines.append(
            f"spatial parallelism over {spec.spatial_parts} GPUs: this GPU runs one slab of "
            f"every sample (input {traced_sample_shape}), its padded convolutions "
            f"and pools receive halo rows from both neighbours ({format_bytes(halo_exchange_bytes)} "
            "per iteration); weights replicated, their gradients all-reduced (buckets not "
            "counted here)")
    if spec.offload_activations:
        lines.append(
            f"activations offloaded as save_on_cpu does: every saved tensor copied to pinned "
            f"host memory ({format_bytes(offloaded_bytes)} per iteration) and back in "
            "backward; the copies' time is not modelled")
    return lines


def compiled_assumptions(names: Sequence[str], fallbacks: Sequence[str]) -> list[str]:
    """How the compiled modules were traced, and a WARNING for each that ran eagerly."""
    if not names:
        return []
    which = ("the model" if "" in names else
             f"{len(names)} module{'s' if len(names) > 1 else ''} ({', '.join(names[:3])}"
             + (", …" if len(names) > 3 else "") + ")")
    lines = [f"torch.compile: {which} traced as Inductor runs it for training: AOTAutograd's "
             "joint graph after Inductor's decompositions, split by its min-cut partitioner "
             "(what the forward saves, what the backward recomputes); each graph run op by "
             "op, a pointwise op whose users are all pointwise fused away, one writing into "
             "a dying input of its shape in place, every value freed after its last use. "
             "Inductor's own scheduling and buffer planning beyond that are not read"]
    lines += [f"WARNING: torch.compile: {fallback}" for fallback in fallbacks]
    return lines


def bounded_size_assumptions(bounded_sizes: Sequence[BoundedSize]) -> list[str]:
    """A line naming the data-dependent ops traced at the most work, and one naming the
    values read with a default (which may leave work out), when there are any."""
    upper = [use for use in bounded_sizes if use.keeps_most_work]
    defaults = [use for use in bounded_sizes if not use.keeps_most_work]
    lines = []
    if upper:
        uses = "; ".join(f"{use.op} {use.count}x: {use.bound}" for use in upper)
        lines.append(f"data-dependent ops traced at upper bounds of their sizes, or with the "
                     f"values that keep the most work (a real step can be smaller, not "
                     f"larger: Mask and Keypoint R-CNN's heads are traced on every sampled "
                     f"proposal, not only the positive ones, about 2x their real step): {uses}")
    if defaults:
        uses = "; ".join(f"{use.op} {use.count}x: {use.bound}" for use in defaults)
        lines.append(f"values read from tensors that no rule covers took a default (a loop "
                     f"or branch they drive may skip work a real step does: the estimate can "
                     f"be LOW): {uses}")
    return lines


def skipped_workspace_assumptions(skipped_bytes: int) -> list[str]:
    """What the replay at capacity left out, when it left anything out."""
    if not skipped_bytes:
        return []
    return [f"cuDNN workspaces of {format_bytes(skipped_bytes)} in all did not fit at the "
            "capacity and are left out of every figure: cuDNN falls back to plans that need "
            "less there (the step can be slower)"]


def attention_assumptions(attention_backends: dict[str, int], gpu: GpuSpec | None) -> list[str]:
    """Which CUDA attention kernel the traced step's SDPA calls ran, and what each keeps."""
    if not attention_backends:
        return []
    card = (f"{gpu.name} (sm {gpu.compute_capability})" if gpu else
            f"an unnamed GPU, sm {'.'.join(map(str, ASSUMED_CAPABILITY))} assumed")
    calls = ", ".join(f"{name} {count}x" for name, count in sorted(attention_backends.items()))
    return [f"scaled-dot-product attention on {card}: {calls}, chosen by the dtype, head size, "
            "mask, dropout and card as PyTorch's sdp_utils.cpp chooses (cuDNN first on sm90/"
            "sm100); cudnn/flash/efficient keep the output and a float32 log-sum-exp per row "
            "(no S x S matrix; dropout regenerated from its seed), math keeps the S x S "
            "probabilities (float32 for half inputs) and a 1-byte dropout mask; cuDNN's "
            "backward takes a workspace of a float32 query gradient and row sum for the call "
            "(flash's backward scratch is not modelled)"]


def step_unsupported(spec: TrainingSpec, *, checkpoint_blocks: tuple[str, ...],
                     table_error: str | None, trace_error: str | None,
                     leaf_outputs_counted: bool = True,
                     unmodelled_kernels: Sequence[str] = ()) -> list[str]:
    """What this estimate could not do, before the gaps every CUDA estimate has."""
    lines = list(unmodelled_kernels)
    if trace_error:
        lines.append(f"{TRACE_FAILED_PREFIX}{trace_error}; the device figure is a STATIC "
                     "estimate (model states, input, layer outputs once), not a trace")
        if not leaf_outputs_counted:
            lines.append("activations: NOT COUNTED in the static estimate (neither torchinfo "
                         "nor a forward on meta tensors could run the model): its figure holds "
                         "model states and the input only")
    if table_error:
        lines.append(f"per-layer table: torchinfo failed ({table_error})")
    if spec.activation_checkpointing and not checkpoint_blocks:
        lines.append("activation checkpointing: no repeated blocks found, not applied")
    return lines + unsupported(spec)


def _traced_rank(parallel) -> str:
    """Which rank the figures are of, and what its batch counts."""
    if parallel.cp > 1:
        return (f"the larger of ranks 0 and {(parallel.cp - 1) * parallel.tp} (the first and "
                "last of a context-parallel group: torch's load-balanced causal ring gives them "
                "different halves of its work; ring attention on the fused kernel CUDA picks, "
                "keys and values all-gathered, torch's default), batch per context-parallel "
                "group")
    if parallel.pp > 1:
        return "the rank of the largest traced stage, batch per pipeline replica"
    return "one rank (rank 0), batch per GPU"
