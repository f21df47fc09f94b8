import pytest
import torch

from memcalc.measure_cpu import measure_cpu_peak_bytes
from memcalc.model_source import resolve_model
from memcalc.optimizers import optimizer_rule
from memcalc.specs import LossKind, TrainingSpec


@pytest.fixture(autouse=True)
def _single_thread():
    # CPU truth runs allocate the same on 1 or 2 threads; one keeps the timings stable.
    torch.set_num_threads(1)


def real_cpu_peak(spec: TrainingSpec, traced_batch_shape: tuple[int, ...]) -> int:
    """Measure the spec's training step for real on CPU (profiler memory timeline)."""
    torch.manual_seed(0)
    source = resolve_model(spec.model, spec.model_args)
    model = source.factory(**spec.model_args)
    token_ids = (spec.input_dtype or source.default_input_dtype or "float32").startswith("int")
    if token_ids:
        batch = torch.randint(0, 100, traced_batch_shape)
    else:
        batch = torch.randn(traced_batch_shape)
    autocast = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(spec.precision.value)
    return measure_cpu_peak_bytes(model, batch, LossKind(spec.loss), optimizer_rule(spec.optimizer),
                                  classes_last=token_ids, autocast_dtype=autocast)
