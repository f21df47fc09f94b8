"""The options of the evaluation step (``--phase eval``) and of sliding-window inference over
whole volumes, and the sliding-window spec they make."""

from __future__ import annotations

from typing import Any

import click

from memcalc.cli.types import FiniteFloatRange, ShapeType, enum_choice
from memcalc.errors import InputError
from memcalc.eval_specs import BufferDevice, GradMode, SlidingWindowSpec, StepPhase, WindowMode

EVAL_OPTIONS = [
    click.option("--phase", type=enum_choice(StepPhase), default="train", show_default=True,
                 help="'eval': the evaluation step of validation or inference instead "
                      "(model.eval(), forward and loss; no gradients or optimizer state)."),
    click.option("--eval-grad-mode", type=enum_choice(GradMode), default="no_grad",
                 show_default=True,
                 help="The evaluation step under torch.no_grad(), torch.inference_mode(), "
                      "or neither ('enabled': a validation loop that forgot no_grad)."),
    click.option("--eval-shape", "eval_shape", type=ShapeType(),
                 help="The job validates on samples of this shape (whole volumes): its "
                      "validation step is traced too, with the optimizer's state resident, "
                      "and the verdict is the larger peak."),
    click.option("--eval-batch-size", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Samples per validation batch (with --eval-shape)."),
    click.option("--roi", type=ShapeType(), metavar="D,H,W",
                 help="Evaluate each whole volume (--shape) window by window with MONAI's "
                      "sliding_window_inference, windows of this size (with --phase eval)."),
    click.option("--sw-batch-size", type=click.IntRange(min=1),
                 help="Windows per forward (sliding_window_inference's sw_batch_size) "
                      "[default: 1]."),
    click.option("--overlap", type=FiniteFloatRange(min=0, max=1, max_open=True),
                 help="Share of a window overlapping its neighbours [default: 0.25]."),
    click.option("--sw-mode", type=enum_choice(WindowMode),
                 help="How overlapping windows are weighted [default: constant]."),
    click.option("--volume-device", type=enum_choice(BufferDevice),
                 help="Where the whole volume lives (MONAI's inputs): 'cpu' keeps it in host "
                      "RAM and copies each window batch to the GPU [default: gpu]."),
    click.option("--output-device", type=enum_choice(BufferDevice),
                 help="Where the output and count map are aggregated (MONAI's device): 'cpu' "
                      "puts them in host RAM [default: the volume's]."),
]

_WINDOW_OPTIONS = {"sw_batch_size": "--sw-batch-size", "overlap": "--overlap",
                   "sw_mode": "--sw-mode", "volume_device": "--volume-device",
                   "output_device": "--output-device"}


def sliding_window_from_options(options: dict[str, Any]) -> SlidingWindowSpec | None:
    """Pop the sliding-window options; their spec, or None without ``--roi``."""
    roi = options.pop("roi", None)
    given = {name: options.pop(name, None) for name in _WINDOW_OPTIONS}
    if roi is None:
        stray = [_WINDOW_OPTIONS[name] for name, value in given.items() if value is not None]
        if stray:
            verb = "sets" if len(stray) == 1 else "set"
            raise InputError(f"{', '.join(stray)} {verb} a sliding window: give its size with "
                             "--roi D,H,W (and --phase eval or --eval-shape)")
        return None
    fields = {"sw_batch_size": given["sw_batch_size"], "overlap": given["overlap"],
              "mode": given["sw_mode"], "volume_device": given["volume_device"],
              "output_device": given["output_device"]}
    return SlidingWindowSpec(roi=roi, **{k: v for k, v in fields.items() if v is not None})
