// Option errors of fsdp-shard-parameters name the option and its value.
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="strategy=zero3" 2>&1 | FileCheck %s --check-prefix=STRATEGY
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=0" 2>&1 | FileCheck %s --check-prefix=RANKS
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="replicas=2" 2>&1 | FileCheck %s --check-prefix=REPLICAS
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=6 reshard-group=4" 2>&1 | FileCheck %s --check-prefix=GROUP
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=8 reshard-group=2 strategy=hybrid-shard" 2>&1 | FileCheck %s --check-prefix=GROUPHSDP

// STRATEGY: error: unknown strategy 'zero3'; use full-shard, shard-grad-op, hybrid-shard or no-shard
// RANKS: error: ranks and replicas must be >= 1, got ranks=0 replicas=1
// REPLICAS: error: replicas > 1 needs strategy=hybrid-shard
// GROUP: error: reshard-group 4 must divide ranks (6)
// GROUPHSDP: error: reshard-group (integer reshard-after-forward) needs strategy=full-shard
