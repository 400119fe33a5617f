"""How long fsdpc takes to compile a step, cold and warm, without a GPU:
capture for the target device on the meta device, shard and lower (what
rank 0 does before the first step; loading the program and the first
step's NVRTC compiles come on top), once with an empty program cache and
then again with it filled, each phase timed.

    PYTHONPATH=python .venv/bin/python benchmarks/compile_time.py --model llama-0.9b --device cuda

The model is built on meta; the batch is the size the GPU benchmark trains
(`benchmarks/gpu_one.py`'s table), bf16 compute with fp32 reductions.
"""

import argparse
import os
import tempfile
import time

import torch

from fsdpc import runtime
from fsdpc.capture import MixedPrecision
from fsdpc.models.language import next_token_loss
from gpu_one import MODELS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-0.9b")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--warm", type=int, default=2, help="warm compiles after the cold one")
    args = parser.parse_args()
    factory, config, batch, seq, _ = MODELS[args.model]
    with torch.device("meta"):
        model = factory(config)
    tokens = [torch.zeros(batch, seq, dtype=torch.long, device="meta") for _ in range(2)]
    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FSDPC_CACHE"] = cache
        for attempt in ["cold"] + ["warm"] * args.warm:
            phases: dict[str, float] = {}
            clock = [time.perf_counter()]
            start = clock[0]

            def lap(phase: str) -> None:
                now = time.perf_counter()
                phases[phase] = now - clock[0]
                clock[0] = now

            backend = "nccl" if args.device == "cuda" else "gloo"
            runtime.compile_entry(model, tokens, next_token_loss, options=f"ranks=1 backend={backend}",
                                  mixed_precision=precision, lap=lap, device=args.device)
            detail = ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in phases.items())
            print(f"{args.model} {batch} x {seq} for {args.device}, {attempt}: {time.perf_counter() - start:.2f} s "
                  f"({detail})", flush=True)


if __name__ == "__main__":
    main()
