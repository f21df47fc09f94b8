"""Optimizer registry: how to build each optimizer and how much state it keeps.

Adding an optimizer is one decorated builder. ``state_copies`` is the number of
parameter-shaped state tensors the optimizer keeps per parameter (in the parameter's dtype);
``step_counter`` says whether it also keeps a scalar ``step`` tensor per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from memcalc.errors import InputError

OptimizerBuilder = Callable[[Iterable[torch.nn.Parameter], bool], torch.optim.Optimizer]

# torch.optim keeps ``state["step"]`` as a float32 scalar tensor (``_get_scalar_dtype``).
STEP_COUNTER_BYTES = 4


@dataclass(frozen=True)
class OptimizerRule:
    """What an optimizer costs and how to build it for a traced step."""

    name: str
    state_copies: int
    step_counter: bool
    description: str
    build: OptimizerBuilder

    def state_bytes(self, parameter_bytes: int) -> int:
        """Bytes of per-element state for parameters occupying ``parameter_bytes``."""
        return self.state_copies * parameter_bytes

    def step_counter_bytes(self, parameter_tensors: int) -> int:
        """Bytes of scalar step counters for ``parameter_tensors`` parameter tensors."""
        return STEP_COUNTER_BYTES * parameter_tensors if self.step_counter else 0


_REGISTRY: dict[str, OptimizerRule] = {}


def register_optimizer(name: str, *, state_copies: int, step_counter: bool, description: str):
    """Register ``builder(params, foreach) -> Optimizer`` under ``name``."""

    def decorate(builder: OptimizerBuilder) -> OptimizerBuilder:
        if name in _REGISTRY:
            raise ValueError(f"optimizer {name!r} is registered twice")
        _REGISTRY[name] = OptimizerRule(name, state_copies, step_counter, description, builder)
        return builder

    return decorate


def optimizer_names() -> list[str]:
    return list(_REGISTRY)


def optimizer_rule(name: str) -> OptimizerRule:
    if name not in _REGISTRY:
        raise InputError(f"unknown optimizer {name!r}; accepted: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


@register_optimizer("sgd", state_copies=0, step_counter=False, description="SGD, no momentum")
def _sgd(params, foreach):
    return torch.optim.SGD(params, lr=0.01, foreach=foreach)


@register_optimizer(
    "sgd-momentum", state_copies=1, step_counter=False, description="SGD, momentum 0.9"
)
def _sgd_momentum(params, foreach):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach)


@register_optimizer("adam", state_copies=2, step_counter=True, description="Adam (exp_avg, exp_avg_sq)")
def _adam(params, foreach):
    return torch.optim.Adam(params, lr=1e-3, foreach=foreach)


@register_optimizer("adamw", state_copies=2, step_counter=True, description="AdamW (exp_avg, exp_avg_sq)")
def _adamw(params, foreach):
    return torch.optim.AdamW(params, lr=1e-3, foreach=foreach)


@register_optimizer("rmsprop", state_copies=1, step_counter=True, description="RMSprop (square_avg)")
def _rmsprop(params, foreach):
    return torch.optim.RMSprop(params, lr=1e-2, foreach=foreach)


@register_optimizer("adagrad", state_copies=1, step_counter=True, description="Adagrad (sum)")
def _adagrad(params, foreach):
    return torch.optim.Adagrad(params, lr=1e-2, foreach=foreach)
