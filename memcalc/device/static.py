"""Static part: model states counted from the module, and torchinfo's per-layer table."""

from __future__ import annotations

import math

import torch
import torchinfo
from torch import nn

from memcalc.model.user_hooks import hooks_set_aside, user_hooks
from memcalc.device.report import LayerRow, StaticEstimate
from memcalc.dtypes import element_size
from memcalc.model.inputs import ModelInputs, make_call, tensors_in
from memcalc.trace._torch_internals import RealAllocationGuard
from memcalc.trace.numpy_limit import numpy_buffer_limit
from memcalc.trace.optimizers import OptimizerRule
from memcalc.trace.precision import PrecisionPolicy

# Rows of the per-layer table kept in the report (deeper layers are still summed).
LAYER_TABLE_DEPTH = 2


def stored_dtype(tensor: torch.Tensor, policy: PrecisionPolicy) -> torch.dtype:
    """Floating tensors are stored in the policy's parameter dtype, others as they are."""
    return policy.parameter_dtype if tensor.is_floating_point() else tensor.dtype


def tensor_bytes(tensor: torch.Tensor, policy: PrecisionPolicy) -> int:
    return tensor.numel() * element_size(stored_dtype(tensor, policy))


def static_estimate(model: nn.Module, inputs: ModelInputs, batch_size: int,
                    policy: PrecisionPolicy, optimizer: OptimizerRule, *,
                    training: bool = True) -> StaticEstimate:
    """Exact bytes of parameters, buffers, gradients, optimizer state and the input batch
    (an evaluation step, ``training`` False, has no gradients or optimizer state).

    Shared parameters are counted once (``Module.parameters`` de-duplicates them).
    """
    parameters = list(model.parameters())
    trainable = [param for param in parameters if param.requires_grad and training]
    trainable_bytes = sum(tensor_bytes(param, policy) for param in trainable)
    return StaticEstimate(
        parameter_bytes=sum(tensor_bytes(param, policy) for param in parameters),
        buffer_bytes=sum(tensor_bytes(buffer, policy) for buffer in model.buffers()),
        gradient_bytes=trainable_bytes,
        optimizer_state_bytes=optimizer.state_bytes(trainable_bytes),
        optimizer_step_counter_bytes=optimizer.step_counter_bytes(len(trainable)),
        input_batch_bytes=inputs.batch_bytes(batch_size),
    )


def _summary(model: nn.Module, args: list, kwargs: dict):
    return torchinfo.summary(model, input_data=args or None, device="meta", verbose=0,
                             depth=LAYER_TABLE_DEPTH, **kwargs)


def layer_table(model: nn.Module, inputs: ModelInputs
                ) -> tuple[list[LayerRow], int | None, str | None]:
    """torchinfo's table for a batch of one on ``meta``.

    Returns the rows up to ``LAYER_TABLE_DEPTH``, the elements output by leaf layers per
    sample, and torchinfo's error if any. When torchinfo fails, the leaf outputs come from a
    hooked forward on ``meta`` (no table); None only when that fails too.
    """
    with torch.device("meta"):
        call = make_call(model, inputs, 1)
    # the forward runs for real here, on meta tensors: real memory it takes is refused
    with numpy_buffer_limit(), RealAllocationGuard():
        return _table(model, list(call.args), call.kwargs)


def _table(model: nn.Module, args: list, kwargs: dict
           ) -> tuple[list[LayerRow], int | None, str | None]:
    try:
        summary = _summary(model, args, kwargs)
    except (Exception, SystemExit) as error:  # torchinfo runs user code: a failure drops it
        try:        # the model's own hooks may be what fails on meta tensors
            if not user_hooks(model):
                raise
            with hooks_set_aside(model):
                summary = _summary(model, args, kwargs)
        except (Exception, SystemExit):
            message = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            return [], leaf_output_elements(model, args, kwargs), message
    names = {id(module): name for name, module in model.named_modules()}
    rows, leaf_elements = [], 0
    for layer in summary.summary_list:
        shape = layer.output_size if isinstance(layer.output_size, list) else None
        if layer.is_leaf_layer and shape:
            leaf_elements += math.prod(int(dim) for dim in shape)
        if 0 < layer.depth <= LAYER_TABLE_DEPTH:
            rows.append(LayerRow(name=names.get(id(layer.module), layer.var_name), kind=layer.class_name,
                                 depth=layer.depth,
                                 output_shape=[int(dim) for dim in shape] if shape else None,
                                 parameter_count=int(layer.num_params)))
    return rows, leaf_elements, None


def leaf_output_elements(model: nn.Module, args: list, kwargs: dict) -> int | None:
    """Elements of every tensor output by a leaf module in one forward on ``meta`` (batch of
    one); None when the forward fails."""
    total = [0]

    def count(_module, _args, output) -> None:
        for tensor in tensors_in(output):
            total[0] += tensor.numel()

    handles = [module.register_forward_hook(count) for module in model.modules()
               if not any(True for _ in module.children())]
    try:
        with torch.no_grad():
            model(*args, **kwargs)
    except (Exception, SystemExit):  # the model's code cannot run on meta tensors
        return None
    finally:
        for handle in handles:
            handle.remove()
    return total[0]
