// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l0" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 replicas=2 strategy=hybrid-shard offload=*" | FileCheck %s --check-prefix=HYBRID
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 reshard-after-forward=2 offload=l1" | FileCheck %s --check-prefix=INNER
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l7" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 strategy=no-shard offload=l0" 2>&1 | FileCheck %s --check-prefix=NOSHARD

// One unit: its all-gather reads shards from the host and its
// reduce-scatter delivers to the host; the other units stay on the device.
// CHECK:      fsdp.unit @l0 class "Layer" offloaded
// CHECK-NEXT: fsdp.unit @l1 class "Layer"{{$}}
// CHECK:      fsdp.all_gather_start {{.*}} unit @l0 host :
// CHECK:      fsdp.all_gather_start {{.*}} unit @l1 prefetch 1 :
// CHECK:      fsdp.loss
// CHECK:      fsdp.reduce_scatter_start {{.*}} unit @l1 :
// CHECK:      fsdp.reduce_scatter_start {{.*}} unit @l0 host :

// Hybrid sharding: the replicas' all-reduce hands the gradients over, so it
// is the one that delivers to the host; the reduce-scatter before it stays
// on the device.
// HYBRID:     fsdp.unit @root root class "Net" offloaded
// HYBRID:     fsdp.all_gather_start {{.*}} unit @root prefetch 1 host :
// HYBRID:     fsdp.reduce_scatter_start {{.*}} unit @l0 :
// HYBRID:     fsdp.all_reduce_start {{.*}} unit @l0 host :

// An inner reshard group: backward gathers the slice kept on the device
// after forward, not the host shard.
// INNER:      fsdp.all_gather_start {{.*}} unit @l1 prefetch 1 host :
// INNER:      %[[SLICE:.*]] = fsdp.all_slice
// INNER:      fsdp.all_gather_start %[[SLICE]] {{.*}} unit @l1 :
// INNER:      fsdp.reduce_scatter_start {{.*}} unit @l1 host :

// UNKNOWN: error: offload names unit 'l7', which the module does not have; its units: root, l0, l1

// NOSHARD: error: cannot offload unit @l0: parameter 'l0.w' is replicated (no-shard); only shards are offloaded
