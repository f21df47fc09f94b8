"""The registry's state rules against what torch.optim really keeps after a real step."""

import pytest
import torch
from torch import nn

from memcalc.errors import InputError
from memcalc.trace.optimizers import optimizer_names, optimizer_rule, register_optimizer


@pytest.mark.parametrize("name", optimizer_names())
@pytest.mark.parametrize("foreach", [False, True])
def test_rule_matches_real_optimizer_state(name, foreach):
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    rule = optimizer_rule(name)
    optimizer = rule.build(model.parameters(), foreach)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    parameters = list(model.parameters())
    parameter_bytes = sum(p.numel() * p.element_size() for p in parameters)
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    counters = [t for t in state if t.dim() == 0]
    per_element = [t for t in state if t.dim() > 0]
    assert sum(t.numel() * t.element_size() for t in per_element) == rule.state_bytes(parameter_bytes)
    assert sum(t.numel() * t.element_size() for t in counters) == rule.step_counter_bytes(len(parameters))


def test_double_registration_is_an_error():
    with pytest.raises(ValueError, match="registered twice"):
        register_optimizer("adam", state_copies=2, step_counter=True, description="again")(
            lambda params, foreach: None)


def test_unknown_optimizer_lists_the_accepted_names():
    with pytest.raises(InputError, match="accepted: sgd, sgd-momentum, adam"):
        optimizer_rule("lamb")
