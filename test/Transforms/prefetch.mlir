// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-bucket-collectives --fsdp-prefetch | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-bucket-collectives --fsdp-prefetch="forward-depth=0 backward-depth=0" | FileCheck %s --check-prefix=OFF
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-shard-parameters="ranks=4" --fsdp-reshard-after-forward --fsdp-bucket-collectives --fsdp-prefetch="forward-depth=2" | FileCheck %s --check-prefix=DEEP
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-prefetch="forward-depth=-1" 2>&1 | FileCheck %s --check-prefix=NEGATIVE

// Depth 1: l1's gather starts as soon as l0's arrives, before l0 computes;
// the root's head right after l1's. The first gather of each phase has no
// unit before it to overlap with: forward's starts at the top; backward's
// stays right before its use, so that it does not add to the memory peak
// of the loss's gradient.
// CHECK:      %[[F0:.*]] = fsdp.all_gather_start {{.*}} unit @l0 :
// CHECK-NEXT: fsdp.wait %[[F0]]
// CHECK-NEXT: fsdp.get_param @l1.w
// CHECK-NEXT: %[[F1:.*]] = fsdp.all_gather_start {{.*}} unit @l1 prefetch 1
// CHECK-NEXT: fsdp.aten "aten::addmm"
// CHECK:      fsdp.wait %[[F1]]
// CHECK-NEXT: fsdp.get_param @head
// CHECK-NEXT: fsdp.all_gather_start {{.*}} unit @root prefetch 1
// CHECK:      fsdp.loss
// CHECK:      fsdp.reshard
// CHECK-NEXT: fsdp.get_param @l1.w
// CHECK-NEXT: %[[B1:.*]] = fsdp.all_gather_start {{.*}} unit @l1 :
// CHECK-NEXT: fsdp.wait %[[B1]]

// Depth 0: every gather starts right before its wait.
// OFF-NOT: prefetch
// OFF:     fsdp.all_gather_start {{.*}} unit @l1 :
// OFF-NEXT: fsdp.wait

// Depth 2: the first two units' gathers start together at the top, and the
// root's head two units ahead, as soon as l0's gather has arrived.
// DEEP:      fsdp.all_gather_start {{.*}} unit @l0 :
// DEEP-NEXT: fsdp.get_param @l1.w
// DEEP-NEXT: fsdp.all_gather_start {{.*}} unit @l1 prefetch 1
// DEEP-NEXT: fsdp.wait
// DEEP-NEXT: fsdp.get_param @head
// DEEP-NEXT: fsdp.all_gather_start {{.*}} unit @root prefetch 2

// NEGATIVE: error: prefetch depths and memory budget must be >= 0
