"""A small image classifier with strided, depthwise and pointwise
convolutions: the operators (convolution and its backward with a `bool[3]`
output mask) that language models never produce."""

import torch
import torch.nn.functional as F
from torch import nn


class ConvBlock(nn.Module):
    """Depthwise 3x3 then pointwise 1x1 (a MobileNet block), strided."""

    def __init__(self, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.depthwise = nn.Conv2d(channels_in, channels_in, 3, stride=stride, padding=1,
                                   groups=channels_in)
        self.pointwise = nn.Conv2d(channels_in, channels_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.pointwise(F.relu(self.depthwise(x))))


class ConvNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList([ConvBlock(16, 24, 2), ConvBlock(24, 24, 1), ConvBlock(24, 32, 2)])
        self.head = nn.Linear(32, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(images), labels)


def make_convnet(batch: int = 4, **_options):
    model = ConvNet()
    images = torch.randn(batch, 3, 16, 16)
    labels = torch.randint(0, 10, (batch,))
    return model, (images, labels), classification_loss
