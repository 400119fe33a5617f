"""One rank of a failure scenario (test_failures.py starts every rank by hand
with the rendezvous environment, without torchrun's agent, which would kill
the survivors itself). The failure is not caught: a rank that raises exits
with Python's traceback, as a user's job would."""

import faulthandler
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fsdpc
from fsdpc.models.gpt import GPT, GPTConfig
from fsdpc.models.language import next_token_loss

CONFIG = GPTConfig(vocab_size=1021, max_seq=64, d_model=192, n_heads=4, n_layers=4)
# Where the step runs: "cuda" puts every rank on the one GPU (test_gpu.py),
# with Gloo moving its CUDA tensors or NCCL (BACKEND=nccl; the ranks then
# claim hosts of their own, launch.nccl_sharing_one_gpu).
DEVICE = os.environ.get("DEVICE", "cpu")
BACKEND = os.environ.get("BACKEND", "gloo")


def batch():
    generator = torch.Generator().manual_seed(dist.get_rank())
    return (torch.randint(0, CONFIG.vocab_size, (4, 64), generator=generator).to(DEVICE),
            torch.randint(0, CONFIG.vocab_size, (4, 64), generator=generator).to(DEVICE))


def main() -> None:
    scenario, victim = sys.argv[1], int(sys.argv[2])
    faulthandler.register(signal.SIGUSR1)  # a test that finds a rank hanging asks for its stack
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl" if BACKEND == "nccl" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    options = {"timeout": timedelta(seconds=float(os.environ.get("STEP_TIMEOUT", "5")))}
    if DEVICE == "cuda":  # no generated kernels: their first compile (NVRTC) would eat into call 1's deadline
        options["pipeline"] = "fuse-pointwise=false"
    if scenario == "arguments" and rank == victim:
        options["mp_policy"] = "bf16"
    if scenario == "kinds":
        options["gradient_accumulation"] = True
    model = fsdpc.shard(GPT(CONFIG), batch(), next_token_loss, **options)
    optimizer = torch.optim.AdamW(model.parameters())
    for call in range(1, int(os.environ.get("CALLS", "5")) + 1):
        if call == 3 and rank == victim:
            if scenario == "kinds":
                model.set_requires_gradient_sync(False)
            elif scenario == "forward_only":
                with torch.no_grad():
                    model(*batch())
            elif scenario == "die":  # SIGKILL in the middle of the step's collectives
                threading.Timer(0.03, os.kill, (os.getpid(), signal.SIGKILL)).start()
            elif scenario == "vanish":  # agrees to call 3, then dies before its first collective
                agree = model._agree_on_call

                def agree_then_die(*args, **kwargs) -> None:
                    agree(*args, **kwargs)
                    os.kill(os.getpid(), signal.SIGKILL)

                model._agree_on_call = agree_then_die
            elif scenario == "stall":  # stops calling the step, stays alive
                print(f"rank {rank} stalls", flush=True)
                time.sleep(3600)
        if call == 3:
            print(f"rank {rank} call 3 at {time.time():.3f}", flush=True)
        try:
            # Reading the loss waits for the step: on NCCL the call itself
            # returns before its collectives end.
            model(*batch()).item()
            if scenario == "die_clipping":  # dies between the step and the clipping's all-reduce
                if call == 3 and rank == victim:
                    os.kill(os.getpid(), signal.SIGKILL)
                model.clip_grad_norm_(1.0)
        except fsdpc.StepError as error:
            print(f"rank {rank} failed at {time.time():.3f}: {error}", flush=True)
            try:
                model(*batch())
            except fsdpc.StepError as again:
                print(f"rank {rank} second call: {again}", flush=True)
            raise
        optimizer.step()
        optimizer.zero_grad()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
