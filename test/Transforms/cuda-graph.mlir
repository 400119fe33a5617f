// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl cuda-graph=true" | FileCheck %s
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl cuda-graph=true gradient-accumulation=true" | FileCheck %s --check-prefix=ACCUM
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl cuda-graph=true gradient-accumulation=true" | fsdp-translate --fsdp-to-program | FileCheck %s --check-prefix=PROGRAM
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl" | FileCheck %s --check-prefix=OFF
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 backend=nccl cuda-graph=true" 2>&1 | FileCheck %s --check-prefix=CPU
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | not fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=gloo cuda-graph=true" 2>&1 | FileCheck %s --check-prefix=GLOO
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | not fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl offload=l1 cuda-graph=true" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl" | sed 's/fsdp.collective_hash/fsdp.cuda_graph = 1 : i64, fsdp.collective_hash/' | not fsdp-opt 2>&1 | FileCheck %s --check-prefix=NOT-UNIT

// The step is marked; nothing else changes.
// CHECK: func.func @train_step({{.*}}attributes {{{.*}}fsdp.cuda_graph}

// Compiled for gradient accumulation, the synchronizing step reads what the
// calls before it accumulated, new on every call: only the accumulating
// step is replayed.
// ACCUM:     func.func @train_step({{.*}}fsdp.collective_hash = "{{[0-9a-f]+}}"} {
// ACCUM:     func.func @train_step_no_sync({{.*}}fsdp.cuda_graph}

// The program says which functions the runtime replays.
// PROGRAM: {"cuda_graph": false, {{.*}}"name": "train_step",
// PROGRAM: {"cuda_graph": true, {{.*}}"name": "train_step_no_sync",

// OFF-NOT: fsdp.cuda_graph

// CPU: error: cuda-graph needs a step captured for CUDA; this one was captured for cpu (export with --device cuda)
// GLOO: error: cuda-graph needs NCCL collectives; gloo's run on the host, where a graph cannot capture them
// OFFLOAD: error: cuda-graph cannot replay a step that offloads unit @l1: its host copies and host optimizer run beside the step on host threads
// NOT-UNIT: error: fsdp.cuda_graph must be a unit attribute on a function
