// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-bucket-collectives --fsdp-overlap-reductions | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-bucket-collectives --fsdp-overlap-reductions="depth=0" | FileCheck %s --check-prefix=OFF
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-bucket-collectives --fsdp-overlap-reductions="depth=2" | FileCheck %s --check-prefix=DEEP
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=2 replicas=2 strategy=hybrid-shard" --fsdp-bucket-collectives --fsdp-overlap-reductions | FileCheck %s --check-prefix=HYBRID
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-overlap-reductions="depth=-1" 2>&1 | FileCheck %s --check-prefix=NEGATIVE

// Depth 1: l1's reduce-scatter runs under l0's backward and is waited for
// when l0's starts; l0's, the last, where fsdp.gradients reads it.
// CHECK:      %[[R1:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l1
// CHECK-NEXT: fsdp.aten "aten::threshold_backward"
// CHECK-NEXT: fsdp.aten "aten::mm"
// CHECK-NEXT: fsdp.aten "aten::sum.dim_IntList"
// CHECK-NEXT: %[[S1:.*]] = fsdp.wait %[[R1]]
// CHECK-NEXT: %[[R0:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l0
// CHECK-NEXT: %[[S0:.*]]:2 = fsdp.wait %[[R0]]
// CHECK-NEXT: fsdp.gradients [@l0.w, @l0.b, @l1.w] %[[S0]]#0, %[[S0]]#1, %[[S1]]

// Depth 0: every reduction is waited for right after it starts.
// OFF:      %[[R1:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l1
// OFF-NEXT: fsdp.wait %[[R1]]

// Depth 2: both reductions are in flight together; each is waited for
// where fsdp.gradients reads it.
// DEEP:      %[[R1:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l1
// DEEP-NEXT: fsdp.aten "aten::threshold_backward"
// DEEP:      %[[R0:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l0
// DEEP-NEXT: fsdp.wait %[[R1]]
// DEEP-NEXT: fsdp.wait %[[R0]]
// DEEP-NEXT: fsdp.gradients

// Hybrid: each reduction, the replicas' all-reduces included, is waited for
// when the next one starts; a shard's all-reduce reads its reduce-scatter's
// result, and the starts keep their order.
// HYBRID:      %[[R1:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l1
// HYBRID:      %[[S1:.*]] = fsdp.wait %[[R1]]
// HYBRID-NEXT: %[[R0:.*]] = fsdp.reduce_scatter_start {{.*}} unit @l0
// HYBRID-NEXT: %[[S0:.*]]:2 = fsdp.wait %[[R0]]
// HYBRID-NEXT: %[[A0:.*]] = fsdp.all_reduce_start %[[S0]]#0, %[[S0]]#1
// HYBRID-NEXT: fsdp.wait %[[A0]]
// HYBRID-NEXT: fsdp.all_reduce_start %[[S1]]

// NEGATIVE: error: overlap-reductions depth must be >= 0, got -1
