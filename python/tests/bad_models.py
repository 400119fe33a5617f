"""Models fsdpc must refuse, each with a precise error (used by test_capture)."""

import torch
import torch.utils.checkpoint
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


class OddDtype(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y + y.to(torch.uint16).float()


class MixedProduct(nn.Module):
    """Computes in bf16 with an fp32 weight it never casts."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return x.to(torch.bfloat16) @ self.weight


class MixedConvolution(nn.Module):
    """Convolves bf16 activations with its fp32 kernel (no bias)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)  # with a bias, torch checks its dtype itself

    def forward(self, x):
        return self.conv(x.to(torch.bfloat16))


class WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x)


class ReshapesItsBuffer(nn.Module):
    """Transposes a buffer in place in forward: its shape changes, which a
    compiled step's fixed layout cannot follow (new values it could)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("table", torch.zeros(4, 2))

    def forward(self, x):
        self.table.t_()
        return self.linear(x) + self.table.sum()


class SelectsByMask(nn.Module):
    """Keeps the rows whose sum is positive: how many depends on the data."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)[x.sum(1) > 0]


class ReentrantOnTheBatch(nn.Module):
    """Checkpoints its first layer the reentrant way on the batch, which
    requires no grad: PyTorch gives that layer no gradient."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        hidden = torch.utils.checkpoint.checkpoint(self.fc, x, use_reentrant=True)
        return self.out(hidden)


def _sum_loss(model, x):
    return model(x).sum()


def branchy():
    return Branchy(), (torch.randn(2, 4),), _sum_loss


def odd_dtype():
    return OddDtype(), (torch.randn(2, 4),), _sum_loss


def mixed_product():
    return MixedProduct(), (torch.randn(3, 8),), lambda model, x: model(x).float().sum()


def mixed_convolution():
    return MixedConvolution(), (torch.randn(2, 3, 8, 8),), lambda model, x: model(x).float().sum()


def batch_norm():
    return WithBatchNorm(), (torch.randn(3, 4),), _sum_loss


def buffer_reshape():
    return ReshapesItsBuffer(), (torch.randn(3, 4),), _sum_loss


def masked_rows():
    return SelectsByMask(), (torch.randn(3, 4),), _sum_loss


def vector_loss():
    return nn.Linear(4, 4), (torch.randn(2, 4),), lambda model, x: model(x).sum(0)


def branchy_for_training(batch: int = 4, **_options):
    """Branchy as a training factory (for the end-to-end failure test)."""
    return Branchy(), (torch.randn(batch, 4),), _sum_loss


def _scaling_loss(model, x):
    return model(x.mul_(2)).sum()


def batch_update():
    return nn.Linear(4, 4), (torch.randn(2, 4),), _scaling_loss


def reentrant_on_the_batch():
    return ReentrantOnTheBatch(), (torch.randn(2, 4),), _sum_loss

