"""ResNet-50 for images (He et al. 2016), torchvision's layout, written without torchvision."""

from __future__ import annotations

from torch import nn

from models_zoo.resnet_stages import BottleneckBlock, build_stages


class Bottleneck(BottleneckBlock):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        width = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, width, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != width:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width)
            )


class ResNet50(nn.Module):
    """Input (N, 3, H, W); output (N, num_classes)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_planes = build_stages(Bottleneck, (3, 4, 6, 3))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet50(in_channels: int = 3, num_classes: int = 1000) -> ResNet50:
    return ResNet50(in_channels, num_classes)
