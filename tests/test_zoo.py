"""Every zoo model builds without weights and estimates on its default shape."""

import pytest
import torch

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from models_zoo import ZOO

# Published parameter counts (torchvision weight docs `num_params`; HF model cards).
PUBLISHED_PARAMETER_COUNTS = {
    "resnet3d": 33_371_472,   # torchvision R3D_18_Weights.KINETICS400_V1
    "resnet50": 25_557_032,   # torchvision ResNet50_Weights.IMAGENET1K_V1
    "convnext": 28_589_128,   # torchvision ConvNeXt_Tiny_Weights.IMAGENET1K_V1
    "vit_b16": 86_567_656,    # torchvision ViT_B_16_Weights.IMAGENET1K_V1
    "gpt2": 124_439_808,      # Hugging Face gpt2 (GPT2LMHeadModel, tied head)
    "llama_7b": 6_738_415_616,  # Llama-2-7b
    # Hugging Face bert-large-uncased BertModel (335,141,888) + a 1024 x 2 classifier
    "bert_large": 335_141_888 + 1024 * 2 + 2,
}


def _closed_form_mlp(in_features=1024, hidden=4096, depth=3, classes=10):
    return (in_features * hidden + hidden + (depth - 1) * (hidden * hidden + hidden)
            + hidden * classes + classes)


@pytest.mark.parametrize("name", list(ZOO))
def test_builds_on_meta_without_allocating(name):
    with torch.device("meta"):
        model = ZOO[name].build()
    assert all(p.device.type == "meta" for p in model.parameters())
    count = sum(p.numel() for p in model.parameters())
    if name in PUBLISHED_PARAMETER_COUNTS:
        assert count == PUBLISHED_PARAMETER_COUNTS[name]
    if name == "mlp":
        assert count == _closed_form_mlp()


@pytest.mark.parametrize("name", list(ZOO))
def test_estimates_on_default_shape(name):
    report = estimate(TrainingSpec(model=name), card_fits=False)   # the step itself
    device = report.device
    assert device.method == "traced"
    assert tuple(report.input.traced_batch_shape[1:]) == ZOO[name].default_shape
    # a training step holds at least its parameters, their grads at some point, and the input
    assert device.peak_bytes > report.static.parameter_bytes + report.static.input_batch_bytes
    # a model with a Linear layer holds two cuBLAS workspaces (forward and autograd threads);
    # an all-conv model runs on cuDNN and holds none
    with torch.device("meta"):
        modules = list(ZOO[name].build().modules())
    has_linear = any(isinstance(module, torch.nn.Linear) for module in modules)
    assert device.workspace_bytes == (2 * (4096 * 1024 * 2 + 16 * 1024 * 8) if has_linear else 0)
    assert device.breakdown.total_bytes + device.workspace_bytes == device.peak_allocated_bytes
    # CUDA default: reserved is the replayed peak, whole 512 B blocks, ≥ allocated; the total
    # adds the context outside the allocator
    assert device.peak_reserved_bytes >= device.peak_allocated_bytes
    assert device.peak_bytes == device.peak_reserved_bytes + device.context_bytes
    assert device.peak_reserved_bytes % 512 == 0
    assert device.breakdown.parameters == report.static.parameter_bytes


def test_llama_7b_fp32_adam_model_states_are_16_bytes_per_parameter():
    report = estimate(TrainingSpec(model="llama_7b", sample_shape=(128,)), card_fits=False)
    params = PUBLISHED_PARAMETER_COUNTS["llama_7b"]
    states = report.static
    assert states.parameter_bytes + states.gradient_bytes + states.optimizer_state_bytes == 16 * params
    assert report.device.peak_bytes > 16 * params  # does not fit on an 80 GB GPU
