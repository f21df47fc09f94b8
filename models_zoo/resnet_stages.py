"""The four residual stages shared by the 2D and 3D ResNets."""

from __future__ import annotations

from torch import nn

STAGE_WIDTHS = (64, 128, 256, 512)


def build_stages(block: type[nn.Module], counts: tuple[int, ...],
                 in_planes: int = 64) -> tuple[list[nn.Sequential], int]:
    """Stages of ``counts`` blocks; every stage after the first halves resolution at its
    first block. Returns the stages and the channel count they output."""
    stages = []
    for index, (planes, count) in enumerate(zip(STAGE_WIDTHS, counts)):
        blocks = []
        for block_index in range(count):
            stride = 2 if index > 0 and block_index == 0 else 1
            blocks.append(block(in_planes, planes, stride))
            in_planes = planes * block.expansion
        stages.append(nn.Sequential(*blocks))
    return stages, in_planes
