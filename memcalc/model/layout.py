"""Decide where the channel axis is, by checking the shape against the model's first layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from memcalc.errors import LayoutError
from memcalc.specs import Layout

CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d,
              nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


@dataclass(frozen=True)
class LayoutDecision:
    """The per-sample shape the model is traced with, and why."""

    layout: str
    traced_sample_shape: tuple[int, ...]
    explanation: str


def first_layer(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The first registered conv, linear or embedding layer (registration order)."""
    for name, module in model.named_modules():
        if isinstance(module, (*CONV_TYPES, nn.Linear, nn.Embedding)):
            return name or type(module).__name__, module
    return None


NAMED_INPUTS = LayoutDecision("named inputs", (), "no positional sample: every input is named")


def resolve_layout(model: nn.Module, shape: tuple[int, ...], requested: Layout,
                   input_dtype: torch.dtype = torch.float32,
                   other_inputs: dict[str, object] | None = None) -> LayoutDecision:
    """The traced sample shape. An explicit layout is obeyed as given; ``auto`` checks the
    shape against the first layer's in_channels/in_features and, where that check fails,
    against what the first layer really receives when the model runs (stems that reshape
    their input: raw audio ``x[:, None]``, space-to-depth, a video's frames folded into the
    batch; a first registered layer that runs later), called with ``other_inputs`` too (the
    named inputs as meta tensors of batch one, and plain keyword arguments)."""
    requested = Layout(requested)
    if requested is Layout.CHANNELS_LAST:
        traced = (shape[-1], *shape[:-1])
        return LayoutDecision("channels-last", traced,
                              f"--layout channels-last: traced as {_fmt(traced)}")
    if requested is Layout.CHANNELS_FIRST:
        return LayoutDecision("channels-first", shape, "--layout channels-first: as given")
    found = first_layer(model)
    if found is None:
        return LayoutDecision("unchecked", shape, "no conv/linear/embedding layer to check against")
    name, layer = found
    try:
        if isinstance(layer, CONV_TYPES):
            return _conv_layout(name, layer, shape, requested)
        if isinstance(layer, nn.Linear):
            if shape[-1] != layer.in_features:
                raise LayoutError(
                    f"shape {_fmt(shape)} ends in {shape[-1]} but the first layer {name!r} "
                    f"(Linear) takes in_features={layer.in_features}; give a shape ending in "
                    f"{layer.in_features}")
            return LayoutDecision("features-last", shape, f"last dim matches {name!r} in_features")
    except LayoutError:
        reached = first_layer_input(model, shape, input_dtype, other_inputs)
        if reached is None:
            raise
        return LayoutDecision("as given", shape, f"the model turns {_fmt(shape)} into "
                              f"{_fmt(reached)} before its first layer {name!r}")
    return LayoutDecision("token-ids", shape, f"first layer {name!r} is an embedding")


class _Reached(Exception):
    """Stops the probe forward at the first layer it reaches."""


def first_layer_input(model: nn.Module, shape: tuple[int, ...], dtype: torch.dtype,
                      other_inputs: dict[str, object] | None = None) -> tuple[int, ...] | None:
    """The per-sample shape of what the first conv/linear/embedding layer to run receives and
    accepts when ``model`` runs a batch of one on ``meta``; None when the model fails first."""
    def reached(_module, args, _output):
        raise _Reached(tuple(args[0].shape[1:]) if args and hasattr(args[0], "shape") else ())

    handles = [module.register_forward_hook(reached) for module in model.modules()
               if isinstance(module, (*CONV_TYPES, nn.Linear, nn.Embedding))]
    try:
        with torch.no_grad():
            model(torch.empty((1, *shape), dtype=dtype, device="meta"), **(other_inputs or {}))
    except _Reached as stop:
        return stop.args[0]
    except (Exception, SystemExit):  # the model's own code failed on this input
        return None
    finally:
        for handle in handles:
            handle.remove()
    return None


def _conv_layout(name: str, conv: nn.Module, shape: tuple[int, ...],
                 requested: Layout) -> LayoutDecision:
    """``auto`` against a first conv: its in_channels first or last."""
    spatial = len(conv.kernel_size)
    channels = conv.in_channels
    kind = type(conv).__name__
    if len(shape) != spatial + 1:
        raise LayoutError(
            f"shape {_fmt(shape)} has {len(shape)} dims but the first layer {name!r} ({kind}) "
            f"takes samples of {spatial + 1} dims (channels plus {spatial} spatial)"
        )
    first_fits, last_fits = shape[0] == channels, shape[-1] == channels
    if last_fits and not first_fits:
        traced = (shape[-1], *shape[:-1])
        return LayoutDecision("channels-last", traced,
                              f"last dim {channels} = {name!r} in_channels; traced as {_fmt(traced)}")
    if first_fits:
        note = (" (both ends match; channels-first assumed, --layout overrides)"
                if last_fits and len(shape) > 1 else "")
        return LayoutDecision("channels-first", shape,
                              f"first dim {channels} = {name!r} in_channels{note}")
    raise LayoutError(
        f"shape {_fmt(shape)} fits neither layout: the first layer {name!r} ({kind}) takes "
        f"{channels} channels; put {channels} first (channels-first) or last (channels-last)"
    )


def _fmt(shape: tuple[int, ...]) -> str:
    return ",".join(str(dim) for dim in shape)
