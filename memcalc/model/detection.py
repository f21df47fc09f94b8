"""Inputs for torchvision-style detection models in training mode.

Faster/Mask/Keypoint R-CNN, RetinaNet, FCOS and SSD (and models written like them) take
``forward(images, targets=None)``: a list of (C, H, W) images and, in training, one dict of
targets per image; they return a dict of losses. Each target field is one registered entry
(which models need it, how to make it), so a new family's field is one
``@register_target_field`` function.

Tensors are made with ``torch.empty``: inside the fake mode they have shapes and no data.
Their values (box corners, labels) are never read by the trace, whose data-dependent ops run
at bounded sizes (``memcalc.trace.bounded_ops``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from memcalc.errors import InputError

BOXES_PER_IMAGE = 8
"""Ground-truth objects per synthetic image: COCO's train2017 averages 7.3 annotated objects
per image (860,001 instances over 118,287 images, the COCO 2017 annotations)."""

DETECTION_PARAMETERS = ("images", "targets")
"""The first two parameters of a detection model's ``forward``."""


@dataclass(frozen=True)
class TargetField:
    """One key of a target dict: ``needed(model)`` says whether the model reads it,
    ``make(model, boxes, image_shape, dtype)`` makes it for one image."""

    name: str
    needed: Callable[[nn.Module], bool]
    make: Callable[[nn.Module, int, tuple[int, ...], torch.dtype], torch.Tensor]


_FIELDS: dict[str, TargetField] = {}


def register_target_field(name: str, needed: Callable[[nn.Module], bool]):
    """Register ``make(model, boxes, image_shape, dtype) -> Tensor`` for target key ``name``."""

    def register(make: Callable) -> Callable:
        if name in _FIELDS:
            raise ValueError(f"target field {name!r} is registered already")
        _FIELDS[name] = TargetField(name, needed, make)
        return make

    return register


def _always(model: nn.Module) -> bool:
    return True


def _roi_heads_have(part: str) -> Callable[[nn.Module], bool]:
    """Whether the model's ``roi_heads`` answer ``has_mask()`` / ``has_keypoint()``."""

    def needed(model: nn.Module) -> bool:
        check = getattr(getattr(model, "roi_heads", None), part, None)
        return bool(check()) if callable(check) else False

    return needed


@register_target_field("boxes", _always)
def _boxes(model: nn.Module, boxes: int, image_shape, dtype: torch.dtype) -> torch.Tensor:
    """(x1, y1, x2, y2) per object, in the image's floating dtype."""
    return torch.empty((boxes, 4), dtype=dtype)


@register_target_field("labels", _always)
def _labels(model: nn.Module, boxes: int, image_shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((boxes,), dtype=torch.int64)


@register_target_field("masks", _roi_heads_have("has_mask"))
def _masks(model: nn.Module, boxes: int, image_shape, dtype: torch.dtype) -> torch.Tensor:
    """One binary mask per object at the image's size (Mask R-CNN)."""
    return torch.empty((boxes, *image_shape[-2:]), dtype=torch.uint8)


@register_target_field("keypoints", _roi_heads_have("has_keypoint"))
def _keypoints(model: nn.Module, boxes: int, image_shape, dtype: torch.dtype) -> torch.Tensor:
    """(x, y, visibility) per keypoint per object (Keypoint R-CNN)."""
    return torch.empty((boxes, keypoint_count(model), 3), dtype=dtype)


def keypoint_count(model: nn.Module) -> int:
    """Keypoints per object: the output channels of the keypoint predictor (torchvision's
    ``KeypointRCNNPredictor.out_channels``, 17 for COCO persons)."""
    predictor = getattr(getattr(model, "roi_heads", None), "keypoint_predictor", None)
    count = getattr(predictor, "out_channels", None)
    if not isinstance(count, int):
        raise InputError(f"{type(model).__name__} has keypoint heads but no "
                         "roi_heads.keypoint_predictor.out_channels to read the keypoint "
                         "count from; give the model a torchvision KeypointRCNNPredictor")
    return count


def is_detection_model(model: nn.Module) -> bool:
    """Whether ``model`` is called as ``forward(images, targets=None)`` (torchvision's
    GeneralizedRCNN, RetinaNet, FCOS, SSD and models written like them)."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):   # a forward without a readable signature
        return False
    names = tuple(parameter.name for parameter in parameters[:2])
    return names == DETECTION_PARAMETERS and parameters[1].default is None


def target_fields(model: nn.Module) -> list[str]:
    """The keys of the target dicts ``model`` gets (boxes and labels; masks, keypoints)."""
    return [field.name for field in _FIELDS.values() if field.needed(model)]


def detection_call(model: nn.Module, batch_size: int, image_shape: tuple[int, ...],
                   dtype: torch.dtype, boxes_per_image: int = BOXES_PER_IMAGE
                   ) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for ``model(*args, **kwargs)`` in training: ``batch_size`` images of
    ``image_shape`` (C, H, W) in ``dtype`` and one target dict per image with
    ``boxes_per_image`` objects (boxes, labels, and masks or keypoints when the model's heads
    take them). Call inside the fake mode."""
    if len(image_shape) != 3:
        raise InputError(f"a detection model takes (C, H, W) images, got shape {image_shape}; "
                         "give --shape C H W")
    if batch_size < 1 or boxes_per_image < 1:
        raise InputError(f"a detection step needs at least one image and one object per "
                         f"image, got batch {batch_size}, {boxes_per_image} objects per image")
    box_dtype = dtype if dtype.is_floating_point else torch.float32
    fields = [_FIELDS[name] for name in target_fields(model)]
    images = [torch.empty(image_shape, dtype=dtype) for _ in range(batch_size)]
    targets = [{field.name: field.make(model, boxes_per_image, image_shape, box_dtype)
                for field in fields} for _ in range(batch_size)]
    return (images, targets), {}
