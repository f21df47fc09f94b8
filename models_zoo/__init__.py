"""Reference models for memcalc, built on any device without weights.

Each entry names a builder, its default per-sample shape and input dtype. Builders accept
keyword arguments (``--model-arg depth=50``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from models_zoo.bert import bert_large
from models_zoo.convnext import convnext
from models_zoo.gpt2 import gpt2
from models_zoo.llama import llama_7b
from models_zoo.llama3 import llama3_8b
from models_zoo.mlp import mlp
from models_zoo.resnet2d import resnet50
from models_zoo.resnet3d import resnet3d
from models_zoo.unet3d import unet3d
from models_zoo.vit import vit_b16


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model: how to build it and what one sample looks like by default."""

    name: str
    build: Callable[..., nn.Module]
    default_shape: tuple[int, ...]
    input_dtype: str
    description: str


ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry("resnet3d", resnet3d, (3, 112, 112, 112), "float32",
                 "3D ResNet (R3D-18 layout; depth=10/18/34/50), volumes (C, D, H, W)"),
        ZooEntry("unet3d", unet3d, (1, 128, 128, 128), "float32",
                 "3D U-Net, 4 levels from 32 channels, segmentation of (C, D, H, W)"),
        ZooEntry("resnet50", resnet50, (3, 224, 224), "float32", "ResNet-50, images (C, H, W)"),
        ZooEntry("convnext", convnext, (3, 224, 224), "float32",
                 "ConvNeXt (size=tiny/small/base; depthwise 7x7 convs), images (C, H, W)"),
        ZooEntry("vit_b16", vit_b16, (3, 224, 224), "float32", "ViT-B/16, images (C, H, W)"),
        ZooEntry("bert_large", bert_large, (512,), "int64",
                 "BERT-large uncased, sequence classification, eager attention; token ids (S,)"),
        ZooEntry("gpt2", gpt2, (1024,), "int64", "GPT-2 small (124M), token ids (S,)"),
        ZooEntry("llama_7b", llama_7b, (2048,), "int64",
                 "LLaMA-style 7B decoder (RMSNorm, RoPE, SwiGLU), token ids (S,)"),
        ZooEntry("llama3_8b", llama3_8b, (8192,), "int64",
                 "Llama 3.1 8B as torchtitan writes it (GQA, fp32 logits), token ids (S,)"),
        ZooEntry("mlp", mlp, (1024,), "float32", "MLP 1024-4096x3-10, features (F,)"),
    )
}
