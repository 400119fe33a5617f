// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l0" | FileCheck %s
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=2 replicas=2 strategy=hybrid-shard offload=*" | FileCheck %s --check-prefix=HYBRID
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 reshard-after-forward=2 offload=l1" | FileCheck %s --check-prefix=INNER
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 offload=l7" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl gather-into-results=false" --fsdp-offload-units="fit-bytes=891 backend=nccl" | FileCheck %s --check-prefix=FIT-ONE
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl gather-into-results=false offload-to-fit=0" --fsdp-offload-units="fit-bytes=600 backend=nccl" | FileCheck %s --check-prefix=FIT-TWO
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4" --fsdp-offload-units="fit-bytes=100" 2>&1 | FileCheck %s --check-prefix=FIT-CPU
// RUN: sed -e '1i module attributes {fsdp.device = "cuda"} {' -e '$a }' %S/Inputs/step.mlir | not fsdp-opt --fsdp-sharding-pipeline="ranks=4 backend=nccl gather-into-results=false" --fsdp-offload-units="fit-bytes=100 backend=nccl" 2>&1 | FileCheck %s --check-prefix=FIT-NEVER
// RUN: not fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 strategy=no-shard offload=l0" 2>&1 | FileCheck %s --check-prefix=NOSHARD
// RUN: fsdp-opt %S/Inputs/step.mlir --fsdp-sharding-pipeline="ranks=4 strategy=no-shard offload=l0 ignored-params=l0.w,l0.b" | FileCheck %s --check-prefix=NOSHARD-IGNORED

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

// Only what does not fit: the device peak is 892 B. One byte over asks for
// the smallest unit that covers it (the root's 16 B frozen head); 292 B over
// for the largest (l0, 240 B of shard, gradient and AdamW state), then the
// smallest that covers the remaining 52 B (l1). 500 B cannot be met.
// FIT-ONE:      fsdp.unit @root root class "Net" offloaded
// FIT-ONE-NEXT: fsdp.unit @l0 class "Layer"{{$}}
// FIT-ONE-NEXT: fsdp.unit @l1 class "Layer"{{$}}
// FIT-TWO:      fsdp.unit @root root class "Net"{{$}}
// FIT-TWO-NEXT: fsdp.unit @l0 class "Layer" offloaded
// FIT-TWO-NEXT: fsdp.unit @l1 class "Layer" offloaded
// FIT-CPU: error: offload to fit a device memory budget needs a GPU target: on a CPU target host memory is the device's
// FIT-NEVER: error: the step does not fit 100 bytes (0.0 MiB) of device memory even with every unit it can offload in host memory: its peak is 556 bytes, 456 (0.0 MiB) over

// UNKNOWN: error: offload names unit 'l7', which the module does not have; its units: root, l0, l1

// NOSHARD: error: cannot offload unit @l0: parameter 'l0.w' is replicated (no-shard); only shards are offloaded
// Ignored parameters stay on the device and do not stop their unit's offload.
// NOSHARD-IGNORED: fsdp.unit @l0 class "Layer" offloaded
// NOSHARD-IGNORED: fsdp.param @l0.w : tensor<10x4xf32> unit @l0 ignored{{$}}
