import pytest
import torch
import torch.nn.functional as F

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.trace.legacy_autograd import LegacyAutogradMode

ROWS, WIDTH, LAYERS = 1024, 64, 4


@pytest.mark.parametrize("call", [
    lambda x: torch.softmax(x, -1), lambda x: F.softmax(x, dim=-1), lambda x: x.softmax(-1),
    lambda x: torch.log_softmax(x, 1), lambda x: F.log_softmax(x, -1), lambda x: x.log_softmax(-1),
    lambda x: torch.softmax(x, -1, torch.float64), lambda x: F.softmax(x, 1, dtype=torch.float32),
], ids=["torch", "F", "Tensor", "log-torch", "log-F", "log-Tensor", "dtype", "F-dtype"])
def test_old_formula_gives_the_same_values_and_gradients(call):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 5, dtype=torch.float64)
    (call(x) * weight).sum().backward()
    expected_grad, x.grad = x.grad, None
    with LegacyAutogradMode(softmax_saves_input=True):
        legacy = call(x)
    (legacy * weight).sum().backward()
    torch.testing.assert_close(legacy, call(x))
    torch.testing.assert_close(x.grad, expected_grad)


def test_off_leaves_softmax_alone():
    x = torch.randn(2, 3, requires_grad=True)
    with LegacyAutogradMode(softmax_saves_input=False):
        assert torch.softmax(x, -1).grad_fn.name() == "SoftmaxBackward0"


def stacked_softmax():
    """LAYERS x (Linear(WIDTH -> WIDTH), softmax): each softmax input is ROWS x WIDTH fp32."""
    layers = [(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Softmax(-1)) for _ in range(LAYERS)]
    return torch.nn.Sequential(*[module for pair in layers for module in pair])


def test_torch_before_1_11_keeps_every_softmax_input_until_its_backward():
    spec = TrainingSpec(model="tests.test_legacy_autograd:stacked_softmax", sample_shape=(WIDTH,),
                        loss="sum", optimizer="sgd", batch_size=ROWS, device="cpu")
    now = estimate(spec).device.breakdown.activations
    legacy = estimate(spec.with_changes(softmax_saves_input=True)).device.breakdown.activations
    # torch < 1.11 derivatives.yaml: _softmax_backward_data(grad, result, dim, self) keeps the
    # input (the linear's output) besides the result; torch >= 1.11 frees it after forward.
    # The peak comes in backward, once the last softmax's backward has freed its input:
    # LAYERS - 1 inputs of ROWS x WIDTH fp32 are still held there.
    assert legacy - now == (LAYERS - 1) * ROWS * WIDTH * 4
