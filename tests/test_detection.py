"""Detection inputs: which models are called as ``forward(images, targets)``, the targets each
gets, and a tiny detector written like torchvision's traced in training at bounded sizes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memcalc.errors import InputError
from memcalc.model.detection import (
    BOXES_PER_IMAGE,
    detection_call,
    is_detection_model,
    target_fields,
)
from memcalc.trace._torch_internals import fake_cpu_mode, materialize_fake
from memcalc.trace.bounded_ops import BoundedOps, bounded_rule

IMAGE = (3, 32, 48)
STRIDE = 4
LOCATIONS = (IMAGE[1] // STRIDE) * (IMAGE[2] // STRIDE)


class _TinyDetector(nn.Module):
    """torchvision's pattern: a degenerate-box check, one score and box per location, boxes
    matched by a similarity matrix, positives picked by a threshold, a dict of losses."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Conv2d(3, 8, 3, stride=STRIDE, padding=1)
        self.score = nn.Conv2d(8, 1, 1)
        self.box = nn.Conv2d(8, 4, 1)
        self.selected_shapes = []

    def forward(self, images, targets=None):
        for target in targets:
            degenerate = target["boxes"][:, 2:] <= target["boxes"][:, :2]
            if degenerate.any():
                raise ValueError("degenerate boxes")
        features = self.backbone(torch.stack(images))
        scores = self.score(features).flatten(1)                       # (B, L)
        deltas = self.box(features).flatten(2).transpose(1, 2)         # (B, L, 4)
        classification, regression = [], []
        for image, target in enumerate(targets):
            similarity = deltas[image].detach() @ target["boxes"].t()  # (L, objects)
            best, matched = similarity.max(dim=1)
            positive = torch.where(best > 0.5)[0]                      # nonzero: bounded
            selected = deltas[image][positive]
            self.selected_shapes.append(tuple(selected.shape))
            classification.append(F.binary_cross_entropy_with_logits(
                scores[image], (best > 0.5).to(scores.dtype)))
            regression.append(F.l1_loss(selected, target["boxes"][matched[positive]]))
        return {"loss_classifier": sum(classification), "loss_box_reg": sum(regression)}


class _Heads(nn.Module):
    """torchvision's RoIHeads as far as the targets are concerned."""

    def __init__(self, mask: bool, keypoints: int | None):
        super().__init__()
        self.mask = mask
        self.keypoint_predictor = (nn.ConvTranspose2d(8, keypoints, 4) if keypoints else None)
        if keypoints:
            self.keypoint_predictor.out_channels = keypoints

    def has_mask(self):
        return self.mask

    def has_keypoint(self):
        return self.keypoint_predictor is not None


class _TwoStage(_TinyDetector):
    def __init__(self, mask=False, keypoints=None):
        super().__init__()
        self.roi_heads = _Heads(mask, keypoints)


class _NotDetection(nn.Module):
    def forward(self, x, mask=None):
        return x


@pytest.mark.parametrize("model,expected", [
    (_TinyDetector(), True), (_TwoStage(mask=True), True), (nn.Linear(2, 2), False),
    (_NotDetection(), False),
])
def test_detection_models_are_those_called_with_images_and_targets(model, expected):
    assert is_detection_model(model) is expected


@pytest.mark.parametrize("model,fields", [
    (_TinyDetector(), ["boxes", "labels"]),
    (_TwoStage(mask=True), ["boxes", "labels", "masks"]),
    (_TwoStage(keypoints=17), ["boxes", "labels", "keypoints"]),
])
def test_each_family_gets_the_target_fields_its_heads_read(model, fields):
    assert target_fields(model) == fields


def test_the_call_holds_one_image_and_one_target_dict_per_sample():
    model = _TwoStage(mask=True, keypoints=5)
    with fake_cpu_mode():
        (images, targets), kwargs = detection_call(model, 3, IMAGE, torch.bfloat16,
                                                   boxes_per_image=6)
    assert kwargs == {} and len(images) == len(targets) == 3
    assert all(image.shape == IMAGE and image.dtype == torch.bfloat16 for image in images)
    shapes = {key: (tuple(value.shape), value.dtype) for key, value in targets[0].items()}
    assert shapes == {"boxes": ((6, 4), torch.bfloat16), "labels": ((6,), torch.int64),
                      "masks": ((6, *IMAGE[1:]), torch.uint8),
                      "keypoints": ((6, 5, 3), torch.bfloat16)}


def test_integer_images_get_float_boxes():
    with fake_cpu_mode():
        (_, targets), _ = detection_call(_TinyDetector(), 1, IMAGE, torch.uint8)
    assert targets[0]["boxes"].dtype == torch.float32
    assert targets[0]["boxes"].shape == (BOXES_PER_IMAGE, 4)


@pytest.mark.parametrize("shape,batch,boxes,message", [
    ((32, 32), 2, 4, r"\(C, H, W\) images, got shape \(32, 32\)"),
    (IMAGE, 0, 4, "at least one image and one object per image, got batch 0"),
    (IMAGE, 2, 0, "got batch 2, 0 objects per image"),
])
def test_impossible_calls_are_refused_with_what_is_accepted(shape, batch, boxes, message):
    with pytest.raises(InputError, match=message):
        detection_call(_TinyDetector(), batch, shape, torch.float32, boxes_per_image=boxes)


def test_keypoint_heads_without_a_keypoint_count_are_refused():
    model = _TwoStage(keypoints=3)
    model.roi_heads.keypoint_predictor.out_channels = None
    with pytest.raises(InputError, match="keypoint_predictor.out_channels"):
        detection_call(model, 1, IMAGE, torch.float32)


def test_a_detector_trains_on_fake_tensors_at_bounded_sizes():
    batch = 2
    with torch.device("meta"):
        model = _TinyDetector()
    with fake_cpu_mode(), BoundedOps() as bounded:
        model = materialize_fake(model, torch.float32).train()
        args, kwargs = detection_call(model, batch, IMAGE, torch.float32)
        losses = model(*args, **kwargs)
        sum(losses.values()).backward()
    assert set(losses) == {"loss_classifier", "loss_box_reg"}
    assert model.backbone.weight.grad.shape == model.backbone.weight.shape
    # every location is a positive at the bound: (L, 4) boxes regressed per image
    assert model.selected_shapes == [(LOCATIONS, 4)] * batch
    uses = {(use.op, use.bound.split(":")[0]): use.count for use in bounded.uses()}
    assert uses == {("aten::_local_scalar_dense", "False"): batch,      # degenerate.any()
                    ("aten::nonzero", bounded_rule("aten::nonzero").bound): batch}
