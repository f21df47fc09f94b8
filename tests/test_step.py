"""The one training-step body: phases in order, the target made once, the optimizer only
when given, and what it computes on real tensors."""

import torch
from torch import nn

from memcalc.specs import LossKind
from memcalc.trace.ledger import Phase
from memcalc.trace.step import StepBody, StepObserver, TrainingIteration


class _Log(StepObserver):
    def __init__(self):
        self.events = []

    def enter(self, phase):
        self.events.append(phase.value)

    def target_made(self, target):
        self.events.append(f"target {tuple(target.shape)}")

    def loss_begins(self):
        self.events.append("loss")

    def loss_ends(self):
        self.events.append("/loss")


def test_phases_come_in_training_order_and_the_target_is_made_once():
    torch.manual_seed(0)
    model, log = nn.Linear(4, 3), _Log()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = TrainingIteration(StepBody(LossKind.CROSS_ENTROPY, classes_last=False), model,
                             torch.randn(5, 4), optimizer, log)
    assert step() == (5, 3) and step() == (5, 3)
    one = [Phase.FORWARD.value, "loss", "/loss", Phase.BACKWARD.value, Phase.OPTIMIZER.value,
           Phase.ZERO_GRAD.value]
    assert log.events == one[:1] + ["target (5,)"] + one[1:] + one


def test_without_an_optimizer_the_step_ends_after_backward():
    model, log = nn.Linear(4, 3), _Log()
    TrainingIteration(StepBody(LossKind.SUM, classes_last=False), model, torch.randn(2, 4),
                      observer=log)()
    assert log.events[-1] == Phase.BACKWARD.value
    assert model.weight.grad is not None     # kept: nothing zeroes it


def test_a_real_step_takes_the_sgd_update_of_the_summed_output():
    model = nn.Linear(4, 1, bias=False)
    before = model.weight.detach().clone()
    batch = torch.randn(6, 4)
    step = TrainingIteration(StepBody(LossKind.SUM, classes_last=False), model, batch,
                             torch.optim.SGD(model.parameters(), lr=0.5))
    step()
    # d(sum(x @ w.T))/dw = sum of the rows of x
    torch.testing.assert_close(model.weight.detach(), before - 0.5 * batch.sum(0, keepdim=True))
    assert model.weight.grad is None         # zero_grad(set_to_none=True)
