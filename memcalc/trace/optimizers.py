"""Optimizer registry: how to build each optimizer and how much state it keeps.

Adding an optimizer is one decorated builder. ``state_copies`` is the number of
parameter-shaped state tensors the optimizer keeps per parameter (in the parameter's dtype);
``step_counter`` says whether it also keeps a scalar ``step`` tensor per parameter.

Options (``OptimizerOptions``): ``weight_decay`` (torch.optim's own; for-loop and foreach Adam
add a parameter-sized ``grad + wd * param`` temporary, which the trace records), ``amsgrad``
(one more state tensor, ``max_exp_avg_sq``) and ``fused``. The fused CUDA kernels
(``aten/src/ATen/native/cuda/fused_adam_impl.cu``, ``fused_adamw_impl.cu``,
``fused_sgd_kernel.cu``) update parameter and state in place through ``multi_tensor_apply``
with no parameter-sized temporaries; torch's CPU fused kernels (``native/FusedAdam.cpp``,
``FusedSGD.cpp``) do the same in place, so the trace builds the optimizer with ``fused=True``
and records the same tensors. Optimizers without a CUDA fused kernel refuse ``fused``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import torch

from memcalc.errors import InputError



@dataclass(frozen=True)
class OptimizerOptions:
    """torch.optim options that change what an optimizer keeps or allocates."""

    weight_decay: float = 0.0
    amsgrad: bool = False
    fused: bool = False


OptimizerBuilder = Callable[[Iterable[torch.nn.Parameter], bool, OptimizerOptions],
                            torch.optim.Optimizer]

# torch.optim keeps ``state["step"]`` as a float32 scalar tensor (``_get_scalar_dtype``).
STEP_COUNTER_BYTES = 4


@dataclass(frozen=True)
class OptimizerRule:
    """What an optimizer costs and how to build it for a traced step."""

    name: str
    base_copies: int
    step_counter: bool
    description: str
    builder: OptimizerBuilder
    has_amsgrad: bool = False
    has_fused: bool = False
    options: OptimizerOptions = field(default_factory=OptimizerOptions)

    @property
    def state_copies(self) -> int:
        """Parameter-shaped state tensors per parameter (amsgrad adds ``max_exp_avg_sq``)."""
        return self.base_copies + int(self.options.amsgrad and self.has_amsgrad)

    def with_options(self, options: OptimizerOptions) -> OptimizerRule:
        """This rule with ``options``; an InputError for an option the optimizer lacks."""
        if options.amsgrad and not self.has_amsgrad:
            raise InputError(f"optimizer {self.name!r} has no amsgrad option")
        if options.fused and not self.has_fused:
            raise InputError(f"optimizer {self.name!r} has no fused CUDA implementation")
        return replace(self, options=options)

    def build(self, params: Iterable[torch.nn.Parameter], foreach: bool) -> torch.optim.Optimizer:
        """The optimizer over ``params``; fused takes precedence over ``foreach``."""
        return self.builder(params, foreach and not self.options.fused, self.options)

    def state_bytes(self, parameter_bytes: int) -> int:
        """Bytes of per-element state for parameters occupying ``parameter_bytes``."""
        return self.state_copies * parameter_bytes

    def step_counter_bytes(self, parameter_tensors: int) -> int:
        """Bytes of scalar step counters for ``parameter_tensors`` parameter tensors."""
        return STEP_COUNTER_BYTES * parameter_tensors if self.step_counter else 0


_REGISTRY: dict[str, OptimizerRule] = {}


def register_optimizer(name: str, *, state_copies: int, step_counter: bool, description: str,
                       amsgrad: bool = False, fused: bool = False):
    """Register ``builder(params, foreach, options) -> Optimizer`` under ``name``."""

    def decorate(builder: OptimizerBuilder) -> OptimizerBuilder:
        if name in _REGISTRY:
            raise ValueError(f"optimizer {name!r} is registered twice")
        _REGISTRY[name] = OptimizerRule(name, state_copies, step_counter, description, builder,
                                        amsgrad, fused)
        return builder

    return decorate


def optimizer_names() -> list[str]:
    return list(_REGISTRY)


def optimizer_rule(name: str) -> OptimizerRule:
    if name not in _REGISTRY:
        raise InputError(f"unknown optimizer {name!r}; accepted: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def _common(foreach: bool, options: OptimizerOptions) -> dict:
    """Keyword arguments every torch.optim optimizer here takes."""
    return {"foreach": foreach, "weight_decay": options.weight_decay}


def _fused(foreach: bool, options: OptimizerOptions) -> dict:
    """``_common`` plus ``fused`` (torch refuses foreach and fused together)."""
    return {**_common(foreach, options), "fused": options.fused or None}


@register_optimizer("sgd", state_copies=0, step_counter=False, description="SGD, no momentum",
                    fused=True)
def _sgd(params, foreach, options):
    return torch.optim.SGD(params, lr=0.01, **_fused(foreach, options))


@register_optimizer("sgd-momentum", state_copies=1, step_counter=False,
                    description="SGD, momentum 0.9", fused=True)
def _sgd_momentum(params, foreach, options):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, **_fused(foreach, options))


@register_optimizer("adam", state_copies=2, step_counter=True,
                    description="Adam (exp_avg, exp_avg_sq)", amsgrad=True, fused=True)
def _adam(params, foreach, options):
    return torch.optim.Adam(params, lr=1e-3, amsgrad=options.amsgrad, **_fused(foreach, options))


@register_optimizer("adamw", state_copies=2, step_counter=True,
                    description="AdamW (exp_avg, exp_avg_sq)", amsgrad=True, fused=True)
def _adamw(params, foreach, options):
    return torch.optim.AdamW(params, lr=1e-3, amsgrad=options.amsgrad, **_fused(foreach, options))


@register_optimizer("rmsprop", state_copies=1, step_counter=True, description="RMSprop (square_avg)")
def _rmsprop(params, foreach, options):
    return torch.optim.RMSprop(params, lr=1e-2, **_common(foreach, options))


# Adagrad's fused implementation is CPU-only (torch.optim.Adagrad docs), so not offered here.
@register_optimizer("adagrad", state_copies=1, step_counter=True, description="Adagrad (sum)")
def _adagrad(params, foreach, options):
    return torch.optim.Adagrad(params, lr=1e-2, **_common(foreach, options))


def configured_rule(name: str, *, weight_decay: float = 0.0, amsgrad: bool = False,
                    fused: bool = False) -> OptimizerRule:
    """The rule named ``name`` with the spec's options (an InputError for one it lacks)."""
    return optimizer_rule(name).with_options(OptimizerOptions(weight_decay, amsgrad, fused))
