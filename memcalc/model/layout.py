"""Decide where the channel axis is, by checking the shape against the model's first layer."""

from __future__ import annotations

from dataclasses import dataclass

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


def resolve_layout(model: nn.Module, shape: tuple[int, ...], requested: Layout) -> LayoutDecision:
    found = first_layer(model)
    if found is None:
        return LayoutDecision("unchecked", shape, "no conv/linear/embedding layer to check against")
    name, layer = found
    if isinstance(layer, CONV_TYPES):
        return _conv_layout(name, layer, shape, Layout(requested))
    if isinstance(layer, nn.Linear):
        if shape[-1] != layer.in_features:
            raise LayoutError(
                f"shape {_fmt(shape)} ends in {shape[-1]} but the first layer {name!r} (Linear) "
                f"takes in_features={layer.in_features}; give a shape ending in {layer.in_features}"
            )
        return LayoutDecision("features-last", shape, f"last dim matches {name!r} in_features")
    return LayoutDecision("token-ids", shape, f"first layer {name!r} is an embedding")


def _conv_layout(name: str, conv: nn.Module, shape: tuple[int, ...],
                 requested: Layout) -> LayoutDecision:
    spatial = len(conv.kernel_size)
    channels = conv.in_channels
    kind = type(conv).__name__
    if len(shape) != spatial + 1:
        raise LayoutError(
            f"shape {_fmt(shape)} has {len(shape)} dims but the first layer {name!r} ({kind}) "
            f"takes samples of {spatial + 1} dims (channels plus {spatial} spatial)"
        )
    first_fits, last_fits = shape[0] == channels, shape[-1] == channels
    if requested is Layout.CHANNELS_LAST or (requested is Layout.AUTO and last_fits and not first_fits):
        if not last_fits:
            raise LayoutError(
                f"--layout channels-last needs the last dim of {_fmt(shape)} to be "
                f"{name!r}'s in_channels={channels}"
            )
        traced = (shape[-1], *shape[:-1])
        return LayoutDecision("channels-last", traced,
                              f"last dim {channels} = {name!r} in_channels; traced as {_fmt(traced)}")
    if first_fits:
        note = " (both ends match; channels-first assumed, --layout overrides)" if (
            last_fits and requested is Layout.AUTO and len(shape) > 1) else ""
        return LayoutDecision("channels-first", shape,
                              f"first dim {channels} = {name!r} in_channels{note}")
    if requested is Layout.CHANNELS_FIRST:
        raise LayoutError(
            f"--layout channels-first needs the first dim of {_fmt(shape)} to be "
            f"{name!r}'s in_channels={channels}"
        )
    raise LayoutError(
        f"shape {_fmt(shape)} fits neither layout: the first layer {name!r} ({kind}) takes "
        f"{channels} channels; put {channels} first (channels-first) or last (channels-last)"
    )


def _fmt(shape: tuple[int, ...]) -> str:
    return ",".join(str(dim) for dim in shape)
