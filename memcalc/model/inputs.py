"""What the model is called with in the traced step: one positional tensor (the sample), named
tensors (attention masks, ``decoder_input_ids``, ``labels``, ``pixel_values``...), plain keyword
arguments, or what a model family needs (torchvision detection: lists of images and targets).

Input families are a registry: each has a predicate on the built model and a function making
the call's tensors for a batch; the first family whose predicate holds is used, and plain
tensors otherwise. Tensors are made with ``torch.empty`` so that, inside the fake mode, they
have shapes and no data.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memcalc.errors import InputError
from memcalc.model.detection import detection_call, is_detection_model


@dataclass(frozen=True)
class InputTensor:
    """One input tensor, per sample (the batch axis is added in front)."""

    name: str | None
    """Keyword of ``forward``; None for the positional sample."""
    sample_shape: tuple[int, ...]
    dtype: torch.dtype

    def batch_bytes(self, batch_size: int) -> int:
        return batch_size * math.prod(self.sample_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class ModelInputs:
    """Everything ``forward`` receives, batch size aside."""

    positional: InputTensor | None
    named: tuple[InputTensor, ...] = ()
    forward_kwargs: tuple[tuple[str, Any], ...] = ()
    boxes_per_image: int = 8
    """Detection families: ground-truth objects per image in the synthetic targets."""

    @property
    def tensors(self) -> tuple[InputTensor, ...]:
        return ((self.positional,) if self.positional else ()) + self.named

    def batch_bytes(self, batch_size: int) -> int:
        """Bytes of the input tensors of one batch (a family's own targets not included)."""
        return sum(tensor.batch_bytes(batch_size) for tensor in self.tensors)

    def filled_lengths(self) -> dict[str, int]:
        """Per-sample integer inputs named as lengths (``lengths``, ``input_lengths``...) and
        the value the traced step reads from them: the sequence length, the first axis of the
        first input with one (every sample full length, the most work)."""
        axes = [tensor.sample_shape[0] for tensor in self.tensors if tensor.sample_shape]
        return {tensor.name: axes[0] for tensor in self.named
                if axes and not tensor.sample_shape and "len" in tensor.name.lower()
                and not tensor.dtype.is_floating_point and tensor.dtype != torch.bool}


@dataclass
class ModelCall:
    """The arguments of one ``model(*args, **kwargs)`` call."""

    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> list[torch.Tensor]:
        return tensors_in([*self.args, *self.kwargs.values()])


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value``: a tensor, dicts, lists and tuples of them, or an object's
    tensor attributes (Hugging Face ``ModelOutput``, torchvision's ``ImageList``)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in tensors_in(item)]
    if hasattr(value, "__dict__"):
        return [tensor for tensor in vars(value).values() if isinstance(tensor, torch.Tensor)]
    return []


@dataclass(frozen=True)
class InputFamily:
    name: str
    matches: Callable[[nn.Module], bool]
    make: Callable[[nn.Module, ModelInputs, int], ModelCall]


_FAMILIES: dict[str, InputFamily] = {}


def register_family(name: str, matches: Callable[[nn.Module], bool]):
    """Register ``make(model, inputs, batch_size) -> ModelCall`` for models ``matches`` accepts."""
    def decorate(make: Callable[[nn.Module, ModelInputs, int], ModelCall]):
        if name in _FAMILIES:
            raise ValueError(f"input family {name!r} is registered twice")
        _FAMILIES[name] = InputFamily(name, matches, make)
        return make
    return decorate


def family_of(model: nn.Module) -> str:
    """The input family the model is called as (``tensors`` when none matches)."""
    for family in _FAMILIES.values():
        if family.matches(model):
            return family.name
    return "tensors"


def make_call(model: nn.Module, inputs: ModelInputs, batch_size: int) -> ModelCall:
    """The call's tensors for ``batch_size`` samples (inside the fake mode: no data)."""
    family = _FAMILIES.get(family_of(model))
    if family is not None:
        return family.make(model, inputs, batch_size)
    return plain_call(inputs, batch_size)


def require_binding(model: nn.Module, call: ModelCall) -> None:
    """Raise InputError when ``forward`` cannot take the call's arguments (a required input
    not given, an input it has no parameter for): the user's call is wrong, and a trace that
    fails on it must not end in a static estimate."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):   # a forward without a readable signature
        return
    try:
        signature.bind(*call.args, **call.kwargs)
    except TypeError as error:
        raise InputError(_binding_message(type(model).__name__, signature, call, error)) from None


def _binding_message(name: str, signature: inspect.Signature, call: ModelCall,
                     error: TypeError) -> str:
    parameters = signature.parameters
    given = set(call.kwargs)
    missing = [p.name for p in list(parameters.values())[len(call.args):]
               if p.default is p.empty and p.name not in given
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        needed = ", ".join(repr(n) for n in missing)
        example = " ".join(f"--input {n}=SHAPE[:DTYPE]" for n in missing)
        return (f"{name}.forward() needs {needed}, which the traced call does not give: add "
                f"{'it' if len(missing) == 1 else 'each'} per sample with {example} "
                f"(e.g. --input {missing[0]}=512:int64)")
    accepted = ", ".join(parameters) or "no arguments"
    return (f"{name}.forward() cannot take the traced call ({error}): its parameters are "
            f"{accepted}; give inputs by those names with --input NAME=SHAPE[:DTYPE]")


def plain_call(inputs: ModelInputs, batch_size: int) -> ModelCall:
    def tensor(spec: InputTensor) -> torch.Tensor:
        return torch.empty((batch_size, *spec.sample_shape), dtype=spec.dtype)

    args = (tensor(inputs.positional),) if inputs.positional else ()
    kwargs = {spec.name: tensor(spec) for spec in inputs.named}
    for key, value in inputs.forward_kwargs:
        if key in kwargs:
            raise InputError(f"forward argument {key!r} is given both as an input tensor and "
                             "as a --forward-arg; keep one")
        kwargs[key] = value
    return ModelCall(args, kwargs)


@register_family("detection", is_detection_model)
def _detection_call(model: nn.Module, inputs: ModelInputs, batch_size: int) -> ModelCall:
    """torchvision-style detection in train mode: lists of images and target dicts."""
    if inputs.positional is None:
        raise InputError(f"{type(model).__name__} is a detection model: give the image shape "
                         "with --shape C,H,W")
    args, kwargs = detection_call(model, batch_size, inputs.positional.sample_shape,
                                  inputs.positional.dtype, inputs.boxes_per_image)
    return ModelCall(args, kwargs)


def _encoder_decoder(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False)) and _takes(model, DECODER_IDS)


DECODER_IDS = "decoder_input_ids"
_DECODER_GIVEN = (DECODER_IDS, "decoder_inputs_embeds", "labels")


@register_family("encoder-decoder", _encoder_decoder)
def _encoder_decoder_call(model: nn.Module, inputs: ModelInputs, batch_size: int) -> ModelCall:
    """Hugging Face encoder-decoders (T5, BART, Whisper): without decoder ids or labels, the
    decoder gets ids shaped like the encoder's token ids."""
    call = plain_call(inputs, batch_size)
    if any(name in call.kwargs for name in _DECODER_GIVEN):
        return call
    encoder_ids = call.args[0] if call.args else call.kwargs.get("input_ids")
    if encoder_ids is None or encoder_ids.is_floating_point():
        raise InputError(f"{type(model).__name__} is an encoder-decoder fed no token ids: give "
                         "the decoder's with --input decoder_input_ids=LENGTH:int64 (or "
                         "--input labels=LENGTH:int64 with --loss model)")
    call.kwargs[DECODER_IDS] = torch.empty(encoder_ids.shape, dtype=encoder_ids.dtype)
    return call


def _takes(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
