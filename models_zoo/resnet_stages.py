"""The four residual stages shared by the 2D and 3D ResNets."""

from __future__ import annotations

from torch import nn

STAGE_WIDTHS = (64, 128, 256, 512)


class BottleneckBlock(nn.Module):
    """The bottleneck residual block's forward (1×1, 3×3, 1×1 convs with a shortcut); the 2D
    and 3D variants build the layers."""

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def build_stages(block: type[nn.Module], counts: tuple[int, ...],
                 in_planes: int = 64) -> tuple[list[nn.Sequential], int]:
    """Stages of ``counts`` blocks; every stage after the first halves resolution at its
    first block. Returns the stages and the channel count they output."""
    stages = []
    for index, (planes, count) in enumerate(zip(STAGE_WIDTHS, counts, strict=True)):
        blocks = []
        for block_index in range(count):
            stride = 2 if index > 0 and block_index == 0 else 1
            blocks.append(block(in_planes, planes, stride))
            in_planes = planes * block.expansion
        stages.append(nn.Sequential(*blocks))
    return stages, in_planes
