"""One rank of a job whose step reads a setting that is not in the model's
structure or the code (launched twice by test_cache.py with another
SETTING). Six ways a step can read it: a module global in the loss, a
default argument, a closure over a non-plain object, a non-plain
attribute of the model read in forward, the backward of a custom
autograd Function in a module of its own (FUNCTION_DIR's reversal.py,
which test_cache.py writes with the setting in it: code that runs only
in backward), and a helper in another module (negation.py, with the
setting) that a Function's backward calls (by_helper.py, unchanged). Each must give eager's loss (the Function: eager's
gradient), and rank 0 prints whether compiling stopped at a cache hit
before export."""

import os
import sys
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import fsdpc

SMOOTH = float(os.environ["SETTING"])  # a hyper-parameter sweep's flag


class Net(nn.Module):
    def __init__(self, config=None):
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.config = config or types.SimpleNamespace(scale=1.0)

    def forward(self, x):
        return self.fc(x) * self.config.scale


def global_loss(model, x, y):
    return F.cross_entropy(model(x), y, label_smoothing=SMOOTH)


def default_loss(model, x, y, smoothing=SMOOTH):
    return F.cross_entropy(model(x), y, label_smoothing=smoothing)


class Settings:
    def __init__(self, temperature):
        self.temperature = temperature


def closure_loss(settings):
    def loss(model, x, y):
        return F.cross_entropy(model(x) / settings.temperature, y)
    return loss


def plain_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def reversed_loss(model, x, y):
    from reversal import Reversal  # FUNCTION_DIR's

    return F.cross_entropy(Reversal.apply(model(x)), y)


def helper_loss(model, x, y):
    from by_helper import ReversalByHelper  # FUNCTION_DIR's

    return F.cross_entropy(ReversalByHelper.apply(model(x)), y)


def main():
    sys.path.insert(0, os.environ["FUNCTION_DIR"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = float(os.environ["SETTING"])
    cases = {
        "global": (lambda: Net(), global_loss),
        "default": (lambda: Net(), default_loss),
        "closure": (lambda: Net(), closure_loss(Settings(1.0 + value))),
        "attribute": (lambda: Net(types.SimpleNamespace(scale=1.0 + value)), plain_loss),
        "function": (lambda: Net(), reversed_loss),
        "helper": (lambda: Net(), helper_loss),
    }
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(4 * world, 8, generator=generator), torch.randint(0, 5, (4 * world,), generator=generator)
    mine = (x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4])
    for name, (build, loss_fn) in cases.items():
        torch.manual_seed(0)
        eager = build()
        expected_loss = loss_fn(eager, x, y)
        expected_loss.backward()
        expected = expected_loss.item()
        torch.manual_seed(0)
        sharded = fsdpc.shard(build(), mine, loss_fn)
        local = sharded(*mine).detach()
        dist.all_reduce(local)
        got = local.item() / world
        if abs(got - expected) > 1e-5:
            sys.exit(f"{name}: fsdpc's loss {got:.6f}, eager's {expected:.6f} (SETTING={value})")
        gradient = sharded.fc.weight.grad.full_tensor()
        if not torch.allclose(gradient, eager.fc.weight.grad, rtol=1e-5, atol=1e-6):
            sys.exit(f"{name}: fsdpc's gradient differs from eager's (SETTING={value})")
        if rank == 0:
            # A hit on the recorded calls skips export and the joint trace.
            seconds = sharded.compile_seconds
            phases = "cache hit" if "cache hit" in seconds and "export" not in seconds else "compiled"
            print(f"{name} {phases} {got:.6f}", flush=True)
    dist.barrier()  # every rank tears down together: see "Interpreter shutdown" in docs/design.md
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
