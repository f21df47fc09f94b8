"""Losses applied in the traced step, and the targets they need.

Cross-entropy targets are integer class indices shaped like the output minus its class
dimension. The class dimension is dim 1 (PyTorch's convention: (N, C) or (N, C, D, H, W)),
except for models fed integer token ids, whose (N, S, vocab) logits have classes last and are
flattened to (N*S, vocab) as language-model training does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from memcalc.errors import TraceError
from memcalc.specs import LossKind


def primary_output(output: object) -> torch.Tensor:
    """The tensor a loss is computed on: the output itself, ``logits``, or the first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        output = list(output.values())
    if isinstance(output, Sequence):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise TraceError(
        f"the model returned {type(output).__name__}, which holds no tensor to compute a loss "
        "on; return a tensor, a tuple starting with one, or a dict with 'logits'"
    )


def model_loss(output: object) -> torch.Tensor:
    """The loss a model computed itself (``--loss model``): a scalar tensor, ``.loss`` or
    ``["loss"]`` (Hugging Face models given ``labels``), or a dict of scalar losses, summed
    (torchvision detection in train mode)."""
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(())
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, Mapping) and output and all(
            isinstance(value, torch.Tensor) and value.numel() == 1 for value in output.values()):
        return sum(output.values())
    raise TraceError(
        f"--loss model: the model returned {type(output).__name__} with no loss in it; give it "
        "its labels (e.g. --input labels=SHAPE:int64) or use --loss cross-entropy/mse/sum")


def output_shape(output: object) -> tuple[int, ...]:
    """The shape of the tensor a loss would be computed on; () when there is none."""
    try:
        return tuple(primary_output(output).shape)
    except TraceError:
        return ()


def make_target(loss: LossKind, output: torch.Tensor, classes_last: bool) -> torch.Tensor | None:
    """An (uninitialised) target tensor for ``loss``; None when the loss needs none."""
    if loss is LossKind.SUM:
        return None
    if loss is LossKind.MSE:
        return torch.empty_like(output)
    if output.dim() < 2:
        raise TraceError(
            f"cross-entropy needs an output with a class dimension, got shape "
            f"{tuple(output.shape)}; use --loss mse or --loss sum"
        )
    class_dim = output.dim() - 1 if classes_last else 1
    target_shape = [size for dim, size in enumerate(output.shape) if dim != class_dim]
    return torch.zeros(target_shape, dtype=torch.int64, device=output.device)


def compute_loss(loss: LossKind, output: torch.Tensor, target: torch.Tensor | None,
                 classes_last: bool) -> torch.Tensor:
    if loss is LossKind.SUM:
        return output.sum()
    if loss is LossKind.MSE:
        return F.mse_loss(output, target)
    if classes_last and output.dim() > 2:
        return F.cross_entropy(output.flatten(0, -2), target.flatten())
    return F.cross_entropy(output, target)
