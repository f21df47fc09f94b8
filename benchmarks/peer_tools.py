"""What users would reach for instead of memcalc, each as a function of a spec → bytes.

- torchinfo: ``summary(...)``'s "Estimated Total Size" = input + forward/backward pass size
  (layer outputs) + parameters; no gradients, optimizer state or temporaries.
- accelerate's ``estimate-memory`` rule for training with Adam: four times the model size
  (weights, gradients, two Adam states).
- DeepSpeed's ``estimate_zero2_model_states_mem_needs`` on one GPU without offload:
  4 × params + 16 × params ÷ GPUs bytes (model states only).
- PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker``: a real step, tracked (it
  allocates everything, so it runs only where the truth runs; one iteration after a warm-up,
  as it does not track repeated iterations).
"""

from __future__ import annotations

import torch
import torchinfo

from memcalc.checkpointing import apply_checkpointing, repeated_blocks
from memcalc.losses import compute_loss, make_target, primary_output
from memcalc.model_source import resolve_model
from memcalc.optimizers import optimizer_rule
from memcalc.precision import precision_policy
from memcalc.specs import INPUT_DTYPES, TrainingSpec


def _model_and_batch(spec: TrainingSpec, batch_shape: tuple[int, ...], device: str):
    source = resolve_model(spec.model, spec.model_args)
    dtype_name = spec.input_dtype or source.default_input_dtype or "float32"
    token_ids = not INPUT_DTYPES[dtype_name].is_floating_point
    if device == "meta":
        model = source.build_meta()
        batch = torch.empty(batch_shape, dtype=torch.int64 if token_ids else torch.float32,
                            device="meta")
    else:
        torch.manual_seed(0)
        model = source.factory(**spec.model_args)
        batch = (torch.randint(0, 100, batch_shape) if token_ids else torch.randn(batch_shape))
    return model, batch, token_ids


def parameter_count(spec: TrainingSpec) -> int:
    model = resolve_model(spec.model, spec.model_args).build_meta()
    return sum(p.numel() for p in model.parameters())


def torchinfo_total(spec: TrainingSpec, batch_shape: tuple[int, ...]) -> int:
    model, batch, _ = _model_and_batch(spec, batch_shape, "meta")
    stats = torchinfo.summary(model, input_data=[batch], device="meta", verbose=0)
    return int(stats.total_input + stats.total_output_bytes + stats.total_param_bytes)


def accelerate_rule(spec: TrainingSpec) -> int:
    bytes_per_weight = precision_policy(spec.precision).parameter_dtype.itemsize
    return 4 * bytes_per_weight * parameter_count(spec)


def deepspeed_zero2_states(spec: TrainingSpec, gpus: int = 1) -> int:
    params = parameter_count(spec)
    return 4 * params + 16 * params // gpus


def mem_tracker_peak(spec: TrainingSpec, batch_shape: tuple[int, ...]) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    model, batch, token_ids = _model_and_batch(spec, batch_shape, "cpu")
    if spec.activation_checkpointing:
        apply_checkpointing(model, repeated_blocks(model))
    policy = precision_policy(spec.precision)
    if policy.autocast_dtype is None:
        model = model.to(policy.parameter_dtype)
    batch = batch.to(policy.batch_dtype(batch.dtype))
    optimizer = optimizer_rule(spec.optimizer).build(model.parameters(), False)
    target = []

    def step():
        autocast = (torch.autocast("cpu", dtype=policy.autocast_dtype)
                    if policy.autocast_dtype else torch.autocast("cpu", enabled=False))
        with autocast:
            output = primary_output(model(batch))
            if not target:
                target.append(make_target(spec.loss, output, token_ids))
            loss = compute_loss(spec.loss, output, target[0], token_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
