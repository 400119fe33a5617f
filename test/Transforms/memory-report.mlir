// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-memory-report -o /dev/null | FileCheck %s --check-prefix=TABLE
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-memory-report="format=json" -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=4" --fsdp-memory-report="output=%t.txt" | FileCheck %s
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=4" --fsdp-memory-report="optimizer=sgd output=%t.txt" | FileCheck %s --check-prefix=SGD
// RUN: not fsdp-opt %s --fsdp-memory-report="optimizer=lion" 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-memory-report="backend=nccl" -o /dev/null | FileCheck %s --check-prefix=NCCL
// RUN: not fsdp-opt %s --fsdp-memory-report="backend=mpi" 2>&1 | FileCheck %s --check-prefix=BACKEND
// RUN: fsdp-opt %s --fsdp-sharding-pipeline="ranks=4 offload=*" --fsdp-memory-report -o /dev/null | FileCheck %s --check-prefix=OFFLOAD-CPU
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %s | fsdp-opt --fsdp-sharding-pipeline="ranks=4 offload=*" --fsdp-memory-report="backend=nccl" -o /dev/null | FileCheck %s --check-prefix=OFFLOAD-GPU
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=1 backend=nccl" --fsdp-memory-report="backend=nccl" -o /dev/null | FileCheck %s --check-prefix=NCCL-ONE
// RUN: fsdp-opt %S/Inputs/host-gather-cast.mlir --fsdp-memory-report="backend=nccl" -o /dev/null | FileCheck %s --check-prefix=HOST-CAST

// AdamW in fp32 on N ranks: 16 bytes per parameter / N for parameter shards,
// gradient shards and the two moments. 32 parameters on 4 ranks: 128 bytes.
// CHECK: fsdp.memory = {batch = 16 : i64, buffers = 0 : i64, grad_accumulation = 0 : i64, grads = 32 : i64, host = 0 : i64, optimizer = 64 : i64, params = 32 : i64
// SGD: grads = 32 : i64, host = 0 : i64, optimizer = 0 : i64, params = 32 : i64
// BAD: error: unknown optimizer 'lion'; use adamw, adam, sgd-momentum, sgd or none
// NCCL:    collective staging                300 B
// BACKEND: error: unknown collective backend 'mpi'; use gloo or nccl

// Offloaded, the same 128 bytes are host memory. On a CPU target that is the
// device's memory, so the peak stays 372 B; on a GPU they leave the device,
// and the gradient leaves it at its wait.
// OFFLOAD-CPU:      parameter shards                      0 B
// OFFLOAD-CPU:      offloaded to host                   128 B  0.000 MiB (host memory is the device's: in the peak)
// OFFLOAD-CPU-NEXT: peak (persistent + live)            372 B
// OFFLOAD-GPU:      offloaded to host                   128 B  0.000 MiB{{$}}
// OFFLOAD-GPU-NEXT: peak (persistent + live)            308 B
// OFFLOAD-GPU:      gradient shards                       0 B
fsdp.unit @root root
fsdp.param @w : tensor<8x4xf32> unit @root
func.func @train_step(%x: tensor<1x4xf32>) -> tensor<f32> {
  %w = fsdp.get_param @w : tensor<8x4xf32>
  %y = fsdp.aten "aten::mm" (%x, %w) : (tensor<1x4xf32>, tensor<8x4xf32>) -> tensor<1x4xf32>
  %l = fsdp.aten "aten::sum" (%y) : (tensor<1x4xf32>) -> tensor<f32>
  fsdp.loss %l : tensor<f32>
  %g = fsdp.aten "aten::mm" (%y, %x) : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<8x4xf32>
  fsdp.gradients [@w] %g : tensor<8x4xf32>
  return %l : tensor<f32>
}

// The shared step on 4 ranks: padded shards (l0.w's 10 rows take 3 per rank),
// a frozen head without gradient or optimizer state. The peak is l1's
// reduce-scatter: its packed buffer (4 padded shards of 10 elements, reduced
// in place on Gloo) next to the gradient it packs and the activations that
// backward still needs.
// TABLE:      memory per rank: @train_step (optimizer adamw)
// TABLE-NEXT:   parameter shards                    116 B
// TABLE-NEXT:   gradient shards                     100 B
// TABLE-NEXT:   optimizer state                     200 B
// TABLE-NEXT:   buffers                               0 B
// TABLE-NEXT:   batch                                32 B
// TABLE-NEXT:   gradient accumulation                 0 B
// TABLE-NEXT:   peak (persistent + live)            832 B
// TABLE-NEXT:     above the step's start            484 B
// TABLE-NEXT:     gathered parameters                 0 B
// TABLE-NEXT:     activations                       324 B
// TABLE-NEXT:     collective staging                160 B
// TABLE-NEXT:     gradient shards                     0 B
// TABLE-NEXT:     at fsdp.reduce_scatter_start loc(
// TABLE-NEXT:              160 B  fsdp.aten aten::mm in 'l1' tensor<4x10xf32>
// TABLE:        most gathered at once               200 B
// TABLE-NEXT:   saved for backward                   84 B

// On one GPU, NCCL reduces the packed buffer in place (an all-reduce of one
// rank): at l0's reduce-scatter the staging is that buffer alone, 200 B
// (l0's 50 gradient elements in fp32), with no receive buffer of the same
// size beside it (400 B before).
// NCCL-ONE:      collective staging                200 B
// NCCL-ONE-NEXT: gradient shards                   160 B
// NCCL-ONE-NEXT: at fsdp.reduce_scatter_start

// An offloaded bucket of a 40 MB and a 2 MB f32 shard gathered in bf16 on 2
// GPUs stages its receive buffer (42 MB; this rank's 21 MB packed into its
// row, gathered in place), and the shards cross to the device in their own
// dtype through one chunk of 32 MiB (fsdp_rt/HostStaging.h), not a device
// copy of each (42 MB).
// HOST-CAST: collective staging           75554432 B

// JSON:      "function": "train_step",
// JSON:      "most_gathered_params": 200,
// JSON:      "gathered_params": 0,
// JSON:      "staging": 160,
// JSON:      "persistent": {
// JSON-NEXT:   "at_step_start": 348,
// JSON-NEXT:   "batch": 32,
// JSON:        "total": 448
// JSON:      "saved_activations": 84,
// JSON-NEXT: "timeline": [
