"""FLOPs of a training step against closed forms for linear and conv layers."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from memcalc.model.source import resolve_model
from memcalc.trace.checkpointing import apply_checkpointing, repeated_blocks
from memcalc.pipeline import training_flops
from memcalc.specs import TrainingSpec


def test_mlp_flops_are_three_forwards_minus_the_first_input_gradient():
    spec = TrainingSpec(model="mlp", model_args=dict(in_features=256, hidden=1024, depth=2),
                        sample_shape=(256,), device="cpu")
    batch = 4
    layers = [(256, 1024), (1024, 1024), (1024, 10)]
    forward = sum(2 * batch * fan_in * fan_out for fan_in, fan_out in layers)
    first_input_gradient = 2 * batch * 256 * 1024    # the input needs no gradient
    assert training_flops(spec, batch) == 3 * forward - first_input_gradient


def test_conv_flops_follow_output_voxels_times_kernel():
    spec = TrainingSpec(model="tests.fixtures.models:single_conv3d", sample_shape=(2, 8, 8, 8),
                        device="cpu", loss="sum")
    out_voxels = 8 * 8 * 8                      # 3x3x3, padding 1, stride 1
    forward = 2 * 2 * 4 * 27 * out_voxels       # 2 in, 4 out channels
    assert training_flops(spec, 1) == forward * 2   # + weight gradient (input needs none)


def _cpu_attention_formulas() -> dict:
    """torch's attention formulas for CPU's flash kernel, which its counter leaves out."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v)}


def _real_step_flops(model: nn.Module, checkpointed: bool) -> int:
    """FLOPs of a real CPU forward + loss + backward (real weights, torch's own checkpoint)."""
    if checkpointed:
        apply_checkpointing(model, repeated_blocks(model))
    tokens = torch.randint(0, 1000, (1, 64))
    with FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas()) as counter:
        logits = model(tokens)
        nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return counter.get_total_flops()


def test_checkpointing_adds_what_a_real_checkpointed_step_recomputes():
    args = dict(vocab=1000, n_positions=64, dim=64, depth=2, heads=4)
    spec = TrainingSpec(model="gpt2", model_args=args, sample_shape=(64,), device="cpu")
    plain = training_flops(spec)
    checkpointed = training_flops(spec.with_changes(activation_checkpointing=True))
    factory = resolve_model("gpt2", args).factory
    real_plain = _real_step_flops(factory(**args), checkpointed=False)
    real_checkpointed = _real_step_flops(factory(**args), checkpointed=True)
    assert plain == real_plain
    assert checkpointed - plain == real_checkpointed - real_plain > 0


def _closed_form_forward_flops(model, batch) -> int:
    """2 × MACs of every conv and linear layer, from its weight and its output size."""
    total = [0]

    def count(module, _inputs, output):
        if isinstance(module, nn.Linear):
            total[0] += 2 * module.in_features * module.out_features * output.numel() // (
                module.out_features)
        else:   # conv: each output element takes in_channels/groups × kernel MACs
            per_output = module.weight[0].numel()
            total[0] += 2 * per_output * output.numel()

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            module.register_forward_hook(count)
    with torch.no_grad():
        model(batch)
    return total[0]



@pytest.mark.parametrize("name,shape,args", [
    ("resnet50", (2, 3, 64, 64), {"num_classes": 10}),
    ("resnet3d", (1, 3, 16, 32, 32), {"depth": 18, "num_classes": 5}),
    ("vit_b16", (2, 3, 64, 64), {"image_size": 64, "dim": 128, "depth": 2, "heads": 4,
                                 "num_classes": 10}),
])
def test_zoo_forward_flops_match_the_conv_and_linear_closed_form(name, shape, args):
    model = resolve_model(name, args).build_meta()
    batch = torch.empty(shape, device="meta")
    expected = _closed_form_forward_flops(model, batch)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(batch)
    counted = counter.get_total_flops()
    attention = counted - expected          # ViT: the S×S attention matmuls, counted extra
    if name == "vit_b16":
        tokens, dim, depth = (64 // 16) ** 2 + 1, 128, 2
        assert attention == depth * 2 * (2 * shape[0] * tokens * tokens * dim)
    else:
        assert counted == expected


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])   # memory-efficient, cuDNN
def test_attention_flops_are_counted_whichever_kernel_cuda_runs(precision):
    # bf16 on an H100 runs cuDNN attention, traced as CPU's flash kernel, for which torch's
    # formulas count nothing; closed form: the qkv projection forward and its weight's
    # gradient (2 matmuls of B·S × dim × 3·dim: the input needs no gradient), attention's
    # forward (QKᵀ and PV: 4·B·H·S²·D) and its backward (torch's formula: 2.5 forwards)
    batch, seq, dim, heads = 2, 256, 64, 4
    spec = TrainingSpec(model="tests.fixtures.models:attention_with_dropout",
                        sample_shape=(seq, dim), loss="sum", optimizer="sgd",
                        batch_size=batch, precision=precision, gpu="H100-80GB")
    projection = 2 * (2 * batch * seq * dim * 3 * dim)
    attention = 3.5 * (4 * batch * heads * seq * seq * (dim // heads))
    assert training_flops(spec, batch) == projection + attention
