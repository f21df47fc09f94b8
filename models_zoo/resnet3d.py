"""3D ResNets for volumes (Hara et al. 2018; torchvision's R3D-18 layout at depth 18)."""

from __future__ import annotations

from torch import nn

from models_zoo.resnet_stages import BottleneckBlock, build_stages


def _conv3x3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv3d:
    return nn.Conv3d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock3d(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm3d(planes)
        self.conv2 = _conv3x3x3(planes, planes)
        self.bn2 = nn.BatchNorm3d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_planes, planes * self.expansion, stride)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck3d(BottleneckBlock):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm3d(planes)
        self.conv2 = _conv3x3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm3d(planes)
        self.conv3 = nn.Conv3d(planes, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm3d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_planes, planes * self.expansion, stride)


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_planes == out_planes:
        return None
    return nn.Sequential(
        nn.Conv3d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm3d(out_planes),
    )


_DEPTHS = {
    10: (BasicBlock3d, (1, 1, 1, 1)),
    18: (BasicBlock3d, (2, 2, 2, 2)),
    34: (BasicBlock3d, (3, 4, 6, 3)),
    50: (Bottleneck3d, (3, 4, 6, 3)),
}


class ResNet3d(nn.Module):
    """Input (N, C, D, H, W); output (N, num_classes)."""

    def __init__(self, depth: int = 18, in_channels: int = 3, num_classes: int = 400) -> None:
        super().__init__()
        if depth not in _DEPTHS:
            raise ValueError(f"resnet3d depth must be one of {sorted(_DEPTHS)}: depth={depth}")
        block, counts = _DEPTHS[depth]
        self.stem = nn.Sequential(
            nn.Conv3d(in_channels, 64, kernel_size=(3, 7, 7), stride=(1, 2, 2),
                      padding=(1, 3, 3), bias=False),
            nn.BatchNorm3d(64),
            nn.ReLU(inplace=True),
        )
        stages, in_planes = build_stages(block, counts)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet3d(depth: int = 18, in_channels: int = 3, num_classes: int = 400) -> ResNet3d:
    return ResNet3d(depth=depth, in_channels=in_channels, num_classes=num_classes)
