"""``torch._grouped_mm`` (MoE experts in transformers 5) on fake tensors: memcalc's shape rule
against the real CPU kernel, and tiny Mixtral / Qwen2-MoE training steps traced through it."""

import pytest
import torch

from memcalc.specs import LossKind
from memcalc.trace._torch_internals import FAKE_KERNELS, fake_cpu_mode
from memcalc.trace.optimizers import optimizer_rule
from memcalc.trace.precision import precision_policy
from memcalc.trace.tracer import StepSetup, trace_training_step

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"),
                                reason="torch._grouped_mm arrived in torch 2.8")

GROUPED_MM = FAKE_KERNELS["aten::_grouped_mm"]
OFFSETS = [3, 7, 10]


def _operands(case: str, dtype: torch.dtype):
    """Real operands with the 16-byte-aligned strides the kernel requires."""
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    experts = torch.randn(3, 6, 8).transpose(-1, -2)           # (3, 8, 6), column-major
    mat_a, mat_b, offs = {
        "2d x 3d": (torch.randn(10, 8), experts, offs),          # MoE forward
        "3d x 3d": (torch.randn(3, 4, 8), experts, None),
        "2d x 2d": (torch.randn(10, 8).t(), torch.randn(10, 8), offs),   # weight gradient
    }[case]
    return mat_a.to(dtype), mat_b.to(dtype), offs


@pytest.mark.parametrize("case", ["2d x 3d", "3d x 3d", "2d x 2d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_shape_rule_matches_the_real_cpu_kernel(case, dtype):
    mat_a, mat_b, offs = _operands(case, dtype)
    real = torch._grouped_mm(mat_a, mat_b, offs=offs)
    with fake_cpu_mode() as mode:
        fakes = [None if t is None else mode.from_tensor(t) for t in (mat_a, mat_b, offs)]
        fake = GROUPED_MM(*fakes)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)
    assert fake.untyped_storage().nbytes() == real.untyped_storage().nbytes()


def test_mixed_dtypes_are_refused_as_the_kernel_refuses_them():
    with fake_cpu_mode(), pytest.raises(RuntimeError, match="one dtype"):
        GROUPED_MM(torch.empty(10, 8), torch.empty(3, 8, 8, dtype=torch.bfloat16),
                   torch.empty(3, dtype=torch.int32))


def _tiny_moe(family: str):
    transformers = pytest.importorskip("transformers")
    shared = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2)
    if family == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=64, num_local_experts=4, **shared)
        model_class = transformers.MixtralForCausalLM
    else:
        config = transformers.Qwen2MoeConfig(intermediate_size=64, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=64, num_experts=4,
                                             **shared)
        model_class = transformers.Qwen2MoeForCausalLM
    with torch.device("meta"):
        return model_class(config)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_tiny_moe_training_step_traces_through_grouped_mm(family, precision):
    model = _tiny_moe(family)
    setup = StepSetup(lambda: model, (2, 16), torch.int64, LossKind.CROSS_ENTROPY,
                      classes_last=True, optimizer=optimizer_rule("adam"), foreach=True,
                      policy=precision_policy(precision))
    result = trace_training_step(setup)
    assert result.output_shape == (2, 16, 128)
    assert "_grouped_mm" in result.op_names
    assert result.bounded_sizes == ()           # routing sorts and counts: nothing bounded


@pytest.mark.parametrize("implementation,op", [("eager", "nonzero"), ("batched_mm", "bmm")])
def test_the_other_expert_implementations_trace_too(implementation, op):
    """transformers' ``eager`` experts pick their tokens with ``torch.where`` (bounded here);
    ``batched_mm`` gathers every expert's weights per token."""
    model = _tiny_moe("mixtral")
    model.config._experts_implementation = implementation
    setup = StepSetup(lambda: model, (2, 16), torch.int64, LossKind.CROSS_ENTROPY,
                      classes_last=True, optimizer=optimizer_rule("adam"), foreach=True,
                      policy=precision_policy("fp32"))
    result = trace_training_step(setup)
    assert op in result.op_names and "_grouped_mm" not in result.op_names
