"""The training steps measured on a real GPU (``python -m benchmarks.gpu``).

Convolution nets (a 3D ResNet with R3D-18 widths, a 3D U-Net, ResNet-50, ConvNeXt-T) in fp32
with cuDNN's TF32 on (PyTorch's default) and off, bf16-mixed and fp16-mixed, with
``cudnn.benchmark`` off (the default) and on; a ViT and GPT-2 in three precisions. Two
sizes each. Every step is memcalc's: Adam (foreach, CUDA's default), cross-entropy, two
iterations of forward, loss, backward, step, ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONV_NETS = {
    "resnet3d": [((3, 16, 112, 112), 4), ((3, 32, 160, 160), 2)],
    "unet3d": [((1, 64, 64, 64), 2), ((1, 96, 96, 96), 2)],
    "resnet50": [((3, 224, 224), 16), ((3, 224, 224), 64)],
    "convnext": [((3, 224, 224), 16), ((3, 224, 224), 48)],
}
TRANSFORMERS = {
    "vit_b16": [((3, 224, 224), 16), ((3, 224, 224), 48)],
    "gpt2": [((512,), 4), ((1024,), 8)],
}
# (precision, cuDNN TF32) pairs.
CONV_PRECISIONS = [("fp32", True), ("fp32", False), ("bf16-mixed", True), ("fp16-mixed", True)]
TRANSFORMER_PRECISIONS = [("fp32", True), ("bf16-mixed", True), ("fp16-mixed", True)]

# Cards emulated with torch.cuda.set_per_process_memory_fraction for the true largest batch:
# nvidia-smi totals of an RTX 4090 (24 GB), an A100-40GB and this H100 (80 GB).
EMULATED_CARDS = {"24GB": 24564 << 20, "40GB": 40960 << 20, "80GB": 81559 << 20}
LARGEST_BATCH_CASES = [
    ("resnet3d", (3, 16, 112, 112), "fp32"), ("unet3d", (1, 64, 64, 64), "fp32"),
    ("resnet50", (3, 224, 224), "fp32"), ("convnext", (3, 224, 224), "fp32"),
    ("resnet3d", (3, 16, 112, 112), "bf16-mixed"), ("unet3d", (1, 64, 64, 64), "bf16-mixed"),
    ("vit_b16", (3, 224, 224), "fp32"), ("gpt2", (512,), "bf16-mixed"),
]


@dataclass(frozen=True)
class GpuCase:
    """One measured training step."""

    model: str
    sample_shape: tuple[int, ...]
    batch_size: int
    precision: str = "fp32"
    tf32: bool = True
    """``torch.backends.cudnn.allow_tf32`` (convolutions; matmuls keep PyTorch's default)."""
    benchmark: bool = False
    """``torch.backends.cudnn.benchmark``."""
    model_args: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        shape = "x".join(map(str, self.sample_shape))
        math = "" if self.precision != "fp32" else (" tf32" if self.tf32 else " no-tf32")
        return (f"{self.model} b{self.batch_size}x{shape} {self.precision}{math}"
                + (" bench" if self.benchmark else ""))

    @property
    def group(self) -> tuple:
        """Cases of one group run in one fresh process, in order."""
        return (self.model, self.precision, self.tf32, self.benchmark)


def step_cases() -> list[GpuCase]:
    cases = []
    for benchmark in (False, True):
        for model, sizes in CONV_NETS.items():
            for precision, tf32 in CONV_PRECISIONS:
                cases += [GpuCase(model, shape, batch, precision, tf32, benchmark)
                          for shape, batch in sizes]
    for model, sizes in TRANSFORMERS.items():
        for precision, tf32 in TRANSFORMER_PRECISIONS:
            cases += [GpuCase(model, shape, batch, precision, tf32) for shape, batch in sizes]
    return cases


def case_from_dict(row: dict) -> GpuCase:
    row = dict(row)
    row["sample_shape"] = tuple(row["sample_shape"])
    return GpuCase(**row)
