"""Which blocks are checkpointed, and what checkpointing saves (the CPU truth of the traced
effect is in test_pipeline's CPU_TRUTH_CASES: gpt2-checkpointed, llama-checkpointed-bf16-mixed)."""

import pytest
import torch

from tests.fixtures.cases import TINY_GPT2
from memcalc.trace.checkpointing import apply_checkpointing, repeated_blocks
from memcalc.model.source import resolve_model
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec


@pytest.mark.parametrize("model,first,count", [
    ("gpt2", "blocks.0", 12), ("bert_large", "layers.0", 24), ("resnet3d", "layer1.0", 8),
    ("llama_7b", "blocks.0", 32), ("vit_b16", "blocks.0", 12),
])
def test_repeated_blocks_are_the_layers_users_wrap(model, first, count):
    blocks = repeated_blocks(resolve_model(model).build_meta())
    assert blocks[0] == first and len(blocks) == count


def test_a_model_without_repeated_blocks_gets_none():
    assert repeated_blocks(resolve_model("mlp").build_meta()) == []


def test_checkpointed_forward_gives_the_same_gradients():
    torch.manual_seed(0)
    model = resolve_model("gpt2", TINY_GPT2).factory(**TINY_GPT2)
    tokens = torch.randint(0, 100, (2, 16))
    model(tokens).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    apply_checkpointing(model, repeated_blocks(model))
    model(tokens).sum().backward()
    for expected, got in zip(plain, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, expected)


def test_checkpointing_lowers_the_activation_line():
    spec = TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(128,), device="cpu",
                        batch_size=8)
    plain = estimate(spec).device
    checkpointed = estimate(spec.with_changes(activation_checkpointing=True)).device
    assert checkpointed.breakdown.activations < plain.breakdown.activations / 2


def test_counting_flops_in_the_first_iteration_does_not_change_what_it_keeps():
    """Both iterations run the same checkpointed step; the second also holds Adam's state, so
    its peak is the higher one. (A FLOP counter that hooks module outputs kept the recomputed
    activations alive in the first iteration only, and moved the peak there.)"""
    spec = TrainingSpec(model="resnet3d", sample_shape=(3, 128, 64, 128), batch_size=1,
                        activation_checkpointing=True, machine={"cpus": 2, "ram_bytes": 8 << 30})
    device = estimate(spec).device
    by_iteration = {}
    for point in device.timeline:
        by_iteration[point.iteration] = max(by_iteration.get(point.iteration, 0), point.live_bytes)
    assert device.flops is not None and device.flops.total > 0
    assert device.peak_iteration == 2 and by_iteration[1] < by_iteration[2]


TINY_BERT = dict(vocab=1000, dim=64, depth=3, heads=4, hidden=128, max_positions=64)


@pytest.mark.parametrize("policy", ["full", "selective", "every:2"])
def test_dropout_under_checkpointing_traces_for_a_cuda_target(policy):
    """CUDA's fused dropout (a bool mask) is substituted in the forward; the recomputation in
    backward must make the same tensors, or torch's checkpoint refuses the trace."""
    def report(checkpointing):
        return estimate(TrainingSpec(model="bert_large", model_args=TINY_BERT, sample_shape=(64,),
                                     batch_size=8, activation_checkpointing=checkpointing))
    plain, checkpointed = report(None), report(policy)
    assert checkpointed.device.method == plain.device.method == "traced"
    assert checkpointed.device.breakdown.activations < plain.device.breakdown.activations


def test_selective_keeps_more_than_full_and_less_than_none():
    def activations(checkpointing):
        return estimate(TrainingSpec(model="llama_7b", sample_shape=(64,), batch_size=8,
                                     model_args=dict(vocab=1000, dim=64, depth=4, heads=4,
                                                     hidden=172, max_positions=64),
                                     device="cpu", activation_checkpointing=checkpointing)
                        ).device.breakdown.activations
    assert activations("full") < activations("selective") < activations(None)
    assert activations("full") < activations("every:2") < activations(None)


@pytest.mark.parametrize("given,policy", [(True, "full"), (False, None), ("Selective", "selective"),
                                          ("every:3", "every:3")])
def test_checkpointing_policies_accepted(given, policy):
    assert TrainingSpec(model="gpt2", activation_checkpointing=given).activation_checkpointing == policy


@pytest.mark.parametrize("given", ["every:0", "sometimes", "every:x"])
def test_a_bad_checkpointing_policy_is_refused(given):
    with pytest.raises(ValueError, match="use full, selective or every:N"):
        TrainingSpec(model="gpt2", activation_checkpointing=given)
