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

from tests.fixtures.cpu_truth import spec_training_step
from memcalc.model.source import resolve_model
from memcalc.trace.precision import precision_policy
from memcalc.dtypes import INPUT_DTYPES
from memcalc.specs import TrainingSpec


def _meta_model_and_batch(spec: TrainingSpec, batch_shape: tuple[int, ...]):
    source = resolve_model(spec.model, spec.model_args)
    dtype_name = spec.input_dtype or source.default_input_dtype or "float32"
    dtype = torch.float32 if INPUT_DTYPES[dtype_name].is_floating_point else torch.int64
    return source.build_meta(), torch.empty(batch_shape, dtype=dtype, device="meta")


def parameter_count(spec: TrainingSpec) -> int:
    model = resolve_model(spec.model, spec.model_args).build_meta()
    return sum(p.numel() for p in model.parameters())


def torchinfo_total(spec: TrainingSpec, batch_shape: tuple[int, ...]) -> int:
    model, batch = _meta_model_and_batch(spec, batch_shape)
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

    step = spec_training_step(spec, batch_shape)
    step()                      # the optimizer state exists before the tracked step
    tracker = MemTracker()
    tracker.track_external(step.model, step.optimizer)
    with tracker:
        step()
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
