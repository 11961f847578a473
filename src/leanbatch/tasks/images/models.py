"""Models for the benchmark: a small CNN with global pooling and a compact ResNet.

Both end in global average pooling, so they accept any input size. Selective
Backprop relies on that: its selection pass runs the model on a downsampled copy
of the batch (``scale_factor=0.5`` halves each side).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["SmallCNN", "CompactResNet", "build_model", "MODEL_NAMES", "default_model_name"]

MODEL_NAMES = ("cnn", "resnet")


def _conv_bn(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Sequential):
    """Stages of conv3x3 -> 2x2 max-pool -> BatchNorm -> ReLU, then global average pooling and a linear head.

    Pooling before normalisation (as in airbench) runs BatchNorm and ReLU on a
    quarter of the pixels, which on a CPU halves the step time: with the default
    ``widths=(16, 32, 64)`` a forward + backward pass of a batch of 128 MNIST
    digits takes about 16 ms on two cores. Pooling uses ``ceil_mode`` so even
    8x8 inputs (scikit-learn digits), halved by Selective Backprop's selection
    pass, keep a non-empty feature map.
    """

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (16, 32, 64)):
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            layers += [
                nn.Conv2d(c, w, 3, padding=1, bias=False),
                nn.MaxPool2d(2, ceil_mode=True),
                nn.BatchNorm2d(w),
                nn.ReLU(inplace=True),
            ]
            c = w
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes)]
        super().__init__(*layers)


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = _conv_bn(c_in, c_out, stride)
        self.conv2 = nn.Sequential(nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv2(self.conv1(x)) + self.shortcut(x))


class CompactResNet(nn.Module):
    """A ResNet-8 for 32x32 RGB images: a stem, three basic blocks (one per stage), global pooling.

    ``widths=(32, 64, 128)`` keeps CIFAR-10 trainable on a CPU; on a GPU pass
    larger widths through :func:`build_model`.
    """

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...] = (32, 64, 128)):
        super().__init__()
        self.stem = _conv_bn(in_channels, widths[0])
        blocks: list[nn.Module] = []
        c = widths[0]
        for i, w in enumerate(widths):
            blocks.append(_BasicBlock(c, w, stride=1 if i == 0 else 2))
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)))


def default_model_name(in_channels: int, image_size: int) -> str:
    """``"resnet"`` for RGB images of at least 32 pixels a side, ``"cnn"`` otherwise."""
    return "resnet" if in_channels == 3 and image_size >= 32 else "cnn"


def build_model(
    name: str, in_channels: int, num_classes: int, widths: tuple[int, ...] | None = None
) -> nn.Module:
    """Build ``name`` (one of :data:`MODEL_NAMES`) for the given input channels and classes."""
    kwargs = {} if widths is None else {"widths": tuple(widths)}
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, **kwargs)
    if name == "resnet":
        return CompactResNet(in_channels, num_classes, **kwargs)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
