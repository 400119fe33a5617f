"""Command line: `python -m fsdpc export --model gpt --out gpt.mlir`, and
`python -m fsdpc plan --model llama3-70b --gpus 8 --gpu h100-sxm` (will it fit)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

from fsdpc.attention import TARGET_DEVICES
from fsdpc.cache import CacheError
from fsdpc.capture import CaptureError, MixedPrecision
from fsdpc.compiler import FsdpOptError, run_fsdp_opt
from fsdpc.emit import MIXED_PRECISION_TYPES, torch_dtype
from fsdpc.export import build, export_training_step, load_factory
from fsdpc.models import BUILTIN_MODELS
from fsdpc.plan import (HARDWARE_OPTIONS, PlanError, Profile, calibrate, capture_for_plan, each_setting, explain,
                         machine, plan_step, search, size, what_would_fit, when_replayed)


def _export(args: argparse.Namespace) -> int:
    factory = load_factory(args.model)
    options = {key: value for key, value in (("batch", args.batch), ("seq", args.seq)) if value is not None}
    model, batch, loss_fn = build(factory, meta=args.meta, **options)
    wrap = [name for name in args.wrap.split(",") if name] if args.wrap else None
    header = f"Captured by `python -m fsdpc export --model {args.model} --device {args.device}" \
             f"{f' --autocast {args.autocast}' if args.autocast else ''}`: " \
             f"{type(model).__name__}, batch {', '.join(str(tuple(t.shape)) for t in batch)}."
    policy = _mixed_precision(args)
    autocast = contextlib.nullcontext()
    if args.autocast:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--autocast with --device cuda needs a GPU on this machine: autocast's casts are traced "
                             "on CUDA tensors, whose backward needs one (--param-dtype works anywhere)")
        autocast = torch.autocast(args.device, dtype=_DTYPES[args.autocast])
    with autocast:  # as a training call under it: the step computes as eager does there (fsdpc.autocast)
        result = export_training_step(model, batch, loss_fn, wrap=wrap, header=header,
                                      mixed_precision=policy and policy.as_fsdp2_reduces(model),
                                      device=args.device)
    if args.verify:
        run_fsdp_opt(result.mlir, ["-o", "/dev/null"])
    Path(args.out).write_text(result.mlir)
    print(f"fsdpc export: {args.model} ({type(model).__name__}) -> {args.out}"
          f"{' (verified by fsdp-opt)' if args.verify else ''}")
    print("  " + result.summary().replace("\n", "\n  "))
    return 0


def _plan(args: argparse.Namespace) -> int:
    gpus = args.gpus
    if args.nodes is not None:
        if args.nodes < 1:
            raise PlanError(f"--nodes must be at least 1, got {args.nodes}")
        if gpus is not None and gpus != args.nodes * args.gpus_per_node:
            raise PlanError(f"--gpus {gpus} is not --nodes {args.nodes} x --gpus-per-node {args.gpus_per_node}")
        gpus = args.nodes * args.gpus_per_node
    if gpus is None:
        raise PlanError("give --gpus, or --nodes (with --gpus-per-node)")
    timing = "in-backward" if args.host_optimizer_in_backward else \
        "next-forward" if args.overlap_host_optimizer else "after-step"
    chosen = machine(args.gpu, args.gpus_per_node, host_optimizer=timing,
                     **{name.replace("-", "_"): getattr(args, name.replace("-", "_")) for name in HARDWARE_OPTIONS})
    if args.mlir:
        if args.model or args.batch or args.seq or args.param_dtype:
            raise PlanError("--mlir is an already captured step: leave out --model, --batch, --seq and the dtypes")
        name, ir = args.mlir, Path(args.mlir).read_text()
    elif args.model:
        name = args.model
        ir = capture_for_plan(args.model, batch=args.batch, seq=args.seq, mixed_precision=_mixed_precision(args))
    else:
        raise PlanError("give --model (a built-in name or file.py:factory) or --mlir (a captured step)")
    if args.profile:
        profiled = plan_step(ir, gpus=args.profile_gpus, machine=chosen, model=name, optimizer=args.optimizer,
                             pipeline=args.pipeline)
        profile = Profile.read(args.profile, profiled.time.kernel_classes)
        numbers = calibrate(profile, profiled.time.ideal)
        chosen = machine(chosen.kind, chosen.gpus_per_node, host_optimizer=chosen.host_optimizer,
                         **{**dict(chosen.numbers), **numbers})
        print(f"calibrated from {args.profile} ({profile.ops} calls): "
              + ", ".join(f"{key} {value:.3g}" for key, value in numbers.items()))
    if args.search:
        return _search(ir, name, gpus, chosen, args)
    plan = plan_step(ir, gpus=gpus, machine=chosen, model=name, optimizer=args.optimizer, pipeline=args.pipeline,
                     trace=args.trace)
    print(f"fsdpc plan: {name} on {gpus} x {plan.gpu_name}, optimizer {args.optimizer}")
    print(plan.table())
    if args.trace:
        print(f"predicted step's trace: {args.trace} (open in ui.perfetto.dev)")
    replayed = when_replayed(ir, plan, optimizer=args.optimizer, pipeline=args.pipeline)
    if replayed:
        print(replayed)
    ways = what_would_fit(ir, plan, optimizer=args.optimizer, pipeline=args.pipeline)
    if ways:
        print("what would fit:")
        print("\n".join(f"  {way}" for way in ways))
    print(plan.verdict)
    return 0


def _search(ir: str, name: str, gpus: int, chosen, args: argparse.Namespace) -> int:
    budget = int(args.budget_gib * 2**30) if args.budget_gib else None
    began = time.perf_counter()
    result = search(ir, gpus=gpus, machine=chosen, model=name, optimizer=args.optimizer, pipeline=args.pipeline,
                    budget=budget)
    default = result.default
    print(f"fsdpc plan --search: {name} on {gpus} x {default.gpu_name}, optimizer {args.optimizer}: "
          f"{result.tried} configurations planned in {time.perf_counter() - began:.1f} s, "
          f"{len(result.fitting)} distinct ones fit {size(result.budget)}")
    if not result.fitting:
        print(f"does not fit: no configuration fits {size(result.budget)} per GPU on {gpus} GPUs, "
              f"offloading included; the defaults need {size(default.memory.peak)}")
        return 0
    print(f"  {'#':>2} {'step':>10} {'tokens/s/GPU':>13} {'MFU':>6} {'peak':>11}  settings")
    for rank, candidate in enumerate(result.fitting[:args.top], 1):
        plan = candidate.plan
        print(f"  {rank:>2} {plan.time.step * 1e3:>7.1f} ms {plan.time.tokens_per_second:>13,.0f} "
              f"{plan.time.mfu * 100:>5.1f}% {size(plan.memory.peak):>11}  {candidate.description}")
    best = result.fitting[0]
    print(f"why #1: {explain(best, default)}")
    parts = each_setting(ir, best, budget=result.budget, optimizer=args.optimizer, pipeline=args.pipeline)
    if parts:
        print("  each of its settings, against #1 without it: " + "; ".join(parts))
    if args.trace:
        plan_step(ir, gpus=gpus, machine=chosen, model=name, optimizer=args.optimizer,
                  pipeline=f"{args.pipeline} {best.settings}", replicas=best.replicas, trace=args.trace)
        print(f"predicted step's trace of #1: {args.trace} (open in ui.perfetto.dev)")
    print(best.plan.verdict)
    return 0


_DTYPES = {name: torch_dtype(name) for name in MIXED_PRECISION_TYPES}


def _mixed_precision(args: argparse.Namespace) -> MixedPrecision | None:
    """The policy the dtype options give (without --reduce-dtype, the
    commands reduce as fsdpc.shard would: `MixedPrecision.as_fsdp2_reduces`)."""
    if args.param_dtype is None:
        if args.reduce_dtype or args.output_dtype:
            raise ValueError("--reduce-dtype and --output-dtype need --param-dtype")
        return None
    return MixedPrecision(
        param_dtype=_DTYPES[args.param_dtype],
        reduce_dtype=_DTYPES[args.reduce_dtype] if args.reduce_dtype else None,
        output_dtype=_DTYPES[args.output_dtype] if args.output_dtype else None,
        cast_forward_inputs=args.cast_forward_inputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fsdpc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export", help="capture a model's training step as fsdp-dialect IR",
        description="Capture forward, loss and backward of a model as fsdp-dialect IR. "
                    "A factory returns (model, batch, loss_fn) with loss_fn(model, *batch) -> loss.")
    export.add_argument("--model", required=True,
                        help=f"built-in name ({', '.join(BUILTIN_MODELS)}) or path/to/file.py:factory")
    export.add_argument("--out", required=True, help="where to write the .mlir file")
    export.add_argument("--batch", type=int, help="batch size passed to the factory")
    export.add_argument("--seq", type=int, help="sequence length passed to the factory")
    export.add_argument("--wrap", help="comma-separated module class names that become wrap units "
                                       "(default: each block of the model's layer stack)")
    export.add_argument("--param-dtype", choices=sorted(_DTYPES),
                        help="mixed precision: compute dtype of parameters (FSDP2 param_dtype)")
    export.add_argument("--reduce-dtype", choices=sorted(_DTYPES),
                        help="mixed precision: gradient reduction dtype (default: where the installed torch's "
                             "FSDP2 reduces, as fsdpc.shard does: the parameters' dtype from torch 2.15, "
                             "the compute dtype before)")
    export.add_argument("--output-dtype", choices=sorted(_DTYPES),
                        help="mixed precision: dtype of each wrap unit's floating outputs")
    export.add_argument("--cast-forward-inputs", action=argparse.BooleanOptionalAction, default=True,
                        help="mixed precision: cast each unit's floating inputs to --param-dtype")
    export.add_argument("--device", choices=TARGET_DEVICES, default="cpu",
                        help="the device the step will run on: which fused kernels capture keeps whole "
                             "(cuda: flash or memory-efficient attention, as eager PyTorch picks); "
                             "no GPU is needed to capture")
    export.add_argument("--autocast", choices=("bf16", "f16"),
                        help="capture the step as a call under torch.autocast of this dtype makes it (for --device "
                             "cuda, on a machine with a GPU)")
    export.add_argument("--meta", action=argparse.BooleanOptionalAction, default=True,
                        help="build the model on the meta device (default; capture needs only shapes)")
    export.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="check the result with fsdp-opt (default)")
    plan = commands.add_parser(
        "plan", help="will the step fit N GPUs, and how fast: per-rank memory, predicted time and a verdict",
        description="Capture the step on meta for a CUDA target (or take a captured one), shard it for N GPUs, "
                    "hold the memory report of that schedule against the GPU's memory and predict its time.")
    plan.add_argument("--model", help=f"built-in name ({', '.join(BUILTIN_MODELS)}) or path/to/file.py:factory")
    plan.add_argument("--mlir", help="an already captured step (python -m fsdpc export --device cuda)")
    plan.add_argument("--gpus", type=int, help="GPUs the step is sharded over")
    plan.add_argument("--nodes", type=int, help="nodes of --gpus-per-node GPUs (instead of --gpus)")
    plan.add_argument("--gpus-per-node", type=int, default=8, help="GPUs sharing a node's NVLink (default 8)")
    plan.add_argument("--gpu", default="h100-sxm",
                      help="GPU kind: h100-sxm, h100-96gb, h200, a100-80gb, or custom with every GPU number below")
    for number, what in (("memory-gib", "GPU memory, GiB"), ("tensor-tflops", "dense bf16 peak, TFLOP/s"),
                         ("fp32-tflops", "fp32 matmul peak, TFLOP/s"), ("memory-gbps", "memory bandwidth, GB/s"),
                         ("intra-node-gbps", "collective bus bandwidth inside a node, GB/s"),
                         ("inter-node-gbps", "collective bus bandwidth per GPU across nodes, GB/s"),
                         ("host-link-gbps", "pinned host <-> device copies, GB/s"),
                         ("host-optimizer-gbps", "bytes the host optimizer streams, GB/s "
                                                 "(benchmarks/host_optimizer.py measures it)")):
        plan.add_argument(f"--{number}", type=float, help=f"{what} (overrides the kind's)")
    plan.add_argument("--overlap-host-optimizer", action="store_true",
                      help="offloaded units' optimizer steps run beside the next step's forward "
                           "(sharded.overlap_host_optimizer)")
    plan.add_argument("--host-optimizer-in-backward", action="store_true",
                      help="offloaded units' optimizer steps start as their gradients land in host memory, during "
                           "backward (sharded.overlap_host_optimizer(optimizer, in_backward=True))")
    plan.add_argument("--trace", help="write the predicted step as a Perfetto trace here")
    plan.add_argument("--profile",
                      help="a PyTorch profiler Chrome trace of this step measured on the GPU kind: calibrates the "
                           "time model's efficiencies and host time per call")
    plan.add_argument("--profile-gpus", type=int, default=1, help="GPUs the profiled step ran on (default 1)")
    plan.add_argument("--search", action="store_true",
                      help="plan every combination of fsdpc's knobs and rank those that fit by predicted time")
    plan.add_argument("--top", type=int, default=5, help="configurations --search lists (default 5)")
    plan.add_argument("--budget-gib", type=float, help="memory per GPU --search must fit (default: all of it)")
    plan.add_argument("--batch", type=int, help="batch size per GPU, passed to the factory")
    plan.add_argument("--seq", type=int, help="sequence length passed to the factory")
    plan.add_argument("--optimizer", default="adamw", help="adamw, adam, sgd-momentum, sgd or none")
    plan.add_argument("--param-dtype", choices=sorted(_DTYPES), help="mixed precision compute dtype")
    plan.add_argument("--reduce-dtype", choices=sorted(_DTYPES),
                      help="mixed precision reduction dtype (default: as export's)")
    plan.add_argument("--pipeline", default="",
                      help="more fsdp-sharding-pipeline options (strategy=, checkpoint=, offload-to-fit=, ...)")
    plan.set_defaults(output_dtype=None, cast_forward_inputs=True)
    args = parser.parse_args(argv)
    run = _export if args.command == "export" else _plan
    try:
        return run(args)
    except (CaptureError, CacheError, ValueError, FsdpOptError, FileNotFoundError) as error:
        print(f"fsdpc {args.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
