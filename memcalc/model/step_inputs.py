"""The inputs of the traced step, from the spec: the positional sample (its shape, dtype and
layout) and the named tensors and keyword arguments of ``forward``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from memcalc.dtypes import INPUT_DTYPES
from memcalc.errors import InputError
from memcalc.model.inputs import InputTensor, ModelInputs
from memcalc.model.layout import NAMED_INPUTS, LayoutDecision, resolve_layout
from memcalc.specs import TrainingSpec


@dataclass(frozen=True)
class StepInputs:
    """What the model is fed, before the precision policy and the batch axis."""

    layout: LayoutDecision
    sample_shape: tuple[int, ...]
    """One sample as the Dataset yields it (the host side sizes it); the largest named
    input's shape when there is no positional sample."""
    dtype_name: str
    """The positional sample's dtype (the largest named input's without one)."""
    positional: bool
    named: tuple[InputTensor, ...]
    forward_kwargs: tuple[tuple[str, object], ...]

    def model_inputs(self, cast=lambda dtype: dtype) -> ModelInputs:
        """As ``ModelInputs``, each dtype passed through ``cast`` (the precision policy)."""
        positional = (InputTensor(None, self.layout.traced_sample_shape,
                                  cast(INPUT_DTYPES[self.dtype_name])) if self.positional else None)
        named = tuple(InputTensor(t.name, t.sample_shape, cast(t.dtype)) for t in self.named)
        return ModelInputs(positional, named, self.forward_kwargs)


def resolve_step_inputs(spec: TrainingSpec, model: nn.Module, *,
                        default_shape: tuple[int, ...] | None, default_dtype: str | None
                        ) -> StepInputs:
    """``default_shape``/``default_dtype``: the measured Dataset's or the zoo model's."""
    named = tuple(InputTensor(name, tuple(item.shape), INPUT_DTYPES[item.dtype])
                  for name, item in spec.inputs.items())
    kwargs = tuple(spec.forward_args.items())
    sample_shape = spec.sample_shape or default_shape
    if sample_shape is None:
        if not named:
            raise InputError(f"model {spec.model!r} has no default sample shape; give --shape, "
                             "--input NAME=SHAPE:DTYPE or --dataset")
        largest = max(named, key=lambda tensor: tensor.batch_bytes(1))
        return StepInputs(NAMED_INPUTS, largest.sample_shape,
                          str(largest.dtype).removeprefix("torch."), False, named, kwargs)
    dtype_name = spec.input_dtype or default_dtype or "float32"
    input_dtype = INPUT_DTYPES[dtype_name]
    others = {**{tensor.name: torch.empty((1, *tensor.sample_shape), dtype=tensor.dtype,
                                          device="meta") for tensor in named}, **dict(kwargs)}
    layout = resolve_layout(model, sample_shape, spec.layout, input_dtype, others)
    if layout.layout == "token-ids" and input_dtype.is_floating_point:
        raise InputError(f"the first layer of {spec.model!r} is an embedding: token ids need "
                         f"an integer dtype, got --input-dtype {dtype_name}; use int64")
    return StepInputs(layout, sample_shape, dtype_name, True, named, kwargs)


def token_inputs(inputs: StepInputs) -> bool:
    """Whether the model reads integer token ids (its logits then have classes last): the
    positional sample, or without one any named input, is an integer tensor."""
    if inputs.positional:
        return not INPUT_DTYPES[inputs.dtype_name].is_floating_point
    return any(not tensor.dtype.is_floating_point for tensor in inputs.named)

