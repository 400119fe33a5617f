"""fsdpc: compile PyTorch training steps into fully sharded data-parallel code.

`fsdpc.shard(model, example_batch, loss_fn)` (fsdpc/sharded.py) compiles a
model's training step for a torch.distributed job and returns the module
that trains it; `fsdpc.checkpoint` saves and loads it with
torch.distributed.checkpoint. `fsdpc.export` and `python -m fsdpc` capture a
step into the fsdp dialect for fsdp-opt.
"""

from fsdpc import checkpoint
from fsdpc.capture import MixedPrecision
from fsdpc.compiler import FsdpOptError, find_fsdp_opt, run_fsdp_opt
from fsdpc.runtime import StepError
from fsdpc.sharded import ShardedModule, shard

__all__ = ["FsdpOptError", "MixedPrecision", "checkpoint", "ShardedModule", "StepError", "find_fsdp_opt", "run_fsdp_opt",
           "shard"]
