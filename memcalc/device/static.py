"""Static part: model states counted from the module, and torchinfo's per-layer table."""

from __future__ import annotations

import torch
import torchinfo
from torch import nn

from memcalc.device.report import LayerRow, StaticEstimate
from memcalc.dtypes import element_size
from memcalc.trace.optimizers import OptimizerRule
from memcalc.trace.precision import PrecisionPolicy

# Rows of the per-layer table kept in the report (deeper layers are still summed).
LAYER_TABLE_DEPTH = 2


def stored_dtype(tensor: torch.Tensor, policy: PrecisionPolicy) -> torch.dtype:
    """Floating tensors are stored in the policy's parameter dtype, others as they are."""
    return policy.parameter_dtype if tensor.is_floating_point() else tensor.dtype


def tensor_bytes(tensor: torch.Tensor, policy: PrecisionPolicy) -> int:
    return tensor.numel() * element_size(stored_dtype(tensor, policy))


def static_estimate(model: nn.Module, batch_shape: tuple[int, ...], batch_dtype: torch.dtype,
                    policy: PrecisionPolicy, optimizer: OptimizerRule) -> StaticEstimate:
    """Exact bytes of parameters, buffers, gradients, optimizer state and the input batch.

    Shared parameters are counted once (``Module.parameters`` de-duplicates them).
    """
    parameters = list(model.parameters())
    trainable = [param for param in parameters if param.requires_grad]
    trainable_bytes = sum(tensor_bytes(param, policy) for param in trainable)
    batch_elements = 1
    for dim in batch_shape:
        batch_elements *= dim
    return StaticEstimate(
        parameter_bytes=sum(tensor_bytes(param, policy) for param in parameters),
        buffer_bytes=sum(tensor_bytes(buffer, policy) for buffer in model.buffers()),
        gradient_bytes=trainable_bytes,
        optimizer_state_bytes=optimizer.state_bytes(trainable_bytes),
        optimizer_step_counter_bytes=optimizer.step_counter_bytes(len(trainable)),
        input_batch_bytes=batch_elements * element_size(batch_dtype),
    )


def layer_table(model: nn.Module, sample_shape: tuple[int, ...],
                input_dtype: torch.dtype) -> tuple[list[LayerRow], int | None, str | None]:
    """torchinfo's table for a batch of one on ``meta``.

    Returns the rows up to ``LAYER_TABLE_DEPTH``, the elements output by leaf layers per
    sample (None if torchinfo could not run), and torchinfo's error if any.
    """
    sample = torch.empty((1, *sample_shape), dtype=input_dtype, device="meta")
    try:
        summary = torchinfo.summary(model, input_data=[sample], device="meta", verbose=0,
                                    depth=LAYER_TABLE_DEPTH)
    except Exception as error:  # torchinfo runs user code; any failure just drops the table
        return [], None, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    names = {id(module): name for name, module in model.named_modules()}
    rows, leaf_output_elements = [], 0
    for layer in summary.summary_list:
        shape = layer.output_size if isinstance(layer.output_size, list) else None
        if layer.is_leaf_layer and shape:
            count = 1
            for dim in shape:
                count *= int(dim)
            leaf_output_elements += count
        if 0 < layer.depth <= LAYER_TABLE_DEPTH:
            rows.append(LayerRow(name=names.get(id(layer.module), layer.var_name), kind=layer.class_name,
                                 depth=layer.depth,
                                 output_shape=[int(dim) for dim in shape] if shape else None,
                                 parameter_count=int(layer.num_params)))
    return rows, leaf_output_elements, None
