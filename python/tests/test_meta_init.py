"""Meta-device init at scale: a Llama-shaped model compiled for 64 ranks; one
rank creates and initializes its shards in about 1/64 of the model's memory
(allocator bytes, from the profiler's memory events). The real 70B shape is
benchmarks/meta_init_70b.py."""

import torch

from fsdpc.models.llama import LlamaConfig, _make
from fsdpc.profiling import peak_allocated_above_start
from fsdpc.program import Program
from fsdpc.runtime import compile_entry
from fsdpc.sharded import new_shard, shard_extent

RANKS = 64


def test_one_rank_of_64_holds_a_64th_of_the_model():
    config = LlamaConfig(vocab_size=8192, dim=256, n_layers=4, n_heads=8, n_kv_heads=2, ffn_dim=704, max_seq=64)
    with torch.device("meta"):
        model, batch, loss_fn = _make(config, 1, 16)
    entry = compile_entry(model, batch, loss_fn, options=f"ranks={RANKS}")
    program = Program.parse(entry["program"])
    whole = sum(p.numel() * p.element_size() for p in model.parameters())

    def create_rank_5():
        shards = {}
        for spec in program.params:
            shard = new_shard(spec, torch.float32)
            begin, real = shard_extent(program, spec, 5)
            torch.nn.init.normal_(shard[:real], std=0.02)
            shards[spec.name] = shard
        return shards

    peak, shards = peak_allocated_above_start(create_rank_5)
    held = sum(s.numel() * s.element_size() for s in shards.values())
    assert set(shards) == {name for name, _ in model.named_parameters()}
    assert held == peak, "creating the shards allocated more than the shards"
    assert whole / RANKS <= held <= 1.05 * whole / RANKS, f"{held} bytes on one rank of a {whole}-byte model"
