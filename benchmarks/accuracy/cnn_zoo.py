"""torchvision-style CNNs built without weights, for the sweeps: torchvision's module layouts, written here.

torchvision's wheel for the pinned torch (0.28.0 on PyPI) is a CUDA build that does not import beside the
CPU torch ("operator torchvision::nms does not exist"), and its CPU build is not on PyPI; so the layouts
that decide which plans exist are rebuilt here after torchvision/models: VGG's `features` nn.Sequential
of conv/norm/ReLU/pool, ResNet's stem and `layer1..4` nn.Sequentials of BasicBlock or Bottleneck,
MobileNetV2's `features` nn.Sequential of InvertedResidual blocks (each a `conv` nn.Sequential), AlexNet's
`features` and `classifier`, and SqueezeNet's Fire modules. Heads have `CLASSES` outputs after global
pooling (VGG's and AlexNet's 4096-wide classifiers at 7x7 would be most of the parameters at these sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CLASSES = 10


def vgg(config: str = "A", batch_norm: bool = True) -> Any:
    """VGG (Simonyan and Zisserman): configuration A is VGG-11, D VGG-16."""
    import torch
    from torch import nn

    layouts = {"A": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
               "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]}
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    before = 3
    for width in layouts[config]:
        if width == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        assert isinstance(width, int)
        layers += [nn.Conv2d(before, width, 3, padding=1), *([nn.BatchNorm2d(width)] if batch_norm else []),
                   nn.ReLU(inplace=True)]
        before = width
    model = nn.Module()
    model.features = nn.Sequential(*layers)
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.classifier = nn.Sequential(nn.Linear(512, 512), nn.ReLU(True), nn.Dropout(), nn.Linear(512, CLASSES))
    return _with_forward(model, lambda m, x: m.classifier(torch.flatten(m.avgpool(m.features(x)), 1)), "VGG")


def resnet(blocks: tuple[int, int, int, int] = (2, 2, 2, 2), bottleneck: bool = False) -> Any:
    """ResNet (He et al.): (2, 2, 2, 2) BasicBlocks is ResNet-18, (3, 4, 6, 3) Bottlenecks ResNet-50."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    block: Any = Bottleneck if bottleneck else BasicBlock
    torch.manual_seed(0)
    model = nn.Module()
    model.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
    model.bn1 = nn.BatchNorm2d(64)
    model.relu = nn.ReLU(inplace=True)
    model.maxpool = nn.MaxPool2d(3, 2, 1)
    inplanes = 64
    for index, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
        stride = 1 if index == 0 else 2
        downsample = None
        if stride != 1 or inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(inplanes, planes, stride, downsample)]
        inplanes = planes * block.expansion
        layers += [block(inplanes, planes, 1, None) for _ in range(1, count)]
        setattr(model, f"layer{index + 1}", nn.Sequential(*layers))
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.fc = nn.Linear(512 * block.expansion, CLASSES)

    def forward(m: Any, x: Any) -> Any:
        x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
        x = m.layer4(m.layer3(m.layer2(m.layer1(x))))
        return m.fc(torch.flatten(m.avgpool(x), 1))

    return _with_forward(model, forward, "ResNet")


def mobilenet_v2() -> Any:
    """MobileNetV2 (Sandler et al.), width 1.0."""
    import torch
    from torch import nn

    def conv_norm_act(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                      act: bool = True) -> nn.Sequential:
        layers: list[nn.Module] = [nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                                   nn.BatchNorm2d(out)]
        return nn.Sequential(*layers, *([nn.ReLU6(inplace=True)] if act else []))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, oup: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = inp * expand
            self.use_res_connect = stride == 1 and inp == oup
            layers: list[nn.Module] = [conv_norm_act(inp, hidden, 1)] if expand != 1 else []
            layers += [conv_norm_act(hidden, hidden, stride=stride, groups=hidden),
                       nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    torch.manual_seed(0)
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]
    features: list[nn.Module] = [conv_norm_act(3, 32, stride=2)]
    before = 32
    for expand, channels, repeats, stride in settings:
        for index in range(repeats):
            features.append(InvertedResidual(before, channels, stride if index == 0 else 1, expand))
            before = channels
    features.append(conv_norm_act(before, 1280, 1))
    model = nn.Module()
    model.features = nn.Sequential(*features)
    model.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, CLASSES))
    return _with_forward(model, lambda m, x: m.classifier(torch.flatten(
        nn.functional.adaptive_avg_pool2d(m.features(x), 1), 1)), "MobileNetV2")


def alexnet() -> Any:
    """AlexNet (Krizhevsky et al.), torchvision's one-GPU variant."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Module()
    model.features = nn.Sequential(
        nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    model.classifier = nn.Sequential(nn.Dropout(), nn.Linear(256, 1024), nn.ReLU(inplace=True), nn.Dropout(),
                                     nn.Linear(1024, 1024), nn.ReLU(inplace=True), nn.Linear(1024, CLASSES))
    return _with_forward(model, lambda m, x: m.classifier(torch.flatten(m.avgpool(m.features(x)), 1)), "AlexNet")


def squeezenet() -> Any:
    """SqueezeNet 1.1 (Iandola et al.)."""
    import torch
    from torch import nn

    class Fire(nn.Module):
        def __init__(self, inplanes: int, squeeze: int, expand1: int, expand3: int) -> None:
            super().__init__()
            self.squeeze = nn.Conv2d(inplanes, squeeze, 1)
            self.squeeze_activation = nn.ReLU(inplace=True)
            self.expand1x1 = nn.Conv2d(squeeze, expand1, 1)
            self.expand1x1_activation = nn.ReLU(inplace=True)
            self.expand3x3 = nn.Conv2d(squeeze, expand3, 3, padding=1)
            self.expand3x3_activation = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.squeeze_activation(self.squeeze(x))
            return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                              self.expand3x3_activation(self.expand3x3(x))], 1)

    torch.manual_seed(0)
    model = nn.Module()
    model.features = nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
    model.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, CLASSES, 1), nn.ReLU(inplace=True),
                                     nn.AdaptiveAvgPool2d(1))
    return _with_forward(model, lambda m, x: torch.flatten(m.classifier(m.features(x)), 1), "SqueezeNet")


def _with_forward(model: Any, forward: Callable[[Any, Any], Any], name: str) -> Any:
    """The module as an instance of a class `name` whose forward is `forward`."""
    cls = type(name, (type(model),), {"forward": lambda self, x: forward(self, x)})
    model.__class__ = cls
    return model.train()


MODELS: dict[str, Callable[[], Any]] = {
    "vgg11_bn": lambda: vgg("A"),
    "vgg16": lambda: vgg("D", batch_norm=False),
    "resnet18": lambda: resnet((2, 2, 2, 2)),
    "resnet50": lambda: resnet((3, 4, 6, 3), bottleneck=True),
    "mobilenet_v2": mobilenet_v2,
    "alexnet": alexnet,
    "squeezenet1_1": squeezenet,
}
"""name -> a builder: each model in train mode, its weights torch's default initialization (seed 0)."""

INPUT = (8, 3, 64, 64)
"""Images of the step: 8 at 64x64 (AlexNet's stride-4 stem needs at least 63)."""
