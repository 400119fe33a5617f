"""A model whose parameter and buffer names hold everything that breaks
printers: a backslash-newline, quotes, NUL, non-ASCII, and text that reads
as code in C, Python and JSON."""

import torch
import torch.nn.functional as F
from torch import nn

HOSTILE = 'w\\\n"q\'\x00\u00e9\u2603 }; system("rm -rf /"); //'
HOSTILE_BUFFER = 'scale\\\n\x00"}]'


class HostileNames(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_parameter(HOSTILE, nn.Parameter(torch.randn(5, 4)))
        self.register_buffer(HOSTILE_BUFFER, torch.full((4,), 0.5))
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = getattr(self, HOSTILE)
        return self.fc((x @ weight.t() @ weight) * getattr(self, HOSTILE_BUFFER))


def make(batch: int = 4, **_options):
    model = HostileNames()
    return model, (torch.randn(batch, 4), torch.randn(batch, 3)), \
        lambda model, x, y: F.mse_loss(model(x), y)
