"""A two-layer perceptron: the smallest model worth sharding."""

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def mse_loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # In the target's dtype: under a bf16 policy the output is bf16, and
    # torch 2.11's mse_loss backward fails on mixed dtypes.
    return F.mse_loss(model(x).to(target.dtype), target)


def make_mlp(batch: int = 8, **_options):
    model = MLP()
    x = torch.randn(batch, 16)
    target = torch.randn(batch, 10)
    return model, (x, target), mse_loss
