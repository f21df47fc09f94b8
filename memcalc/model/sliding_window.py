"""Whole volumes evaluated window by window: the model wrapped so that its forward is MONAI's
own ``sliding_window_inference``, traced as it runs (the windows gathered ``sw_batch_size``
at a time, the importance map, the output and count map of the whole volume), so the buffers
are those of the MONAI version installed, not a formula of them."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from memcalc.errors import InputError
from memcalc.eval_specs import SlidingWindowSpec


class SlidingWindow(nn.Module):
    """``net`` evaluated over a whole volume by ``sliding_window_inference`` (its defaults:
    the output and count map on the input's device, no buffered steps)."""

    def __init__(self, net: nn.Module, spec: SlidingWindowSpec) -> None:
        super().__init__()
        self.net, self.spec = net, spec

    def forward(self, volume):
        from monai.inferers import sliding_window_inference

        spec = self.spec
        return sliding_window_inference(volume, spec.roi, spec.sw_batch_size, self.net,
                                        overlap=spec.overlap, mode=spec.mode.value)


def monai_version() -> str:
    """The installed MONAI's version; InputError when it is missing."""
    try:
        import monai
    except ImportError:
        raise InputError("a sliding window (--roi) is traced through MONAI's "
                         "sliding_window_inference: install monai (pip install monai)") from None
    return monai.__version__


def windowed(build: Callable[[], nn.Module], spec: SlidingWindowSpec,
             sample_shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    """``build`` wrapped so each copy evaluates whole volumes of ``sample_shape`` (channels
    first) window by window; the window's dimensions are checked against the volume's."""
    spatial = sample_shape[1:]
    if len(spec.roi) != len(spatial):
        raise InputError(f"the window --roi {','.join(map(str, spec.roi))} has {len(spec.roi)} "
                         f"dims but the volume {','.join(map(str, sample_shape))} has "
                         f"{len(spatial)} spatial dims (after its channels)")
    monai_version()
    return lambda: SlidingWindow(build(), spec)
