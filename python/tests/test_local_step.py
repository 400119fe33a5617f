"""The optimizer step on the shards' local tensors (fsdpc/local_step.py):
the same parameters and state, to the bit, as DTensor's own path, and the
DTensors back in place after every step, also after one that raised."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

import fsdpc
from fsdpc.models.gpt import GPT, GPTConfig
from fsdpc.models.language import next_token_loss

CONFIG = GPTConfig(vocab_size=64, max_seq=16, d_model=16, n_heads=2, n_layers=2)


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    created = not dist.is_initialized()  # another test file in this process may have made one
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_world_size() == 1
    yield
    if created:
        dist.destroy_process_group()


def sharded_gpt(seed: int = 0):
    torch.manual_seed(seed)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 9))
    batch = (tokens[:, :-1], tokens[:, 1:])
    return fsdpc.shard(GPT(CONFIG), batch, next_token_loss), batch


def on_dtensors(optimizer):
    """A step hook of the optimizer's own keeps the step on DTensor's path."""
    optimizer.register_step_pre_hook(lambda *_: None)
    return optimizer


OPTIMIZERS = {
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=1e-2, fused=True),
    "adamw-foreach": lambda params: torch.optim.AdamW(params, lr=1e-2, foreach=True, amsgrad=True),
    "adam-for-loop": lambda params: torch.optim.Adam(params, lr=1e-2, foreach=False, weight_decay=0.1),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=1e-2),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True),
    "nadam": lambda params: torch.optim.NAdam(params, lr=1e-2),
    "asgd": lambda params: torch.optim.ASGD(params, lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_local_step_equals_dtensor_step(name):
    fast, batch = sharded_gpt()
    slow, _ = sharded_gpt()
    fast_opt = OPTIMIZERS[name](fast.parameters())
    slow_opt = on_dtensors(OPTIMIZERS[name](slow.parameters()))
    scheduler = torch.optim.lr_scheduler.StepLR(fast_opt, step_size=2, gamma=0.5)
    slow_scheduler = torch.optim.lr_scheduler.StepLR(slow_opt, step_size=2, gamma=0.5)
    for _ in range(4):
        for model, optimizer, sched in ((fast, fast_opt, scheduler), (slow, slow_opt, slow_scheduler)):
            model(*batch)
            optimizer.step()
            optimizer.zero_grad()
            sched.step()
    for (fqn, mine), theirs in zip(fast.named_parameters(), slow.parameters()):
        assert isinstance(mine, DTensor)
        assert torch.equal(mine.to_local(), theirs.to_local()), fqn
    fast_state, slow_state = fast_opt.state_dict()["state"], slow_opt.state_dict()["state"]
    assert fast_state.keys() == slow_state.keys() and fast_state
    for index, entry in fast_state.items():
        for key, value in entry.items():
            other = slow_state[index][key]
            assert type(value) is type(other), (index, key)
            if isinstance(value, DTensor):
                assert value.placements == other.placements and value.shape == other.shape
                value, other = value.to_local(), other.to_local()
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(other)), (index, key)
    for group in fast_opt.param_groups:
        assert all(isinstance(p, DTensor) for p in group["params"])
    assert all(p._local_tensor.grad is None for p in fast.parameters())  # no gradient kept alive


def test_every_step_runs_on_local_tensors_and_creates_dtensor_state():
    model, batch = sharded_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []
    real = torch.optim.AdamW._init_group

    def recording(self, group, *args, **kwargs):
        seen.append(all(not isinstance(p, DTensor) for p in group["params"]))
        return real(self, group, *args, **kwargs)

    torch.optim.AdamW._init_group = recording
    try:
        for _ in range(3):
            model(*batch)
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.optim.AdamW._init_group = real
    assert seen == [True, True, True]  # the first step too: it creates the state, made DTensors after it
    assert all(isinstance(v, DTensor) for entry in optimizer.state.values() for k, v in entry.items()
               if k != "step")


def test_a_raising_step_leaves_dtensors_for_state_dict_and_the_next_step():
    model, batch = sharded_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    model(*batch)
    optimizer.step()
    optimizer.zero_grad()
    model(*batch)
    real = torch._foreach_add_

    def fail(*_args, **_kwargs):
        raise RuntimeError("injected")

    torch._foreach_add_ = fail
    try:
        with pytest.raises(RuntimeError, match="injected"):
            optimizer.step()
    finally:
        torch._foreach_add_ = real
    assert any(not isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"])
    state = optimizer.state_dict()  # puts the DTensors back first
    assert all(isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"])
    assert all(isinstance(v["exp_avg"], DTensor) for v in state["state"].values())
    optimizer.step()
    assert all(isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"])


class Tempered(nn.Module):
    """A linear map scaled by a learned scalar (a temperature)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.linear(x) * self.scale


def test_a_scalar_parameter_gets_state_as_dtensor_path_makes_it():
    """A scalar shard's first state is made on DTensors (its moments 0-dim
    DTensors, its step count plain): on local tensors both would be 0-dim
    plain tensors, which no rule tells apart. Later steps run on local
    tensors and equal DTensor's own path to the bit."""
    batch = (torch.randn(3, 4),)
    made = []
    for _ in range(2):
        torch.manual_seed(0)
        made.append(fsdpc.shard(Tempered(), batch, lambda model, x: model(x).square().sum()))
    fast, slow = made
    fast_opt = torch.optim.AdamW(fast.parameters(), lr=1e-2)
    slow_opt = on_dtensors(torch.optim.AdamW(slow.parameters(), lr=1e-2))
    for _ in range(3):
        for model, optimizer in ((fast, fast_opt), (slow, slow_opt)):
            model(*batch)
            optimizer.step()
            optimizer.zero_grad()
    state = fast_opt.state[fast.scale]
    assert isinstance(state["exp_avg"], DTensor) and isinstance(state["exp_avg_sq"], DTensor)
    assert not isinstance(state["step"], DTensor)
    for mine, theirs in zip(fast.parameters(), slow.parameters()):
        assert torch.equal(mine.to_local(), theirs.to_local())


class SubclassedAdamW(torch.optim.AdamW):
    """A subclass may change the math: not known to be elementwise."""


def test_subclassed_or_hooked_optimizers_keep_dtensors():
    model, batch = sharded_gpt()
    subclassed = SubclassedAdamW(model.parameters(), lr=1e-2)
    hooked = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []
    hooked.register_step_post_hook(
        lambda opt, *_: seen.append(all(isinstance(p, DTensor) for g in opt.param_groups for p in g["params"])))
    real = torch.optim.AdamW._init_group

    def recording(self, group, *args, **kwargs):
        seen.append(all(isinstance(p, DTensor) for p in group["params"]))
        return real(self, group, *args, **kwargs)

    torch.optim.AdamW._init_group = recording
    try:
        for optimizer in (subclassed, subclassed, hooked, hooked):
            model(*batch)
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.optim.AdamW._init_group = real
    assert seen == [True] * 6  # subclassed: 2 steps; hooked: 2 steps and 2 post-hooks


def test_offloaded_shards_and_replaced_state_stay_in_host_memory_under_a_cuda_mesh():
    """An offloaded unit's shard, and optimizer state a step replaces for it,
    are DTensors of the job's (CUDA) mesh whose local tensors stay in host
    memory, as FSDP2's: DTensor.from_local would copy them to the GPU. A
    mesh of kind "cuda" is made here without a GPU (no backend)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard

    from fsdpc.device import dtensor_where_it_is
    from fsdpc.local_step import LocalStep, restore

    mesh = DeviceMesh("cuda", torch.arange(1), _init_backend=False)
    shard = torch.randn(4, 3)
    param = torch.nn.Parameter(dtensor_where_it_is(shard, mesh, [Shard(0)], (4, 3), (3, 1)))
    assert param.device.type == "cpu" and param.device_mesh.device_type == "cuda"
    assert param._local_tensor.data_ptr() == shard.data_ptr() and tuple(param.shape) == (4, 3)
    param.grad = dtensor_where_it_is(torch.ones(4, 3), mesh, [Shard(0)], (4, 3), (3, 1))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    optimizer.state[param]["step"] = torch.tensor(0.0)  # state exists, so the step runs on local tensors
    LocalStep(lambda p: True).before(optimizer, (), {})
    optimizer.step()  # creates momentum_buffer as a plain tensor, which restore turns into a DTensor
    restore(optimizer)
    momentum = optimizer.state[param]["momentum_buffer"]
    assert isinstance(momentum, DTensor) and momentum.device_mesh is mesh
    assert momentum._local_tensor.device.type == "cpu"
    torch.testing.assert_close(momentum._local_tensor, torch.ones(4, 3))
