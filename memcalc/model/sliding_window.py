"""Whole volumes evaluated window by window: the model wrapped so that its forward is MONAI's
own ``sliding_window_inference``, traced as it runs (the windows gathered ``sw_batch_size``
at a time, the importance map, the output and count map of the whole volume), so the buffers
are those of the MONAI version installed, not a formula of them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from memcalc.errors import InputError
from memcalc.eval_specs import BufferDevice, SlidingWindowSpec
from memcalc.model.inputs import ModelCall, ModelInputs, register_family

HOST_DEVICE = torch.device("meta")
"""Where a traced step makes the tensors it keeps in host RAM: the storage watcher leaves
``meta`` tensors out of the GPU's ledger and ``memcalc.trace.host_tensors`` counts them."""


class SlidingWindow(nn.Module):
    """``net`` evaluated over a whole volume by ``sliding_window_inference`` (no buffered
    steps). With ``host_split`` the volume and the aggregation the spec puts on the CPU are
    made on ``HOST_DEVICE`` (MONAI's ``inputs`` and ``device``) and the windows run on the
    net's device (``sw_device``); without it everything stays on the step's one device."""

    def __init__(self, net: nn.Module, spec: SlidingWindowSpec, host_split: bool = False) -> None:
        super().__init__()
        self.net, self.spec, self.host_split = net, spec, host_split

    @property
    def volume_on_host(self) -> bool:
        return self.host_split and self.spec.volume_device is BufferDevice.CPU

    def forward(self, volume):
        from monai.inferers import sliding_window_inference

        spec = self.spec
        devices = {}
        if self.host_split:
            window_device = next((p.device for p in self.net.parameters()), torch.device("cpu"))
            place = {BufferDevice.GPU: window_device, BufferDevice.CPU: HOST_DEVICE}
            devices = {"sw_device": window_device, "device": place[spec.aggregated_on]}
        return sliding_window_inference(volume, spec.roi, spec.sw_batch_size, self.net,
                                        overlap=spec.overlap, mode=spec.mode.value, **devices)


@register_family("volume in host RAM",
                 lambda model: isinstance(model, SlidingWindow) and model.volume_on_host)
def _host_volume_call(model: nn.Module, inputs: ModelInputs, batch_size: int) -> ModelCall:
    """The whole volumes on ``HOST_DEVICE``: MONAI copies each window batch to the GPU."""
    volume = inputs.positional
    return ModelCall((torch.empty((batch_size, *volume.sample_shape), dtype=volume.dtype,
                                  device=HOST_DEVICE),))


def windows_per_volume(spec: SlidingWindowSpec, spatial: tuple[int, ...]) -> int:
    """Windows ``sliding_window_inference`` cuts from one volume: per axis one window where it
    spans the axis, else ``ceil((size - roi) / interval) + 1`` with the interval
    ``int(roi * (1 - overlap))`` (at least 1), as MONAI's ``dense_patch_slices`` does."""
    count = 1
    for size, roi in zip(spatial, spec.roi):
        if size <= roi:
            continue
        interval = max(1, int(roi * (1 - spec.overlap)))
        count *= -(-(size - roi) // interval) + 1
    return count


def monai_version() -> str:
    """The installed MONAI's version; InputError when it is missing."""
    try:
        import monai
    except ImportError:
        raise InputError("a sliding window (--roi) is traced through MONAI's "
                         "sliding_window_inference: install monai (pip install monai)") from None
    return monai.__version__


def windowed(build: Callable[[], nn.Module], spec: SlidingWindowSpec,
             sample_shape: tuple[int, ...], host_split: bool = False) -> Callable[[], nn.Module]:
    """``build`` wrapped so each copy evaluates whole volumes of ``sample_shape`` (channels
    first) window by window; the window's dimensions are checked against the volume's.
    ``host_split``: the step runs on a GPU, so what the spec keeps on the CPU is host RAM."""
    spatial = sample_shape[1:]
    if len(spec.roi) != len(spatial):
        raise InputError(f"the window --roi {','.join(map(str, spec.roi))} has {len(spec.roi)} "
                         f"dims but the volume {','.join(map(str, sample_shape))} has "
                         f"{len(spatial)} spatial dims (after its channels)")
    monai_version()
    return lambda: SlidingWindow(build(), spec, host_split and spec.uses_host)
